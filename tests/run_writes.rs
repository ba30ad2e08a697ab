//! Writing results never destroys results, and a run refuses up front what
//! it cannot do: `falsify run`, the real binary, into scratch folders.
//!
//! - an existing `falsification.csv` that does not parse (a hand-edited
//!   cell, a row missing fields, a torn last line) is kept beside the new
//!   one under another name, and the run says so on stderr;
//! - two contract trees run into one folder keep the rows of both;
//! - an `--out` that cannot be written is refused before any trial runs,
//!   with a message that names the folder and says why once;
//! - when writing fails at the end anyway, the rows go to a fallback folder
//!   the error names, and the summary is still printed;
//! - `--inject` of a test whose own trial this run does not run is refused;
//! - contract text reaches the terminal with its control characters escaped.

mod procs;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use falsify_core::report::meta::RunMeta;
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
    rule: Softmax is shift invariant
    prediction: within 1e-9
    if_fails: softmax is wrong
    mutant: softmax_without_max_subtraction
    check: {kind: property, property: softmax_shift_invariant, cases: 8, tolerance: 1.0e-9}
"#;

const OTHER: &str = r#"
metadata:
  id: other
  version: 1.0.0
  description: A contract of another tree.
falsification_tests:
  - id: F-O-001
    rule: Softmax rows sum to one
    prediction: within 1e-12
    if_fails: softmax is wrong
    mutant: softmax_without_max_subtraction
    check: {kind: property, property: softmax_rows_sum_to_one, cases: 8, tolerance: 1.0e-12}
"#;

/// One cpu trial of seconds (300 reference training steps).
const SLOW: &str = r#"
metadata:
  id: slow
  version: 1.0.0
  description: A long cpu trial.
falsification_tests:
  - id: F-S-001
    rule: Training on tiny lowers the loss
    prediction: final <= 0.9 initial
    if_fails: the step is wrong
    mutant: adamw_update_sign_flipped
    timeout_s: 600
    check: {kind: loss_descent, model: tiny, steps: 300, max_fraction: 0.9}
"#;

/// A contract tree `name` in `root` with one file per (id, text).
fn tree(root: &Path, name: &str, contracts: &[(&str, &str)]) -> PathBuf {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).expect("mkdir");
    for (id, text) in contracts {
        std::fs::write(dir.join(format!("{id}.yaml")), text).expect("write contract");
    }
    dir
}

fn falsify() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_falsify"));
    cmd.stdin(Stdio::null());
    cmd
}

/// `falsify run --contracts <contracts> --out <out> <args>`.
fn run(contracts: &Path, out: &Path, args: &[&str]) -> Output {
    falsify()
        .arg("run")
        .arg("--contracts")
        .arg(contracts)
        .arg("--out")
        .arg(out)
        .args(args)
        .output()
        .expect("falsify runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn rows(out: &Path) -> Vec<FalsificationRow> {
    read_rows(&out.join("falsification.csv")).expect("the report reads")
}

/// The files in `dir` whose names start with `prefix`.
fn named(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("read dir")
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(prefix))
        })
        .collect();
    found.sort();
    found
}

/// Where each data record of `csv` starts (byte offsets).
fn record_starts(csv: &str) -> Vec<usize> {
    let mut reader = csv::Reader::from_reader(csv.as_bytes());
    let mut starts = Vec::new();
    let mut record = csv::StringRecord::new();
    loop {
        let at = reader.position().byte() as usize;
        if !reader.read_record(&mut record).expect("the report parses") {
            return starts;
        }
        starts.push(at);
    }
}

