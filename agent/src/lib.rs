//! stormwatch: a node diagnostics agent. Probes in the kernel aggregate per cgroup; this crate
//! loads them, collects windows of figures, names the cgroups, diagnoses what the windows show,
//! and presents it.
//!
//! Data flows one way: `probes` → `collect` → `pipeline` (one tick: the window, named by
//! `identity`) → `diagnose` (the session and its rules) → `report` (trace's documents) and
//! `export` (`/metrics`) → `cli` (the front ends).
//!
//! The layers, top first; a module imports only from its own layer's subtree and the layers
//! below it (`cargo +stable xtask imports` draws the graph and fails on an arrow up or a
//! circle; `xtask test` runs it):
//!
//! 1. `main`, `cli` — the front ends: check, trace, diagnose, run; nothing imports them;
//! 2. `config` — flags > environment > file > defaults;
//! 3. `export` — `/metrics`: the exporter's state, the family table, the HTTP server;
//! 4. `report` — trace's documents;
//! 5. `diagnose` — the diagnosis session and the rules;
//! 6. `pipeline` — one tick: the probes' maps read, the cgroups named;
//! 7. `collect` — snapshots, windows and their arithmetic, which figures exist;
//! 8. `identity`, `netinfo`, `host` — what the cgroups, the network and the host are;
//! 9. `probes` — loading, attaching, reading the eBPF programs and maps;
//! 10. `counters` — the counter types the probes produce;
//! 11. `symbolize`, `privileges`, `memory` — leaves.

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
