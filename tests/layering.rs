//! The layering the workspace promises, bottom to top:
//!
//! - the stack `qlora` and the driver observer `falsify-observer` depend on
//!   no workspace crate;
//! - the harness core `falsify-core` depends on the observer at most, and
//!   reaches no stack through anything it depends on (Cargo.lock's graph,
//!   what `cargo tree -p falsify-core` shows);
//! - a subject (`falsify-qlora`) depends on the core, the observer and its
//!   stack;
//! - the front ends (`falsify`, the root package) on anything.
//!
//! Every edge is checked from both sides: the manifests' path dependencies
//! (every table: normal, build, dev, target-specific), and the sources —
//! no file of a crate names a crate it may not depend on (`qlora::` in the
//! core, `falsify_core::` in the stack, `extern crate`, `use x;`), and a
//! `#[path]` include never leaves its crate's folder. Inside the core and
//! the qlora subject, every edge between top-level modules (`crate::x`,
//! `$crate::x` in macros, doc links included; unit tests aside) is one of
//! the allowed edges listed below, whose order is the stated layering.
//!
//! Read from files, so a dependency or a `use` that breaks the layering
//! fails here on any machine, GPU or network or not.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use toml_edit::{DocumentMut, Item};

/// One crate of the workspace.
struct Crate {
    /// The package name (manifests, Cargo.lock).
    package: &'static str,
    /// Its folder, relative to the workspace root.
    dir: &'static str,
    /// The name its library has in Rust sources.
    lib: &'static str,
    /// The workspace crates it may depend on, and name in its sources.
    may_use: &'static [&'static str],
}

/// Every workspace member, bottom to top.
const CRATES: &[Crate] = &[
    Crate {
        package: "qlora",
        dir: "qlora",
        lib: "qlora",
        may_use: &[],
    },
    Crate {
        package: "falsify-observer",
        dir: "observer",
        lib: "falsify_observer",
        may_use: &[],
    },
    Crate {
        package: "falsify-core",
        dir: "core",
        lib: "falsify_core",
        may_use: &["falsify-observer"],
    },
    Crate {
        package: "falsify-qlora",
        dir: "subjects/qlora",
        lib: "falsify_qlora",
        may_use: &["falsify-core", "falsify-observer", "qlora"],
    },
    Crate {
        package: "falsify",
        dir: ".",
        lib: "falsify",
        may_use: &["falsify-core", "falsify-qlora", "falsify-observer", "qlora"],
    },
];

/// The stacks under test: the core reaches none of them.
const STACKS: &[&str] = &["qlora"];

/// The core's top-level modules, bottom to top, each with the modules it
/// may name. Each allowed edge points to a module listed before it.
const CORE_MODULES: &[(&str, &[&str])] = &[
    ("error", &[]),
    ("child", &[]),
    ("report", &["error"]),
    ("check", &["error", "report"]),
    ("subject", &["error", "report", "check"]),
    ("workload", &["error", "child", "check", "subject"]),
    ("core_kinds", &["error", "check", "subject", "workload"]),
    ("contract", &["error", "check", "subject", "core_kinds"]),
    (
        "run",
        &[
            "error",
            "child",
            "report",
            "check",
            "subject",
            "workload",
            "core_kinds",
            "contract",
        ],
    ),
    (
        "harness",
        &[
            "error",
            "report",
            "check",
            "subject",
            "core_kinds",
            "contract",
            "run",
        ],
    ),
];

