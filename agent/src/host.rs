//! The host the containers run on: its online CPUs, the hypervisor under it (if any), its NUMA
//! nodes, its kernel — read once at start — and the CPU time the hypervisor stole, read per
//! window.
//!
//! Why it matters: the same lock storm costs more in a VM. Each hand-off to a thread queued on
//! another CPU is an inter-processor interrupt, which a guest usually cannot send without a VM
//! exit; and steal is CPU time the hypervisor gave to someone else while the guest had work.
//!
//! Reading is split from parsing: the parsers are pure and table-tested; the readers only fetch
//! text (sysfs, procfs) or registers (CPUID).

use std::path::Path;

use procfs_core::{ExplicitSystemInfo, FromBufReadSI as _, KernelStats};
use serde::Serialize;

use crate::identity::limits::parse_cpu_list;

/// What does not change while the agent runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Host {
    /// Online CPUs.
    pub cpus: u32,
    /// The hypervisor the host runs under (`kvm`, `xen`, `hyperv`, `vmware`, …; `unknown` when
    /// a hypervisor is there but does not say which), `None` when nothing shows one: bare metal.
    pub hypervisor: Option<String>,
    /// Online NUMA nodes; `None` when the kernel does not list them (built without NUMA).
    pub numa_nodes: Option<u32>,
    /// The running kernel's release (`uname -r`).
    pub kernel: String,
}

impl Host {
    /// Reads the host's static context: sysfs, procfs, CPUID and uname; never fails (each part
    /// that cannot be read is left out, as its type allows).
    pub fn read() -> Self {
        Self {
            cpus: online_cpus(),
            hypervisor: detect_hypervisor(&HypervisorSigns::read()),
            numa_nodes: read("/sys/devices/system/node/online")
                .and_then(|t| parse_cpu_list(&t))
                .map(|nodes| nodes.len() as u32),
            kernel: rustix::system::uname()
                .release()
                .to_string_lossy()
                .into_owned(),
        }
    }
}

fn read(path: impl AsRef<Path>) -> Option<String> {
    crate::files::kernel_text(path)
}

/// Online CPUs of the host, from `/sys/devices/system/cpu/online` (what glibc's
/// `sysconf(_SC_NPROCESSORS_ONLN)` reads too), else the per-CPU lines of `/proc/stat` (which
/// lists online CPUs only). Not the process's affinity or quota: those are the container's.
pub fn online_cpus() -> u32 {
    read("/sys/devices/system/cpu/online")
        .and_then(|t| parse_cpu_list(&t))
        .map(|cpus| cpus.len() as u32)
        .or_else(|| read("/proc/stat").and_then(|t| count_cpu_lines(&t)))
        .unwrap_or(1)
        .max(1)
}

/// The number of per-CPU lines (`cpu0 …`, `cpu1 …`) of a `/proc/stat` text.
fn count_cpu_lines(stat: &str) -> Option<u32> {
    Some(kernel_stats(stat)?.cpu_time.len() as u32)
}

/// A `/proc/stat` text, parsed by procfs-core. Only its tick counts are read, as they are:
/// the system figures it asks for to convert them are never used.
fn kernel_stats(stat: &str) -> Option<KernelStats> {
    let system = ExplicitSystemInfo {
        boot_time_secs: 0,
        ticks_per_second: ticks_per_second(),
        page_size: 0,
        is_little_endian: cfg!(target_endian = "little"),
    };
    KernelStats::from_buf_read(stat.as_bytes(), &system).ok()
}

// ---- the hypervisor ---------------------------------------------------------------------------

