//! Advice that reads the node: pinning where the container is not pinned yet, with the steps
//! its kubelet's CPU manager policy needs, and sizing runtimes sized from the node's CPUs.

use super::Facts;

/// How to pin where the node's CPU manager policy is not known (`{n}`: the CPUs).
pub(super) const PIN_STEPS: &str = "On Kubernetes: the kubelet's static CPU manager policy with a \
                         Guaranteed pod (CPU request = limit = {n}, an integer); elsewhere \
                         taskset -c or a cpuset.";
/// As [`PIN_STEPS`], when the count is not the point.
pub(super) const PIN_FEWER_STEPS: &str = "On Kubernetes use the kubelet's static CPU manager policy \
                               (Guaranteed pod, integer CPU request); elsewhere a cpuset.";

/// Pinning advice that reads the node (issue #44): a container already held to fewer CPUs than
/// the host's — by the kubelet's static CPU manager, or by its cpuset — is not told to pin
/// again, but what remains; otherwise `pin` (why to pin) gets the steps the node's CPU manager
/// policy needs, or `steps` where the policy is not known (no kubelet checkpoint read).
pub(super) fn pin_on_this_node(f: &Facts, n: u64, pin: String, steps: &str) -> String {
    if let Some(pinned) = f.pinned_cpus() {
        let by = match &f.cpu_pinning.exclusive_cpus {
            Some(cpus) => format!(
                "the kubelet's static CPU manager gave it CPUs {} for itself",
                cpu_list(cpus)
            ),
            None => format!(
                "its cpuset holds {pinned} of the host's {} CPUs",
                f.host_cpus
            ),
        };
        return format!(
            "The container is already pinned ({by}): pinning is not what is left to do. What \
             remains is in its threads: size its runtimes and pools to those {pinned} CPU(s), \
             and change the code that takes the lock (below)."
        );
    }
    let node = match f.cpu_pinning.node_policy.as_deref() {
        Some("static") => format!(
            "This node's kubelet runs the static CPU manager policy: make the pod Guaranteed \
             with an integer CPU request = limit = {n}, and its container gets {n} CPU(s) of \
             its own."
        ),
        Some(policy) => format!(
            "This node's kubelet runs the CPU manager policy `{policy}`, which pins nothing: \
             set `--cpu-manager-policy=static` with CPUs reserved for the system \
             (`--reserved-cpus`), drain the node, remove /var/lib/kubelet/cpu_manager_state \
             and restart the kubelet; then a Guaranteed pod with an integer CPU request = \
             limit = {n}."
        ),
        None => steps.replace("{n}", &n.to_string()),
    };
    format!("{pin} {node}")
}

/// `1-4,7` for [1, 2, 3, 4, 7].
fn cpu_list(cpus: &[u32]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let start = cpus[i];
        while i + 1 < cpus.len() && cpus[i + 1] == cpus[i] + 1 {
            i += 1;
        }
        out.push(if cpus[i] == start {
            start.to_string()
        } else {
            format!("{start}-{}", cpus[i])
        });
        i += 1;
    }
    out.join(",")
}

/// Sizing advice when the pools were sized from the node: the runtime flags that set the CPU
/// count each runtime sizes its pools from.
pub(super) fn node_sizing(threads: f64, host_cpus: u32, n: u64) -> String {
    format!(
        "Size the runtimes to the container's {n} CPU(s), not the node's {host_cpus}: \
         {threads:.0} threads on a {host_cpus}-CPU node is what pools sized from the node look \
         like. JVM: -XX:ActiveProcessorCount={n} (GC and JIT threads and the common ForkJoinPool \
         follow it), and where flags or libraries set them, -XX:ParallelGCThreads={n} and \
         -Djava.util.concurrent.ForkJoinPool.common.parallelism={n}; Go: GOMAXPROCS={n} (or \
         go.uber.org/automaxprocs; Go 1.25 and later read the CPU limit); .NET: \
         DOTNET_PROCESSOR_COUNT={n}; OpenMP: OMP_NUM_THREADS={n}; then the application's own \
         pools (executors, request workers)."
    )
}
