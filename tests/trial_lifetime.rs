//! No trial outlives its run: `falsify run` killed with SIGKILL (nothing
//! of it runs after that signal, no handler, no cleanup) takes its running
//! trial process with it, within moments, instead of leaving it to finish
//! its work on a CPU (or a GPU) nobody reads.
//!
//! The data-parallel ranks are started the same way (`child::Piped`), so
//! the same holds for them; they need GPUs and are not started here.

#![cfg(target_os = "linux")]

mod procs;

use std::process::{Command, Stdio};
use std::time::Duration;

/// A trial far longer than the test waits for it to end (2,000 reference
/// training steps: tens of seconds).
const ENDLESS: &str = r#"
metadata:
  id: endless
  version: 1.0.0
  description: A trial far longer than the test waits.
falsification_tests:
  - id: F-E-001
    rule: Training on tiny lowers the loss
    prediction: final <= 0.9 initial
    if_fails: the step is wrong
    mutant: adamw_update_sign_flipped
    timeout_s: 3600
    check: {kind: loss_descent, model: tiny, steps: 2000, max_fraction: 0.9}
"#;

#[test]
fn a_trial_process_dies_with_its_killed_run() {
    let root = tempfile::tempdir().expect("tempdir");
    let contracts = root.path().join("contracts");
    std::fs::create_dir_all(&contracts).expect("mkdir");
    std::fs::write(contracts.join("endless.yaml"), ENDLESS).expect("write");
    let mut run = Command::new(env!("CARGO_BIN_EXE_falsify"))
        .arg("run")
        .arg("--contracts")
        .arg(&contracts)
        .arg("--out")
        .arg(root.path().join("latest"))
        .arg("--no-mutants")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("falsify run starts");
    let trial = procs::settled_trial_process(
        run.id(),
        Duration::from_millis(300),
        Duration::from_secs(60),
    );
    run.kill().expect("SIGKILL the run");
    run.wait().expect("reap the run");
    let trial = trial.expect("the trial process never started");
    let gone = procs::gone_within(trial, Duration::from_secs(5));
    if !gone {
        procs::kill(trial);
    }
    assert!(gone, "trial process {trial} outlived its killed run");
}