/// Every sign of a hypervisor the host gives, as read; each `None` when it could not be read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HypervisorSigns {
    /// CPUID leaf 1, ECX bit 31: set by every hypervisor that follows the convention (x86 only).
    pub cpuid_hypervisor_bit: Option<bool>,
    /// The vendor signature of CPUID leaf 0x40000000 (EBX, ECX, EDX), when the bit is set.
    pub cpuid_vendor: Option<[u8; 12]>,
    /// The signature of leaf 0x40000100: KVM and Xen put theirs there when they also present a
    /// Hyper-V interface (enlightenments) at 0x40000000.
    pub cpuid_vendor_next: Option<[u8; 12]>,
    /// `/sys/hypervisor/type` (`xen` on Xen guests and dom0).
    pub sys_hypervisor_type: Option<String>,
    /// `/sys/class/dmi/id/sys_vendor` and `product_name` (firmware tables; absent in some VMs,
    /// e.g. Firecracker, and on most non-x86 machines without ACPI).
    pub dmi_sys_vendor: Option<String>,
    pub dmi_product_name: Option<String>,
    /// The `hypervisor` flag of `/proc/cpuinfo` (the kernel's copy of the CPUID bit).
    pub cpuinfo_hypervisor_flag: Option<bool>,
}

impl HypervisorSigns {
    pub fn read() -> Self {
        let (bit, vendor, next) = cpuid_signs();
        let trimmed = |p: &str| {
            read(p)
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
        };
        Self {
            cpuid_hypervisor_bit: bit,
            cpuid_vendor: vendor,
            cpuid_vendor_next: next,
            sys_hypervisor_type: trimmed("/sys/hypervisor/type"),
            dmi_sys_vendor: trimmed("/sys/class/dmi/id/sys_vendor"),
            dmi_product_name: trimmed("/sys/class/dmi/id/product_name"),
            cpuinfo_hypervisor_flag: read("/proc/cpuinfo").and_then(|t| cpuinfo_flag(&t)),
        }
    }
}

/// CPUID's hypervisor bit and the signatures at 0x40000000 and 0x40000100.
#[cfg(target_arch = "x86_64")]
fn cpuid_signs() -> (Option<bool>, Option<[u8; 12]>, Option<[u8; 12]>) {
    use core::arch::x86_64::__cpuid;
    let signature = |leaf: u32| {
        let r = __cpuid(leaf);
        let mut s = [0u8; 12];
        s[..4].copy_from_slice(&r.ebx.to_le_bytes());
        s[4..8].copy_from_slice(&r.ecx.to_le_bytes());
        s[8..].copy_from_slice(&r.edx.to_le_bytes());
        s
    };
    let bit = __cpuid(1).ecx & (1 << 31) != 0;
    if !bit {
        // Without the bit, leaves 0x4000_0000 and up are not defined: on Intel they return the
        // highest basic leaf's data, which is not a signature.
        return (Some(false), None, None);
    }
    (
        Some(true),
        Some(signature(0x4000_0000)),
        Some(signature(0x4000_0100)),
    )
}

/// No CPUID outside x86: the sysfs and DMI signs decide.
#[cfg(not(target_arch = "x86_64"))]
fn cpuid_signs() -> (Option<bool>, Option<[u8; 12]>, Option<[u8; 12]>) {
    (None, None, None)
}

/// The `hypervisor` flag on the first `flags` line of `/proc/cpuinfo`; `None` when the text has
/// no `flags` line (non-x86 kernels list `Features` instead).
pub fn cpuinfo_flag(cpuinfo: &str) -> Option<bool> {
    let flags = cpuinfo
        .lines()
        .find(|l| l.split(':').next().is_some_and(|k| k.trim() == "flags"))?;
    let (_, list) = flags.split_once(':')?;
    Some(list.split_whitespace().any(|f| f == "hypervisor"))
}

