//! The release gate judges only complete, checked evidence of the run it
//! names. Each case is what a user did to a report folder, then
//! `falsify report`: rows an earlier run left behind, an interrupted or
//! filtered run over a complete one, an empty or damaged CSV, a trial twice,
//! rows of two builds or two texts of a contract, a folder written before
//! runs recorded what they selected, and shards merged by `--merge`.
//!
//! Runs are written through the report API the run engine uses
//! (`ReportDir::record_run`), with the planted baseline's trials.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use falsify_core::report::compare::{Verdict, EXIT_INCOMPLETE, EXIT_NO_VERDICT};
use falsify_core::report::markdown::{write_report, REPORT_MD};
use falsify_core::report::meta::RunMeta;
use falsify_core::report::{read_rows, write_rows_atomic, FalsificationRow, ReportDir, Status};

fn planted_baseline() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/report/planted_baseline")
}

/// A copy of the planted baseline (8 trials, one build, one run) in `tmp`.
fn baseline(tmp: &Path) -> PathBuf {
    let dir = tmp.join("baseline");
    std::fs::create_dir_all(&dir).unwrap();
    for file in ["falsification.csv", "run.json"] {
        std::fs::copy(planted_baseline().join(file), dir.join(file)).unwrap();
    }
    dir
}

/// The baseline's trials as run `run_id`: the same statuses, the one the
/// baseline falsified (F-SOFTMAX-002) now a known violation, since any
/// other falsified trial would regress whatever the baseline says.
fn trials(run_id: &str) -> Vec<FalsificationRow> {
    read_rows::<FalsificationRow>(&planted_baseline().join("falsification.csv"))
        .unwrap()
        .into_iter()
        .map(|r| FalsificationRow {
            run_id: run_id.into(),
            known_violation: if r.status == Status::Falsified {
                "falsified in the baseline too".into()
            } else {
                String::new()
            },
            ..r
        })
        .collect()
}

fn key(r: &FalsificationRow) -> String {
    format!("{}::{}", r.contract, r.test_id)
}

/// Records run `run_id` into `dir` as the engine does: the rows of the
/// trials that finished, and a run record listing what it selected.
fn record(
    dir: &Path,
    run_id: &str,
    finished: &[FalsificationRow],
    selected: &[String],
    interrupted: bool,
) {
    let known: HashSet<String> = trials("x").iter().map(key).collect();
    let mut meta = RunMeta::detect();
    meta.run_id = run_id.into();
    meta.git_sha = "aaaa11112222".into();
    meta.selected = selected.to_vec();
    if interrupted {
        meta.incomplete = Some("interrupted by SIGINT".into());
    }
    ReportDir::new(dir)
        .record_run(
            (finished.to_vec(), &HashSet::new()),
            Vec::new(),
            &known,
            &meta,
        )
        .unwrap();
}

/// A complete run of every trial, as run `run_id`.
fn complete_run(dir: &Path, run_id: &str) {
    let rows = trials(run_id);
    let selected: Vec<String> = rows.iter().map(key).collect();
    record(dir, run_id, &rows, &selected, false);
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

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `report` refuses (exit 2), and its message contains every part of `says`.
fn assert_refused(baseline: &Path, current: &Path, says: &[&str]) {
    let err = match write_report(baseline, current) {
        Ok(outcome) => panic!("judged ({:?}) instead of refused", outcome.verdict),
        Err(e) => e.to_string(),
    };
    for part in says {
        assert!(err.contains(part), "`{part}` not in: {err}");
    }
    let out = report_cli(baseline, current);
    assert_eq!(
        out.status.code(),
        Some(EXIT_NO_VERDICT.into()),
        "{}",
        text(&out)
    );
}

#[test]
fn an_interrupted_run_over_a_complete_one_is_never_clean() {
    let tmp = tempfile::tempdir().unwrap();
    let baseline = baseline(tmp.path());
    let current = tmp.path().join("latest");
    complete_run(&current, "earlier");
    // The next run selects every trial and is stopped after three.
    let rows = trials("stopped");
    let selected: Vec<String> = rows.iter().map(key).collect();
    record(&current, "stopped", &rows[..3], &selected, true);

    let outcome = write_report(&baseline, &current).unwrap();
    assert_eq!(outcome.verdict, Verdict::Incomplete);
    let out = report_cli(&baseline, &current);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(EXIT_INCOMPLETE.into()), "{said}");
    assert!(said.contains("verdict: incomplete (exit 3)"), "{said}");
    assert!(
        said.contains("set aside 5 row(s) of 1 run (earlier: 5)"),
        "{said}"
    );
    assert!(
        said.contains("the run did not finish: interrupted by SIGINT"),
        "{said}"
    );
    assert!(
        said.contains(&format!("MISSING {} (selected by this run", selected[3])),
        "{said}"
    );
    let md = std::fs::read_to_string(current.join(REPORT_MD)).unwrap();
    assert!(md.contains("**Verdict: INCOMPLETE**"), "{md}");
    assert!(
        md.contains("| no: the run did not finish: interrupted by SIGINT; 5 trial(s) the run selected have no row of it |"),
        "{md}"
    );

    // Interrupted after its last trial: every row is there, still not clean.
    let whole = tmp.path().join("whole");
    record(&whole, "late-stop", &trials("late-stop"), &selected, true);
    let outcome = write_report(&baseline, &whole).unwrap();
    assert_eq!(outcome.verdict, Verdict::Incomplete);
}

