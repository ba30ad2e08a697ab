//! The observer belongs to the harness core: it depends on no crate of the
//! workspace (not the stack `qlora`, not the harness `falsify`), only on
//! published crates, so any subject can use it.

use std::fs;
use std::path::{Path, PathBuf};

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("a readable folder") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn the_manifest_names_no_workspace_crate() {
    let manifest = fs::read_to_string(crate_dir().join("Cargo.toml")).expect("Cargo.toml");
    let mut section = String::new();
    let mut dependencies = 0;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line.to_string();
            continue;
        }
        if !section.contains("dependencies") || line.is_empty() || line.starts_with('#') {
            continue;
        }
        dependencies += 1;
        let name = line.split(['=', ' ']).next().unwrap_or_default();
        assert!(
            !line.contains("path"),
            "{section} has a path dependency: {line}"
        );
        assert!(
            !["qlora", "falsify"].contains(&name),
            "{section} depends on {name}"
        );
    }
    assert!(
        dependencies >= 5,
        "found only {dependencies} dependency lines"
    );
}

#[test]
fn the_sources_name_no_workspace_crate() {
    let mut files = Vec::new();
    for dir in ["src", "examples", "tests"] {
        rust_files(&crate_dir().join(dir), &mut files);
    }
    assert!(files.len() >= 10, "found only {files:?}");
    for file in files {
        let text = fs::read_to_string(&file).expect("a readable source");
        // Spelled in pieces so that this file does not name them either.
        for needle in
            [["qlora", "::"], ["use falsify", "::"], ["falsify", "::{"]].map(|p| p.concat())
        {
            assert!(!text.contains(&needle), "{} names {needle}", file.display());
        }
    }
}