/// The hypervisor a CPUID vendor signature names.
pub fn hypervisor_of_signature(signature: &[u8; 12]) -> Option<&'static str> {
    Some(match signature {
        b"KVMKVMKVM\0\0\0" | b"Linux KVM Hv" => "kvm",
        b"Microsoft Hv" => "hyperv",
        b"VMwareVMware" => "vmware",
        b"XenVMMXenVMM" => "xen",
        // QEMU without KVM: every instruction emulated.
        b"TCGTCGTCGTCG" => "qemu",
        b"VBoxVBoxVBox" => "virtualbox",
        b" lrpepyh  vr" => "parallels",
        b"bhyve bhyve " => "bhyve",
        b"ACRNACRNACRN" => "acrn",
        b"QNXQVMBSQG\0\0" => "qnx",
        _ => return None,
    })
}

/// The hypervisor DMI names (firmware vendor and product), for machines without CPUID.
pub fn hypervisor_of_dmi(sys_vendor: &str, product_name: &str) -> Option<&'static str> {
    let vendor = sys_vendor.trim();
    let product = product_name.trim();
    Some(match vendor {
        // QEMU's machine types say "KVM Virtual Machine" when KVM accelerates them.
        "QEMU" if product.contains("KVM") => "kvm",
        "QEMU" => "qemu",
        "KVM" => "kvm",
        // EC2's Nitro and Google's hypervisor are KVM-based; EC2's bare-metal instances keep
        // the vendor string and say `.metal` in the product.
        "Amazon EC2" if product.ends_with(".metal") => return None,
        "Amazon EC2" | "Google" => "kvm",
        "Microsoft Corporation" if product == "Virtual Machine" => "hyperv",
        "Xen" => "xen",
        "innotek GmbH" => "virtualbox",
        "Oracle Corporation" if product == "VirtualBox" => "virtualbox",
        "Parallels Software International Inc." | "Parallels International GmbH." => "parallels",
        "BHYVE" => "bhyve",
        v if v.starts_with("VMware") => "vmware",
        _ => return None,
    })
}

/// The hypervisor the signs point to. CPUID's signature names it best (the hypervisor writes
/// it itself); a Hyper-V signature hides KVM or Xen when they emulate Hyper-V, so the next
/// leaf is asked first. Without a known signature, `/sys/hypervisor/type`, then DMI. A VM
/// that names no known hypervisor is `unknown`; no sign at all is bare metal (`None`).
pub fn detect_hypervisor(s: &HypervisorSigns) -> Option<String> {
    let named = s
        .cpuid_vendor_next
        .as_ref()
        .and_then(hypervisor_of_signature)
        .filter(|h| matches!(*h, "kvm" | "xen"))
        .or_else(|| s.cpuid_vendor.as_ref().and_then(hypervisor_of_signature))
        .map(str::to_owned)
        .or_else(|| s.sys_hypervisor_type.as_deref().map(str::to_lowercase))
        .or_else(|| {
            hypervisor_of_dmi(
                s.dmi_sys_vendor.as_deref()?,
                s.dmi_product_name.as_deref().unwrap_or(""),
            )
            .map(str::to_owned)
        });
    if named.is_some() {
        return named;
    }
    let virtual_cpu =
        s.cpuid_hypervisor_bit == Some(true) || s.cpuinfo_hypervisor_flag == Some(true);
    virtual_cpu.then(|| "unknown".to_owned())
}

// ---- steal ------------------------------------------------------------------------------------

/// The host's CPU time counters, from the `cpu` line of `/proc/stat`, in clock ticks
/// (USER_HZ), summed over CPUs since boot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuTicks {
    /// Time a virtual CPU had work but the hypervisor ran something else.
    pub steal: u64,
    /// All of it: user, nice, system, idle, iowait, irq, softirq, steal (guest time is already
    /// in user and nice).
    pub total: u64,
}

/// The `cpu` line of a `/proc/stat` text. `None` without one, or when it has no steal column
/// (kernels before 2.6.11), or when the file does not parse.
pub fn parse_cpu_ticks(stat: &str) -> Option<CpuTicks> {
    let cpu = kernel_stats(stat)?.total;
    // The columns before steal are all there when it is.
    let steal = cpu.steal?;
    Some(CpuTicks {
        steal,
        total: cpu.user
            + cpu.nice
            + cpu.system
            + cpu.idle
            + cpu.iowait?
            + cpu.irq?
            + cpu.softirq?
            + steal,
    })
}

