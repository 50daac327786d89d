//! The eBPF crate is linked by `bpf-linker`, an undeclared build tool: rebuild when it changes.
fn main() {
    match which::which("bpf-linker") {
        Ok(path) => println!("cargo::rerun-if-changed={}", path.display()),
        Err(err) => {
            println!("cargo::warning=bpf-linker not found ({err}); run `cargo xtask setup`")
        }
    }
}
