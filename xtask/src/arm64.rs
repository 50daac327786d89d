//! `xtask arm64-check`: the arm64 agent's `stormwatch check` in an arm64 guest, under emulation.
//!
//! - The kernel: Debian's newest plain `linux-image-<series>.*-arm64`, fetched as the kernel
//!   matrix fetches its amd64 images ([`kernels::fetch_arch`]; dpkg needs the `arm64`
//!   architecture for `apt-get download` to see it, [`crate::setup::arm64_guest`] adds it).
//! - The guest's userland: virtme-ng boots with the host's root filesystem, which is amd64, so
//!   the guest gets a small initramfs of its own instead: Debian's static busybox for arm64
//!   (`busybox-static:arm64`, downloaded and unpacked, never installed), the agent, and the
//!   arm64 glibc it is linked against, from the cross toolchain's `libc6-arm64-cross`
//!   (`/usr/aarch64-linux-gnu/lib`); its `/init` mounts /proc, /sys, devtmpfs, tracefs and
//!   cgroup2 (only v2: `cgroup_no_v1=all`), runs `stormwatch check`, prints its output between
//!   markers on the serial console, and powers the guest off.
//! - The guest: `qemu-system-aarch64 -M virt -cpu max` with 2 vCPUs and 2 GiB, software
//!   emulation (TCG) of another architecture: right for correctness, far too slow for timings.
//!   Everything `check` needs is built into Debian's arm64 kernel (BPF, its BTF, tracefs, the
//!   PL011 serial console), so no module is loaded.
//!
//! The host judges the console once the guest is gone, as the kernel matrix judges `check`.

