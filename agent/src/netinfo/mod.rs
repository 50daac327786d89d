//! What the network looks like, read rather than probed: the network namespaces and which
//! container each belongs to ([`namespaces`]), their interfaces, MTUs, tunnels and routes
//! ([`inventory`]), and the kernel's own fragmentation and ICMP counters ([`snmp`]).

pub mod inventory;
pub mod namespaces;
pub mod snmp;

pub use inventory::{NetState, NetWatch};