/// Damage done to a complete `falsification.csv`, as a person or a crash
/// would do it.
fn damaged(csv: &str, how: &str) -> String {
    let starts = record_starts(csv);
    let last = *starts.last().expect("rows");
    match how {
        // A status cell edited by hand: the report's statuses are lower case.
        "cell" => csv.replacen(",passed,", ",Passed,", 1),
        // The first row without its last two fields.
        "fields" => {
            let mut reader = csv::Reader::from_reader(csv.as_bytes());
            let mut writer = csv::WriterBuilder::new()
                .flexible(true)
                .from_writer(Vec::new());
            writer
                .write_record(reader.headers().expect("header"))
                .expect("write");
            for (i, record) in reader.records().enumerate() {
                let record = record.expect("record");
                let keep = if i == 0 {
                    record.len() - 2
                } else {
                    record.len()
                };
                writer
                    .write_record(record.iter().take(keep))
                    .expect("write");
            }
            String::from_utf8(writer.into_inner().expect("flush")).expect("utf-8")
        }
        // The last row torn early (its later fields gone), or in its last
        // field: a crash mid-append leaves either, without the final newline.
        "torn" => csv[..last + 40].to_string(),
        "torn-end" => csv[..csv.len() - 3].to_string(),
        _ => unreachable!("{how}"),
    }
}

/// A `falsification.csv` that does not parse is kept beside the new one,
/// byte for byte, and the run says on stderr where it went; the new report
/// holds the rows of the run.
#[test]
fn an_unreadable_report_is_kept_aside_and_said() {
    for how in ["cell", "fields", "torn", "torn-end"] {
        let root = tempfile::tempdir().expect("tempdir");
        let contracts = tree(root.path(), "contracts", &[("quick", QUICK)]);
        let out = root.path().join("latest");
        let first = run(&contracts, &out, &[]);
        assert!(first.status.success(), "{how}: {first:?}");
        let csv = out.join("falsification.csv");
        let complete = std::fs::read_to_string(&csv).expect("the report");
        let broken = damaged(&complete, how);
        assert_ne!(broken, complete, "{how}");
        std::fs::write(&csv, &broken).expect("damage the report");

        let second = run(&contracts, &out, &["--filter", "F-Q-001"]);
        let stderr = text(&second.stderr);
        assert!(second.status.success(), "{how}: {second:?}");
        let aside = named(&out, "falsification.csv.unreadable-");
        assert_eq!(aside.len(), 1, "{how}: one file kept aside: {stderr}");
        assert_eq!(
            std::fs::read_to_string(&aside[0]).expect("the kept file"),
            broken,
            "{how}: kept byte for byte"
        );
        let name = aside[0].file_name().expect("name").to_string_lossy();
        assert!(
            stderr.contains(name.as_ref()) && stderr.contains("does not parse"),
            "{how}: stderr must say where the old report went: {stderr}"
        );
        let ids: Vec<String> = rows(&out).into_iter().map(|r| r.test_id).collect();
        assert_eq!(ids, ["F-Q-001", "F-Q-001::mutant"], "{how}");
    }
}

/// `falsify run`, then `falsify run --contracts <another tree>` into the
/// same folder (the README's variations in order): both runs' rows stay,
/// each with its own run id, and the second run says it kept rows it does
/// not own.
#[test]
fn two_contract_trees_into_one_folder_keep_both() {
    let root = tempfile::tempdir().expect("tempdir");
    let first_tree = tree(root.path(), "contracts", &[("quick", QUICK)]);
    let second_tree = tree(root.path(), "examples", &[("other", OTHER)]);
    let out = root.path().join("latest");
    assert!(run(&first_tree, &out, &[]).status.success());
    let first = rows(&out);
    assert_eq!(first.len(), 4);

    let second = run(&second_tree, &out, &[]);
    assert!(second.status.success(), "{second:?}");
    let after = rows(&out);
    assert_eq!(after.len(), 6, "every row of both runs: {after:?}");
    for row in &first {
        assert!(
            after.contains(row),
            "the first run's row is unchanged: {row:?}"
        );
    }
    let other: Vec<&FalsificationRow> = after.iter().filter(|r| r.contract == "other").collect();
    assert_eq!(other.len(), 2);
    assert_ne!(other[0].run_id, first[0].run_id, "each row keeps its run");
    let stderr = text(&second.stderr);
    assert!(
        stderr.contains("kept 4 row(s)") && stderr.contains("quick"),
        "the kept rows are said: {stderr}"
    );
}

