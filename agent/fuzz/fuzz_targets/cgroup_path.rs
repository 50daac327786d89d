//! Fuzzes the parsers that read untrusted text: cgroup paths (anyone with a delegated subtree
//! can name a cgroup), kubelet log file names, and cgroupfs file contents. Beyond "never
//! panics", it checks the invariants callers rely on.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stormwatch::identity::{
    container::{is_container_id, normalize_pod_uid, parse_cgroup_path},
    kubelet::{parse_container_log_name, parse_pod_log_dir},
    limits::{parse_cpu_list, parse_cpu_max, parse_pressure},
};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };

    let identity = parse_cgroup_path(text);
    if let Some(id) = &identity.container_id {
        assert!(is_container_id(id), "container id {id:?} from {text:?}");
        assert!(text.contains(id.as_str()));
    }
    if let Some(id) = &identity.conmon_for {
        assert!(is_container_id(id));
        assert!(
            identity.container_id.is_none(),
            "conmon is not the container"
        );
    }
    if let Some(uid) = &identity.pod_uid {
        assert_eq!(normalize_pod_uid(uid).as_deref(), Some(uid.as_str()));
        assert!(!uid.contains('_'));
    }

    if let Some(log) = parse_container_log_name(text) {
        assert!(is_container_id(&log.container_id));
        // Parsing loses nothing: the name can be rebuilt exactly.
        let rebuilt = format!(
            "{}_{}_{}-{}.log",
            log.pod, log.namespace, log.container, log.container_id
        );
        assert_eq!(rebuilt, text);
    }
    if let Some(dir) = parse_pod_log_dir(text) {
        assert_eq!(
            format!("{}_{}_{}", dir.namespace, dir.pod, dir.pod_uid),
            text
        );
    }

    if let Some(cpus) = parse_cpu_list(text) {
        assert!(cpus.windows(2).all(|w| w[0] < w[1]), "sorted and unique");
    }
    if let Some(cores) = parse_cpu_max(text) {
        assert!(cores.is_finite() && cores > 0.0);
    }
    let pressure = parse_pressure(text);
    for line in [pressure.some, pressure.full].into_iter().flatten() {
        assert!((0.0..=100.0).contains(&line.avg10));
    }
});