#[test]
fn a_filtered_run_over_a_complete_one_is_judged_on_its_own_rows() {
    let tmp = tempfile::tempdir().unwrap();
    let baseline = baseline(tmp.path());
    let current = tmp.path().join("latest");
    complete_run(&current, "full");
    let one = trials("filtered").remove(0);
    record(
        &current,
        "filtered",
        std::slice::from_ref(&one),
        &[key(&one)],
        false,
    );
    assert_eq!(
        read_rows::<FalsificationRow>(&current.join("falsification.csv"))
            .unwrap()
            .len(),
        8
    );

    let outcome = write_report(&baseline, &current).unwrap();
    assert_eq!(outcome.verdict, Verdict::Incomplete);
    assert_eq!(outcome.not_run.len(), 7, "{:?}", outcome.not_run);
    let md = std::fs::read_to_string(current.join(REPORT_MD)).unwrap();
    assert!(
        md.contains("current: read 8 row(s) of 2 runs (full: 7, filtered: 1)"),
        "{md}"
    );
}

#[test]
fn a_selected_trial_without_a_row_is_missing_whatever_older_rows_say() {
    let tmp = tempfile::tempdir().unwrap();
    let baseline = baseline(tmp.path());
    let current = tmp.path().join("latest");
    // Every baseline trial passed as before, and a new trial never finished.
    let rows = trials("run");
    let mut selected: Vec<String> = rows.iter().map(key).collect();
    selected.push("new-contract-v1::F-NEW-001".into());
    record(&current, "run", &rows, &selected, false);
    let outcome = write_report(&baseline, &current).unwrap();
    assert_eq!(outcome.verdict, Verdict::Incomplete);
    let out = report_cli(&baseline, &current);
    assert_eq!(out.status.code(), Some(EXIT_INCOMPLETE.into()));
    assert!(
        text(&out).contains("MISSING new-contract-v1::F-NEW-001"),
        "{}",
        text(&out)
    );
}

#[test]
fn an_empty_or_header_only_report_is_refused_on_either_side() {
    let tmp = tempfile::tempdir().unwrap();
    let header = std::fs::read_to_string(planted_baseline().join("falsification.csv"))
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .to_string();
    for (name, content) in [("empty", String::new()), ("header-only", header + "\n")] {
        // An empty baseline once gave `clean`, "0 compared".
        let baseline = baseline(&tmp.path().join(name));
        let current = tmp.path().join(name).join("latest");
        complete_run(&current, "run");
        std::fs::write(baseline.join("falsification.csv"), &content).unwrap();
        assert_refused(
            &baseline,
            &current,
            &["baseline/falsification.csv", "no rows", "read 0 row(s)"],
        );
        // And an empty current report.
        let baseline = self::baseline(&tmp.path().join(name).join("again"));
        std::fs::write(current.join("falsification.csv"), &content).unwrap();
        assert_refused(
            &baseline,
            &current,
            &["latest/falsification.csv", "no rows"],
        );
    }
}

