//! Fetching the matrix's kernels: the newest plain image of each Debian LTS series in the
//! package index (`apt-cache policy` decides), downloaded with `apt-get download` and unpacked
//! with `dpkg-deb -x` under `target/kernels/`; superseded images of a series are removed.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use crate::{root, run_cmd, say, setup::output};

/// The LTS series of the matrix, as Debian names its kernel images.
pub const SERIES: [&str; 2] = ["6.1", "6.12"];

/// A kernel image unpacked under `target/kernels/`.
#[derive(Clone, Debug)]
pub struct Kernel {
    pub series: &'static str,
    pub package: String,
    pub version: String,
    pub vmlinuz: PathBuf,
}

pub fn kernels_dir() -> PathBuf {
    root().join("target/kernels")
}

/// Whether `name` is the plain `arch` image of `series` (not -cloud, -rt, -16k, dbg, unsigned).
fn is_plain_image(series: &str, arch: &str, name: &str) -> bool {
    let Some(rest) = name.strip_prefix(&format!("linux-image-{series}.")) else {
        return false;
    };
    rest.starts_with(|c: char| c.is_ascii_digit())
        && rest.ends_with(&format!("-{arch}"))
        && !["cloud", "-rt-", "dbg", "unsigned"]
            .iter()
            .any(|s| rest.contains(s))
}

/// `(package, candidate version)` from `apt-cache policy` output.
fn parse_policy(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut current = None;
    for line in text.lines() {
        if !line.starts_with(' ')
            && let Some(name) = line.strip_suffix(':')
        {
            // A foreign architecture's package is `name:arch`.
            let name = name.split(':').next().unwrap_or(name);
            current = Some(name.to_owned());
        } else if let Some(v) = line.trim().strip_prefix("Candidate:")
            && let Some(name) = current.take()
        {
            let v = v.trim();
            if v != "(none)" {
                out.push((name, v.to_owned()));
            }
        }
    }
    out
}

fn version_greater(a: &str, b: &str) -> bool {
    Command::new("dpkg")
        .args(["--compare-versions", a, "gt", b])
        .status()
        .is_ok_and(|s| s.success())
}

/// The newest plain `arch` image of `series` in the package index: `(package, version)`.
fn newest(series: &'static str, arch: &str) -> Result<Option<(String, String)>> {
    let pattern = format!("^linux-image-{}\\.", series.replace('.', "\\."));
    let found = output(Command::new("apt-cache").args(["search", "--names-only", &pattern]))?;
    let names: Vec<String> = found
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| is_plain_image(series, arch, n))
        .map(|n| format!("{n}:{arch}"))
        .collect();
    if names.is_empty() {
        return Ok(None);
    }
    let policy = output(Command::new("apt-cache").arg("policy").args(&names))?;
    let mut best: Option<(String, String)> = None;
    for (name, version) in parse_policy(&policy) {
        if best
            .as_ref()
            .is_none_or(|(_, v)| version_greater(&version, v))
        {
            best = Some((name, version));
        }
    }
    Ok(best)
}

/// The newest amd64 image of `series`, downloaded and unpacked (once); older images of the
/// series left under `target/kernels/` are removed.
pub fn fetch(series: &'static str) -> Result<Kernel> {
    fetch_arch(series, "amd64")
}

/// The `.deb` of `package` (without its architecture) in `debs`, if it was downloaded.
fn deb_of(debs: &Path, package: &str) -> Option<PathBuf> {
    std::fs::read_dir(debs)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name().is_some_and(|n| {
                let n = n.to_string_lossy();
                n.starts_with(&format!("{package}_")) && n.ends_with(".deb")
            })
        })
}

/// `package` for `arch`, downloaded into `debs` (`apt-get download`) unless it is there; the
/// package index is refreshed once if the download fails and `refreshed` says it was not yet.
pub fn download_deb(
    debs: &Path,
    package: &str,
    arch: &str,
    refreshed: &mut bool,
) -> Result<PathBuf> {
    std::fs::create_dir_all(debs).with_context(|| format!("creating {}", debs.display()))?;
    if let Some(deb) = deb_of(debs, package) {
        return Ok(deb);
    }
    say(&format!("downloading {package}:{arch} (apt-get download)"));
    let spec = format!("{package}:{arch}");
    let download = || {
        run_cmd(
            Command::new("apt-get")
                .args(["download", "-q", &spec])
                .current_dir(debs),
        )
    };
    if download().is_err() {
        if *refreshed {
            bail!("apt-get download {spec} failed");
        }
        run_cmd(Command::new("apt-get").args(["update", "-q"]))?;
        *refreshed = true;
        download()?;
    }
    deb_of(debs, package).with_context(|| format!("no .deb of {package} after download"))
}

