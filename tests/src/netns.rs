//! Network namespaces for the network tests: throw-away namespaces (removed, with every link
//! in them, on drop), an underlay veth between two "nodes" with a VXLAN overlay on top, an
//! optional "pod" behind the first node, and the kernel's own counters read from inside each
//! namespace as ground truth.
//!
//! Nothing here is skipped: a missing tool or kernel feature panics with what to install.

use std::{
    collections::HashMap,
    ffi::OsStr,
    os::unix::fs::MetadataExt as _,
    process::{Child, Command, Output, Stdio},
    sync::atomic::{AtomicUsize, Ordering},
};

/// Runs a command to completion, panicking with its output when it fails.
#[track_caller]
pub fn run(cmd: &mut Command) -> Output {
    let shown = format!("{cmd:?}");
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {shown}: {e}"));
    assert!(
        out.status.success(),
        "{shown} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// See [`Netns::resident`].
pub struct Resident(Child);

impl Drop for Resident {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What a ping may do at a hop too small for it (`ping -M`).
#[derive(Clone, Copy, Debug)]
pub enum PingDf {
    /// `-M do`: DF set, never fragmented; too big is an error (and a "packet too big").
    Set,
    /// `-M dont`: DF clear; a hop too small fragments it.
    Clear,
}

/// The arguments of `ping -q` to node B's overlay address: `count` echo requests of `payload`
/// bytes (IP packets 28 bytes larger), `interval` seconds apart, with `extra` options.
pub fn ping_node_b(
    df: PingDf,
    payload: u32,
    count: u32,
    interval: &str,
    extra: &[&str],
) -> Vec<String> {
    let df = match df {
        PingDf::Set => "do",
        PingDf::Clear => "dont",
    };
    let (payload, count) = (payload.to_string(), count.to_string());
    [
        "ping", "-q", "-M", df, "-s", &payload, "-c", &count, "-i", interval,
    ]
    .into_iter()
    .chain(extra.iter().copied())
    .chain([NODE_B_OVERLAY_IP])
    .map(str::to_owned)
    .collect()
}

/// Panics, saying how to install them, unless the tools the network tests need are here.
pub fn require_tools() {
    for (tool, package) in [
        ("ip", "iproute2"),
        ("ping", "iputils-ping"),
        ("iperf3", "iperf3"),
    ] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|o| o.status.success());
        assert!(
            found,
            "`{tool}` is missing: install it with `apt-get install {package}` (or run \
             `cargo xtask setup`, which installs every test dependency)"
        );
    }
}

/// A network namespace named `sw-<tag>-<pid>-<n>`, deleted on drop.
pub struct Netns {
    name: String,
}

impl Netns {
    pub fn new(tag: &str) -> Self {
        static SEQ: AtomicUsize = AtomicUsize::new(0);
        static SWEPT: std::sync::Once = std::sync::Once::new();
        SWEPT.call_once(remove_stale);
        let name = format!(
            "sw-{tag}-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        run(Command::new("ip").args(["netns", "add", &name]));
        let ns = Self { name };
        // Only the traffic the test makes: no IPv6 neighbour discovery or MLD.
        ns.exec(&[
            "sysctl",
            "-qw",
            "net.ipv6.conf.all.disable_ipv6=1",
            "net.ipv6.conf.default.disable_ipv6=1",
        ]);
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The namespace's inode, as the agent reports it.
    pub fn inode(&self) -> u64 {
        std::fs::metadata(format!("/run/netns/{}", self.name))
            .unwrap_or_else(|e| panic!("stat /run/netns/{}: {e}", self.name))
            .ino()
    }

    /// `ip netns exec <name> <args>`, which must succeed.
    #[track_caller]
    pub fn exec(&self, args: &[&str]) -> Output {
        run(Command::new("ip")
            .args(["netns", "exec", &self.name])
            .args(args))
    }

    /// `ip -n <name> <args>`, which must succeed.
    #[track_caller]
    pub fn ip(&self, args: &[&str]) {
        run(Command::new("ip").args(["-n", &self.name]).args(args));
    }

    /// A process of `cgroup`'s in the namespace: the agent learns whose a namespace is from the
    /// processes in it. Killed when dropped (drop it before removing the cgroup).
    pub fn resident(&self, cgroup: &crate::TestCgroup) -> Resident {
        Resident(crate::run_in_cgroup(
            &mut self.command(&["sleep", "120"]),
            cgroup,
        ))
    }

    /// A command that runs `args` in the namespace (for [`crate::run_in_cgroup`]).
    pub fn command(&self, args: &[impl AsRef<OsStr>]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name]).args(args);
        c
    }

    /// Waits (up to 10 s) until no TCP connection of the namespace can still send: every one
    /// closed or in TIME-WAIT. A closing connection may still retransmit its FIN or last data
    /// after its process exited, so counters read before that may miss a segment that a trace
    /// running longer sees.
    #[track_caller]
    pub fn tcp_quiet(&self) {
        for _ in 0..200 {
            let out = self.exec(&[
                "ss",
                "-Htan",
                "exclude",
                "time-wait",
                "exclude",
                "listening",
            ]);
            if out.stdout.iter().all(u8::is_ascii_whitespace) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let out = self.exec(&["ss", "-tan"]);
        panic!(
            "TCP connections in {} did not close in 10 s:\n{}",
            self.name,
            String::from_utf8_lossy(&out.stdout)
        );
    }

    /// The kernel's IP, ICMP and TCP counters of the namespace and their extensions
    /// (`/proc/net/snmp`, `/proc/net/netstat`: `TcpExt`), as `Proto.Name` → value.
    pub fn snmp(&self) -> HashMap<String, u64> {
        let out = self.exec(&["cat", "/proc/net/snmp", "/proc/net/netstat"]);
        parse_snmp(&String::from_utf8_lossy(&out.stdout))
    }

    /// An interface's counter (`/sys/class/net/<dev>/statistics/<name>`), as the driver
    /// counts it; `ip netns exec` mounts the namespace's own /sys.
    pub fn if_stat(&self, dev: &str, name: &str) -> u64 {
        let out = self.exec(&["cat", &format!("/sys/class/net/{dev}/statistics/{name}")]);
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("{dev} {name} in {}: {e}", self.name))
    }
}

/// Deletes the namespaces of test processes that died without dropping them (a run killed
/// half-way): `sw-<tag>-<pid>-<n>` whose pid is gone.
fn remove_stale() {
    let Ok(dir) = std::fs::read_dir("/run/netns") else {
        return;
    };
    for name in dir
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
    {
        if crate::left_by_dead_test(&name, "sw-") {
            eprintln!("removing network namespace {name}, left by a test run that died");
            let _ = Command::new("ip")
                .args(["netns", "del", &name])
                .stdin(Stdio::null())
                .output();
        }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Deleting the namespace destroys its links (and a veth's peer with it).
        let out = Command::new("ip")
            .args(["netns", "del", &self.name])
            .stdin(Stdio::null())
            .output();
        match out {
            Ok(o) if o.status.success() => {}
            other => {
                let msg = format!("cannot delete network namespace {}: {other:?}", self.name);
                if std::thread::panicking() {
                    eprintln!("{msg}");
                } else {
                    panic!("{msg}");
                }
            }
        }
    }
}

/// `/proc/net/snmp` as `Proto.Name` → value (pairs of header and value lines). Written apart
/// from the agent's parser: these are the ground truth it is checked against.
pub fn parse_snmp(text: &str) -> HashMap<String, u64> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = HashMap::new();
    for pair in lines.chunks(2) {
        let [names, values] = pair else { continue };
        let names: Vec<&str> = names.split_whitespace().collect();
        let values: Vec<&str> = values.split_whitespace().collect();
        let Some(proto) = names.first().and_then(|p| p.strip_suffix(':')) else {
            continue;
        };
        for (n, v) in names.iter().zip(values.iter()).skip(1) {
            if let Ok(v) = v.parse() {
                out.insert(format!("{proto}.{n}"), v);
            }
        }
    }
    out
}

/// The change of counter `key` between two readings (0 when absent: IcmpMsg lists only the
/// types seen so far).
pub fn delta(before: &HashMap<String, u64>, after: &HashMap<String, u64>, key: &str) -> u64 {
    after.get(key).copied().unwrap_or(0) - before.get(key).copied().unwrap_or(0)
}

/// How the overlay's outer packets treat the DF bit (`ip link add … type vxlan df …`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OuterDf {
    /// Outer packets may be fragmented (the default).
    Unset,
    /// Outer packets carry DF: too-big ones are dropped with an ICMP "fragmentation needed".
    Set,
}