#[test]
fn the_same_trial_twice_is_refused_whatever_the_row_order() {
    let tmp = tempfile::tempdir().unwrap();
    let baseline = baseline(tmp.path());
    // A hand merge of two shards: F-RMS-GPU-001 falsified in one, passed in
    // the other. One order once hid the regression.
    let mut falsified = trials("shard-2")[0].clone();
    falsified.status = Status::Falsified;
    for (order, first) in [("falsified-first", true), ("passed-first", false)] {
        let current = tmp.path().join(order);
        let mut rows = trials("shard-1");
        if first {
            rows.insert(0, falsified.clone());
        } else {
            rows.push(falsified.clone());
        }
        write_rows_atomic(&current.join("falsification.csv"), &rows).unwrap();
        let (a, b) = if first { (2, 3) } else { (2, 10) };
        assert_refused(
            &baseline,
            &current,
            &[
                "falsification.csv:",
                "rmsnorm-kernels-v1::F-RMS-GPU-001 twice",
                &format!("at lines {a} ("),
                &format!("and {b} ("),
                "read 9 row(s) of 2 runs",
            ],
        );
    }
}

/// Replaces line `n` (1-based) of `path` by `with(line)`.
fn edit_line(path: &Path, n: usize, with: impl Fn(&str) -> String) {
    let text = std::fs::read_to_string(path).unwrap();
    let lines: Vec<String> = text
        .lines()
        .enumerate()
        .map(|(i, l)| if i + 1 == n { with(l) } else { l.to_string() })
        .collect();
    std::fs::write(path, lines.join("\n") + "\n").unwrap();
}

#[test]
fn a_malformed_report_is_refused_naming_its_file_and_line() {
    let tmp = tempfile::tempdir().unwrap();
    type Damage = fn(&Path);
    let damages: [(&str, Damage, &str); 3] = [
        // A hand-edited cell: `Passed` is not a status.
        (
            "cell",
            |p| edit_line(p, 4, |l| l.replace(",passed,", ",Passed,")),
            "line: 4",
        ),
        // A row missing two fields.
        (
            "fields",
            |p| {
                edit_line(p, 6, |l| {
                    let cells: Vec<&str> = l.split(',').collect();
                    cells[..cells.len() - 2].join(",")
                })
            },
            "line: 6",
        ),
        // A torn last line.
        (
            "torn",
            |p| {
                let text = std::fs::read_to_string(p).unwrap();
                std::fs::write(p, &text[..text.len() - 60]).unwrap();
            },
            "line: 9",
        ),
    ];
    for (name, damage, line) in damages {
        let root = tmp.path().join(name);
        let good = baseline(&root.join("good"));
        let current = root.join("latest");
        complete_run(&current, "run");
        let bad = baseline(&root);
        damage(&bad.join("falsification.csv"));
        assert_refused(&bad, &current, &["baseline/falsification.csv", line]);
        damage(&current.join("falsification.csv"));
        assert_refused(&good, &current, &["latest/falsification.csv", line]);
    }
}

#[test]
fn rows_of_two_builds_or_two_texts_of_a_contract_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let baseline = baseline(tmp.path());
    type Change = fn(&mut FalsificationRow);
    let changes: [(&str, Change, &[&str]); 3] = [
        (
            "build",
            |r| r.git_sha = "bbbb33334444".into(),
            &["2 builds (aaaa11112222 from line 2, bbbb33334444 from line 5)"],
        ),
        (
            "version",
            |r| r.contract_version = "1.2.0".into(),
            &["softmax-properties-v1 was judged against two texts (version 1.1.0 at line 4, 1.2.0 at line 5)"],
        ),
        (
            "hash",
            |r| r.contract_hash = "00000000000000ff".into(),
            &["file hash 0123456789abcdef at line 4, 00000000000000ff at line 5"],
        ),
    ];
    for (name, change, says) in changes {
        let current = tmp.path().join(name);
        let mut rows = trials("one-run");
        for r in rows.iter_mut() {
            r.contract_hash = "0123456789abcdef".into();
        }
        change(&mut rows[3]);
        write_rows_atomic(&current.join("falsification.csv"), &rows).unwrap();
        assert_refused(&baseline, &current, says);
        // The same rows as a baseline are no reference either.
        let good = tmp.path().join(format!("{name}-good"));
        complete_run(&good, "good");
        let as_baseline = tmp.path().join(format!("{name}-baseline"));
        write_rows_atomic(&as_baseline.join("falsification.csv"), &rows).unwrap();
        assert_refused(&as_baseline, &good, says);
    }
}

