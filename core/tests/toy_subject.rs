//! A subject with no GPU code, through the core alone: its contracts load
//! with located errors, its trials run in-process (cpu: for real, cuda:
//! skipped with the reason), its mutant is caught, and the reports name it.

mod toy;

use std::path::Path;

use falsify_core::contract::{load_dir, parse};
use falsify_core::report::{read_rows, FalsificationRow, Status};
use falsify_core::run::{plan, Engine, RunOptions};
use falsify_core::subject::{reference_markdown, KindSet};
use falsify_core::Error;
use toy::Toy;

fn contracts() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/toy/contracts")
}

#[test]
fn the_toy_runs_its_trials_and_records_them_as_its_own() {
    let out = tempfile::tempdir().unwrap();
    let trials = plan::<Toy>(load_dir::<Toy>(&contracts()).unwrap());
    let names: Vec<&str> = trials.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "toy-sum-v1::T-SUM-001",
            "toy-sum-v1::T-SUM-001::mutant",
            "toy-sum-v1::T-SUM-002",
            "toy-sum-v1::T-SUM-002::mutant",
        ]
    );
    let engine = Engine::<Toy>::new(RunOptions {
        out_dir: out.path().to_path_buf(),
        ..RunOptions::default()
    });
    let statuses: Vec<Status> = trials.iter().map(|t| engine.run(t).status).collect();
    use Status::{Passed, Skipped};
    assert_eq!(statuses, [Passed, Passed, Skipped, Skipped]);
    let skipped = &engine.rows()[2].detail;
    assert!(
        skipped == "no CUDA driver"
            || skipped.starts_with("no usable CUDA device: the toy has no device"),
        "{skipped}"
    );
    engine.write_reports(&trials).unwrap();
    let rows: Vec<FalsificationRow> = read_rows(&out.path().join("falsification.csv")).unwrap();
    assert_eq!(rows.len(), 4);
    assert!(
        rows[1].detail.starts_with("mutant `sum_drops_last` caught"),
        "{}",
        rows[1].detail
    );
    let record = falsify_core::report::meta::RunMeta::read_json(out.path())
        .unwrap()
        .unwrap();
    assert_eq!(record.subject, "toy");
}

#[test]
fn the_toys_contracts_parse_as_strictly_as_any() {
    let bad = "metadata: {id: bad, version: '1', description: d}\nfalsification_tests:\n  - id: T-1\n    rule: r\n    prediction: p\n    if_fails: f\n    mutant: sum_drops_last\n    check: {kind: product, values: [1]}\n";
    let e = parse::<Toy>(Path::new("contracts/bad.yaml"), bad).unwrap_err();
    let Error::Contract { line, message, .. } = &e else {
        panic!("{e}")
    };
    assert_eq!(*line, 8, "{e}");
    assert!(
        message.contains("unknown check kind `product`; known kinds: sum"),
        "{e}"
    );
    let bad_mutant = bad
        .replace("kind: product", "kind: sum, expect: 1")
        .replace("sum_drops_last", "sum_twice");
    let e = parse::<Toy>(Path::new("contracts/bad.yaml"), &bad_mutant).unwrap_err();
    assert!(e.to_string().contains("unknown variant `sum_twice`"), "{e}");
    assert!(e.to_string().starts_with("contracts/bad.yaml:7:"), "{e}");
    let empty = bad.replace(
        "kind: product, values: [1]",
        "kind: sum, values: [], expect: 0",
    );
    let e = parse::<Toy>(Path::new("contracts/bad.yaml"), &empty).unwrap_err();
    assert!(e.to_string().contains("values: at least one number"), "{e}");
}

/// The toy has no training workload: the core's driver-observed kinds are
/// refused, located at the check's `kind`.
#[test]
fn a_subject_without_a_workload_cannot_use_the_cores_driver_kinds() {
    let text = "metadata: {id: bad, version: '1', description: d}\nrequires: [cuda]\nfalsification_tests:\n  - id: T-1\n    rule: r\n    prediction: p\n    if_fails: f\n    mutant: driver_older_target_module\n    check:\n      kind: driver_target_parity\n      model: tiny\n      steps: 2\n";
    let e = parse::<Toy>(Path::new("contracts/bad.yaml"), text).unwrap_err();
    let Error::Contract { line, message, .. } = &e else {
        panic!("{e}")
    };
    assert_eq!(*line, 10, "{e}");
    assert!(
        message.contains(
            "subject `toy` has no training workload, so the core's driver-observed kinds cannot \
             run for it"
        ),
        "{e}"
    );
}

#[test]
fn the_toys_kinds_are_documented_like_any() {
    let doc = reference_markdown::<toy::ToyKinds>();
    assert!(doc.starts_with("#### `sum`\n"), "{doc}");
    assert!(
        doc.contains("Minimal check: `{kind: sum, values: [1, 2], expect: 3}`."),
        "{doc}"
    );
    assert!(doc.contains("| `tolerance` | `1e-9` | >= 0 |"), "{doc}");
    assert_eq!(toy::ToyKinds::KINDS.len(), 1);
}
