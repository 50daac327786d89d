//! stormwatch: a node diagnostics agent. Probes in the kernel aggregate per cgroup; this crate
//! loads them, collects windows of figures, names the cgroups, judges them, and presents them.
//!
//! Data flows one way: `probes` read the kernel's maps → `collect` turns them into snapshots
//! and windows → `pipeline` names the cgroups (`identity`, `netinfo`) → `diagnose` judges the
//! windows → `report` (`trace`'s documents) and `export` (`/metrics`) present them → `cli` runs
//! it all through one `engine`, for a duration (`trace`, `diagnose`, `check`) or as a daemon
//! (`run`).
//!
//! # Layers
//!
//! The modules, from the top layer down: what each owns, and which modules of this crate it may
//! import ("May import"), only modules below it, besides `stormwatch_common`. A module that
//! still imports one above it says so ("Against the layering"), with what it takes from there.
//! A test (`layers`, at the bottom of lib.rs) reads this list and every `crate::` path of the
//! sources: a module missing here, an import the list does not allow, an allowed import above
//! the module, or an exception no longer needed fails it, so the list cannot drift from the code.
//! `cargo +stable xtask imports` draws the graph of every file's imports and fails on a circle
//! (`xtask test` runs it).
//!
//! - [`cli`]: the front ends, one module per subcommand (`check`, `trace`, `diagnose`, `run`):
//!   arguments → [`engine`] → output (the table, the documents, the daemon's endpoint and its
//!   loop). Nothing imports it.
//!   May import: any module below.
//! - [`engine`]: one engine for every front end: a tick steps the pipeline's window into the
//!   diagnosis session, a judgement of its window says what it found and what it asks of the
//!   on-demand probes, which it attaches or detaches; the clock of a front end that runs for a
//!   duration.
//!   May import: `diagnose`, `pipeline`, `probes`, `collect`, `identity`, `netinfo`, `memory`.
//! - [`config`]: `stormwatch run`'s configuration: the TOML file, the environment and the flags,
//!   merged (flags > environment > file > defaults), and the validators they share.
//!   May import: `export` (the endpoint's limits), `diagnose` (the thresholds), `probes` (when
//!   the on-demand tiers attach), `files`.
//! - [`export`]: `/metrics`: the per-cgroup series and their state between collections, the
//!   OpenMetrics exposition and the classic text, the HTTP server (TLS, basic auth, limits).
//!   May import: `report`, `diagnose`, `collect`, `probes`, `identity`, `netinfo`, `host`,
//!   `memory`, `files`.
//! - [`report`]: `trace`'s documents: a window's figures per cgroup, as JSON and as the live
//!   table; a figure whose probe is not attached is `null`, never zero.
//!   May import: `diagnose`, `pipeline` (the context a report of its windows needs), `collect`,
//!   `probes`, `identity`, `netinfo`, `host`, `symbolize`, `files`.
//! - [`diagnose`]: the diagnosis: one session (the sliding window of snapshots, the resource
//!   and host context sampled over it, the facts) and the rules, pure functions of the facts →
//!   findings.
//!   May import: `collect`, `probes`, `identity`, `netinfo`, `host`, `symbolize` (the named
//!   call sites of hand-offs), `memory` (its caches' sizes), `files`.
//! - [`pipeline`]: one tick: probes → collect → identity → a window, with the cgroups,
//!   processes and call sites in it named; each family's user-space half a stage it steps.
//!   May import: `collect`, `probes`, `identity`, `netinfo`, `symbolize`, `memory` (the
//!   caches' sizes), `files`.
//! - [`collect`]: snapshots (the probes' maps read into cumulative counters per cgroup),
//!   windows (the difference of two, added through one `add` per struct) and which figures
//!   exist (the availability every layer above reads); a window carries the named call sites of
//!   its sampled hand-offs.
//!   May import: `probes`, `counters`, `symbolize`, `files`.
//! - [`probes`]: loading, attaching and reading the eBPF programs, one module per family, each
//!   family one object that keeps its state (what adding one touches: [`probes::family`]); the
//!   one BTF reader; the tiers attached on demand.
//!   May import: `counters`, `memory`, `files`.
//! - [`counters`]: the counter types the probes produce and every layer above reads, each with
//!   one add and one difference; what the agent itself had to drop.
//!   May import: nothing.
//! - [`host`]: the host: its CPUs, the hypervisor under it, its NUMA nodes and kernel, the CPU
//!   time stolen.
//!   May import: `identity` (the CPU list parser of `limits.rs`), `files`.
//! - [`identity`]: which cgroup a cgroup id names, and what runs in it (runtime, pod,
//!   container, process runtimes); the cgroup's limits, threads and throttling.
//!   May import: `netinfo` (the network namespaces, in `netns.rs`), `memory` (its caches'
//!   sizes), `files`.
//! - [`netinfo`]: what the network looks like, read rather than probed: namespaces and their
//!   owners, links, routes, encapsulations, the MTU inventory, the kernel's SNMP counters.
//!   May import: `files`.
//! - [`symbolize`]: call sites: a contended kernel lock's stack, symbolized against
//!   `/proc/kallsyms`; the sampled user stacks of futex hand-offs, unwound with the binaries'
//!   call-frame information, named (ELF, DWARF, a JVM's perf map) and counted per cgroup.
//!   May import: `memory` (its caches' sizes), `files`.
//! - [`privileges`]: what the agent needs from the kernel's permission checks (capabilities,
//!   seccomp), and naming what is missing.
//!   May import: `files`.
//! - [`memory`]: giving the allocator's free memory back to the system; the sizes of the
//!   agent's caches.
//!   May import: nothing.
//! - [`files`]: reading a file with a bound: regular files only, at most what its kind can
//!   hold (a BTF, a config, a kernel file), so that no path or process can make the agent read
//!   without end or wait on a FIFO. Every module below `cli` may import it.
//!   May import: nothing.