/// Two "nodes" joined by a veth underlay (10.200.0.1 – .2), a VXLAN overlay on top
/// (10.201.0.1 – .2, VNI 42, no lower device so that its MTU is not capped), and optionally a
/// "pod" behind node A (10.202.0.2, routed through A's overlay). Every namespace and link goes
/// away on drop.
pub struct Overlay {
    pub a: Netns,
    pub b: Netns,
    pub pod: Option<Netns>,
    pub underlay_mtu: u32,
    pub overlay_mtu: u32,
}

pub const NODE_A_OVERLAY_IP: &str = "10.201.0.1";
pub const NODE_B_OVERLAY_IP: &str = "10.201.0.2";
pub const POD_IP: &str = "10.202.0.2";
/// Interface names in the namespaces.
pub const UNDERLAY_A: &str = "ul0";
pub const UNDERLAY_B: &str = "ul1";
pub const OVERLAY_DEV: &str = "ov0";
pub const POD_DEV: &str = "eth0";
pub const POD_PEER_DEV: &str = "pod0";

/// A veth between two namespaces: `a_dev` in `a`, `b_dev` in `b`, both at `mtu`.
pub fn veth_between(a: &Netns, a_dev: &str, b: &Netns, b_dev: &str, mtu: u32) {
    let mtu = mtu.to_string();
    run(Command::new("ip").args([
        "link",
        "add",
        a_dev,
        "netns",
        a.name(),
        "mtu",
        &mtu,
        "type",
        "veth",
        "peer",
        "name",
        b_dev,
        "netns",
        b.name(),
        "mtu",
        &mtu,
    ]));
}