/// The host's CPU time counters now.
pub fn read_cpu_ticks() -> Option<CpuTicks> {
    parse_cpu_ticks(&read("/proc/stat")?)
}

/// Clock ticks per second of `/proc/stat` (USER_HZ: 100 on every Linux architecture today,
/// but the kernel says so in the aux vector, and that is what is read).
pub fn ticks_per_second() -> u64 {
    rustix::param::clock_ticks_per_second().max(1)
}

/// Steal since the host booted, in seconds: a counter (`/proc/stat` sums over possible CPUs,
/// so it does not go back when a CPU goes offline).
pub fn steal_seconds_since_boot() -> Option<f64> {
    Some(read_cpu_ticks()?.steal as f64 / ticks_per_second() as f64)
}

/// Steal over a window, from two readings of the counters.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Steal {
    pub seconds: f64,
    /// Of all the host's CPU time in the window, the part stolen.
    pub share: Option<f64>,
}

impl Steal {
    /// Between two readings. `None` if the counters went backwards (not the same boot).
    pub fn between(start: CpuTicks, end: CpuTicks, ticks_per_second: u64) -> Option<Self> {
        let steal = end.steal.checked_sub(start.steal)?;
        let total = end.total.checked_sub(start.total)?;
        Some(Self {
            seconds: steal as f64 / ticks_per_second.max(1) as f64,
            share: (total > 0).then(|| steal as f64 / total as f64),
        })
    }
}

/// The host context in `trace --json` and `diagnose --json` (top-level `"host"`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct HostReport {
    /// Online CPUs.
    pub cpus: u32,
    /// `kvm`, `xen`, `hyperv`, `vmware`, …, `unknown` (a hypervisor that does not say which);
    /// `null` on bare metal.
    pub hypervisor: Option<String>,
    /// Online NUMA nodes; `null` when the kernel does not list them.
    pub numa_nodes: Option<u32>,
    /// CPU time stolen by the hypervisor over the window, summed over CPUs; `null` when
    /// `/proc/stat` could not be read.
    pub steal_seconds: Option<f64>,
    /// Kernel release.
    pub kernel: String,
}

