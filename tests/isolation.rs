//! One trial, one process: a trial whose process aborts, hangs past its
//! timeout or exits without a result costs that trial one `error` row naming
//! the cause, and every other trial still runs and is recorded. An
//! interrupted run (SIGTERM) keeps the rows of the trials that finished and
//! says in run.json that it is incomplete.
//!
//! The crash and the hang are real processes: the trial command is a shell
//! that aborts or sleeps for one chosen trial and runs the real `falsify`
//! trial process for the others.

mod common;
mod procs;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use falsify_core::contract::load_dir;
use falsify_core::report::{read_rows, FalsificationRow, Status};
use falsify_core::run::{plan, ChildCommand, Isolation, RunMeta, RunOptions, RUN_JSON};
use falsify_qlora::Qlora;

type Engine = falsify_core::run::Engine<Qlora>;

/// Three cheap cpu trials (and their self-tests); `F-ISO-002` is the one the
/// trial command breaks.
const CONTRACT: &str = r#"
metadata:
  id: isolation
  version: 1.0.0
  description: One broken trial costs one row.
falsification_tests:
  - id: F-ISO-001
    rule: Softmax rows sum to one
    prediction: within 1e-12
    if_fails: softmax is wrong
    mutant: softmax_without_max_subtraction
    check: {kind: property, property: softmax_rows_sum_to_one, cases: 8, tolerance: 1.0e-12}
  - id: F-ISO-002
    rule: Softmax rows sum to one (the trial the command breaks)
    prediction: within 1e-12
    if_fails: softmax is wrong
    mutant: softmax_without_max_subtraction
    timeout_s: 2
    check: {kind: property, property: softmax_rows_sum_to_one, cases: 8, tolerance: 1.0e-12}
  - id: F-ISO-003
    rule: Softmax rows sum to one
    prediction: within 1e-12
    if_fails: softmax is wrong
    mutant: softmax_without_max_subtraction
    check: {kind: property, property: softmax_rows_sum_to_one, cases: 8, tolerance: 1.0e-12}
"#;

fn falsify_exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_falsify"))
}

/// A temp dir with the contract in `contracts/isolation.yaml`.
fn contracts_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let contracts = dir.path().join("contracts");
    std::fs::create_dir_all(&contracts).expect("mkdir");
    std::fs::write(contracts.join("isolation.yaml"), CONTRACT).expect("write");
    dir
}

/// A trial command that runs `action` (shell) for trial `F-ISO-002` and the
/// real trial process for every other trial. The engine appends the child
/// flag and writes the JSON request, which names the trial, to stdin; the
/// script reads it and hands it on.
fn breaking(action: &str) -> ChildCommand {
    let script = format!(
        r#"exe="$1"; shift; req=$(cat); case "$req" in *'"trial":"isolation::F-ISO-002"'*) {action};; esac; printf '%s' "$req" | "$exe" "$@""#
    );
    ChildCommand {
        program: PathBuf::from("sh"),
        args: vec![
            "-c".into(),
            script.into(),
            "sh".into(),
            falsify_exe().into(),
        ],
    }
}

/// Runs every trial of the contract in `dir` with `command`; returns the rows.
fn run_with(dir: &Path, command: ChildCommand) -> Vec<FalsificationRow> {
    let trials =
        plan::<Qlora>(load_dir::<Qlora>(&dir.join("contracts")).expect("the contract loads"));
    let engine = Engine::new(RunOptions {
        out_dir: dir.join("latest"),
        isolation: Isolation::Child(command),
        ..RunOptions::default()
    });
    for t in &trials {
        engine.run(t);
    }
    engine
        .write_reports(&trials)
        .expect("the report is written");
    read_rows(&dir.join("latest/falsification.csv")).expect("the CSV reads back")
}

/// All but the broken trial passed; the broken one has exactly one error row.
fn only_the_broken_trial_failed(rows: &[FalsificationRow]) -> String {
    assert_eq!(rows.len(), 6, "one row per trial");
    for id in [
        "F-ISO-001",
        "F-ISO-003",
        "F-ISO-001::mutant",
        "F-ISO-003::mutant",
    ] {
        assert_eq!(common::row_named(rows, id).status, Status::Passed, "{id}");
    }
    let broken = common::row_named(rows, "F-ISO-002");
    assert_eq!(broken.status, Status::Error, "{}", broken.detail);
    broken.detail.clone()
}

