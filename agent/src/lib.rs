//! stormwatch: a node diagnostics agent. Probes in the kernel aggregate per cgroup; this crate
//! loads them, collects windows of figures, names the cgroups, and presents them.
//!
//! Data flows one way: `probes` → `collect` → `identity` → `report` / `cli`.

pub mod cli;
pub mod collect;
pub mod config;
pub mod counters;
pub mod diagnose;
pub mod export;
pub mod host;
pub mod identity;
pub mod memory;
pub mod netinfo;
pub mod pipeline;
pub mod privileges;
pub mod probes;
pub mod report;
pub mod symbolize;
