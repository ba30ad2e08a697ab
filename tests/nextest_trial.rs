//! The contract harness under cargo-nextest: each trial runs in the process
//! nextest started for it, and still costs exactly one row however it ends.
//!
//! The harness executable (`contracts`, built beside this test) is started
//! the way nextest starts it — `--exact "[cpu] name"` with `NEXTEST_RUN_ID`
//! set — on real contracts in a scratch directory. A trial past its timeout
//! is stopped and recorded as timed out; a trial whose process is killed
//! leaves the `error` row written before it started; a trial that finishes
//! replaces that row with its own. Two shards run this way, merged by
//! `falsify report --merge`, give the verdicts of one unsplit `cargo test`
//! run of the same contracts.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use falsify_core::harness::gpu_locks::{self, Access};
use falsify_core::report::{read_rows, FalsificationRow, Status};

const QUICK: &str = r#"
metadata:
  id: quick
  version: 1.0.0
  description: Cheap cpu trials.
falsification_tests:
  - id: F-Q-001
    rule: Softmax rows sum to one
    prediction: within 1e-12
    if_fails: softmax is wrong
    mutant: softmax_without_max_subtraction
    check: {kind: property, property: softmax_rows_sum_to_one, cases: 8, tolerance: 1.0e-12}
  - id: F-Q-002
    rule: Softmax rows sum to one
    prediction: within 1e-12
    if_fails: softmax is wrong
    mutant: softmax_without_max_subtraction
    check: {kind: property, property: softmax_rows_sum_to_one, cases: 8, tolerance: 1.0e-12}
"#;

/// A trial that takes seconds, with a timeout it cannot meet.
const SLOW: &str = r#"
metadata:
  id: slow
  version: 1.0.0
  description: A long cpu trial.
falsification_tests:
  - id: F-S-001
    rule: Training on tiny lowers the loss
    prediction: final <= 0.99 initial
    if_fails: the step is wrong
    mutant: adamw_update_sign_flipped
    timeout_s: 1
    check: {kind: loss_descent, model: tiny, steps: 500, max_fraction: 0.99}
  - id: F-S-002
    rule: Training on tiny lowers the loss
    prediction: final <= 0.99 initial
    if_fails: the step is wrong
    mutant: adamw_update_sign_flipped
    check: {kind: loss_descent, model: tiny, steps: 500, max_fraction: 0.99}
"#;

/// The `contracts` harness of this build: the newest `contracts-<hash>`
/// executable beside this test's own executable (`cargo test` and
/// `cargo nextest run` build it with this test; `--test nextest_trial`
/// alone does not).
fn harness() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    let deps = exe.parent().expect("deps folder");
    let mut found: Vec<(std::time::SystemTime, PathBuf)> = std::fs::read_dir(deps)
        .expect("read deps")
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned());
            name.is_some_and(|n| n.starts_with("contracts-") && !n.contains('.'))
        })
        .filter_map(|p| Some((p.metadata().ok()?.modified().ok()?, p)))
        .collect();
    found.sort();
    found
        .pop()
        .map(|(_, p)| p)
        .unwrap_or_else(|| panic!("no contracts harness in {}", deps.display()))
}

/// A scratch project: `contracts/<id>.yaml` for each (id, text).
fn project(contracts: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("contracts")).expect("mkdir");
    for (id, text) in contracts {
        std::fs::write(dir.path().join(format!("contracts/{id}.yaml")), text).expect("write");
    }
    dir
}

/// The harness in `dir`, without whatever nextest environment this test
/// itself runs under; `run_id` makes it a nextest test process.
fn command(dir: &Path, run_id: Option<&str>) -> Command {
    let mut cmd = Command::new(harness());
    // The trials' temporary folder, where they keep their GPU locks.
    cmd.current_dir(dir)
        .env("TMPDIR", dir)
        .env_remove("NEXTEST_RUN_ID")
        .env_remove("NEXTEST_TEST_GROUP")
        .env_remove("NEXTEST_TEST_GROUP_SLOT")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(id) = run_id {
        cmd.env("NEXTEST_RUN_ID", id);
    }
    cmd
}

/// Runs one trial as nextest would.
fn nextest_trial(dir: &Path, run_id: &str, name: &str) -> Output {
    command(dir, Some(run_id))
        .args(["--exact", &format!("[cpu] {name}"), "--nocapture"])
        .output()
        .expect("the harness runs")
}

fn rows(dir: &Path) -> Vec<FalsificationRow> {
    read_rows(&dir.join("reports/latest/falsification.csv")).expect("the report reads")
}

#[test]
fn a_trial_past_its_timeout_is_stopped_and_recorded() {
    let dir = project(&[("slow", SLOW)]);
    let started = Instant::now();
    let out = nextest_trial(dir.path(), "run-t", "slow::F-S-001");
    assert_eq!(out.status.code(), Some(124), "{out:?}");
    assert!(started.elapsed() < Duration::from_secs(20));
    let rows = rows(dir.path());
    assert_eq!(rows.len(), 1, "only the trial that ran: {rows:?}");
    let row = common::row_named(&rows, "F-S-001").clone();
    assert_eq!(row.status, Status::Error);
    assert!(row.detail.starts_with("timed out"), "{}", row.detail);
    assert_eq!(row.run_id, "run-t");
}