pub mod cli;
pub mod collect;
pub mod config;
pub mod counters;
pub mod diagnose;
pub mod engine;
pub mod export;
pub mod files;
pub mod host;
pub mod identity;
pub mod memory;
pub mod netinfo;
pub mod pipeline;
pub mod privileges;
pub mod probes;
pub mod report;
pub mod symbolize;

#[cfg(test)]
mod layers {
    //! Checks the list of layers in the crate's documentation against the sources.

    use std::{
        collections::{BTreeMap, BTreeSet},
        path::{Path, PathBuf},
    };

    /// A module's declared place: what it may import, and what it imports against the layering.
    #[derive(Debug)]
    struct Declared {
        name: String,
        may: BTreeSet<String>,
        against: BTreeSet<String>,
    }

    /// The layers listed in lib.rs's documentation, in order, with the modules each may import
    /// and imports against the layering.
    fn declared(lib: &str) -> Vec<Declared> {
        let mut entries: Vec<(String, String)> = Vec::new();
        for line in lib.lines() {
            let Some(text) = line.strip_prefix("//!") else {
                continue;
            };
            if let Some(rest) = text.strip_prefix(" - [`") {
                let (name, text) = rest.split_once("`]").expect("`- [`name`]: …`");
                entries.push((name.to_owned(), text.to_owned()));
            } else if let (Some(entry), Some(more)) = (entries.last_mut(), text.strip_prefix("   "))
            {
                entry.1.push(' ');
                entry.1.push_str(more.trim());
            }
        }
        let names: Vec<String> = entries.iter().map(|(n, _)| n.clone()).collect();
        entries
            .iter()
            .enumerate()
            .map(|(i, (name, text))| {
                let (_, rest) = text
                    .split_once("May import:")
                    .unwrap_or_else(|| panic!("`{name}` says nothing of what it may import"));
                let (may, against) = rest
                    .split_once("Against the layering:")
                    .unwrap_or((rest, ""));
                let mut may = named(may);
                if may.remove("any module below") {
                    may.extend(names[i + 1..].iter().cloned());
                }
                Declared {
                    name: name.clone(),
                    may,
                    against: named(against),
                }
            })
            .collect()
    }

    /// The names in backticks in `text`, outside parentheses (and "any module below").
    fn named(text: &str) -> BTreeSet<String> {
        // What is in parentheses says why, and may name files: left out.
        let mut depth = 0;
        let text: String = text
            .chars()
            .filter(|c| {
                match c {
                    '(' => depth += 1,
                    ')' => depth -= 1,
                    _ => return depth == 0,
                }
                false
            })
            .collect();
        let mut names: BTreeSet<String> = text
            .split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect();
        if text.contains("any module below") {
            names.insert("any module below".to_owned());
        }
        names
    }

