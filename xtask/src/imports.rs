//! The import graph of a crate's modules, from its source: which module names which (`use
//! crate::…`, `super::…`, and paths in the code). `cargo +stable xtask imports` prints the
//! agent's and xtask's graphs and fails on a circle (modules that import each other; a module
//! and its own submodules, which re-export and share its items, count as one); `xtask test`
//! runs the check. Which layer may import which is the agent's own test (`layers`, in
//! agent/src/lib.rs, against the list of layers there).

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use anyhow::{Context as _, Result, bail};

/// A module's path (`export::state`) from its file (`src/export/state.rs`).
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap_or(file).with_extension("");
    let parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .filter(|p| p != "mod")
        .collect();
    if parts.is_empty() {
        "lib".to_owned()
    } else {
        parts.join("::")
    }
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            rust_files(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    Ok(())
}

/// The code of a file without its tests and comments (what the program imports).
fn code_of(text: &str) -> String {
    let text = text.split("#[cfg(test)]").next().unwrap_or(text);
    text.lines()
        .map(|l| {
            let t = l.trim_start();
            if t.starts_with("//") { "" } else { l }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The modules of `known` that `module`'s code names.
fn imports_of(module: &str, code: &str, known: &BTreeSet<String>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let parent: Vec<&str> = module.split("::").collect();
    // Every path that starts at the crate or at the parent, with its nested `{…}` groups
    // flattened: `crate::{a::b, c}` names `a::b` and `c`.
    let flat = code.replace(['\n', ' '], "");
    for (prefix, base) in [
        ("crate::", Vec::new()),
        (
            "super::",
            parent[..parent.len().saturating_sub(1)]
                .iter()
                .map(|s| (*s).to_owned())
                .collect::<Vec<_>>(),
        ),
        (
            "self::",
            parent.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>(),
        ),
    ] {
        let mut rest = flat.as_str();
        while let Some(at) = rest.find(prefix) {
            // `super::super::` and the like are rare here: taken one level.
            let after = &rest[at + prefix.len()..];
            for path in expand(after) {
                let mut full = base.clone();
                full.extend(path.split("::").map(str::to_owned));
                // The longest known module the path starts with.
                for n in (1..=full.len()).rev() {
                    let candidate = full[..n].join("::");
                    if known.contains(&candidate) {
                        if candidate != module {
                            out.insert(candidate);
                        }
                        break;
                    }
                }
            }
            rest = after;
        }
    }
    out
}

/// The paths a `use` tree (or a plain path) names, from the text after its prefix.
fn expand(text: &str) -> Vec<String> {
    let mut head = String::new();
    for (i, c) in text.char_indices() {
        match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '_' | ':' => head.push(c),
            '{' => {
                // The group, to its matching brace.
                let mut depth = 1;
                let mut end = i + 1;
                for (j, c) in text[i + 1..].char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                end = i + 1 + j;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                let inner = &text[i + 1..end];
                let mut parts = Vec::new();
                let (mut depth, mut start) = (0, 0);
                for (j, c) in inner.char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => depth -= 1,
                        ',' if depth == 0 => {
                            parts.push(&inner[start..j]);
                            start = j + 1;
                        }
                        _ => {}
                    }
                }
                parts.push(&inner[start..]);
                return parts
                    .into_iter()
                    .filter(|p| !p.is_empty())
                    .flat_map(|p| expand(p).into_iter().map(|s| format!("{head}{s}")))
                    .collect();
            }
            _ => break,
        }
    }
    vec![head.trim_end_matches(':').to_owned()]
}

/// The graph of a crate's modules: module → the modules it imports.
pub fn graph(src: &Path) -> Result<BTreeMap<String, BTreeSet<String>>> {
    let mut files = Vec::new();
    rust_files(src, &mut files)?;
    let known: BTreeSet<String> = files.iter().map(|f| module_of(src, f)).collect();
    let mut graph = BTreeMap::new();
    for f in &files {
        let module = module_of(src, f);
        let code = code_of(&std::fs::read_to_string(f)?);
        graph.insert(module.clone(), imports_of(&module, &code, &known));
    }
    Ok(graph)
}

