//! A kernel that faults (an illegal address) poisons its CUDA context, and
//! CUDA refuses all further work in that process. With each trial in a
//! process of its own (what the CLI and `cargo test` do), the faulting trial
//! costs exactly one `error` row and every other trial passes. In one process,
//! the run records the faulting trial as `error` with the CUDA error, the
//! remaining cuda trials as `error: context lost` without touching the
//! device, and still finishes every other trial and writes its CSV.
//!
//! Needs a GPU: run on the GPU machine with
//! `gpu_fault_isolation --ignored --test-threads 1`.

use falsify_core::contract::load_dir;
use falsify_core::report::{read_rows, FalsificationRow, Status};
use falsify_core::run::{plan, ChildCommand, Isolation, RunOptions};
use falsify_qlora::Qlora;

type Engine = falsify_core::run::Engine<Qlora>;
type TrialSpec = falsify_core::run::TrialSpec<Qlora>;

const CONTRACT: &str = r#"
metadata:
  id: fault-isolation
  version: 1.0.0
  description: A faulting kernel costs one trial, not the run.
requires: [cuda]
falsification_tests:
  - id: F-FAULT-001
    rule: Scale matches the reference
    prediction: rel-L2 <= 1e-5
    if_fails: The scale kernel is wrong
    mutant: out_of_bounds_write
    check:
      kind: op_parity
      op: scale
      shapes: [{rows: 4, cols: 33}]
  - id: F-FAULT-002
    rule: Residual add matches the reference after a fault was recovered
    prediction: rel-L2 <= 1e-5
    if_fails: The context was not replaced after the fault
    mutant: last_element_unwritten
    check:
      kind: op_parity
      op: residual_add
      shapes: [{rows: 4, cols: 33}, {rows: 1, cols: 896}]
  - id: F-CPU-001
    requires: []
    rule: CPU trials run on after the device is lost
    prediction: Rows of softmax sum to one
    if_fails: The fault stopped the run
    mutant: softmax_without_max_subtraction
    check:
      kind: property
      property: softmax_rows_sum_to_one
      cases: 16
      tolerance: 1.0e-12
"#;

/// A temp directory holding `yaml` as contract `stem`, its planned trials,
/// and an engine writing to `latest/` there. Needs a CUDA driver.
fn setup(stem: &str, yaml: &str) -> (tempfile::TempDir, Vec<TrialSpec>, Engine) {
    setup_with(stem, yaml, Isolation::InProcess)
}

/// [`setup`] with trials run as `isolation` says.
fn setup_with(
    stem: &str,
    yaml: &str,
    isolation: Isolation,
) -> (tempfile::TempDir, Vec<TrialSpec>, Engine) {
    assert!(
        qlora::gpu::driver_present(),
        "this test needs a CUDA driver"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let contracts = dir.path().join("contracts");
    std::fs::create_dir_all(&contracts).expect("mkdir");
    std::fs::write(contracts.join(format!("{stem}.yaml")), yaml).expect("write contract");
    let trials = plan::<Qlora>(load_dir::<Qlora>(&contracts).expect("the contract loads"));
    let engine = Engine::new(RunOptions {
        out_dir: dir.path().join("latest"),
        isolation,
        ..RunOptions::default()
    });
    (dir, trials, engine)
}

/// The `falsify` binary: where cargo built it; where cargo-nextest put it
/// when it runs an archive on a machine without a toolchain (it names the
/// extracted binary in `NEXTEST_BIN_EXE_falsify`); or beside this test when
/// the executables were staged by hand (`.gpu/bin/falsify-cli`, copied from
/// `target/release/falsify`).
fn falsify_exe() -> std::path::PathBuf {
    let built = std::path::PathBuf::from(env!("CARGO_BIN_EXE_falsify"));
    if built.exists() {
        return built;
    }
    let archived = std::env::var_os("NEXTEST_BIN_EXE_falsify").map(std::path::PathBuf::from);
    let staged = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|d| d.join("falsify-cli")));
    [archived, staged]
        .into_iter()
        .flatten()
        .find(|p| p.exists())
        .unwrap_or(built)
}