/// Runs `falsify run` on a contract of half a minute (2,000 training steps)
/// with `out` and waits at most `limit`; `None` (after killing it) when it
/// did not end in time.
fn run_long_within(root: &Path, out: &Path, limit: Duration) -> Option<Output> {
    let long = SLOW.replace("steps: 300", "steps: 2000");
    let contracts = tree(root, "long-contracts", &[("slow", &long)]);
    let mut child = falsify()
        .arg("run")
        .arg("--contracts")
        .arg(&contracts)
        .arg("--out")
        .arg(out)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("falsify runs");
    let started = Instant::now();
    while started.elapsed() < limit {
        if child.try_wait().expect("wait").is_some() {
            return Some(child.wait_with_output().expect("output"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if let Some((pid, _)) = procs::children(child.id()).first() {
        procs::kill(*pid);
    }
    child.kill().expect("kill");
    child.wait().expect("reap");
    None
}

/// An `--out` that is a file, or a folder below a file, is refused before
/// the first trial runs (the trial would take tens of seconds), naming the
/// folder, saying why, and quoting the OS error at most once.
#[test]
fn an_unwritable_out_is_refused_before_any_trial() {
    let root = tempfile::tempdir().expect("tempdir");
    let file = root.path().join("a-file");
    std::fs::write(&file, "not a folder").expect("write");
    for out in [file.clone(), file.join("below")] {
        let output = run_long_within(root.path(), &out, Duration::from_secs(10))
            .unwrap_or_else(|| panic!("{}: the run started its trials", out.display()));
        let stderr = text(&output.stderr);
        assert!(!output.status.success(), "{stderr}");
        assert!(
            stderr.contains(&file.display().to_string()) && stderr.contains("not a folder"),
            "{}: {stderr}",
            out.display()
        );
        assert!(!stderr.contains("File exists"), "{stderr}");
        assert!(stderr.matches("os error").count() <= 1, "{stderr}");
        assert!(
            stderr.contains("no trial was run"),
            "{}: {stderr}",
            out.display()
        );
        assert_eq!(text(&output.stdout), "", "no summary: nothing ran");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "not a folder");
    }
}

/// When the folder cannot be written at the end (here: it was replaced by a
/// file while the trial ran), the summary is still printed and the rows go
/// to a fallback folder the error names.
#[cfg(target_os = "linux")]
#[test]
fn rows_that_cannot_be_written_go_to_a_fallback_folder() {
    let root = tempfile::tempdir().expect("tempdir");
    let tmp = root.path().join("system-tmp");
    std::fs::create_dir_all(&tmp).expect("mkdir");
    let contracts = tree(root.path(), "contracts", &[("slow", SLOW)]);
    let out = root.path().join("latest");
    let child = falsify()
        .arg("run")
        .arg("--contracts")
        .arg(&contracts)
        .arg("--out")
        .arg(&out)
        .arg("--no-mutants")
        .env("TMPDIR", &tmp)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("falsify runs");
    let trial = procs::settled_trial_process(
        child.id(),
        Duration::from_millis(200),
        Duration::from_secs(60),
    );
    assert!(trial.is_some(), "the slow trial never ran");
    if out.exists() {
        std::fs::remove_dir_all(&out).expect("remove the folder");
    }
    std::fs::write(&out, "in the way").expect("a file in its place");
    let output = child.wait_with_output().expect("the run ends");
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    assert!(!output.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("1 passed, 0 falsified"),
        "the summary: {stdout}"
    );
    let fallback = named(&tmp, "falsify-unwritten-");
    assert_eq!(fallback.len(), 1, "{stderr}");
    let csv = fallback[0].join("falsification.csv");
    assert!(
        stderr.contains(&csv.display().to_string()),
        "the error names the fallback file: {stderr}"
    );
    let kept = rows(&fallback[0]);
    assert_eq!(kept.len(), 1);
    assert_eq!(
        (kept[0].test_id.as_str(), kept[0].status),
        ("F-S-001", Status::Passed)
    );
}

/// `--inject` of a test whose own trial the run leaves out would run the
/// rehearsal without its mutant: refused before anything runs. With
/// `--no-mutants` the test's own trial still runs, so the injection takes
/// effect and is accepted.
#[test]
fn an_inject_that_cannot_take_effect_is_refused() {
    let root = tempfile::tempdir().expect("tempdir");
    let contracts = tree(root.path(), "contracts", &[("quick", QUICK)]);
    let out = root.path().join("latest");
    for args in [
        ["--filter", "F-Q-001", "--inject", "F-Q-002"],
        ["--filter", "F-Q-001::mutant", "--inject", "F-Q-001"],
    ] {
        let output = run(&contracts, &out, &args);
        let stderr = text(&output.stderr);
        assert!(!output.status.success(), "{args:?}: {stderr}");
        assert!(
            stderr.contains(&format!("--inject {}", args[3])) && stderr.contains("not selected"),
            "{args:?}: {stderr}"
        );
        assert_eq!(text(&output.stdout), "", "{args:?}: nothing ran");
        assert!(!out.join("falsification.csv").exists(), "{args:?}");
    }
    let output = run(
        &contracts,
        &out,
        &["--filter", "F-Q-001", "--no-mutants", "--inject", "F-Q-001"],
    );
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let got = rows(&out);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].status, Status::Falsified, "{}", got[0].detail);
    assert!(got[0].detail.contains("injected on purpose"));
}

/// A contract whose `if_fails` holds terminal controls (clear the line,
/// return, recolour) prints them as escapes on the FALSIFIED line; an
/// error quoting a key made of controls does too.
#[test]
fn contract_text_reaches_the_terminal_escaped() {
    let root = tempfile::tempdir().expect("tempdir");
    let hostile = QUICK.replace(
        "if_fails: softmax is wrong\n    mutant: softmax_without_max_subtraction\n    check: {kind: property, property: softmax_rows_sum_to_one",
        "if_fails: \"\\e[2K\\rPASSED all good\\e[32m\"\n    mutant: softmax_without_max_subtraction\n    check: {kind: property, property: softmax_rows_sum_to_one",
    );
    assert_ne!(hostile, QUICK);
    let contracts = tree(root.path(), "contracts", &[("quick", &hostile)]);
    let out = root.path().join("latest");
    let output = run(
        &contracts,
        &out,
        &["--filter", "F-Q-001", "--no-mutants", "--inject", "F-Q-001"],
    );
    let stdout = text(&output.stdout);
    assert!(stdout.contains("FALSIFIED quick::F-Q-001"), "{stdout}");
    assert!(
        stdout.contains("\\u{1b}[2K\\rPASSED all good"),
        "the controls as escapes: {stdout:?}"
    );
    assert!(!stdout.contains(['\u{1b}', '\r']), "{stdout:?}");

    let bad = tree(
        root.path(),
        "bad",
        &[("quick", &format!("{QUICK}\"\\e[31mred\\u009b2J\": 1\n"))],
    );
    let output = falsify()
        .arg("list")
        .arg("--contracts")
        .arg(&bad)
        .output()
        .expect("falsify runs");
    let stderr = text(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("error:") && stderr.contains("red"),
        "{stderr}"
    );
    assert!(!stderr.contains(['\u{1b}', '\u{9b}']), "{stderr:?}");
}

/// `falsify run` records in run.json every trial it selected.
#[test]
fn run_json_lists_the_selected_trials() {
    let root = tempfile::tempdir().expect("tempdir");
    let contracts = tree(root.path(), "contracts", &[("quick", QUICK)]);
    let out = root.path().join("latest");
    assert!(run(&contracts, &out, &["--filter", "F-Q-002"])
        .status
        .success());
    let meta = RunMeta::read_json(&out).expect("reads").expect("run.json");
    assert_eq!(meta.selected, ["quick::F-Q-002", "quick::F-Q-002::mutant"]);
    assert!(rows(&out).iter().all(|r| r.run_id == meta.run_id));
}