/// The circles of a graph, each once: modules that import each other, directly or through
/// others. A module and its own submodules count as one (a parent re-exports what its files
/// define, and they use its types).
pub fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let mut out = Vec::new();
    // Circles: a depth-first search for back edges.
    let mut state: BTreeMap<&str, u8> = BTreeMap::new();
    let mut seen_circles = BTreeSet::new();
    fn visit<'a>(
        n: &'a str,
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<&'a str, u8>,
        stack: &mut Vec<&'a str>,
        out: &mut Vec<String>,
        seen: &mut BTreeSet<Vec<String>>,
    ) {
        state.insert(n, 1);
        stack.push(n);
        // A module and its own submodules are one unit (a parent re-exports what its files
        // define, and they use its types): only arrows between other modules make circles.
        let kin =
            |a: &str, b: &str| a.starts_with(&format!("{b}::")) || b.starts_with(&format!("{a}::"));
        for m in graph.get(n).into_iter().flatten().filter(|m| !kin(n, m)) {
            match state.get(m.as_str()) {
                Some(1) => {
                    let at = stack.iter().position(|s| *s == m).unwrap_or(0);
                    let mut circle: Vec<String> =
                        stack[at..].iter().map(|s| (*s).to_owned()).collect();
                    let mut key = circle.clone();
                    key.sort();
                    if seen.insert(key) {
                        circle.push(m.clone());
                        out.push(format!("a circle: {}", circle.join(" → ")));
                    }
                }
                Some(_) => {}
                None => visit(m, graph, state, stack, out, seen),
            }
        }
        stack.pop();
        state.insert(n, 2);
    }
    for n in graph.keys() {
        if !state.contains_key(n.as_str()) {
            visit(
                n,
                graph,
                &mut state,
                &mut Vec::new(),
                &mut out,
                &mut seen_circles,
            );
        }
    }
    out
}

/// `cargo xtask imports`: prints the agent's and xtask's graphs (with `print`); fails on a
/// circle.
pub fn run(print: bool) -> Result<()> {
    let root = crate::root();
    let mut all = Vec::new();
    for (name, src) in [
        ("agent", root.join("agent/src")),
        ("xtask", root.join("xtask/src")),
    ] {
        let g = graph(&src)?;
        if print {
            println!("# {name}");
            for (from, tos) in &g {
                if !tos.is_empty() {
                    println!(
                        "{from} → {}",
                        tos.iter().cloned().collect::<Vec<_>>().join(", ")
                    );
                }
            }
        }
        all.extend(circles(&g).into_iter().map(|p| format!("{name}: {p}")));
    }
    if !all.is_empty() {
        bail!("the import graph has circles:\n  {}", all.join("\n  "));
    }
    crate::say("imports: no circle");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn use_trees_are_flattened() {
        assert_eq!(expand("a::b;"), ["a::b"]);
        assert_eq!(expand("{a::{b,c},d::E},"), ["a::b", "a::c", "d::E"]);
    }

    #[test]
    fn imports_are_read_and_circles_found() {
        let known: BTreeSet<String> = ["a", "b", "c", "c::x", "c::y"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        let code = "use crate::{b, c::x::Thing};\nfn f() { super::y::g() }";
        assert_eq!(
            imports_of("c::x", code, &known),
            ["b", "c::y"].iter().map(|s| (*s).to_owned()).collect()
        );
        let g: BTreeMap<String, BTreeSet<String>> = [
            ("a", vec!["b"]),
            ("b", vec!["c"]),
            ("c", vec!["c::x"]),
            ("c::x", vec!["c::y", "c"]),
            ("c::y", vec!["c::x"]),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.into_iter().map(str::to_owned).collect()))
        .collect();
        let p = circles(&g);
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].contains("c::x") && p[0].contains("c::y"), "{p:?}");
    }
}
