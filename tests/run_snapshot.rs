//! A run is a snapshot: the contracts are read once, when the run is
//! planned, and each trial process is handed the text its trial comes from
//! (through a pipe, so the text is not bounded by what a command line can
//! carry). Editing or deleting a contract file while the
//! run goes on changes nothing for that run; every row records the hash of
//! the text the run read.

use std::path::{Path, PathBuf};

use falsify_core::contract::load_dir;
use falsify_core::report::{read_rows, FalsificationRow, Status};
use falsify_core::run::{plan, ChildCommand, Isolation, RunOptions};
use falsify_qlora::Qlora;
use sha2::{Digest, Sha256};

type Engine = falsify_core::run::Engine<Qlora>;

const CONTRACT: &str = r#"
metadata:
  id: snap
  version: 1.0.0
  description: Two cheap cpu trials.
falsification_tests:
  - id: F-SNAP-001
    rule: Softmax rows sum to one
    prediction: within 1e-12
    if_fails: softmax is wrong
    mutant: softmax_without_max_subtraction
    check: {kind: property, property: softmax_rows_sum_to_one, cases: 8, tolerance: 1.0e-12}
  - id: F-SNAP-002
    rule: Softmax is shift invariant
    prediction: within 1e-9
    if_fails: softmax is wrong
    mutant: softmax_without_max_subtraction
    check: {kind: property, property: softmax_shift_invariant, cases: 8, tolerance: 1.0e-9}
"#;

/// The same contract as edited during the run: a new version, the first
/// test gone, the second one's mutant a fault its check cannot see (its
/// self-test would be falsified).
const EDITED: &str = r#"
metadata:
  id: snap
  version: 2.0.0
  description: Edited while the run went on.
falsification_tests:
  - id: F-SNAP-002
    rule: Softmax is shift invariant
    prediction: within 1e-9
    if_fails: softmax is wrong
    mutant: adamw_update_sign_flipped
    check: {kind: property, property: softmax_shift_invariant, cases: 8, tolerance: 1.0e-9}
"#;

fn hash(text: &str) -> String {
    let digest = Sha256::digest(text.as_bytes());
    digest.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

fn child_engine(out: &Path) -> Engine {
    Engine::new(RunOptions {
        out_dir: out.to_path_buf(),
        isolation: Isolation::Child(ChildCommand {
            program: PathBuf::from(env!("CARGO_BIN_EXE_falsify")),
            args: Vec::new(),
        }),
        ..RunOptions::default()
    })
}

/// Plans the contract `text` as `contracts/<id>.yaml` in `dir`, runs every
/// trial in a trial process after `between` (given the file's path), and
/// returns the rows written.
fn run(dir: &Path, id: &str, text: &str, between: impl FnOnce(&Path)) -> Vec<FalsificationRow> {
    let contracts = dir.join("contracts");
    std::fs::create_dir_all(&contracts).expect("mkdir");
    let file = contracts.join(format!("{id}.yaml"));
    std::fs::write(&file, text).expect("write");
    let trials = plan::<Qlora>(load_dir::<Qlora>(&contracts).expect("the contract loads"));
    between(&file);
    let out = dir.join("latest");
    let engine = child_engine(&out);
    for t in &trials {
        engine.run(t);
    }
    engine
        .write_reports(&trials)
        .expect("the report is written");
    read_rows(&out.join("falsification.csv")).expect("the report reads")
}

#[test]
fn a_contract_edited_during_the_run_changes_nothing_for_that_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rows = run(dir.path(), "snap", CONTRACT, |file| {
        std::fs::write(file, EDITED).expect("edit the contract");
    });
    let got: Vec<(&str, Status)> = rows
        .iter()
        .map(|r| (r.test_id.as_str(), r.status))
        .collect();
    assert_eq!(
        got,
        [
            ("F-SNAP-001", Status::Passed),
            ("F-SNAP-001::mutant", Status::Passed),
            ("F-SNAP-002", Status::Passed),
            ("F-SNAP-002::mutant", Status::Passed),
        ],
        "{rows:#?}"
    );
    for r in &rows {
        assert_eq!(r.contract_version, "1.0.0", "{}", r.test_id);
        assert_eq!(r.contract_hash, hash(CONTRACT), "{}", r.test_id);
    }
}

#[test]
fn a_contract_deleted_during_the_run_still_runs_as_read() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rows = run(dir.path(), "snap", CONTRACT, |file| {
        std::fs::remove_file(file).expect("delete the contract");
    });
    assert_eq!(rows.len(), 4);
    assert!(rows.iter().all(|r| r.status == Status::Passed), "{rows:#?}");
}

/// A contract larger than one command-line argument may be (128 KiB on
/// Linux) reaches its trial process all the same: the process gets the
/// text through a pipe. (Ids themselves are bounded at load time.)
#[test]
fn a_contract_longer_than_an_argument_runs_in_its_trial_process() {
    let long_rule = format!("rule: Softmax rows sum to one {}", "x".repeat(140 * 1024));
    let text = CONTRACT.replacen("rule: Softmax rows sum to one", &long_rule, 1);
    assert!(text.len() > 140 * 1024);
    let dir = tempfile::tempdir().expect("tempdir");
    let rows = run(dir.path(), "snap", &text, |_| {});
    let first = rows
        .iter()
        .find(|r| r.test_id == "F-SNAP-001")
        .expect("the long contract's row");
    assert_eq!(first.status, Status::Passed, "{}", first.detail);
    assert_eq!(first.contract_hash, hash(&text));
}
