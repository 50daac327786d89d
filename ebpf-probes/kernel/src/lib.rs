//! Empty library target: `agent` depends on this crate at build time so that cargo rebuilds it
//! when the probes change; the probes themselves are the `stormwatch` binary target.
#![no_std]