#[cfg(unix)]
#[test]
fn an_aborting_trial_costs_one_error_row() {
    let dir = contracts_dir();
    let rows = run_with(dir.path(), breaking("kill -ABRT $$"));
    let detail = only_the_broken_trial_failed(&rows);
    assert!(
        detail.contains("signal 6") && detail.contains("SIGABRT"),
        "{detail}"
    );
}

#[cfg(unix)]
#[test]
fn a_segfaulting_trial_costs_one_error_row() {
    let dir = contracts_dir();
    let rows = run_with(dir.path(), breaking("kill -SEGV $$"));
    let detail = only_the_broken_trial_failed(&rows);
    assert!(detail.contains("SIGSEGV"), "{detail}");
}

#[test]
fn a_hanging_trial_is_stopped_at_its_timeout() {
    let dir = contracts_dir();
    let started = std::time::Instant::now();
    let rows = run_with(dir.path(), breaking("sleep 60"));
    let detail = only_the_broken_trial_failed(&rows);
    assert!(
        detail.contains("timed out") && detail.contains("2 s"),
        "{detail}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(40),
        "the hang was not cut short"
    );
}

#[test]
fn a_trial_process_without_a_result_costs_one_error_row() {
    let dir = contracts_dir();
    let rows = run_with(dir.path(), breaking("exit 3"));
    let detail = only_the_broken_trial_failed(&rows);
    assert!(detail.contains("without a result"), "{detail}");
}

/// `falsify run` stopped with SIGTERM while a trial hangs, into a folder
/// that holds an earlier complete run: the trials that finished have rows of
/// this run, the others keep the earlier run's rows (and run id), run.json
/// says the run is incomplete and lists every trial it selected, and the
/// exit code is 130.
#[cfg(target_os = "linux")]
#[test]
fn an_interrupted_run_keeps_the_finished_trials() {
    let dir = contracts_dir();
    let out = dir.path().join("latest");
    let earlier = run_with(dir.path(), breaking("true"));
    // A contract whose second test trains for far longer than the test waits.
    let slow = CONTRACT
        .replace("timeout_s: 2", "timeout_s: 600")
        .replace(
            "check: {kind: property, property: softmax_rows_sum_to_one, cases: 8, tolerance: 1.0e-12}\n  - id: F-ISO-003",
            "check: {kind: loss_descent, model: tiny, steps: 2000, max_fraction: 0.9}\n  - id: F-ISO-003",
        );
    assert_ne!(slow, CONTRACT);
    std::fs::write(dir.path().join("contracts/isolation.yaml"), slow).expect("write");
    let mut child = Command::new(falsify_exe())
        .arg("run")
        .arg("--contracts")
        .arg(dir.path().join("contracts"))
        .arg("--out")
        .arg(&out)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("falsify run starts");
    // Stop the run once F-ISO-001 and its self-test have finished and the
    // trial process of F-ISO-002 (2,000 reference steps, many seconds of
    // work) runs: the first trial process of this run that lives for 2 s
    // (the others take milliseconds).
    assert!(
        procs::settled_trial_process(
            child.id(),
            Duration::from_millis(2000),
            Duration::from_secs(60)
        )
        .is_some(),
        "the trial process of F-ISO-002 never started"
    );
    let killed = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status()
        .expect("kill runs");
    assert!(killed.success());
    let status = child.wait().expect("falsify run ends");
    assert_eq!(status.code(), Some(130), "{status}");
    let record = std::fs::read_to_string(out.join(RUN_JSON)).expect("run.json");
    let meta: RunMeta = serde_json::from_str(&record).expect("run.json parses");
    assert!(
        meta.incomplete
            .as_deref()
            .is_some_and(|w| w.contains("interrupted")),
        "{record}"
    );
    let all: Vec<String> = earlier
        .iter()
        .map(|r| format!("isolation::{}", r.test_id))
        .collect();
    assert_eq!(meta.selected, all, "every trial the run selected");
    let rows: Vec<FalsificationRow> =
        read_rows(&out.join("falsification.csv")).expect("the CSV reads back");
    let this_run: Vec<&str> = rows
        .iter()
        .filter(|r| r.run_id == meta.run_id)
        .map(|r| r.test_id.as_str())
        .collect();
    assert_eq!(
        this_run,
        ["F-ISO-001", "F-ISO-001::mutant"],
        "finished trials only"
    );
    for id in [
        "F-ISO-002",
        "F-ISO-002::mutant",
        "F-ISO-003",
        "F-ISO-003::mutant",
    ] {
        assert_eq!(
            common::row_named(&rows, id),
            common::row_named(&earlier, id),
            "{id}: the earlier run's row, run id included"
        );
    }
}