/// The newest `arch` image of `series` (`amd64`, or `arm64` once dpkg has that architecture),
/// downloaded and unpacked (once); older images of the series left under `target/kernels/` are
/// removed.
pub fn fetch_arch(series: &'static str, arch: &str) -> Result<Kernel> {
    let dir = kernels_dir();
    let debs = dir.join("deb");
    let mut refreshed = false;
    let (package, version) = loop {
        match newest(series, arch)? {
            Some(found) => break found,
            None if !refreshed => {
                say(&format!(
                    "no linux-image-{series}.*-{arch} in the package index: apt-get update"
                ));
                run_cmd(Command::new("apt-get").args(["update", "-q"]))?;
                refreshed = true;
            }
            None => bail!("the package index has no linux-image-{series}.*-{arch}"),
        }
    };
    let unpacked = dir.join(&package);
    let vmlinuz = |root: &Path| -> Option<PathBuf> {
        std::fs::read_dir(root.join("boot"))
            .ok()?
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("vmlinuz-"))
            })
    };
    if let Some(vmlinuz) = vmlinuz(&unpacked) {
        say(&format!("kernel {package} {version}: unpacked"));
        return Ok(Kernel {
            series,
            package,
            version,
            vmlinuz,
        });
    }
    let deb = download_deb(&debs, &package, arch, &mut refreshed)?;
    // Unpacked beside, then renamed: a half-unpacked tree is never taken for a kernel.
    let partial = dir.join(format!("{package}.partial"));
    let _ = std::fs::remove_dir_all(&partial);
    say(&format!("unpacking {} (dpkg-deb -x)", deb.display()));
    run_cmd(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&partial))?;
    std::fs::rename(&partial, &unpacked)?;
    // Older images of the series: superseded.
    for entry in std::fs::read_dir(&dir)?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let base = name.split('_').next().unwrap_or(&name);
        if base != package && is_plain_image(series, arch, base) {
            say(&format!("removing {name}, superseded by {package}"));
            let path = entry.path();
            let _ = std::fs::remove_dir_all(&path);
        }
    }
    for entry in std::fs::read_dir(&debs)?.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let base = name.split('_').next().unwrap_or(&name);
        if base != package && is_plain_image(series, arch, base) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    let vmlinuz = vmlinuz(&unpacked).with_context(|| format!("no vmlinuz in {package}"))?;
    Ok(Kernel {
        series,
        package,
        version,
        vmlinuz,
    })
}

/// Every kernel of the matrix, fetched.
pub fn fetch_all() -> Result<Vec<Kernel>> {
    SERIES.iter().map(|s| fetch(s)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_images_of_the_series() {
        let amd64 = |series, name| is_plain_image(series, "amd64", name);
        assert!(amd64("6.1", "linux-image-6.1.0-50-amd64"));
        assert!(amd64("6.12", "linux-image-6.12.117+deb12-amd64"));
        assert!(!amd64("6.1", "linux-image-6.12.117+deb12-amd64"));
        assert!(!amd64("6.1", "linux-image-6.1.0-50-cloud-amd64"));
        assert!(!amd64("6.1", "linux-image-6.1.0-50-rt-amd64"));
        assert!(!amd64("6.1", "linux-image-6.1.0-50-amd64-dbg"));
        assert!(!amd64("6.12", "linux-image-6.12.117+deb12-amd64-unsigned"));
        assert!(!amd64("6.1", "linux-image-amd64"));
        assert!(!amd64("6.12", "linux-image-6.12.117+deb12-arm64"));
        let arm64 = |series, name| is_plain_image(series, "arm64", name);
        assert!(arm64("6.12", "linux-image-6.12.117+deb12-arm64"));
        assert!(arm64("6.1", "linux-image-6.1.0-50-arm64"));
        assert!(!arm64("6.12", "linux-image-6.12.117+deb12-arm64-16k"));
        assert!(!arm64("6.12", "linux-image-6.12.117+deb12-cloud-arm64"));
        assert!(!arm64("6.12", "linux-image-6.12.117+deb12-amd64"));
    }

    #[test]
    fn candidates_from_apt_cache_policy() {
        let text = "linux-image-6.1.0-48-amd64:\n  Installed: (none)\n  Candidate: 6.1.170-1\n  \
                    Version table:\n     6.1.170-1 500\nlinux-image-6.1.0-50-amd64:\n  \
                    Installed: (none)\n  Candidate: 6.1.176-1\n  Version table:\n     \
                    6.1.176-1 500\n        500 http://deb.debian.org/debian bookworm/main amd64 \
                    Packages\nlinux-image-6.1.0-9-amd64:\n  Installed: (none)\n  Candidate: \
                    (none)\nlinux-image-6.12.117+deb12-arm64:arm64:\n  Installed: (none)\n  \
                    Candidate: 6.12.117-1~deb12u1\n";
        assert_eq!(
            parse_policy(text),
            [
                ("linux-image-6.1.0-48-amd64".into(), "6.1.170-1".into()),
                ("linux-image-6.1.0-50-amd64".into(), "6.1.176-1".into()),
                (
                    "linux-image-6.12.117+deb12-arm64".into(),
                    "6.12.117-1~deb12u1".into()
                )
            ]
        );
    }
}
