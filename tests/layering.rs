//! The layering the workspace promises: the harness (`falsify`, `src/`) above,
//! the training stack (`qlora/`) below, nothing importing upward, and no two
//! top-level modules of the harness importing each other.
//!
//! Read from the sources, so a new `use` that breaks the layering fails here
//! on any machine, GPU or not.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every `.rs` file under `dir`, recursively, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in fs::read_dir(&d).expect("a readable source folder") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The source of `path` without its `#[cfg(test)]` tail: unit tests may
/// reach anywhere.
fn library_source(path: &Path) -> String {
    let text = fs::read_to_string(path).expect("a readable source file");
    match text.find("#[cfg(test)]") {
        Some(i) => text[..i].to_string(),
        None => text,
    }
}

/// The top-level modules of `src/` that each top-level module names
/// through `crate::<module>`.
fn harness_imports() -> BTreeMap<String, BTreeSet<String>> {
    let src = root().join("core/src");
    let modules: BTreeSet<String> = fs::read_dir(&src)
        .expect("src/")
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for module in &modules {
        let to = edges.entry(module.clone()).or_default();
        for file in rust_files(&src.join(module)) {
            let text = library_source(&file);
            for (i, _) in text.match_indices("crate::") {
                let name: String = text[i + "crate::".len()..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if name != *module && modules.contains(&name) {
                    to.insert(name);
                }
            }
        }
    }
    edges
}

#[test]
fn no_harness_module_imports_a_module_that_imports_it_back() {
    let edges = harness_imports();
    assert!(edges.len() >= 4, "found only {:?}", edges.keys());
    // Depth-first search for a cycle, reporting its path.
    fn visit(
        node: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(start) = path.iter().position(|p| p == node) {
            let mut cycle = path[start..].to_vec();
            cycle.push(node.to_string());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in edges.get(node).into_iter().flatten() {
            if let Some(c) = visit(next, edges, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    for node in edges.keys() {
        if let Some(cycle) = visit(node, &edges, &mut Vec::new(), &mut done) {
            panic!("import cycle: {}", cycle.join(" -> "));
        }
    }
}

#[test]
fn the_stack_names_nothing_of_the_harness() {
    let stack = root().join("qlora");
    let mut hits = Vec::new();
    for file in rust_files(&stack.join("src"))
        .into_iter()
        .chain(rust_files(&stack.join("tests")))
    {
        let text = fs::read_to_string(&file).expect("a readable source file");
        for (n, line) in text.lines().enumerate() {
            if line.contains("falsify") {
                hits.push(format!("{}:{}: {line}", file.display(), n + 1));
            }
        }
    }
    assert!(
        hits.is_empty(),
        "the stack names the harness:\n{}",
        hits.join("\n")
    );
}

#[test]
fn the_stack_depends_on_no_harness_crate() {
    let manifest = fs::read_to_string(root().join("qlora/Cargo.toml")).expect("qlora/Cargo.toml");
    // The normal dependencies only: a test runner may use a harness crate.
    let normal = manifest
        .split("[dependencies]")
        .nth(1)
        .and_then(|rest| rest.split("\n[").next())
        .expect("a [dependencies] table");
    let harness_crates = [
        "falsify",
        "serde_yaml",
        "libtest-mimic",
        "csv",
        "plotters",
        "clap",
        "indicatif",
        "proptest",
        "criterion",
    ];
    for line in normal.lines() {
        let name = line.split('=').next().unwrap_or("").trim();
        assert!(
            !harness_crates.contains(&name),
            "qlora/Cargo.toml depends on {name}"
        );
    }
}
