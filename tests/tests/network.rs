//! The network family against the real kernel: namespaces made by the test (two "nodes"
//! joined by a veth underlay, a VXLAN overlay on top, a "pod" behind the first node), MTUs
//! set right or deliberately wrong, real traffic from a process in a test cgroup.
//!
//! Ground truth, independent of the agent: the kernel's own counters read by the test from
//! inside each namespace (`/proc/net/snmp`: FragCreates, FragFails, ReasmReqds, ICMP type 3;
//! TCP OutSegs/RetransSegs/InSegs), the drivers' interface counters
//! (`/sys/class/net/<dev>/statistics`), and what ping says it sent and received.
//!
//! The wrong setup is the classic one: an overlay whose MTU equals its underlay's, so that every
//! full-size inner packet becomes an outer packet 50 bytes too big. With the outer DF bit unset
//! the outer packets are fragmented; with it set (or for traffic forwarded from a pod) they are
//! dropped, with an ICMP "fragmentation needed" that goes nowhere useful: the MTU black hole.

use std::collections::HashMap;

use stormwatch_tests::{
    Agent, TestCgroup, assert_within,
    daemon::{Daemon, assert_promtool_clean, sample_with, wait_for, write_file},
    netns::{
        NODE_B_OVERLAY_IP, Netns, OVERLAY_DEV, OuterDf, Overlay, POD_DEV, PingDf, UNDERLAY_A,
        delta, ping_counts, ping_node_b, require_tools, underlay_between,
    },
    report::{self, Diagnosis, Finding, Interface, NetworkSummary, Trace},
    require_bpf, run_in_cgroup,
};

/// The agent runs this long: long enough for the traffic below, which starts once it attached.
/// Under emulation (the kernel matrix's guests) 12 s: there a window of 8 s ended 0.41 s
/// before 300 pings 5 ms apart did (6.12 guest, CI run of 2026-12-02).
fn trace_seconds() -> &'static str {
    if stormwatch_tests::corpus::timings_are_real() {
        "8"
    } else {
        "12"
    }
}

/// The trace and the diagnosis, watching the same traffic.
struct Watch {
    trace: Agent,
    diagnose: Agent,
}

impl Watch {
    fn start() -> Self {
        let seconds = trace_seconds();
        let trace = Agent::trace(&["--json", "--duration", seconds, "--probes", "net"]);
        let diagnose = Agent::start(&["diagnose", "--json", "--duration", seconds]);
        Self { trace, diagnose }
    }

    /// (trace report, diagnose report).
    fn finish(mut self, what: &str) -> (Trace, Diagnosis) {
        self.trace.assert_still_tracing(what);
        assert!(
            self.diagnose.is_running(),
            "the diagnosis ended before {what} did"
        );
        let report = self.trace.finish().trace;
        let out = self.diagnose.finish_output();
        // 3: findings; 0: none.
        let code = out.status.code();
        assert!(
            matches!(code, Some(0 | 3)),
            "stormwatch diagnose failed ({}):\n{}",
            out.status,
            out.stderr.join("\n")
        );
        let diag: Diagnosis = report::parse("stormwatch diagnose --json", &out.stdout_text());
        (report, diag)
    }
}