use std::{
    io::{BufRead as _, BufReader, Write as _},
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::{
    kernels::{self, Expect},
    root, run_cmd, say,
    setup::output,
};

/// Debian's name of the architecture.
const ARCH: &str = "arm64";
/// `uname -m` in the guest.
const MACHINE: &str = "aarch64";
/// Where the cross toolchain's arm64 glibc is (Debian's `libc6-arm64-cross`).
const CROSS_LIBS: &str = "/usr/aarch64-linux-gnu/lib";
const READELF: &str = "aarch64-linux-gnu-readelf";
/// How long the guest may run in all (boot, `check`, power-off).
const GUEST_TIMEOUT: Duration = Duration::from_secs(15 * 60);
/// What the guest's /init prints around `check`'s output.
const MARK: &str = "STORMWATCH-ARM64";

fn work_dir() -> PathBuf {
    root().join("target/kernels/arm64-guest")
}

/// `(interpreter, NEEDED libraries)` from `readelf -l -d` output.
fn dynamic_deps(readelf: &str) -> (Option<String>, Vec<String>) {
    let mut interpreter = None;
    let mut needed = Vec::new();
    for line in readelf.lines() {
        if let Some(rest) = line
            .trim()
            .strip_prefix("[Requesting program interpreter: ")
        {
            interpreter = rest.strip_suffix(']').map(str::to_owned);
        } else if line.contains("(NEEDED)")
            && let Some(lib) = line
                .split("Shared library: [")
                .nth(1)
                .and_then(|r| r.strip_suffix(']'))
        {
            needed.push(lib.to_owned());
        }
    }
    (interpreter, needed)
}

/// Copies `bin`'s interpreter and libraries, and theirs, from the cross toolchain's glibc into
/// `dest`'s /lib (the interpreter at the path the binary asks for).
fn copy_libraries(bin: &Path, dest: &Path) -> Result<Vec<String>> {
    let mut todo = vec![bin.to_path_buf()];
    let mut copied: Vec<String> = Vec::new();
    while let Some(file) = todo.pop() {
        let text = output(Command::new(READELF).args(["-l", "-d"]).arg(&file))?;
        let (interpreter, needed) = dynamic_deps(&text);
        let mut wanted: Vec<(String, PathBuf)> = needed
            .into_iter()
            .map(|lib| {
                let target = dest.join("lib").join(&lib);
                (lib, target)
            })
            .collect();
        if let Some(interp) = interpreter {
            let name = Path::new(&interp)
                .file_name()
                .context("an interpreter without a file name")?
                .to_string_lossy()
                .into_owned();
            wanted.push((name, dest.join(interp.trim_start_matches('/'))));
        }
        for (lib, target) in wanted {
            if target.exists() {
                continue;
            }
            let source = Path::new(CROSS_LIBS).join(&lib);
            std::fs::create_dir_all(target.parent().expect("a path under dest"))?;
            std::fs::copy(&source, &target).with_context(|| {
                format!(
                    "copying {} (needed by {}; from libc6-arm64-cross)",
                    source.display(),
                    file.display()
                )
            })?;
            copied.push(lib);
            todo.push(source);
        }
    }
    Ok(copied)
}

/// The guest's /init (run by busybox's shell).
fn init_script() -> String {
    format!(
        r#"#!/bin/busybox sh
# Written by `cargo xtask arm64-check` (xtask/src/arm64.rs): the arm64 guest's init.
/bin/busybox mount -t proc proc /proc
/bin/busybox --install -s /bin
export PATH=/bin
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
exec </dev/console >/dev/console 2>&1
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
mount -t tracefs nodev /sys/kernel/tracing
mount -t cgroup2 cgroup2 /sys/fs/cgroup
mount -t bpf bpf /sys/fs/bpf
# Kernel messages from here on would cut into the report.
dmesg -n 1
echo "{MARK} uname $(uname -r) $(uname -m)"
/stormwatch check > /tmp/check.out 2>&1
rc=$?
echo "{MARK} check begin"
cat /tmp/check.out
echo "{MARK} check end $rc"
poweroff -f
"#
    )
}

/// What the guest printed between the markers.
#[derive(Debug, PartialEq)]
struct GuestCheck {
    release: String,
    machine: String,
    rc: i32,
    output: String,
}

/// The guest's result from its serial console (lines end in `\r\n` there).
fn guest_check(console: &str) -> Result<GuestCheck> {
    let mut uname = None;
    let mut body: Option<Vec<&str>> = None;
    let mut rc = None;
    for line in console.lines().map(|l| l.trim_end_matches('\r')) {
        let Some(rest) = line.find(MARK).map(|i| line[i + MARK.len()..].trim_start()) else {
            if let Some(b) = body.as_mut() {
                b.push(line);
            }
            continue;
        };
        if let Some(u) = rest.strip_prefix("uname ") {
            uname = u
                .split_once(' ')
                .map(|(r, m)| (r.to_owned(), m.trim().to_owned()));
        } else if rest == "check begin" {
            body = Some(Vec::new());
        } else if let Some(code) = rest.strip_prefix("check end ") {
            rc = Some(
                code.trim()
                    .parse::<i32>()
                    .with_context(|| format!("`{line}`: no exit status"))?,
            );
            break;
        }
    }
    let (release, machine) = uname.context("the guest never reached its /init")?;
    let body = body.context("the guest's init did not get to `stormwatch check`")?;
    let rc = rc.context("`stormwatch check` did not finish in the guest")?;
    Ok(GuestCheck {
        release,
        machine,
        rc,
        output: body.join("\n"),
    })
}

/// Debian's static busybox for arm64, downloaded and unpacked under `target/kernels/`.
fn busybox() -> Result<PathBuf> {
    let dir = root().join("target/kernels");
    let unpacked = dir.join("busybox-static-arm64");
    let bin = unpacked.join("bin/busybox");
    if bin.is_file() {
        return Ok(bin);
    }
    let mut refreshed = false;
    let deb = kernels::download_deb(&dir.join("deb"), "busybox-static", ARCH, &mut refreshed)?;
    let partial = dir.join("busybox-static-arm64.partial");
    let _ = std::fs::remove_dir_all(&partial);
    run_cmd(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&partial))?;
    let _ = std::fs::remove_dir_all(&unpacked);
    std::fs::rename(&partial, &unpacked)?;
    if !bin.is_file() {
        bail!("no bin/busybox in {}", deb.display());
    }
    Ok(bin)
}

