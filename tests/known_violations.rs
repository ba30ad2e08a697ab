//! Known violations through `falsify report`: a subject's claims its
//! contracts state are falsified (the `known_violation` column) gate on
//! changes only. A known violation still falsified is no regression; one
//! that holds now is reported as fixed, prominently, and is no regression
//! either; a falsified trial not marked known regresses, with or without a
//! baseline row. Old reports (no such column) still read.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use falsify_core::report::compare::{Verdict, EXIT_REGRESSED};
use falsify_core::report::markdown::{write_report, REPORT_MD};
use falsify_core::report::meta::RunMeta;
use falsify_core::report::{write_rows_atomic, FalsificationRow, Status, FALSIFICATION_CSV};

const SUBJECT: &str = "aprender-train";
const CONTRACT: &str = "prewarm-v1";
const LATE_LOAD: &str = "modules compile on first use, after the weights are uploaded";
const SYNC: &str = "the clipping reads the norm back to the host";

/// A row of `test_id` with `status`, known to be falsified for `reason`
/// when there is one.
fn row(run_id: &str, test_id: &str, status: Status, reason: Option<&str>) -> FalsificationRow {
    FalsificationRow {
        status,
        known_violation: reason.unwrap_or_default().to_string(),
        ..common::row(run_id, CONTRACT, test_id.to_string(), 0)
    }
}

/// A finished run of `rows` in `dir`, as `falsify run` leaves it: the rows
/// and a record of the subject that names them as selected.
fn record(dir: &Path, run_id: &str, rows: &[FalsificationRow]) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    write_rows_atomic(&dir.join(FALSIFICATION_CSV), rows).unwrap();
    let mut meta = RunMeta::detect();
    meta.run_id = run_id.into();
    meta.subject = SUBJECT.into();
    meta.git_sha = "abc123".into();
    meta.selected = rows
        .iter()
        .map(|r| format!("{}::{}", r.contract, r.test_id))
        .collect();
    meta.selected.sort();
    meta.write_json(dir).unwrap();
    dir.to_path_buf()
}

/// The committed baseline: `A` holds, `LATE` and `SYNC` are known
/// violations, every mutant is caught.
fn baseline(root: &Path) -> PathBuf {
    let rows = [
        row("base", "A", Status::Passed, None),
        row("base", "A::mutant", Status::Passed, None),
        row("base", "LATE", Status::Falsified, Some(LATE_LOAD)),
        row("base", "LATE::mutant", Status::Passed, None),
        row("base", "SYNC", Status::Falsified, Some(SYNC)),
        row("base", "SYNC::mutant", Status::Passed, None),
    ];
    record(&root.join("baseline"), "base", &rows)
}

/// The current run: as the baseline, but `SYNC` with `sync` and `extra`
/// rows added.
fn current(root: &Path, sync: Status, extra: &[FalsificationRow]) -> PathBuf {
    let mut rows = vec![
        row("now", "A", Status::Passed, None),
        row("now", "A::mutant", Status::Passed, None),
        row("now", "LATE", Status::Falsified, Some(LATE_LOAD)),
        row("now", "LATE::mutant", Status::Passed, None),
        row("now", "SYNC", sync, Some(SYNC)),
        row("now", "SYNC::mutant", Status::Passed, None),
    ];
    rows.extend_from_slice(extra);
    record(&root.join("current"), "now", &rows)
}

fn report_cli(baseline: &Path, current: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_falsify"))
        .arg("report")
        .arg("--baseline")
        .arg(baseline)
        .arg("--current")
        .arg(current)
        .output()
        .unwrap()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The body of `## heading` in `md`.
fn section<'a>(md: &'a str, heading: &str) -> &'a str {
    let line = format!("\n{heading}\n");
    let start = md.find(&line).unwrap_or_else(|| panic!("no {heading}"));
    let rest = &md[start + line.len()..];
    &rest[..rest.find("\n## ").unwrap_or(rest.len())]
}

#[test]
fn known_violations_still_falsified_are_clean_and_listed_per_subject() {
    let tmp = tempfile::tempdir().unwrap();
    let baseline = baseline(tmp.path());
    let current = current(tmp.path(), Status::Falsified, &[]);
    let out = report_cli(&baseline, &current);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(!text.contains("REGRESSION"), "{text}");
    assert!(
        text.contains("known violations of aprender-train: 2 still falsified"),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "KNOWN VIOLATION aprender-train prewarm-v1::LATE: {LATE_LOAD}"
        )),
        "{text}"
    );
    assert!(text.contains("verdict: clean (exit 0)"), "{text}");

    let md = std::fs::read_to_string(current.join(REPORT_MD)).unwrap();
    assert!(md.contains("**Verdict: clean**"), "{md}");
    assert_eq!(section(&md, "## Regressions").trim(), "None.");
    let known = section(&md, "## Known violations");
    assert!(known.contains("Claims `aprender-train` is known not to keep"));
    // Each with what it measured and the reason its contract gives.
    assert!(
        known.contains(&format!(
            "| prewarm-v1::SYNC | cpu | max_abs_err 0 <= 1e-6: falsified by a violation (see \
             detail) | {SYNC} |"
        )),
        "{known}"
    );
    assert!(known.contains(LATE_LOAD), "{known}");
    assert!(!known.contains("Fixed"), "{known}");
    // The verdict table marks them, never as regressions.
    assert!(md.contains("| LATE (known violation) | cpu | falsified | falsified |"));
}