/// Runs `args` in namespace `ns` from a process in `cgroup`, to completion: (stdout, success).
fn run_in(
    ns: &stormwatch_tests::netns::Netns,
    args: &[impl AsRef<std::ffi::OsStr>],
    cgroup: &TestCgroup,
) -> String {
    let child = run_in_cgroup(&mut ns.command(args), cgroup);
    let out = child.wait_with_output().expect("waiting for the traffic");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The sum of `figure` over a namespace's interfaces.
fn sum_over(report: &Trace, netns: u64, figure: impl Fn(&Interface) -> u64) -> f64 {
    report
        .interfaces_of(netns)
        .into_iter()
        .map(|i| figure(i) as f64)
        .sum()
}

/// All drops at a namespace's interfaces, every reason.
fn drops_in(report: &Trace, netns: u64) -> f64 {
    sum_over(report, netns, Interface::drops_total)
}

/// The `mtu_mismatch` findings about the given namespaces.
fn mtu_findings(diag: &Diagnosis, inodes: &[u64]) -> Vec<Finding> {
    diag.findings
        .iter()
        .filter(|f| f.kind == "mtu_mismatch")
        .filter(|f| {
            let ns = f.evidence("netns").map(|n| n as u64);
            ns.is_some_and(|n| inodes.contains(&n))
        })
        .cloned()
        .collect()
}

fn finding_for(findings: &[Finding], netns: u64) -> &Finding {
    findings
        .iter()
        .find(|f| f.evidence("netns") == Some(netns as f64))
        .unwrap_or_else(|| panic!("no mtu_mismatch finding for netns {netns}: {findings:#?}"))
}

#[test]
fn overlay_as_large_as_its_underlay_fragments_and_is_found() {
    require_bpf();
    require_tools();
    let net = Overlay::new(1500, 1500, OuterDf::Unset, None);
    // Two more namespaces joined as nodes A and B are, both ends at index 2 as theirs are: the
    // indexes alone cannot tell which is the underlay's peer, the namespace ids must.
    let (decoy_a, decoy_b) = (Netns::new("decoy"), Netns::new("decoy"));
    underlay_between(&decoy_a, &decoy_b, 1500);
    let cg = TestCgroup::new("net-frag");
    let (a_ns, b_ns) = (net.a.inode(), net.b.inode());
    // A process of the container in node A's namespace: what the namespace receives is the
    // container's (the agent learns whose a namespace is from the processes in it).
    let keep = net.a.resident(&cg);
    let watch = Watch::start();
    let (a0, b0) = (net.a.snmp(), net.b.snmp());
    // 1472 bytes of ICMP payload: 1500-byte IP packets, the overlay's MTU, 1550 once
    // encapsulated. Without DF, something has to fragment them.
    let stdout = run_in(
        &net.a,
        &ping_node_b(PingDf::Clear, 1472, 200, "0.005", &[]),
        &cg,
    );
    let (sent, received) = ping_counts(&stdout);
    let (a1, b1) = (net.a.snmp(), net.b.snmp());
    let (report, diag) = watch.finish("the ping");
    drop(keep);

    let frag_a = delta(&a0, &a1, "Ip.FragCreates") as f64;
    let reasm_a = delta(&a0, &a1, "Ip.ReasmReqds") as f64;
    let frag_b = delta(&b0, &b1, "Ip.FragCreates") as f64;
    eprintln!(
        "ping {sent} sent / {received} received; node A FragCreates {frag_a} ReasmReqds \
         {reasm_a}; node B FragCreates {frag_b}"
    );
    assert_eq!(sent, 200, "{stdout}");
    assert!(received >= 190, "the fragments get through: {stdout}");
    assert!(
        frag_a >= sent as f64,
        "every 1500-byte packet is fragmented at node A: {frag_a} fragments"
    );

    // The interface probes see each fragment leave and arrive.
    let tx_frags = sum_over(&report, a_ns, |i| i.tx().fragments);
    let rx_frags = sum_over(&report, a_ns, |i| i.rx().fragments);
    eprintln!("agent: node A fragments sent {tx_frags}, received {rx_frags}");
    assert_within(
        "fragments sent by node A's interfaces",
        tx_frags,
        frag_a,
        0.02,
    );
    assert_within(
        "fragments received by node A's interfaces",
        rx_frags,
        reasm_a,
        0.02,
    );
    // The namespace's own counters, as the agent read them over its window.
    let counters = snmp_of(&report, a_ns);
    assert_within(
        "node A's FragCreates as the agent reports it",
        counters.fragments_created.expect("fragments_created") as f64,
        frag_a,
        0.02,
    );

    // The inventory: the overlay, its overhead and its underlay.
    let ov = report.interface(a_ns, OVERLAY_DEV);
    assert_eq!(ov.kind, "vxlan", "{ov:#?}");
    assert_eq!(ov.mtu, 1500);
    assert_eq!(ov.encapsulation_overhead, Some(50));
    let underlay = ov.underlay.as_ref();
    assert_eq!(
        underlay.map(|u| u.name.as_str()),
        Some(UNDERLAY_A),
        "{ov:#?}"
    );
    assert_eq!(underlay.map(|u| u.path_mtu), Some(1500));
    assert!(ov.tx().packets >= sent, "{ov:#?}");
    let ul = report.interface(a_ns, UNDERLAY_A);
    assert_eq!(ul.kind, "veth");
    assert_eq!(ul.encapsulation_overhead, Some(0));
    assert_eq!(
        ul.peer.as_ref().map(|p| p.netns),
        Some(b_ns),
        "the veth's peer is node B's: {ul:#?}"
    );
    let decoy = report.interface(decoy_a.inode(), UNDERLAY_A);
    assert_eq!(
        (decoy.ifindex, decoy.peer.as_ref().map(|p| p.ifindex)),
        (ul.ifindex, ul.peer.as_ref().map(|p| p.ifindex)),
        "the decoy pair is numbered as the underlay is: {decoy:#?}"
    );
    assert_eq!(
        decoy.peer.as_ref().map(|p| p.netns),
        Some(decoy_b.inode()),
        "the decoy's peer is its own: {decoy:#?}"
    );

    // The container: what ping sent and received, whole packets (before fragmentation).
    let c = container_network(&report, &cg);
    eprintln!("agent: container network {c:?}");
    assert_within(
        "packets the container sent",
        c.packets_sent as f64,
        sent as f64,
        0.02,
    );
    assert_within(
        "packets the container received",
        c.packets_received as f64,
        received as f64,
        0.02,
    );
    assert_within(
        "bytes the container sent",
        c.bytes_sent as f64,
        1500.0 * sent as f64,
        0.02,
    );

    // The finding, for both nodes, with the evidence.
    let findings = mtu_findings(&diag, &[a_ns, b_ns]);
    eprintln!("findings: {findings:#?}");
    let f = finding_for(&findings, a_ns);
    assert_eq!(f.severity, "warning", "fragments, nothing lost: {f:#?}");
    assert_eq!(f.figure("overlay_mtu"), 1500.0);
    assert_eq!(f.figure("underlay_mtu"), 1500.0);
    assert_eq!(f.figure("encapsulation_overhead"), 50.0);
    assert_eq!(f.figure("allowed_mtu"), 1450.0);
    assert_within(
        "fragments in the finding",
        f.figure("fragments_created"),
        frag_a,
        0.02,
    );
    let fix = f.recommendations.first().expect("a recommendation");
    assert!(fix.contains("mtu 1450"), "{fix}");
    assert!(fix.contains(OVERLAY_DEV), "{fix}");
    finding_for(&findings, b_ns);
    cg.remove();
}

#[test]
fn pod_traffic_into_a_too_large_overlay_is_blackholed_and_found() {
    require_bpf();
    require_tools();
    // The outer DF bit set: too-big outer packets cannot be fragmented.
    let net = Overlay::new(1500, 1500, OuterDf::Set, Some(1500));
    let (a_ns, pod_ns) = (net.a.inode(), net.pod().inode());
    let cg = TestCgroup::new("net-blackhole");
    // Keeps a process of the container in the pod's namespace: that is how the agent ties
    // the namespace to the container.
    let keep = net.pod().resident(&cg);
    let watch = Watch::start();
    let a0 = net.a.snmp();
    let stdout = run_in(
        net.pod(),
        &ping_node_b(PingDf::Set, 1472, 50, "0.02", &["-W", "1"]),
        &cg,
    );
    let (sent, received) = ping_counts(&stdout);
    let a1 = net.a.snmp();
    let (report, diag) = watch.finish("the ping");
    drop(keep);

    let frag_fails = delta(&a0, &a1, "Ip.FragFails") as f64;
    let unreach_out = delta(&a0, &a1, "IcmpMsg.OutType3") as f64;
    let unreach_in = delta(&a0, &a1, "IcmpMsg.InType3") as f64;
    eprintln!(
        "ping {sent} sent / {received} received; node A FragFails {frag_fails}, ICMP \
         unreachable out {unreach_out} in {unreach_in}"
    );
    assert_eq!((sent, received), (50, 0), "a black hole: {stdout}");
    assert!(frag_fails >= 50.0, "node A cannot fragment: {frag_fails}");

    // Every "fragmentation needed" node A sends (to itself: the outer source) is seen leaving
    // and arriving; here every ICMP unreachable is one.
    let ptb_tx = sum_over(&report, a_ns, |i| i.tx().packet_too_big);
    let ptb_rx = sum_over(&report, a_ns, |i| i.rx().packet_too_big);
    let drops = drops_in(&report, a_ns);
    let ul_drops = report.interface(a_ns, UNDERLAY_A).drops_total() as f64;
    eprintln!(
        "agent: node A PTB sent {ptb_tx} received {ptb_rx}; drops {drops} ({ul_drops} at the underlay)"
    );
    assert_within("ICMP fragmentation-needed sent", ptb_tx, unreach_out, 0.02);
    assert_within(
        "ICMP fragmentation-needed received",
        ptb_rx,
        unreach_in,
        0.02,
    );
    assert_within(
        "packets dropped at the underlay",
        ul_drops,
        frag_fails,
        0.02,
    );
    assert!(drops >= ul_drops);
    let counters = snmp_of(&report, a_ns);
    assert_within(
        "node A's FragFails as the agent reports it",
        counters
            .fragmentation_failures
            .expect("fragmentation_failures") as f64,
        frag_fails,
        0.02,
    );
    let c = container_network(&report, &cg);
    assert_within(
        "packets the pod sent",
        c.packets_sent as f64,
        sent as f64,
        0.02,
    );
    assert_eq!(c.packets_received, 0, "{c:?}");
    // The pod's namespace and its path.
    let eth0 = report.interface(pod_ns, POD_DEV);
    assert_eq!(eth0.peer.as_ref().map(|p| p.netns), Some(a_ns), "{eth0:#?}");
    assert!(
        report
            .namespace(pod_ns)
            .cgroups
            .iter()
            .any(|p| p == cg.rel_path()),
        "the pod's namespace belongs to the container"
    );

    // Two findings: the overlay (node A) and the pod, both critical (packets are lost).
    let findings = mtu_findings(&diag, &[a_ns, pod_ns]);
    eprintln!("findings: {findings:#?}");
    let overlay = finding_for(&findings, a_ns);
    assert_eq!(overlay.severity, "critical", "{overlay:#?}");
    assert_within(
        "FragFails in the overlay finding",
        overlay.figure("fragmentation_failures"),
        frag_fails,
        0.02,
    );
    assert_within(
        "PTB sent in the overlay finding",
        overlay.figure("packet_too_big_sent"),
        unreach_out,
        0.02,
    );
    let pod = finding_for(&findings, pod_ns);
    assert_eq!(pod.severity, "critical", "{pod:#?}");
    assert_eq!(
        pod.cgroup,
        cg.rel_path(),
        "the pod's finding names its container"
    );
    assert_eq!(pod.figure("container_mtu"), 1500.0);
    assert_eq!(pod.figure("allowed_mtu"), 1450.0);
    assert_eq!(pod.figure("encapsulation_overhead"), 50.0);
    cg.remove();
}

/// `count` pings from the pod to node B of 1450-byte packets (1422 bytes of payload): exactly
/// the pod's and the overlay's MTU, DF set. ping's stdout.
fn full_size_pings(net: &Overlay, cg: &TestCgroup, count: u32) -> String {
    run_in(
        net.pod(),
        &ping_node_b(PingDf::Set, 1422, count, "0.005", &[]),
        cg,
    )
}

/// The `network` figures of the test's container in a report.
#[track_caller]
fn container_network<'a>(report: &'a Trace, cg: &TestCgroup) -> &'a NetworkSummary {
    let c = report
        .container_by_path(cg.rel_path())
        .unwrap_or_else(|| panic!("{} not in the report", cg.rel_path()));
    c.network
        .as_ref()
        .unwrap_or_else(|| panic!("no network figures: {c:#?}"))
}