#[cfg(unix)]
#[test]
fn a_killed_trial_process_leaves_one_error_row_and_a_finished_one_replaces_it() {
    let dir = project(&[("slow", SLOW)]);
    let mut child = command(dir.path(), Some("run-k"))
        .args(["--exact", "[cpu] slow::F-S-002", "--nocapture"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let csv = dir.path().join("reports/latest/falsification.csv");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !csv.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().expect("SIGKILL");
    child.wait().expect("reap");
    let row = common::row_named(&rows(dir.path()), "F-S-002").clone();
    assert_eq!(row.status, Status::Error, "{row:?}");
    assert!(
        row.detail.contains("ended before it recorded a result"),
        "{}",
        row.detail
    );

    let out = nextest_trial(dir.path(), "run-k", "slow::F-S-002");
    assert!(out.status.success(), "{out:?}");
    let row = common::row_named(&rows(dir.path()), "F-S-002").clone();
    assert_eq!(row.status, Status::Passed, "{}", row.detail);
    let setup = row.setup_ms.expect("a trial that ran records its setup");
    assert!(setup > 0.0 && setup < 10_000.0, "{setup}");
}

/// The GPU locks of the trial processes of `dir` (the harness's
/// `command` makes `dir` their temporary folder), and the lock name of GPU 0.
fn gpu0_lock(dir: &Path) -> (PathBuf, Vec<String>) {
    (dir.join("falsify-gpu-locks"), vec![gpu_locks::gpu_name(0)])
}

/// Runs the cheap cpu trial as a test of nextest group `group`, slot 0,
/// while this test holds GPU 0's lock with `held`; lets the lock go after
/// `release_after`. Returns how long the trial's process took and its stderr.
fn trial_beside(
    dir: &Path,
    group: &str,
    held: Access,
    release_after: Duration,
) -> (Duration, String) {
    let (locks, gpu0) = gpu0_lock(dir);
    let (lock, _) = gpu_locks::acquire(&locks, &gpu0, held).expect("this test takes the lock");
    let releaser = std::thread::spawn(move || {
        std::thread::sleep(release_after);
        drop(lock);
    });
    let started = Instant::now();
    let out = command(dir, Some("run-locks"))
        .env("NEXTEST_TEST_GROUP", group)
        .env("NEXTEST_TEST_GROUP_SLOT", "0")
        .args(["--exact", "[cpu] quick::F-Q-001", "--nocapture"])
        .output()
        .expect("the harness runs");
    let took = started.elapsed();
    releaser.join().expect("the lock is released");
    assert!(out.status.success(), "{out:?}");
    (took, String::from_utf8_lossy(&out.stderr).into_owned())
}

/// A trial that times its GPU (`gpu`) waits while another process holds
/// that GPU's lock, shared or not, and does not count the wait as its
/// setup; one that shares its GPU (`gpu-shared`) or starts untimed ranks
/// on every GPU (`gpu-ranks`) waits only for a timed one.
#[test]
fn a_timed_trial_waits_for_every_other_trial_on_its_gpu_and_others_only_for_timed_ones() {
    let dir = project(&[("quick", QUICK)]);
    let long = Duration::from_millis(1500);
    for (group, held, waits) in [
        ("gpu", Access::Shared, true),
        ("gpu-shared", Access::Shared, false),
        ("gpu-shared", Access::Exclusive, true),
        ("gpu-ranks", Access::Exclusive, true),
    ] {
        let (took, stderr) = trial_beside(dir.path(), group, held, long);
        let case = format!("{group} beside {held:?}: {took:?}\n{stderr}");
        if waits {
            assert!(took >= Duration::from_millis(1200), "{case}");
            assert!(
                stderr.contains("waited") && stderr.contains("GPU(s) [0]"),
                "{case}"
            );
            let row = rows(dir.path()).pop().expect("a row");
            let setup = row.setup_ms.expect("a trial that ran records its setup");
            assert!(
                setup < 1000.0,
                "the wait counted as setup: {setup} ms; {case}"
            );
        } else {
            assert!(took < Duration::from_millis(1200), "{case}");
            assert!(!stderr.contains("waited"), "{case}");
        }
    }
}

#[test]
fn two_nextest_shards_merge_into_the_verdicts_of_one_run() {
    let whole = project(&[("quick", QUICK)]);
    let out = command(whole.path(), None)
        .output()
        .expect("cargo test mode");
    assert!(out.status.success(), "{out:?}");
    let expected = rows(whole.path());
    assert_eq!(expected.len(), 4);
    let selected = |dir: &Path| {
        falsify_core::report::meta::RunMeta::read_json(&dir.join("reports/latest"))
            .expect("run.json reads")
            .expect("run.json exists")
            .selected
    };
    let all: Vec<String> = expected
        .iter()
        .map(|r| format!("quick::{}", r.test_id))
        .collect();
    assert_eq!(
        selected(whole.path()),
        all,
        "cargo test records its selection"
    );

    let shards = [
        ("shard-1", ["quick::F-Q-001", "quick::F-Q-002::mutant"]),
        ("shard-2", ["quick::F-Q-002", "quick::F-Q-001::mutant"]),
    ];
    let mut dirs = Vec::new();
    for (run_id, trials) in shards {
        let shard = project(&[("quick", QUICK)]);
        for trial in trials {
            let out = nextest_trial(shard.path(), run_id, trial);
            assert!(out.status.success(), "{trial}: {out:?}");
        }
        assert_eq!(rows(shard.path()).len(), 2, "{run_id} ran its half");
        let mut half: Vec<String> = trials.iter().map(|t| t.to_string()).collect();
        half.sort();
        assert_eq!(
            selected(shard.path()),
            half,
            "{run_id}: each process adds its trial to the selection"
        );
        dirs.push(shard);
    }
    let merged = whole.path().join("merged");
    let out = Command::new(env!("CARGO_BIN_EXE_falsify"))
        .arg("report")
        .arg("--baseline")
        .arg(whole.path().join("reports/latest"))
        .arg("--current")
        .arg(&merged)
        .arg("--merge")
        .args(dirs.iter().map(|d| d.path().join("reports/latest")))
        .output()
        .expect("falsify report runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{out:?}");
    assert!(stdout.contains("merged 2 run(s)"), "{stdout}");
    let got: Vec<FalsificationRow> = read_rows(&merged.join("falsification.csv")).expect("reads");
    let verdicts = |rows: &[FalsificationRow]| -> Vec<(String, Status)> {
        rows.iter().map(|r| (r.test_id.clone(), r.status)).collect()
    };
    assert_eq!(verdicts(&got), verdicts(&expected));
    let mut run_ids: Vec<&str> = got.iter().map(|r| r.run_id.as_str()).collect();
    run_ids.sort_unstable();
    run_ids.dedup();
    assert_eq!(
        run_ids.len(),
        2,
        "each row keeps its shard's run: {run_ids:?}"
    );
}

/// The `gpu` test group's slot picks the CUDA device; `gpu-shared` trials
/// run on the slot modulo the GPUs (device 0 here, where no driver
/// answers); outside both it is device 0. The run record names the device ordinal the
/// engine was given.
#[test]
fn the_gpu_group_slot_is_the_device_ordinal() {
    let dir = project(&[("quick", QUICK)]);
    let shared_ordinal = if falsify_core::run::driver_present() {
        None
    } else {
        Some(0)
    };
    for (group, slot, ordinal) in [
        ("gpu", "1", Some(1)),
        ("gpu-shared", "5", shared_ordinal),
        ("@global", "none", Some(0)),
    ] {
        let Some(ordinal) = ordinal else { continue };
        let out = command(dir.path(), Some("run-slot"))
            .args(["--exact", "[cpu] quick::F-Q-001"])
            .env("NEXTEST_TEST_GROUP", group)
            .env("NEXTEST_TEST_GROUP_SLOT", slot)
            .output()
            .expect("the harness runs");
        assert!(out.status.success(), "{out:?}");
        let meta =
            falsify_core::report::meta::RunMeta::read_json(&dir.path().join("reports/latest"))
                .expect("run.json reads")
                .expect("run.json exists");
        assert!(
            meta.options.gpu.contains(&format!("ordinal: {ordinal},")),
            "{group} slot {slot}: {}",
            meta.options.gpu
        );
    }
}

/// A contract whose `if_fails` holds terminal controls (clear the line,
/// return, recolour), falsified in a cheap cpu trial.
const HOSTILE: &str = r#"
metadata:
  id: hostile
  version: 1.0.0
  description: A contract whose text holds terminal controls.
falsification_tests:
  - id: F-H-001
    rule: Training on tiny lowers the loss a hundredfold in five steps
    prediction: final <= 0.01 initial
    if_fails: "\e[2K\rPASSED all good\e[32m"
    mutant: adamw_update_sign_flipped
    check: {kind: loss_descent, model: tiny, steps: 5, max_fraction: 0.01}
"#;

/// libtest's message for a falsified trial quotes the contract's
/// `if_fails` with its control characters escaped, so the contract cannot
/// overwrite or recolour what the runner prints about it.
#[test]
fn a_falsified_trials_message_escapes_contract_text() {
    let dir = project(&[("hostile", HOSTILE)]);
    let out = command(dir.path(), None)
        .args(["--exact", "[cpu] hostile::F-H-001"])
        .output()
        .expect("the harness runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{stdout}");
    assert!(
        stdout.contains("falsified: ") && stdout.contains("\\u{1b}[2K\\rPASSED all good"),
        "{stdout}"
    );
    assert!(!stdout.contains(['\u{1b}', '\r']), "{stdout:?}");
}
