//! stormwatch's kernel side: one module per probe family (`sched`, `futex`, `locks`, `net`),
//! the maps and helpers they share (`shared`), and the empty programs the benchmarks measure
//! against (`bench`). Each entry point reads its tracepoint's arguments and hands them to its
//! family's logic, and returns 0: a program cannot fail, so what it could not record (a map
//! full, a kernel read refused, task storage busy) is counted instead, in `PROBE_ERRORS`
//! (`NET_ERRORS` for the network family), where the agent reads it.
#![no_std]
#![no_main]
// `rdonly_cast`'s placeholder call (`shared`): inline assembly for the BPF target.
#![feature(asm_experimental_arch)]

mod bench;
mod futex;
mod gomutex;
mod handoff;
mod locks;
mod net;
mod pglock;
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