/// A namespace's kernel counters as the agent read them over its window.
#[track_caller]
fn snmp_of(report: &Trace, netns: u64) -> &stormwatch_tests::report::Snmp {
    let ns = report.namespace(netns);
    ns.counters
        .as_ref()
        .unwrap_or_else(|| panic!("no counters of netns {netns}: {ns:#?}"))
}

/// The pod's eth0 as the agent saw it against the driver's counters over the same time
/// (`driver`: a counter's change), with `sent` full-size pings at the MTU.
fn assert_eth0_matches_its_driver(eth0: &Interface, driver: impl Fn(&str) -> f64, sent: u64) {
    assert_within(
        "eth0 packets sent",
        eth0.tx().packets as f64,
        driver("tx_packets"),
        0.02,
    );
    assert_within(
        "eth0 packets received",
        eth0.rx().packets as f64,
        driver("rx_packets"),
        0.02,
    );
    assert_within(
        "eth0 packets at the MTU",
        eth0.tx().lengths.at_mtu.expect("at_mtu") as f64,
        sent as f64,
        0.02,
    );
}

/// Counters of an interface, read from its driver.
fn if_stats(ns: &stormwatch_tests::netns::Netns, dev: &str) -> HashMap<&'static str, u64> {
    ["tx_packets", "rx_packets", "tx_bytes", "rx_bytes"]
        .into_iter()
        .map(|k| (k, ns.if_stat(dev, k)))
        .collect()
}