#[test]
fn a_folder_that_does_not_list_its_selected_trials_is_judged_only_as_one_run() {
    let tmp = tempfile::tempdir().unwrap();
    let baseline = baseline(tmp.path());
    // No run.json: rows of one run are judged...
    let one = tmp.path().join("one");
    write_rows_atomic(&one.join("falsification.csv"), &trials("only")).unwrap();
    assert_eq!(
        write_report(&baseline, &one).unwrap().verdict,
        Verdict::Clean
    );
    // ... rows of two are refused.
    let two = tmp.path().join("two");
    let mut rows = trials("older");
    rows.truncate(5);
    rows.extend(trials("newer").split_off(5));
    write_rows_atomic(&two.join("falsification.csv"), &rows).unwrap();
    assert_refused(
        &baseline,
        &two,
        &["rows of 2 runs (older, newer)", "no run.json"],
    );
    // A run record written before `selected` existed, naming one of them.
    let mut meta = RunMeta::detect();
    meta.run_id = "newer".into();
    meta.write_json(&two).unwrap();
    assert_refused(
        &baseline,
        &two,
        &[
            "run.json names run newer but rows of other run older are here too",
            "written before runs recorded them",
        ],
    );
    // Naming both (as a merge records its shards) makes them one evidence.
    meta.runs = vec!["older".into(), "newer".into()];
    meta.write_json(&two).unwrap();
    assert_eq!(
        write_report(&baseline, &two).unwrap().verdict,
        Verdict::Clean
    );
}

#[test]
fn report_says_what_it_read_on_each_side() {
    let tmp = tempfile::tempdir().unwrap();
    let baseline = baseline(tmp.path());
    let current = tmp.path().join("latest");
    complete_run(&current, "run-1");
    let out = report_cli(&baseline, &current);
    let said = text(&out);
    assert_eq!(out.status.code(), Some(0), "{said}");
    let base_line = format!(
        "baseline `h200`: read 8 row(s) of 1 run (base-1: 8) from {}; judged all (build aaaa11112222)",
        baseline.join("falsification.csv").display()
    );
    let current_line = format!(
        "current: read 8 row(s) of 1 run (run-1: 8) from {}; judged all (build aaaa11112222)",
        current.join("falsification.csv").display()
    );
    assert!(said.contains(&base_line), "{said}");
    assert!(said.contains(&current_line), "{said}");
    let md = std::fs::read_to_string(current.join(REPORT_MD)).unwrap();
    assert!(md.contains("## Evidence"), "{md}");
    assert!(md.contains(&format!("- {base_line}")), "{md}");
    assert!(md.contains(&format!("- {current_line}")), "{md}");
}

/// `falsify report --merge`: the merged folder is judged on its shards'
/// rows, then and later; a run written into it afterwards is judged alone.
#[test]
fn a_merged_folder_is_judged_on_its_shards_rows_now_and_later() {
    let tmp = tempfile::tempdir().unwrap();
    let baseline = baseline(tmp.path());
    let rows = trials("x");
    let mut shards = Vec::new();
    for (i, half) in rows.chunks(4).enumerate() {
        let dir = tmp.path().join(format!("shard-{i}"));
        let run_id = format!("shard-run-{i}");
        let half: Vec<FalsificationRow> = half
            .iter()
            .map(|r| FalsificationRow {
                run_id: run_id.clone(),
                ..r.clone()
            })
            .collect();
        let selected: Vec<String> = half.iter().map(key).collect();
        record(&dir, &run_id, &half, &selected, false);
        shards.push(dir);
    }
    let merged = tmp.path().join("merged");
    let out = Command::new(env!("CARGO_BIN_EXE_falsify"))
        .arg("report")
        .arg("--baseline")
        .arg(&baseline)
        .arg("--current")
        .arg(&merged)
        .arg("--merge")
        .args(&shards)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let said = text(&out);
    let evidence = said
        .lines()
        .find(|l| l.starts_with("current: read 8 row(s) of 2 runs ("))
        .unwrap_or_else(|| panic!("{said}"));
    assert!(
        evidence.contains("shard-run-0: 4")
            && evidence.contains("shard-run-1: 4")
            && evidence.ends_with("judged all (build aaaa11112222)"),
        "{said}"
    );
    let out = report_cli(&baseline, &merged);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    // A filtered run into the merged folder is judged on its own row.
    let one = trials("later").remove(0);
    record(
        &merged,
        "later",
        std::slice::from_ref(&one),
        &[key(&one)],
        false,
    );
    let out = report_cli(&baseline, &merged);
    assert_eq!(
        out.status.code(),
        Some(EXIT_INCOMPLETE.into()),
        "{}",
        text(&out)
    );
}
