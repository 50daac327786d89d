//! stormwatch's kernel side. Each program is a thin entry point around a `try_` function; every
//! failure is counted in `PROBE_ERRORS` where the agent reads it.
#![no_std]
#![no_main]
// `atomic_xchg` for the switch cache's generation (sched.rs, `bump`): the bpf target's atomic
// types have no read-modify-write methods.
#![allow(internal_features)]
#![feature(core_intrinsics)]

mod bench;
mod futex;
mod locks;
mod net;
mod sched;
mod shared;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // The verifier rejects any program that could reach this; it exists to satisfy no_std.
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