#[test]
fn right_mtus_give_no_finding_and_counts_match_the_interfaces() {
    require_bpf();
    require_tools();
    // Overlay = underlay - 50, pod = overlay.
    let net = Overlay::new(1500, 1450, OuterDf::Set, Some(1450));
    let inodes = net.inodes();
    let (a_ns, pod_ns) = (net.a.inode(), net.pod().inode());
    let cg = TestCgroup::new("net-right");
    let keep = net.pod().resident(&cg);
    let watch = Watch::start();
    let (a0, s0) = (net.a.snmp(), if_stats(net.pod(), POD_DEV));
    // They fit.
    let stdout = full_size_pings(&net, &cg, 300);
    let (sent, received) = ping_counts(&stdout);
    let (a1, s1) = (net.a.snmp(), if_stats(net.pod(), POD_DEV));
    let (report, diag) = watch.finish("the ping");
    drop(keep);
    let d = |k: &str| (s1[k] - s0[k]) as f64;
    eprintln!(
        "ping {sent} sent / {received} received; pod eth0 tx {} packets {} bytes, rx {} \
         packets {} bytes",
        d("tx_packets"),
        d("tx_bytes"),
        d("rx_packets"),
        d("rx_bytes")
    );
    assert_eq!((sent, received), (300, 300), "{stdout}");
    assert_eq!(delta(&a0, &a1, "Ip.FragCreates"), 0);
    assert_eq!(delta(&a0, &a1, "Ip.FragFails"), 0);

    // No finding about these namespaces.
    let findings = mtu_findings(&diag, &inodes);
    assert!(findings.is_empty(), "right MTUs, yet: {findings:#?}");

    // The container's traffic is what its namespace's only interface carried (the driver's
    // counters also count a couple of ARP packets, and link-layer headers in bytes).
    let c = container_network(&report, &cg);
    eprintln!("agent: container network {c:?}");
    assert_within("packets sent", c.packets_sent as f64, d("tx_packets"), 0.02);
    assert_within(
        "packets received",
        c.packets_received as f64,
        d("rx_packets"),
        0.02,
    );
    const ETH_HLEN: f64 = 14.0;
    assert_within(
        "bytes sent (+ Ethernet headers)",
        c.bytes_sent as f64 + ETH_HLEN * c.packets_sent as f64,
        d("tx_bytes"),
        0.02,
    );
    assert_within(
        "bytes received (+ Ethernet headers)",
        c.bytes_received as f64 + ETH_HLEN * c.packets_received as f64,
        d("rx_bytes"),
        0.02,
    );
    // The interface probes against the driver's counters, and the MTU bucket.
    let eth0 = report.interface(pod_ns, POD_DEV);
    eprintln!("agent: pod eth0 {eth0:?}");
    assert_eth0_matches_its_driver(eth0, d, sent);
    assert_eq!(eth0.tx().lengths.over_mtu, Some(0));
    assert_eq!(eth0.tx().fragments, 0);
    // Forwarded by node A into the overlay: at its MTU too, and nothing fragmented.
    let ov = report.interface(a_ns, OVERLAY_DEV);
    assert_within(
        "overlay packets at the MTU",
        ov.tx().lengths.at_mtu.expect("at_mtu") as f64,
        sent as f64,
        0.02,
    );
    assert_eq!(sum_over(&report, a_ns, |i| i.tx().fragments), 0.0);
    cg.remove();
}

