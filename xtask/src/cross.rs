//! `xtask build --target <triple>`: the agent for another architecture, with its eBPF programs.
//!
//! The pinned nightly has no `rust-std` for arm64 to download ("unavailable for download"), so
//! the standard library is built from `rust-src` (`-Z build-std`, which the pinned toolchain
//! has for the eBPF crate anyway). Linking, and the C in the dependencies (ring), use Debian's
//! cross GCC and arm64 glibc's headers and start files. The eBPF object is the same bytecode
//! for every architecture except for what `bpf_target_arch` selects (aya-build sets it from
//! the target, as it sets it for the host).

use std::path::PathBuf;

use anyhow::{Context as _, Result, bail};

use crate::{cargo, root, run_cmd, say, setup};

/// A target the agent is built for besides the host.
#[derive(Clone, Copy, Debug)]
pub struct Target {
    pub triple: &'static str,
    /// The Debian packages that building for it needs: what each is for.
    pub packages: &'static [(&'static str, &'static str)],
    /// The cross compiler's command prefix.
    pub gcc_prefix: &'static str,
    /// The ELF `e_machine` of binaries for it.
    pub elf_machine: u16,
}

/// `EM_BPF`: the eBPF object embedded in the agent.
const EM_BPF: u16 = 247;

pub const TARGETS: [Target; 1] = [Target {
    triple: "aarch64-unknown-linux-gnu",
    packages: &[
        (
            "gcc-aarch64-linux-gnu",
            "the cross linker, and the C compiler of the dependencies' C code (ring)",
        ),
        (
            "libc6-dev-arm64-cross",
            "arm64 glibc's headers, which ring's C includes (bits/libc-header-start.h), and its \
             start files for the link; gcc-aarch64-linux-gnu only recommends it",
        ),
    ],
    gcc_prefix: "aarch64-linux-gnu",
    elf_machine: 183, // EM_AARCH64
}];

pub fn target(triple: &str) -> Option<Target> {
    TARGETS.into_iter().find(|t| t.triple == triple)
}

/// The ELF `e_machine` of a file, if it is a little-endian ELF file.
fn elf_machine(path: &std::path::Path) -> Result<u16> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    if bytes.get(..4) != Some(b"\x7fELF".as_slice()) || bytes.get(5) != Some(&1) {
        bail!("{} is not a little-endian ELF file", path.display());
    }
    let m = bytes.get(18..20).context("truncated ELF header")?;
    Ok(u16::from_le_bytes([m[0], m[1]]))
}

/// Installs what building for every target needs (`xtask setup`; [`build`] installs its own).
pub fn packages() -> Result<()> {
    for t in TARGETS {
        setup::packages(t.packages)?;
    }
    Ok(())
}

/// Builds the release agent for `t`; checks that the binary is `t`'s and that the eBPF object
/// built beside it is eBPF. Returns the binary's path.
pub fn build(t: Target) -> Result<PathBuf> {
    setup::packages(t.packages)?;
    say(&format!(
        "building stormwatch (release) for {} (-Z build-std, linked by {}-gcc)",
        t.triple, t.gcc_prefix
    ));
    let env_triple = t.triple.replace('-', "_");
    let gcc = format!("{}-gcc", t.gcc_prefix);
    run_cmd(
        cargo()
            .args([
                "build",
                "--release",
                "--package",
                "stormwatch",
                "--target",
                t.triple,
                "-Z",
                "build-std=std,panic_abort",
            ])
            .env(
                format!("CARGO_TARGET_{}_LINKER", env_triple.to_uppercase()),
                &gcc,
            )
            .env(format!("CC_{env_triple}"), &gcc)
            .env(format!("AR_{env_triple}"), format!("{}-ar", t.gcc_prefix)),
    )?;
    let release = root().join("target").join(t.triple).join("release");
    let bin = release.join("stormwatch");
    let machine = elf_machine(&bin)?;
    if machine != t.elf_machine {
        bail!(
            "{} is for ELF machine {machine}, not {}'s {}",
            bin.display(),
            t.triple,
            t.elf_machine
        );
    }
    // The eBPF object the binary embeds (agent/build.rs puts it in its OUT_DIR).
    let newest_object = std::fs::read_dir(release.join("build"))?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("stormwatch-"))
        .map(|e| e.path().join("out/stormwatch"))
        .filter(|p| p.is_file())
        .max_by_key(|p| p.metadata().and_then(|m| m.modified()).ok())
        .context("no eBPF object in the build's OUT_DIR")?;
    let object_machine = elf_machine(&newest_object)?;
    if object_machine != EM_BPF {
        bail!(
            "{} is for ELF machine {object_machine}, not eBPF",
            newest_object.display()
        );
    }
    say(&format!(
        "{}: {} for {} with its eBPF object ({} bytes)",
        t.triple,
        bin.display(),
        t.triple,
        newest_object.metadata()?.len()
    ));
    Ok(bin)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_elf_machine_is_read_from_the_header() {
        let exe = std::env::current_exe().unwrap();
        let machine = elf_machine(&exe).unwrap();
        #[cfg(target_arch = "x86_64")]
        assert_eq!(machine, 62);
        #[cfg(target_arch = "aarch64")]
        assert_eq!(machine, 183);
        let dir = tempfile::tempdir().unwrap();
        let text = dir.path().join("t");
        std::fs::write(&text, "not an ELF file at all").unwrap();
        assert!(elf_machine(&text).is_err());
    }
}