    /// Every `.rs` file of a module: `src/<name>.rs` and everything under `src/<name>/`.
    fn files(src: &Path, name: &str) -> Vec<PathBuf> {
        let mut out = Vec::new();
        let file = src.join(format!("{name}.rs"));
        if file.is_file() {
            out.push(file);
        }
        let mut dirs = vec![src.join(name)];
        while let Some(dir) = dirs.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries {
                let path = entry.expect("a directory entry").path();
                if path.is_dir() {
                    dirs.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    out.push(path);
                }
            }
        }
        out
    }

    /// The first segment of every `crate::` path in `source` (comment lines left out), with
    /// the grouped form `crate::{a::X, b}` taken apart.
    fn imports(source: &str) -> BTreeSet<String> {
        let code: String = source
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        let ident = |s: &str| -> String {
            s.trim_start()
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect()
        };
        let mut out = BTreeSet::new();
        for (at, _) in code.match_indices("crate::") {
            let rest = &code[at + "crate::".len()..];
            let Some(group) = rest.strip_prefix('{') else {
                out.insert(ident(rest));
                continue;
            };
            // The top-level items of the group, up to its closing brace.
            let (mut depth, mut item) = (0, String::new());
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        out.insert(ident(&item));
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                if depth == 0 {
                    item.push(c);
                }
            }
            out.insert(ident(&item));
        }
        out.remove("");
        out
    }

    #[test]
    fn modules_import_only_what_their_docs_allow() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let lib = include_str!("lib.rs");
        let modules = declared(lib);
        let names: Vec<&str> = modules.iter().map(|d| d.name.as_str()).collect();
        let mut listed = names.clone();
        listed.sort_unstable();
        let mut crate_modules: Vec<&str> = lib
            .lines()
            .filter_map(|l| l.strip_prefix("pub mod ")?.strip_suffix(';'))
            .collect();
        crate_modules.sort_unstable();
        assert_eq!(
            listed, crate_modules,
            "every module of lib.rs, and no other, is in its list of layers"
        );
        let mut used: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
        for (i, m) in modules.iter().enumerate() {
            let above = &names[..i];
            for name in m.may.iter().chain(&m.against) {
                assert!(
                    names.contains(&name.as_str()),
                    "`{}` names `{name}`, which is not in the list of layers",
                    m.name
                );
            }
            for name in &m.may {
                assert!(
                    !above.contains(&name.as_str()),
                    "`{}` may import `{name}`, a module above it: list it under \"Against the \
                     layering\", or move the code",
                    m.name
                );
            }
            for name in &m.against {
                assert!(
                    above.contains(&name.as_str()),
                    "`{}` lists `{name}` against the layering, but it is below: move it to \
                     \"May import\"",
                    m.name
                );
            }
            let files = files(&src, &m.name);
            assert!(!files.is_empty(), "no source for `{}`", m.name);
            let mut imported = BTreeSet::new();
            for file in &files {
                let text = std::fs::read_to_string(file).expect("a source file");
                for name in imports(&text) {
                    if name != m.name && names.contains(&name.as_str()) {
                        assert!(
                            m.may.contains(&name) || m.against.contains(&name),
                            "{} imports `{name}`, which the layers in lib.rs do not allow `{}`",
                            file.display(),
                            m.name
                        );
                        imported.insert(name);
                    }
                }
            }
            used.insert(&m.name, imported);
        }
        for m in &modules {
            for name in &m.against {
                assert!(
                    used[m.name.as_str()].contains(name),
                    "`{}` no longer imports `{name}`: drop it from \"Against the layering\"",
                    m.name
                );
            }
        }
    }

    #[test]
    fn imports_are_read_from_paths_and_groups_not_comments() {
        let source = "use crate::{\n    collect::{Snapshot, Window},\n    probes::Probes,\n};\n\
                      // crate::cli in a comment\nlet x = crate::host::read();\n";
        assert_eq!(
            imports(source),
            BTreeSet::from(["collect", "host", "probes"].map(str::to_owned))
        );
    }
}