#[test]
fn tcp_super_packets_count_as_their_segments() {
    require_bpf();
    require_tools();
    let net = Overlay::new(1500, 1450, OuterDf::Set, Some(1450));
    let (a_ns, pod_ns) = (net.a.inode(), net.pod().inode());
    let cg = TestCgroup::new("net-tcp");
    let mut server = net
        .b
        .command(&["iperf3", "-s", "-1", "-B", NODE_B_OVERLAY_IP])
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("iperf3 -s");
    // Until the server listens.
    for _ in 0..100 {
        let out = net.b.exec(&["ss", "-ltn"]);
        if String::from_utf8_lossy(&out.stdout).contains(":5201") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let keep = net.pod().resident(&cg);
    let watch = Watch::start();
    let p0 = net.pod().snmp();
    let stdout = run_in(
        net.pod(),
        &["iperf3", "-c", NODE_B_OVERLAY_IP, "-t", "2"],
        &cg,
    );
    // The trace ends after the second read: nothing may be sent between the two.
    net.pod().tcp_quiet();
    let p1 = net.pod().snmp();
    let (report, _diag) = watch.finish("iperf3");
    let _ = server.kill();
    let _ = server.wait();
    drop(keep);
    assert!(
        stdout.contains("receiver"),
        "iperf3 did not finish: {stdout}"
    );

    // TCP counts every segment it sends (OutSegs, without retransmissions, which
    // RetransSegs counts) and every skb it receives (InSegs: here ACKs, never coalesced).
    let out_segs = delta(&p0, &p1, "Tcp.OutSegs") as f64;
    let retrans = delta(&p0, &p1, "Tcp.RetransSegs") as f64;
    let in_segs = delta(&p0, &p1, "Tcp.InSegs") as f64;
    let c = container_network(&report, &cg);
    eprintln!(
        "pod TCP: OutSegs {out_segs} RetransSegs {retrans} TCPRetransFail {} InSegs {in_segs}; \
         agent: {c:?}",
        delta(&p0, &p1, "TcpExt.TCPRetransFail")
    );
    assert!(out_segs > 10_000.0, "iperf3 sent little: {out_segs}");
    assert!(
        c.gso_packets_sent > 0,
        "TCP over veth sends GSO super-packets: {c:?}"
    );
    assert_within(
        "segments the container sent",
        c.packets_sent as f64,
        out_segs + retrans,
        0.02,
    );
    assert_within(
        "segments the container received",
        c.packets_received as f64,
        in_segs,
        0.02,
    );
    // Retransmissions the device refused count in RetransSegs and in TCPRetransFail both; the
    // agent counts the ones sent. Equal in every run but one: a CI run of 2026-11-30 counted
    // 4,838 of 4,861 (TCPRetransFail was not read then; the cause is open). Never more than
    // the kernel's count, at most 1% fewer; the lost events print with a failure.
    let refused = delta(&p0, &p1, "TcpExt.TCPRetransFail") as f64;
    let sent_retrans = retrans - refused;
    let agent_retrans = c.tcp_retransmits.expect("tcp_retransmits") as f64;
    assert!(
        agent_retrans <= sent_retrans && agent_retrans >= 0.99 * sent_retrans,
        "retransmitted segments: agent {agent_retrans}, the kernel's RetransSegs ({retrans}) \
         less TCPRetransFail ({refused}); lost events {:?}",
        report.lost_events
    );
    if agent_retrans != sent_retrans {
        eprintln!(
            "retransmits: agent {agent_retrans} of {sent_retrans} (lost events {:?})",
            report.lost_events
        );
    }
    // Super-packets are counted apart at the interfaces, never as over the MTU.
    let eth0 = report.interface(pod_ns, POD_DEV);
    assert!(eth0.tx().gso_packets > 0, "{eth0:#?}");
    assert!(eth0.tx().gso_segments > eth0.tx().gso_packets);
    assert_eq!(eth0.tx().lengths.over_mtu, Some(0), "{eth0:#?}");
    let ov = report.interface(a_ns, OVERLAY_DEV);
    assert_eq!(ov.tx().lengths.over_mtu, Some(0), "{ov:#?}");
    assert_eq!(sum_over(&report, a_ns, |i| i.tx().fragments), 0.0);
    cg.remove();
}

#[test]
fn classic_tracepoint_fallback_counts_the_same() {
    require_bpf();
    require_tools();
    let net = Overlay::new(1500, 1450, OuterDf::Set, Some(1450));
    let pod_ns = net.pod().inode();
    let cg = TestCgroup::new("net-classic");
    let mut trace = Agent::trace(&[
        "--json",
        "--duration",
        "5",
        "--probes",
        "net",
        "--force-tracepoints",
    ]);
    let s0 = if_stats(net.pod(), POD_DEV);
    let stdout = full_size_pings(&net, &cg, 200);
    let (sent, _) = ping_counts(&stdout);
    let s1 = if_stats(net.pod(), POD_DEV);
    trace.assert_still_tracing("the ping");
    let report = trace.finish().trace;
    let kinds: Vec<(&str, &str)> = report
        .probes
        .iter()
        .map(|p| {
            (
                p.tracepoint.as_str(),
                p.kind.as_deref().unwrap_or("not attached"),
            )
        })
        .collect();
    assert!(
        kinds.contains(&("net:net_dev_start_xmit", "tracepoint"))
            && kinds.contains(&("net:netif_receive_skb", "tracepoint")),
        "{kinds:?}"
    );
    let d = |k: &str| (s1[k] - s0[k]) as f64;
    let eth0 = report.interface(pod_ns, POD_DEV);
    eprintln!(
        "classic: pod eth0 tx {} rx {} (driver); agent {eth0:?}",
        d("tx_packets"),
        d("rx_packets")
    );
    assert_eth0_matches_its_driver(eth0, d, sent);
    cg.remove();
}

/// The exposition once a collection that started after this call has finished: everything
/// that happened before the call is in it.
fn metrics_after_collection(daemon: &Daemon) -> String {
    let called = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs_f64();
    // The first collection to end after the call may have started before it; the one after
    // that did not.
    let mut first_end: Option<f64> = None;
    wait_for(
        "a collection that started after the traffic",
        std::time::Duration::from_secs(60),
        || {
            let body = daemon.metrics();
            let last = sample_with(&body, "stormwatch_last_collection_timestamp_seconds", &[]);
            match (last, first_end) {
                (Some(t), None) if t > called => {
                    first_end = Some(t);
                    None
                }
                (Some(t), Some(first)) if t > first => Some(body),
                _ => None,
            }
        },
    )
}

#[track_caller]
fn value(text: &str, metric: &str, labels: &[(&str, &str)]) -> f64 {
    sample_with(text, metric, labels)
        .unwrap_or_else(|| panic!("no {metric} with {labels:?} in /metrics:\n{text}"))
}

#[test]
fn the_daemon_exports_a_containers_network_series_and_the_mtu_inventory() {
    require_bpf();
    require_tools();
    let net = Overlay::new(1500, 1450, OuterDf::Set, Some(1450));
    let (a_ns, pod_ns) = (net.a.inode().to_string(), net.pod().inode().to_string());
    let cg = TestCgroup::new("net-daemon");
    let keep = net.pod().resident(&cg);
    // Room for the test's cgroup however many other cgroups this host has; the per-packet
    // probes attached throughout, as "always" attaches them (these packets all fit: on demand
    // they would count only in surveys, see `daemon::run_attaches_the_per_packet_probes_…`).
    let dir = tempfile::tempdir().expect("a temp dir");
    let config = write_file(
        dir.path(),
        "stormwatch.toml",
        "max_cgroups = 1000000\nnet_packet_probes = \"always\"\n",
    );
    let daemon = Daemon::start(&["--config", config.to_str().expect("UTF-8 path")]);
    let m0 = metrics_after_collection(&daemon);
    let s0 = if_stats(net.pod(), POD_DEV);
    let stdout = full_size_pings(&net, &cg, 300);
    let (sent, received) = ping_counts(&stdout);
    let s1 = if_stats(net.pod(), POD_DEV);
    let m1 = metrics_after_collection(&daemon);
    drop(keep);
    assert_eq!((sent, received), (300, 300), "{stdout}");
    let d = |k: &str| (s1[k] - s0[k]) as f64;

    // The container: what its namespace's only interface carried, by the driver's counters.
    let container = [("cgroup", cg.rel_path())];
    let grew = |metric: &str, labels: &[(&str, &str)]| {
        let before = sample_with(&m0, metric, labels).unwrap_or(0.0);
        value(&m1, metric, labels) - before
    };
    for (direction, driver) in [("sent", "tx_packets"), ("received", "rx_packets")] {
        let labels = [container[0], ("direction", direction)];
        let got = grew("stormwatch_network_packets_total", &labels);
        eprintln!(
            "/metrics: container packets {direction} {got}, eth0 {}",
            d(driver)
        );
        assert_within(
            &format!("packets {direction} in /metrics"),
            got,
            d(driver),
            0.02,
        );
    }
    const ETH_HLEN: f64 = 14.0;
    let bytes_sent = grew(
        "stormwatch_network_bytes_total",
        &[container[0], ("direction", "sent")],
    );
    assert_within(
        "bytes sent in /metrics (+ Ethernet headers)",
        bytes_sent + ETH_HLEN * d("tx_packets"),
        d("tx_bytes"),
        0.02,
    );

    // The pod's interface: its packets against the driver's, and at its MTU.
    let eth0 = [("netns", pod_ns.as_str()), ("interface", POD_DEV)];
    for (direction, driver) in [("sent", "tx_packets"), ("received", "rx_packets")] {
        let labels = [eth0[0], eth0[1], ("direction", direction)];
        assert_within(
            &format!("eth0 packets {direction} in /metrics"),
            grew("stormwatch_interface_packets_total", &labels),
            d(driver),
            0.02,
        );
    }
    let at_mtu = [eth0[0], eth0[1], ("direction", "sent"), ("size", "at_mtu")];
    assert_within(
        "eth0 packets sent at the MTU",
        grew("stormwatch_interface_packets_by_size_total", &at_mtu),
        sent as f64,
        0.02,
    );
    // The interface series carry the pod's container (the owner of the namespace).
    assert!(
        sample_with(
            &m1,
            "stormwatch_interface_packets_total",
            &[eth0[0], container[0]]
        )
        .is_some(),
        "eth0's series name the container's cgroup"
    );

    // The inventory: the overlay in node A, its overhead and its underlay.
    let ov = [
        ("netns", a_ns.as_str()),
        ("interface", OVERLAY_DEV),
        ("kind", "vxlan"),
    ];
    assert_eq!(value(&m1, "stormwatch_interface_mtu_bytes", &ov), 1450.0);
    assert_eq!(
        value(
            &m1,
            "stormwatch_interface_encapsulation_overhead_bytes",
            &ov
        ),
        50.0
    );
    assert_eq!(
        value(&m1, "stormwatch_interface_underlay_path_mtu_bytes", &ov),
        1500.0
    );
    assert_eq!(
        value(
            &m1,
            "stormwatch_interface_mtu_bytes",
            &[eth0[0], eth0[1], ("kind", "veth")]
        ),
        1450.0
    );

    // promtool has nothing to say about the exposition.
    assert_promtool_clean(&m1);
    drop(daemon);
    cg.remove();
}

/// Sends `n` UDP datagrams of two bytes ("x\n": 30-byte IPv4 packets) to the discard port on
/// loopback from a process in `cgroup`, one socket each.
fn udp_datagrams(cgroup: &TestCgroup, n: u32) {
    let script = format!("for i in $(seq {n}); do echo x > /dev/udp/127.0.0.1/9; done");
    let out = run_in_cgroup(
        std::process::Command::new("bash").args(["-c", &script]),
        cgroup,
    )
    .wait_with_output()
    .expect("waiting for the datagrams");
    assert!(out.status.success(), "bash's datagrams: {}", out.status);
}

/// The cgroups the network family placed in direct slots (`NET_CG_SLOT_DIR`), read with
/// bpftool while the agent runs.
fn placed_net_cgroups() -> Vec<u64> {
    let out = std::process::Command::new("bpftool")
        .args(["-j", "map", "dump", "name", "NET_CG_SLOT_DIR"])
        .output()
        .expect("cannot run bpftool");
    assert!(out.status.success(), "bpftool map dump: {out:?}");
    let entries: Vec<serde_json::Value> =
        serde_json::from_slice(&out.stdout).expect("bpftool's JSON");
    entries
        .iter()
        .filter_map(|e| {
            let bytes: Vec<u8> = e["value"]
                .as_array()?
                .iter()
                .filter_map(|b| u8::from_str_radix(b.as_str()?.trim_start_matches("0x"), 16).ok())
                .collect();
            Some(u64::from_le_bytes(bytes.try_into().ok()?))
        })
        .filter(|id| *id != 0)
        .collect()
}

/// The direct slots (agent/METRICS.md, "Direct slots"): a cgroup whose slot held a removed
/// cgroup's figures counts from zero. Cgroup A sends in two bursts (placed in its slot after
/// the agent's first read), is removed; a new cgroup B that maps to the same slot, found by
/// making cgroups until one does, sends in two bursts after the slot was released and zeroed:
/// B's packets and bytes are exactly what it sent, and B held the slot by then.
#[test]
fn a_recycled_direct_slot_counts_its_new_cgroup_from_zero() {
    require_bpf();
    let trace = Agent::trace(&["--json", "--duration", "14", "--probes", "net"]);
    let a = TestCgroup::new("slot-a");
    let slot = stormwatch_common::slots::slot_of(a.id());
    udp_datagrams(&a, 400);
    std::thread::sleep(std::time::Duration::from_millis(2500));
    udp_datagrams(&a, 400);
    assert!(
        placed_net_cgroups().contains(&a.id()),
        "cgroup A ({}) should hold its slot after two reads",
        a.id()
    );
    a.remove();
    // Removed at the next read (released), zeroed and free at the one after.
    std::thread::sleep(std::time::Duration::from_millis(3000));
    let mut b = None;
    for i in 0..4096 {
        let c = TestCgroup::new(&format!("slot-b{i}"));
        if stormwatch_common::slots::slot_of(c.id()) == slot {
            b = Some(c);
            break;
        }
        c.remove();
    }
    let b = b.expect("no cgroup id of 4096 mapped to A's slot");
    udp_datagrams(&b, 300);
    std::thread::sleep(std::time::Duration::from_millis(2500));
    udp_datagrams(&b, 300);
    assert!(
        placed_net_cgroups().contains(&b.id()),
        "cgroup B ({}) should hold A's slot {slot} once it was free",
        b.id()
    );
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let report = trace.finish().trace;
    let net = container_network(&report, &b);
    assert_eq!(net.packets_sent, 600, "B's packets: {net:?}");
    assert_eq!(net.bytes_sent, 600 * 30, "B's bytes: {net:?}");
}
