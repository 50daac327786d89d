//! The Kubernetes labels every per-container series carries. Below the exporter's state and its
//! network series, which both label by them.

use crate::identity::workload::Identity;

/// The Kubernetes names of a cgroup; empty when unknown.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Labels {
    pub namespace: String,
    pub pod: String,
    pub container: String,
}

impl Labels {
    pub fn of(identity: Option<&Identity>) -> Self {
        let name = |v: Option<&String>| v.cloned().unwrap_or_default();
        match identity {
            Some(i) => Self {
                namespace: name(i.namespace.as_ref()),
                pod: name(i.pod.as_ref()),
                container: name(i.container.as_ref()),
            },
            None => Self::default(),
        }
    }
}