#[test]
fn a_known_violation_that_holds_now_is_fixed_prominently_and_no_regression() {
    let tmp = tempfile::tempdir().unwrap();
    let baseline = baseline(tmp.path());
    let current = current(tmp.path(), Status::Passed, &[]);
    let outcome = write_report(&baseline, &current).unwrap();
    assert_eq!(outcome.verdict, Verdict::Clean, "{:?}", outcome.regressions);
    assert_eq!(outcome.subject, SUBJECT);
    assert_eq!(outcome.fixed.len(), 1, "{:?}", outcome.fixed);
    assert!(outcome.fixed[0].starts_with("prewarm-v1::SYNC (passes now: "));
    assert!(outcome.fixed[0].ends_with(&format!("its contract says: {SYNC})")));
    assert_eq!(
        outcome.known_violations,
        [format!("prewarm-v1::LATE: {LATE_LOAD}")]
    );

    let md = std::fs::read_to_string(&outcome.path).unwrap();
    // Said in the verdict line at the top, and first in its section.
    let top = md.lines().find(|l| l.starts_with("**Verdict")).unwrap();
    assert!(
        top.contains(
            "**1 known violation(s) of `aprender-train` now hold: remove their `known_violation`**"
        ),
        "{top}"
    );
    let known = section(&md, "## Known violations");
    assert!(
        known.starts_with("\n**Fixed: 1 known violation(s) of `aprender-train` now hold."),
        "{known}"
    );
    assert!(
        known.contains("- **prewarm-v1::SYNC** — passes now: "),
        "{known}"
    );
    let changes = section(&md, "## Changes of status");
    assert!(
        changes.contains("| prewarm-v1::SYNC | cpu | falsified | passed | **fixed: remove the known_violation** |"),
        "{changes}"
    );

    let out = report_cli(&baseline, &current);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains("FIXED aprender-train prewarm-v1::SYNC (passes now: ")
            && text.contains("remove its known_violation from the contract"),
        "{text}"
    );
}

#[test]
fn a_falsified_trial_not_marked_known_regresses_with_or_without_a_baseline_row() {
    let tmp = tempfile::tempdir().unwrap();
    let baseline = baseline(tmp.path());
    // A new test, and `A` (which held), falsified; neither is known.
    let current = current(
        tmp.path(),
        Status::Falsified,
        &[row("now", "NEW", Status::Falsified, None)],
    );
    let mut rows: Vec<FalsificationRow> =
        falsify_core::report::read_rows(&current.join(FALSIFICATION_CSV)).unwrap();
    rows.iter_mut()
        .filter(|r| r.test_id == "A")
        .for_each(|r| r.status = Status::Falsified);
    write_rows_atomic(&current.join(FALSIFICATION_CSV), &rows).unwrap();

    let out = report_cli(&baseline, &current);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(i32::from(EXIT_REGRESSED)), "{text}");
    assert!(
        text.contains("REGRESSION prewarm-v1::A (passed -> falsified)"),
        "{text}"
    );
    assert!(
        text.contains("REGRESSION prewarm-v1::NEW (absent -> falsified)"),
        "{text}"
    );
    // The known ones are still listed as such, not as regressions.
    assert!(!text.contains("REGRESSION prewarm-v1::LATE"), "{text}");
    assert!(text.contains("KNOWN VIOLATION aprender-train prewarm-v1::LATE"));
    assert!(text.contains("verdict: regressed (exit 1)"), "{text}");
}

/// A baseline written before the column existed reads, its falsified rows
/// not known; the current run's column is what the gate reads.
#[test]
fn a_baseline_without_the_column_still_reads() {
    let tmp = tempfile::tempdir().unwrap();
    let baseline = baseline(tmp.path());
    let csv_path = baseline.join(FALSIFICATION_CSV);
    let mut reader = csv::Reader::from_path(&csv_path).unwrap();
    let headers = reader.headers().unwrap().clone();
    let keep: Vec<usize> = (0..headers.len())
        .filter(|&i| &headers[i] != "known_violation")
        .collect();
    assert_eq!(keep.len() + 1, headers.len(), "the column is written");
    let records: Vec<csv::StringRecord> = reader.records().map(Result::unwrap).collect();
    let mut writer = csv::Writer::from_path(&csv_path).unwrap();
    writer
        .write_record(keep.iter().map(|&i| &headers[i]))
        .unwrap();
    for r in &records {
        writer.write_record(keep.iter().map(|&i| &r[i])).unwrap();
    }
    writer.flush().unwrap();
    drop(writer);

    let current = current(tmp.path(), Status::Falsified, &[]);
    let outcome = write_report(&baseline, &current).unwrap();
    assert_eq!(outcome.verdict, Verdict::Clean, "{:?}", outcome.regressions);
    assert_eq!(outcome.known_violations.len(), 2);
}