/// The underlay veth: [`UNDERLAY_A`] in `a`, [`UNDERLAY_B`] in `b`, both ends at index 2 in
/// namespaces made by [`Netns::new`] (lo is 1).
pub fn underlay_between(a: &Netns, b: &Netns, mtu: u32) {
    veth_between(a, UNDERLAY_A, b, UNDERLAY_B, mtu);
}

impl Overlay {
    pub fn new(underlay_mtu: u32, overlay_mtu: u32, df: OuterDf, pod_mtu: Option<u32>) -> Self {
        let a = Netns::new("a");
        let b = Netns::new("b");
        let omtu = overlay_mtu.to_string();
        underlay_between(&a, &b, underlay_mtu);
        let df = match df {
            OuterDf::Unset => "unset",
            OuterDf::Set => "set",
        };
        for (ns, dev, local, remote, overlay_ip) in [
            (
                &a,
                UNDERLAY_A,
                "10.200.0.1",
                "10.200.0.2",
                NODE_A_OVERLAY_IP,
            ),
            (
                &b,
                UNDERLAY_B,
                "10.200.0.2",
                "10.200.0.1",
                NODE_B_OVERLAY_IP,
            ),
        ] {
            ns.ip(&["addr", "add", &format!("{local}/24"), "dev", dev]);
            ns.ip(&["link", "set", dev, "up"]);
            let created = Command::new("ip")
                .args(["-n", ns.name(), "link", "add", OVERLAY_DEV, "type", "vxlan"])
                .args([
                    "id", "42", "local", local, "remote", remote, "dstport", "4789",
                ])
                .args(["df", df])
                .output()
                .expect("ip link add … type vxlan");
            assert!(
                created.status.success(),
                "cannot create a VXLAN device: {} (the kernel needs CONFIG_VXLAN, and iproute2 \
                 `df` support, 5.0+)",
                String::from_utf8_lossy(&created.stderr)
            );
            ns.ip(&["link", "set", OVERLAY_DEV, "mtu", &omtu, "up"]);
            ns.ip(&[
                "addr",
                "add",
                &format!("{overlay_ip}/24"),
                "dev",
                OVERLAY_DEV,
            ]);
        }
        let pod = pod_mtu.map(|pmtu| {
            let pod = Netns::new("pod");
            veth_between(&pod, POD_DEV, &a, POD_PEER_DEV, pmtu);
            pod.ip(&["addr", "add", &format!("{POD_IP}/24"), "dev", POD_DEV]);
            pod.ip(&["link", "set", POD_DEV, "up"]);
            pod.ip(&["route", "add", "default", "via", "10.202.0.1"]);
            a.ip(&["addr", "add", "10.202.0.1/24", "dev", POD_PEER_DEV]);
            a.ip(&["link", "set", POD_PEER_DEV, "up"]);
            a.exec(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
            b.ip(&["route", "add", "10.202.0.0/24", "via", NODE_A_OVERLAY_IP]);
            pod
        });
        Self {
            a,
            b,
            pod,
            underlay_mtu,
            overlay_mtu,
        }
    }

    pub fn pod(&self) -> &Netns {
        self.pod.as_ref().expect("an overlay with a pod")
    }

    /// The namespaces' inodes.
    pub fn inodes(&self) -> Vec<u64> {
        let mut v = vec![self.a.inode(), self.b.inode()];
        v.extend(self.pod.as_ref().map(Netns::inode));
        v
    }
}

/// `N packets transmitted, M received` of ping's summary.
pub fn ping_counts(stdout: &str) -> (u64, u64) {
    let line = stdout
        .lines()
        .find(|l| l.contains("packets transmitted"))
        .unwrap_or_else(|| panic!("no ping summary in {stdout:?}"));
    let nums: Vec<u64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|s| s.parse().ok())
        .collect();
    (nums[0], nums[1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snmp_pairs_and_ping_summaries() {
        let text = "Ip: Forwarding FragCreates\nIp: 1 40\nIcmpMsg: InType3 OutType3\n\
                    IcmpMsg: 2 3\nTcp: MaxConn\nTcp: -1\n";
        let m = parse_snmp(text);
        assert_eq!(m["Ip.FragCreates"], 40);
        assert_eq!(m["IcmpMsg.OutType3"], 3);
        assert!(!m.contains_key("Tcp.MaxConn"));
        let before = HashMap::new();
        assert_eq!(delta(&before, &m, "Ip.FragCreates"), 40);
        assert_eq!(delta(&before, &m, "IcmpMsg.OutType0"), 0);
        assert_eq!(
            ping_counts(
                "--- x ping statistics ---\n200 packets transmitted, 199 received, 0% packet loss"
            ),
            (200, 199)
        );
        assert_eq!(
            ping_counts("30 packets transmitted, 0 received, +3 errors, 100% packet loss"),
            (30, 0)
        );
    }
}