/// The guest's initramfs (an uncompressed newc cpio): busybox, the agent, its glibc, /init.
fn initramfs(agent_bin: &Path, busybox: &Path, work: &Path) -> Result<PathBuf> {
    let tree = work.join("root");
    let _ = std::fs::remove_dir_all(&tree);
    for d in ["bin", "lib", "dev", "proc", "sys", "tmp", "run"] {
        std::fs::create_dir_all(tree.join(d))?;
    }
    std::fs::copy(busybox, tree.join("bin/busybox"))?;
    std::fs::copy(agent_bin, tree.join("stormwatch"))?;
    let libs = copy_libraries(agent_bin, &tree)?;
    say(&format!(
        "initramfs: busybox, stormwatch and {}",
        libs.join(", ")
    ));
    let init = tree.join("init");
    std::fs::write(&init, init_script())?;
    std::fs::set_permissions(&init, std::fs::Permissions::from_mode(0o755))?;
    let cpio = work.join("initramfs.cpio");
    run_cmd(
        Command::new("sh")
            .args([
                "-c",
                "find . | LC_ALL=C sort | cpio -o -H newc -R 0:0 --quiet > \"$1\"",
                "sh",
            ])
            .arg(&cpio)
            .current_dir(&tree),
    )?;
    Ok(cpio)
}

