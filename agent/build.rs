//! Builds the eBPF probes (`ebpf-probes/kernel`) for the bpf target with aya-build and puts the
//! object in OUT_DIR, where `include_bytes_aligned!` picks it up.
use aya_build::{Package, Toolchain};

/// Must match rust-toolchain.toml: bpf-linker's LLVM (22) must equal this rustc's LLVM.
const EBPF_TOOLCHAIN: &str = "nightly-2026-06-20";

fn main() -> aya_build::Result<()> {
    // aya-build relays every line the nested cargo prints to stderr as a `warning:` of this
    // package: ~40 "Compiling …" lines that look like something is wrong. Quiet, the nested
    // cargo prints only what matters: compiler diagnostics and errors, which still come through
    // in full (and an error fails this build).
    // SAFETY: a build script is single-threaded here; nothing reads the environment meanwhile.
    unsafe { std::env::set_var("CARGO_TERM_QUIET", "true") };
    let probes = Package {
        name: "stormwatch-ebpf",
        root_dir: concat!(env!("CARGO_MANIFEST_DIR"), "/../ebpf-probes/kernel"),
        ..Default::default()
    };
    aya_build::build_ebpf([probes], Toolchain::Custom(EBPF_TOOLCHAIN))
}
