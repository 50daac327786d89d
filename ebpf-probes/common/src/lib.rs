//! The ABI shared by the eBPF probes (`stormwatch-ebpf`) and the agent.
//!
//! Every type here is `#[repr(C)]`, made of fixed-width integers only and laid out without
//! implicit padding, so that both sides agree on it byte for byte. Map names are constants:
//! the agent never retypes them as strings. The size tests at the bottom of each module
//! (`tests`) catch layout drift.
//!
//! One module per probe family, as on the kernel side (`ebpf-probes/kernel/src/`): [`sched`],
//! [`futex`], [`handoff`], [`gomutex`], [`pglock`], [`locks`], [`net`]; the direct slots in front of their per-key maps ([`slots`]); the histogram the scheduler and
//! futex figures share ([`histogram`]), what the probes could not record ([`errors`]), and the
//! maps', globals' and programs' names ([`names`]). Everything but the network family is also
//! re-exported here, the path both sides use (`stormwatch_common::SchedStats`); the network
//! family keeps its own (`stormwatch_common::net::…`), as its names would clash.
#![no_std]

pub mod errors;
pub mod futex;
pub mod gomutex;
pub mod handoff;
pub mod histogram;
pub mod kfuncs;
pub mod locks;
pub mod names;
pub mod net;
pub mod pglock;
pub mod sched;
pub mod slots;

pub use errors::*;
pub use futex::*;
pub use gomutex::*;
pub use handoff::*;
pub use histogram::*;
pub use locks::*;
pub use names::*;
pub use pglock::*;
pub use sched::*;