/// Named to sort first: with `--test-threads 1` it runs before the in-process
/// test below poisons this test process's own CUDA context (the engine reads
/// the GPU's facts in the parent before it starts trial processes).
#[test]
#[ignore = "needs a CUDA device: run on the GPU machine with --ignored"]
fn a_fault_in_a_trial_process_costs_exactly_one_row() {
    let command = ChildCommand {
        program: falsify_exe(),
        args: Vec::new(),
    };
    let (_dir, trials, engine) = setup_with("fault-isolation", CONTRACT, Isolation::Child(command));
    assert_eq!(engine.cuda_skip_reason(), None, "a usable device");
    let got: Vec<(String, Status, String)> = trials
        .iter()
        .map(|t| {
            let o = engine.run(t);
            (t.name.clone(), o.status, o.detail)
        })
        .collect();
    for (name, status, detail) in &got {
        println!("{name}: {status:?}: {detail}");
    }
    for (name, status, detail) in &got {
        let want = if name == "fault-isolation::F-FAULT-001::mutant" {
            Status::Error
        } else {
            Status::Passed
        };
        assert_eq!(*status, want, "{name}: {detail}");
    }
    let fault = &got[1].2;
    assert!(
        fault.contains("ILLEGAL_ADDRESS") || fault.contains("illegal"),
        "the error names the CUDA fault: {fault}"
    );
}

#[test]
#[ignore = "needs a CUDA device: run on the GPU machine with --ignored"]
fn a_faulting_kernel_costs_one_error_row_and_the_run_completes() {
    let (_dir, trials, engine) = setup("fault-isolation", CONTRACT);
    assert_eq!(engine.cuda_skip_reason(), None, "a usable device");

    let statuses: Vec<(String, Status, String)> = trials
        .iter()
        .map(|t| {
            let o = engine.run(t);
            (t.name.clone(), o.status, o.detail)
        })
        .collect();
    for (name, status, detail) in &statuses {
        println!("{name}: {status:?}: {detail}");
    }
    let expect = [
        ("fault-isolation::F-FAULT-001", Status::Passed),
        ("fault-isolation::F-FAULT-001::mutant", Status::Error),
        ("fault-isolation::F-FAULT-002", Status::Error),
        ("fault-isolation::F-FAULT-002::mutant", Status::Error),
        ("fault-isolation::F-CPU-001", Status::Passed),
        ("fault-isolation::F-CPU-001::mutant", Status::Passed),
    ];
    let got: Vec<(&str, Status)> = statuses.iter().map(|(n, s, _)| (n.as_str(), *s)).collect();
    assert_eq!(got, expect);
    let fault = &statuses[1].2;
    assert!(
        fault.contains("ILLEGAL_ADDRESS") || fault.contains("illegal"),
        "the error names the CUDA fault: {fault}"
    );
    for (name, _, detail) in &statuses[2..4] {
        assert!(detail.starts_with("context lost"), "{name}: {detail}");
    }

    let path = engine
        .write_reports(&trials)
        .expect("the report is written")
        .path;
    let rows: Vec<FalsificationRow> = read_rows(&path).expect("the report reads back");
    assert_eq!(rows.len(), 6);
    let faulted: Vec<&str> = rows
        .iter()
        .filter(|r| r.status == Status::Error && !r.detail.starts_with("context lost"))
        .map(|r| r.test_id.as_str())
        .collect();
    assert_eq!(faulted, ["F-FAULT-001::mutant"], "one trial faulted");
}

const TOO_BIG: &str = r#"
metadata:
  id: too-big
  version: 1.0.0
  description: A configuration that cannot fit is refused before allocating.
requires: [cuda]
falsification_tests:
  - id: F-TOO-BIG-001
    rule: qwen2.5-0.5b at batch 1024 trains within 1000 GiB
    prediction: It does not fit on one GPU, so it is skipped with the arithmetic
    if_fails: The memory estimate or the budget is wrong
    mutant: activations_doubled
    check:
      kind: memory_budget
      model: qwen2.5-0.5b
      batch: 1024
      max_gib: 1000.0
"#;

#[test]
#[ignore = "needs a CUDA device: run on the GPU machine with --ignored"]
fn a_configuration_that_does_not_fit_is_skipped_before_allocation() {
    let (_dir, trials, engine) = setup("too-big", TOO_BIG);
    let outcome = engine.run(&trials[0]);
    println!("{:?}: {}", outcome.status, outcome.detail);
    assert_eq!(outcome.status, Status::Skipped);
    assert!(
        outcome.detail.contains("needs") && outcome.detail.contains("GiB free"),
        "says what it needs and what the device has: {}",
        outcome.detail
    );
    // The device is still usable afterwards: nothing was half-allocated.
    assert_eq!(engine.cuda_skip_reason(), None);
}
