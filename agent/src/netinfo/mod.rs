//! What the network looks like, read rather than probed: the network namespaces and which
//! container each belongs to ([`namespaces`]); their links ([`links`]) and routes ([`routes`])
//! over rtnetlink ([`netlink`]: no `ip` subprocess); what each kind of link adds to its packets
//! ([`encapsulation`]); the inventory that puts them together — MTUs, tunnels and their
//! underlays, veth pairs, uplinks ([`inventory`]); and the kernel's own fragmentation and ICMP
//! counters ([`snmp`]).

pub mod encapsulation;
pub mod inventory;
pub mod links;
pub mod namespaces;
pub mod netlink;
pub mod routes;
pub mod snmp;

pub use inventory::{NetState, NetWatch};