/// The qlora subject's top-level modules, likewise. The oracle is a leaf
/// beside the error type: it names no check, mutant or rank. The training
/// workload (for the core's driver-observed kinds) sits on the checks.
const QLORA_SUBJECT_MODULES: &[(&str, &[&str])] = &[
    ("error", &[]),
    ("reference", &["error"]),
    ("mutant", &["error", "reference"]),
    ("ranks", &["error", "mutant"]),
    ("check", &["error", "reference", "mutant", "ranks"]),
    ("workload", &["error", "mutant", "check"]),
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn toml(path: &Path) -> DocumentMut {
    read(path)
        .parse()
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn krate(package: &str) -> &'static Crate {
    CRATES
        .iter()
        .find(|c| c.package == package)
        .unwrap_or_else(|| panic!("`{package}` is not in CRATES: place it in the layering"))
}

/// The workspace members the root manifest lists.
fn members() -> Vec<String> {
    let manifest = toml(&root().join("Cargo.toml"));
    manifest["workspace"]["members"]
        .as_array()
        .expect("[workspace] members")
        .iter()
        .filter_map(|m| m.as_str().map(str::to_string))
        .collect()
}

/// Every table of dependencies of a manifest: `[dependencies]`,
/// `[build-dependencies]`, `[dev-dependencies]`, and each of those under
/// `[target.'...']`.
fn dependency_tables(manifest: &DocumentMut) -> Vec<(String, &toml_edit::Table)> {
    const KINDS: [&str; 3] = ["dependencies", "build-dependencies", "dev-dependencies"];
    let mut tables = Vec::new();
    for kind in KINDS {
        if let Some(t) = manifest.get(kind).and_then(Item::as_table) {
            tables.push((kind.to_string(), t));
        }
    }
    if let Some(targets) = manifest.get("target").and_then(Item::as_table) {
        for (cfg, target) in targets.iter() {
            for kind in KINDS {
                if let Some(t) = target.get(kind).and_then(Item::as_table) {
                    tables.push((format!("target.{cfg}.{kind}"), t));
                }
            }
        }
    }
    tables
}

/// The workspace crates `c`'s manifest depends on by path, with the table
/// each is in.
fn path_dependencies(c: &Crate) -> Vec<(String, &'static str)> {
    let dir = root().join(c.dir);
    let manifest = toml(&dir.join("Cargo.toml"));
    let mut found = Vec::new();
    for (table, deps) in dependency_tables(&manifest) {
        for (name, spec) in deps.iter() {
            let Some(path) = spec.get("path").and_then(|p| p.as_str()) else {
                continue;
            };
            let target = normalise(&dir.join(path));
            let Some(to) = CRATES
                .iter()
                .find(|d| normalise(&root().join(d.dir)) == target)
            else {
                panic!(
                    "{}: {table}.{name} is a path dependency on {}, which is not in CRATES",
                    c.package,
                    target.display()
                );
            };
            found.push((table.clone(), to.package));
        }
    }
    found
}

/// `path` with `.` and `..` resolved lexically.
fn normalise(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// Every `.rs` file of the crate in `dir`: its folder without `target/`,
/// hidden folders, and folders that are crates of their own (they hold a
/// `Cargo.toml`), sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in fs::read_dir(&d).expect("a readable source folder") {
            let path = entry.expect("a directory entry").path();
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
            let name = name.unwrap_or_default();
            if path.is_dir() {
                let skipped = name == "target" || name.starts_with('.');
                if !skipped && !path.join("Cargo.toml").exists() {
                    stack.push(path);
                }
            } else if name.ends_with(".rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// Whether `text` names the crate `lib` at byte `at` (not as the tail of a
/// longer name: `qlora::` inside `falsify_qlora::` is not `qlora`).
fn starts_name(text: &str, at: usize) -> bool {
    text[..at]
        .chars()
        .next_back()
        .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_'))
}

/// The lines of `text` that name the crate `lib`: `lib::`, `extern crate
/// lib`, `use lib;` or `use lib as`.
fn mentions(text: &str, lib: &str) -> Vec<usize> {
    let patterns = [
        format!("{lib}::"),
        format!("extern crate {lib}"),
        format!("use {lib};"),
        format!("use {lib} as"),
    ];
    let mut lines = BTreeSet::new();
    for pattern in &patterns {
        for (at, _) in text.match_indices(pattern.as_str()) {
            let starts = if pattern.starts_with(lib) {
                starts_name(text, at)
            } else {
                true
            };
            if starts {
                lines.insert(text[..at].lines().count().max(1));
            }
        }
    }
    lines.into_iter().collect()
}

/// The files `#[path = "..."]` attributes in `file` include, resolved from
/// the file's folder.
fn path_includes(file: &Path, text: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for (at, _) in text.match_indices("#[path") {
        let rest = &text[at..];
        let Some(open) = rest.find('"') else { continue };
        let Some(len) = rest[open + 1..].find('"') else {
            continue;
        };
        let target = &rest[open + 1..open + 1 + len];
        let base = file.parent().unwrap_or(Path::new("."));
        out.push(normalise(&base.join(target)));
    }
    out
}

#[test]
fn every_workspace_crate_has_its_place_in_the_layering() {
    let root = normalise(&root());
    for member in members() {
        let dir = normalise(&root.join(&member));
        assert!(
            CRATES.iter().any(|c| normalise(&root.join(c.dir)) == dir),
            "workspace member {member} is not in CRATES"
        );
    }
}

#[test]
fn manifests_depend_only_downward() {
    let mut wrong = Vec::new();
    for c in CRATES {
        for (table, to) in path_dependencies(c) {
            if !c.may_use.contains(&to) {
                wrong.push(format!("{}: [{table}] {to}", c.package));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "dependencies against the layering:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn sources_name_only_the_crates_below_them() {
    let mut wrong = Vec::new();
    for c in CRATES {
        let forbidden: Vec<&Crate> = CRATES
            .iter()
            .filter(|d| d.package != c.package && !c.may_use.contains(&d.package))
            .collect();
        for file in rust_files(&root().join(c.dir)) {
            let text = read(&file);
            for d in &forbidden {
                for line in mentions(&text, d.lib) {
                    wrong.push(format!(
                        "{}:{line}: {} names {}",
                        file.display(),
                        c.package,
                        d.lib
                    ));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "sources against the layering:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn path_includes_stay_inside_their_crate() {
    let mut wrong = Vec::new();
    for c in CRATES {
        let dir = normalise(&root().join(c.dir));
        let nested: Vec<PathBuf> = CRATES
            .iter()
            .map(|d| normalise(&root().join(d.dir)))
            .filter(|d| *d != dir && d.starts_with(&dir))
            .collect();
        for file in rust_files(&dir) {
            for target in path_includes(&file, &read(&file)) {
                if !target.starts_with(&dir) || nested.iter().any(|n| target.starts_with(n)) {
                    wrong.push(format!("{} includes {}", file.display(), target.display()));
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "#[path] includes across crates:\n{}",
        wrong.join("\n")
    );
}

/// The source of `path` without its `#[cfg(test)]` tail: unit tests may
/// reach anywhere inside their crate.
fn library_source(path: &Path) -> String {
    let text = read(path);
    match text.find("#[cfg(test)]") {
        Some(i) => text[..i].to_string(),
        None => text,
    }
}

/// The top-level modules of the crate whose sources are in `src` (those
/// its `lib.rs` declares outside `#[cfg(test)]`), each with the top-level
/// modules it names through `crate::<module>` or `$crate::<module>`.
fn module_edges(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let lib = library_source(&src.join("lib.rs"));
    let modules: BTreeSet<String> = lib
        .lines()
        .filter_map(|l| {
            l.trim()
                .strip_prefix("pub mod ")
                .or(l.trim().strip_prefix("mod "))
        })
        .map(|m| m.trim_end_matches(';').to_string())
        .collect();
    let mut edges = BTreeMap::new();
    for module in &modules {
        let folder = src.join(module);
        let files = if folder.is_dir() {
            rust_files(&folder)
        } else {
            vec![src.join(format!("{module}.rs"))]
        };
        let to: &mut BTreeSet<String> = edges.entry(module.clone()).or_default();
        for file in files {
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

/// Checks the module edges of the crate in `src` against `allowed`: every
/// module is listed, every edge allowed, and every allowed edge points down
/// the list (so the allowed graph is the stated order, with no cycle).
fn check_modules(src: &Path, allowed: &[(&str, &[&str])]) {
    for (i, (module, below)) in allowed.iter().enumerate() {
        for to in *below {
            let earlier = allowed[..i].iter().any(|(m, _)| m == to);
            assert!(
                earlier,
                "the table lets {module} name {to}, which is not below it"
            );
        }
    }
    let edges = module_edges(src);
    assert!(
        edges.len() >= allowed.len(),
        "found only {:?}",
        edges.keys()
    );
    let mut wrong = Vec::new();
    for (module, to) in &edges {
        let Some((_, below)) = allowed.iter().find(|(m, _)| m == module) else {
            wrong.push(format!(
                "module {module} is not in the table: place it in the layering"
            ));
            continue;
        };
        for t in to.iter().filter(|t| !below.contains(&t.as_str())) {
            wrong.push(format!("{module} names {t}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "{}: module edges against the layering:\n{}",
        src.display(),
        wrong.join("\n")
    );
}

#[test]
fn the_cores_modules_import_only_downward() {
    check_modules(&root().join("core/src"), CORE_MODULES);
}

#[test]
fn the_qlora_subjects_modules_import_only_downward() {
    check_modules(&root().join("subjects/qlora/src"), QLORA_SUBJECT_MODULES);
}

/// Cargo.lock's dependency graph: each package's name and version, with
/// the packages its dependencies name (`name` or `name version`).
fn lock_graph() -> Vec<(String, String, Vec<String>)> {
    let lock = toml(&root().join("Cargo.lock"));
    let packages = lock["package"]
        .as_array_of_tables()
        .expect("[[package]] entries in Cargo.lock");
    packages
        .iter()
        .map(|p| {
            let field = |k: &str| p.get(k).and_then(|v| v.as_str()).unwrap_or("").to_string();
            let deps = p
                .get("dependencies")
                .and_then(|d| d.as_array())
                .map(|a| {
                    a.iter()
                        .filter_map(|d| d.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default();
            (field("name"), field("version"), deps)
        })
        .collect()
}

/// Every package `package` reaches in Cargo.lock's graph (normal, build and
/// dev dependencies alike, as `cargo tree -p` shows them), itself included.
fn reachable(package: &str) -> BTreeSet<String> {
    let graph = lock_graph();
    let find = |dep: &str| {
        let mut words = dep.split_whitespace();
        let (name, version) = (words.next().unwrap_or(""), words.next());
        graph
            .iter()
            .find(|(n, v, _)| n == name && version.is_none_or(|want| want == v))
            .unwrap_or_else(|| panic!("Cargo.lock names `{dep}` but has no such package"))
    };
    let mut seen = BTreeSet::new();
    let mut todo = vec![find(package)];
    while let Some((name, version, deps)) = todo.pop() {
        if seen.insert(format!("{name} {version}")) {
            todo.extend(deps.iter().map(|d| find(d)));
        }
    }
    seen.into_iter()
        .filter_map(|p| p.split_whitespace().next().map(str::to_string))
        .collect()
}

#[test]
fn the_core_reaches_no_stack_and_nothing_above_it() {
    let reached = reachable("falsify-core");
    assert!(reached.contains("serde"), "the graph was read: {reached:?}");
    let above = ["falsify-qlora", "falsify"];
    for bad in STACKS.iter().chain(&above) {
        assert!(
            !reached.contains(*bad),
            "falsify-core reaches {bad} in Cargo.lock"
        );
    }
    // Whatever else it reaches, it is no workspace crate it may not use.
    let core = krate("falsify-core");
    for c in CRATES {
        if c.package != core.package && reached.contains(c.package) {
            assert!(
                core.may_use.contains(&c.package),
                "falsify-core reaches {}",
                c.package
            );
        }
    }
}

#[test]
fn the_stack_names_nothing_of_the_harness() {
    let stack = root().join("qlora");
    let mut hits = Vec::new();
    for file in rust_files(&stack) {
        let text = read(&file);
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

/// The stack's own dependencies (a test runner aside) are no harness's.
#[test]
fn the_stack_depends_on_no_harness_crate() {
    let manifest = toml(&root().join("qlora/Cargo.toml"));
    let harness_crates = [
        "falsify",
        "falsify-core",
        "serde_yaml",
        "libtest-mimic",
        "csv",
        "plotters",
        "clap",
        "indicatif",
        "proptest",
        "criterion",
    ];
    let normal = manifest["dependencies"].as_table().expect("[dependencies]");
    for (name, _) in normal.iter() {
        assert!(
            !harness_crates.contains(&name),
            "qlora/Cargo.toml depends on {name}"
        );
    }
}

#[test]
fn names_are_told_from_longer_names() {
    assert_eq!(
        mentions("use falsify_qlora::Qlora;", "qlora"),
        Vec::<usize>::new()
    );
    assert_eq!(mentions("x\nuse qlora::gpu;", "qlora"), [2]);
    assert_eq!(mentions("extern crate qlora;", "qlora"), [1]);
    assert_eq!(mentions("<qlora::Error>", "qlora"), [1]);
    assert_eq!(
        path_includes(
            Path::new("/w/src/main.rs"),
            "#[path = \"../harness/answer.rs\"]\nmod a;"
        ),
        [PathBuf::from("/w/harness/answer.rs")]
    );
}

/// The example subject (`examples/subject-axpy`, outside the workspace)
/// proves the seam from outside: like another team's crate, it depends on
/// the core alone — by path in its manifest, in its own Cargo.lock, and in
/// the crates its sources name.
#[test]
fn the_example_subject_stands_on_the_core_alone() {
    let dir = root().join("examples/subject-axpy");
    let core = normalise(&root().join(krate("falsify-core").dir));
    let manifest = toml(&dir.join("Cargo.toml"));
    let mut wrong = Vec::new();
    for (table, deps) in dependency_tables(&manifest) {
        for (name, spec) in deps.iter() {
            if let Some(path) = spec.get("path").and_then(|p| p.as_str()) {
                if normalise(&dir.join(path)) != core {
                    wrong.push(format!("[{table}] {name} = {{ path = {path:?} }}"));
                }
            }
        }
    }
    let lock = read(&dir.join("Cargo.lock"));
    assert!(
        lock.contains("name = \"falsify-core\""),
        "its Cargo.lock was read"
    );
    // The core's own dependencies (the observer) may be in its lockfile;
    // no stack and nothing above the core may.
    for package in STACKS.iter().chain(&["falsify-qlora", "falsify"]) {
        if lock.contains(&format!("name = \"{package}\"\n")) {
            wrong.push(format!("Cargo.lock holds {package}"));
        }
    }
    let others = CRATES.iter().filter(|c| c.package != "falsify-core");
    for file in rust_files(&dir) {
        let text = read(&file);
        for c in others.clone() {
            for line in mentions(&text, c.lib) {
                wrong.push(format!("{}:{line}: names {}", file.display(), c.lib));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "the example subject leans on more than the core:\n{}",
        wrong.join("\n")
    );
}