/// Boots `kernel` with `initrd` under `qemu-system-aarch64`, its console into `console`;
/// returns the console's text.
fn boot(kernel: &kernels::Kernel, initrd: &Path, console: &Path) -> Result<(String, Duration)> {
    say(&format!(
        "booting {} ({}) on qemu-system-aarch64 (TCG, 2 vCPUs, 2 GiB); console in {}",
        kernel.package,
        kernel.version,
        console.display()
    ));
    let started = Instant::now();
    let mut child = Command::new("timeout")
        .args(["-k", "10", &GUEST_TIMEOUT.as_secs().to_string()])
        .arg("qemu-system-aarch64")
        .args(["-M", "virt", "-accel", "tcg"])
        // Pointer authentication with QEMU's own algorithm: far cheaper to emulate than the
        // architected one, the same to the kernel.
        .args(["-cpu", "max,pauth-impdef=on"])
        .args(["-smp", "2", "-m", "2G"])
        .args(["-nographic", "-no-reboot"])
        .arg("-kernel")
        .arg(&kernel.vmlinuz)
        .arg("-initrd")
        .arg(initrd)
        .args([
            "-append",
            "console=ttyAMA0 rdinit=/init panic=-1 cgroup_no_v1=all",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("cannot start qemu-system-aarch64")?;
    let mut log = std::fs::File::create(console)?;
    let mut text = String::new();
    if let Some(stdout) = child.stdout.take() {
        for line in BufReader::new(stdout).split(b'\n') {
            let Ok(line) = line else { break };
            let line = String::from_utf8_lossy(&line);
            let _ = writeln!(log, "{line}");
            text.push_str(&line);
            text.push('\n');
        }
    }
    let status = child.wait()?;
    let took = started.elapsed();
    say(&format!(
        "{}: the guest ended after {:.0} s ({status})",
        kernel.package,
        took.as_secs_f64()
    ));
    Ok((text, took))
}

/// The whole task for each of `series`: fetch, build the initramfs (one, the same for every
/// kernel), boot, judge `check`'s report. The guests boot at once, each on its own console
/// log: two took the 11 s of the slower (2026-12-03, AMD), not the sum. Every guest is judged;
/// the first failure is returned, each one's reported.
pub fn check(agent_bin: &Path, series: &[&'static str]) -> Result<()> {
    let kernels = series
        .iter()
        .map(|s| kernels::fetch_arch(s, ARCH))
        .collect::<Result<Vec<_>>>()?;
    let busybox = busybox()?;
    let work = work_dir();
    std::fs::create_dir_all(&work)?;
    let initrd = initramfs(agent_bin, &busybox, &work)?;
    let boots = std::thread::scope(|scope| {
        let runs: Vec<_> = kernels
            .iter()
            .zip(series)
            .map(|(kernel, s)| {
                let (initrd, console) = (&initrd, work.join(format!("console-{s}.log")));
                scope.spawn(move || boot(kernel, initrd, &console).map(|b| (b, console)))
            })
            .collect();
        runs.into_iter()
            .map(|r| r.join().expect("an arm64 guest's thread panicked"))
            .collect::<Vec<_>>()
    });
    let mut first_error = None;
    for (kernel, boot) in kernels.iter().zip(boots) {
        let judged = boot.and_then(|b| judge_console(kernel, b));
        if let Err(e) = judged {
            eprintln!("{}: {e:#}", kernel.package);
            first_error.get_or_insert(e);
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// One guest's console judged: `check` ran on an arm64 kernel and attached every probe.
fn judge_console(
    kernel: &kernels::Kernel,
    ((console, took), log): ((String, Duration), PathBuf),
) -> Result<()> {
    let guest = guest_check(&console)
        .with_context(|| format!("see the guest's console, {}", log.display()))?;
    println!(
        "{} ({}, uname {} {}): {:.0} s from boot to power-off, under emulation\n\
         `stormwatch check` exited {}:\n{}",
        kernel.package,
        kernel.version,
        guest.release,
        guest.machine,
        took.as_secs_f64(),
        guest.rc,
        guest.output
    );
    if guest.machine != MACHINE {
        bail!("the guest is {}, not {MACHINE}", guest.machine);
    }
    kernels::judge(Expect::CheckAllTpBtf, guest.rc, &guest.output)
        .context("the arm64 guest's `check`")?;
    say(&format!(
        "arm64 ({}): `stormwatch check` attaches every probe",
        kernel.package
    ));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_interpreter_and_libraries_from_readelf() {
        let text = "\
Program Headers:
  Type           Offset             VirtAddr           PhysAddr
  INTERP         0x0000000000000238 0x0000000000000238 0x0000000000000238
      [Requesting program interpreter: /lib/ld-linux-aarch64.so.1]

Dynamic section at offset 0xa8fd28 contains 31 entries:
  Tag        Type                         Name/Value
 0x0000000000000001 (NEEDED)             Shared library: [libgcc_s.so.1]
 0x0000000000000001 (NEEDED)             Shared library: [libm.so.6]
 0x0000000000000001 (NEEDED)             Shared library: [libc.so.6]
 0x000000000000000e (SONAME)             Library soname: [libfoo.so.1]
";
        assert_eq!(
            dynamic_deps(text),
            (
                Some("/lib/ld-linux-aarch64.so.1".to_owned()),
                vec![
                    "libgcc_s.so.1".to_owned(),
                    "libm.so.6".to_owned(),
                    "libc.so.6".to_owned()
                ]
            )
        );
        let (interpreter, needed) = dynamic_deps("There is no dynamic section in this file.\n");
        assert!(interpreter.is_none() && needed.is_empty());
    }

    #[test]
    fn the_check_report_is_read_between_the_markers() {
        let console = format!(
            "[    0.000000] Booting Linux on physical CPU 0x0000000000 [0x000f0510]\r\n\
             {MARK} uname 6.12.117+deb12-arm64 aarch64\r\n\
             {MARK} check begin\r\n\
             ok    kernel                                 6.12.117+deb12-arm64\r\n\
             verdict: stormwatch can run here with every probe\r\n\
             {MARK} check end 0\r\n\
             [   61.000000] reboot: Power down\r\n"
        );
        assert_eq!(
            guest_check(&console).unwrap(),
            GuestCheck {
                release: "6.12.117+deb12-arm64".into(),
                machine: "aarch64".into(),
                rc: 0,
                output: "ok    kernel                                 6.12.117+deb12-arm64\n\
                         verdict: stormwatch can run here with every probe"
                    .into(),
            }
        );
        // A guest that died in `check`, and one that never ran /init.
        let cut = console.replace(&format!("{MARK} check end 0\r\n"), "");
        let e = guest_check(&cut).unwrap_err();
        assert!(format!("{e}").contains("did not finish"), "{e}");
        let e = guest_check("Kernel panic - not syncing: No working init found.\n").unwrap_err();
        assert!(format!("{e}").contains("never reached its /init"), "{e}");
    }

    #[test]
    fn the_init_powers_off_after_printing_the_report() {
        let s = init_script();
        let at = |needle: &str| s.find(needle).unwrap_or_else(|| panic!("{needle}: {s}"));
        assert!(at("mount -t tracefs") < at("/stormwatch check"));
        assert!(at("mount -t cgroup2") < at("/stormwatch check"));
        assert!(at("check begin") < at("check end $rc"));
        assert!(at("check end $rc") < at("poweroff -f"));
    }
}