impl HostReport {
    pub fn new(host: &Host, steal: Option<Steal>) -> Self {
        Self {
            cpus: host.cpus,
            hypervisor: host.hypervisor.clone(),
            numa_nodes: host.numa_nodes,
            steal_seconds: steal.map(|s| s.seconds),
            kernel: host.kernel.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `/proc/stat` with these CPU lines, and the lines every kernel writes after them (which
    /// procfs-core requires: a file without them is not a `/proc/stat`).
    fn proc_stat(cpu_lines: &str) -> String {
        format!("{cpu_lines}intr 1 2\nctxt 3\nbtime 4\nprocesses 5\nprocs_running 1\n")
    }

    #[test]
    fn cpu_ticks_from_proc_stat() {
        let stat = proc_stat(
            "cpu  35979 12 7964 22093 938 0 231 1330 7 0\n\
             cpu0 17381 0 3492 12692 105 0 14 631 0 0\n\
             cpu1 18597 0 4472 9401 832 0 217 699 0 0\n",
        );
        assert_eq!(
            parse_cpu_ticks(&stat),
            Some(CpuTicks {
                steal: 1330,
                total: 35979 + 12 + 7964 + 22093 + 938 + 231 + 1330,
            })
        );
        assert_eq!(count_cpu_lines(&stat), Some(2));
        // Exactly eight columns (no guest): still has steal.
        assert_eq!(
            parse_cpu_ticks(&proc_stat("cpu 1 2 3 4 5 6 7 8\n")).map(|t| (t.steal, t.total)),
            Some((8, 36))
        );
        for bad in [
            "",
            "cpu0 1 2 3 4 5 6 7 8 9 10\n",
            "cpu  1 2 3 4 5 6 7\n",
            "cpu  1 2 x 4 5 6 7 8\n",
            "cpu  1 2 3 4 5 6 7 -8\n",
        ] {
            assert_eq!(parse_cpu_ticks(&proc_stat(bad)), None, "{bad:?}");
        }
        assert_eq!(parse_cpu_ticks(""), None);
        // The live file parses.
        assert!(read_cpu_ticks().is_some_and(|t| t.total > 0));
        assert!(count_cpu_lines(&read("/proc/stat").expect("/proc/stat")).is_some_and(|n| n > 0));
    }

    #[test]
    fn steal_between_readings() {
        let a = CpuTicks {
            steal: 100,
            total: 10_000,
        };
        let b = CpuTicks {
            steal: 150,
            total: 10_400,
        };
        let s = Steal::between(a, b, 100).unwrap();
        assert_eq!(s.seconds, 0.5);
        assert_eq!(s.share, Some(0.125));
        assert_eq!(
            Steal::between(b, a, 100),
            None,
            "counters from another boot"
        );
        let idle = Steal::between(a, a, 100).unwrap();
        assert_eq!((idle.seconds, idle.share), (0.0, None), "an empty window");
    }

    #[test]
    fn cpuinfo_hypervisor_flag() {
        let vm =
            "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu vme hypervisor lahf_lm\n";
        assert_eq!(cpuinfo_flag(vm), Some(true));
        let metal = "processor\t: 0\nflags\t\t: fpu vme lahf_lm\nbugs\t\t: hypervisor_x\n";
        assert_eq!(cpuinfo_flag(metal), Some(false));
        // arm64 lists `Features`, and says nothing of a hypervisor.
        assert_eq!(cpuinfo_flag("processor\t: 0\nFeatures\t: fp asimd\n"), None);
    }

    fn sig(s: &[u8]) -> [u8; 12] {
        let mut out = [0; 12];
        out[..s.len()].copy_from_slice(s);
        out
    }

    #[test]
    fn hypervisors_by_their_signs() {
        let kvm = HypervisorSigns {
            cpuid_hypervisor_bit: Some(true),
            cpuid_vendor: Some(sig(b"KVMKVMKVM")),
            cpuid_vendor_next: Some(sig(b"\x01\x02")),
            cpuinfo_hypervisor_flag: Some(true),
            ..HypervisorSigns::default()
        };
        let metal = HypervisorSigns {
            cpuid_hypervisor_bit: Some(false),
            dmi_sys_vendor: Some("Dell Inc.".into()),
            dmi_product_name: Some("PowerEdge R640".into()),
            cpuinfo_hypervisor_flag: Some(false),
            ..HypervisorSigns::default()
        };
        let cases: Vec<(&str, HypervisorSigns, Option<&str>)> = vec![
            ("kvm by cpuid", kvm.clone(), Some("kvm")),
            ("bare metal", metal.clone(), None),
            ("nothing readable", HypervisorSigns::default(), None),
            (
                "hyper-v",
                HypervisorSigns {
                    cpuid_vendor: Some(sig(b"Microsoft Hv")),
                    ..kvm.clone()
                },
                Some("hyperv"),
            ),
            (
                "kvm behind hyper-v enlightenments",
                HypervisorSigns {
                    cpuid_vendor: Some(sig(b"Microsoft Hv")),
                    cpuid_vendor_next: Some(sig(b"KVMKVMKVM")),
                    ..kvm.clone()
                },
                Some("kvm"),
            ),
            (
                "xen hvm with viridian",
                HypervisorSigns {
                    cpuid_vendor: Some(sig(b"Microsoft Hv")),
                    cpuid_vendor_next: Some(sig(b"XenVMMXenVMM")),
                    ..kvm.clone()
                },
                Some("xen"),
            ),
            (
                "vmware",
                HypervisorSigns {
                    cpuid_vendor: Some(sig(b"VMwareVMware")),
                    dmi_sys_vendor: Some("VMware, Inc.".into()),
                    ..kvm.clone()
                },
                Some("vmware"),
            ),
            (
                "xen dom0: no cpuid bit, sysfs says",
                HypervisorSigns {
                    sys_hypervisor_type: Some("xen".into()),
                    ..metal.clone()
                },
                Some("xen"),
            ),
            (
                "arm64 kvm guest: DMI only",
                HypervisorSigns {
                    dmi_sys_vendor: Some("QEMU".into()),
                    dmi_product_name: Some("KVM Virtual Machine".into()),
                    ..HypervisorSigns::default()
                },
                Some("kvm"),
            ),
            (
                "graviton instance",
                HypervisorSigns {
                    dmi_sys_vendor: Some("Amazon EC2".into()),
                    dmi_product_name: Some("m7g.xlarge".into()),
                    ..HypervisorSigns::default()
                },
                Some("kvm"),
            ),
            (
                "graviton bare metal",
                HypervisorSigns {
                    dmi_sys_vendor: Some("Amazon EC2".into()),
                    dmi_product_name: Some("m7g.metal".into()),
                    ..HypervisorSigns::default()
                },
                None,
            ),
            (
                "a hypervisor with an unknown signature",
                HypervisorSigns {
                    cpuid_vendor: Some(sig(b"NewVisorNewV")),
                    ..kvm.clone()
                },
                Some("unknown"),
            ),
            (
                "only the kernel's flag",
                HypervisorSigns {
                    cpuinfo_hypervisor_flag: Some(true),
                    ..HypervisorSigns::default()
                },
                Some("unknown"),
            ),
        ];
        for (what, signs, want) in cases {
            assert_eq!(detect_hypervisor(&signs).as_deref(), want, "{what}");
        }
    }

    #[test]
    fn signatures_and_dmi_names() {
        assert_eq!(hypervisor_of_signature(&sig(b"KVMKVMKVM")), Some("kvm"));
        assert_eq!(hypervisor_of_signature(b"TCGTCGTCGTCG"), Some("qemu"));
        assert_eq!(hypervisor_of_signature(b"KVMKVMKVMKVM"), None);
        assert_eq!(hypervisor_of_dmi("QEMU", "Standard PC (Q35)"), Some("qemu"));
        assert_eq!(
            hypervisor_of_dmi("Microsoft Corporation", "Virtual Machine"),
            Some("hyperv")
        );
        assert_eq!(hypervisor_of_dmi("Microsoft Corporation", "Surface"), None);
        assert_eq!(
            hypervisor_of_dmi("innotek GmbH", "VirtualBox"),
            Some("virtualbox")
        );
        assert_eq!(hypervisor_of_dmi("Supermicro", "X11"), None);
    }

    #[test]
    fn the_host_report_shape() {
        let host = Host {
            cpus: 56,
            hypervisor: Some("kvm".into()),
            numa_nodes: Some(2),
            kernel: "6.18.0".into(),
        };
        let steal = Some(Steal {
            seconds: 1.5,
            share: Some(0.01),
        });
        assert_eq!(
            serde_json::to_value(HostReport::new(&host, steal)).unwrap(),
            serde_json::json!({"cpus": 56, "hypervisor": "kvm", "numa_nodes": 2,
                               "steal_seconds": 1.5, "kernel": "6.18.0"})
        );
        let metal = Host {
            hypervisor: None,
            ..host
        };
        let v = serde_json::to_value(HostReport::new(&metal, None)).unwrap();
        assert_eq!(v["hypervisor"], serde_json::Value::Null);
        assert_eq!(v["steal_seconds"], serde_json::Value::Null);
    }
}
