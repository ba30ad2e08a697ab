//! A run killed while it writes its reports never leaves a torn CSV.
//!
//! The parent test writes a known report, then starts a child process (this
//! same test executable, running the ignored test `child_writes_reports` with
//! [`CHILD_DIR`] set) that rewrites a large report through
//! `ReportDir::merge_and_write` in a loop, and kills it with SIGKILL, at
//! random moments and right after it has started a temp file. After every
//! kill `falsification.csv` must read back completely and be byte-for-byte the
//! old report or the complete new one; `speedups.csv` must be absent or
//! complete.
//!
//! A killed writer leaves its `.falsification.csv.{pid}.tmp` (or
//! `.speedups.csv.{pid}.tmp`) behind: nothing runs on SIGKILL. They are never
//! read; the test counts them as evidence that kills landed mid-write, and
//! checks that the next write removes those of dead writers.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use falsify_core::report::{read_rows, FalsificationRow, ReportDir, SpeedupRow};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Tells the ignored child test which report directory to hammer.
const CHILD_DIR: &str = "FALSIFY_TEST_INTERRUPT_DIR";
/// Rows of the child's report: a few MB, so one write takes tens of ms.
const NEW_ROWS: usize = 12_000;
/// The child stops by itself after this long, should the parent vanish.
const CHILD_LIFETIME: Duration = Duration::from_secs(20);
const KILLS: usize = 6;
/// Rounds beyond [`KILLS`], each killing the child right after it starts a
/// temp file, run only until one kill has landed mid-write: on a loaded
/// machine a write can finish inside the short wait of every even round.
const MORE_KILLS: usize = 50;

fn row(contract: &str, i: usize) -> FalsificationRow {
    common::row("run", contract, format!("F-{i:06}"), i)
}

fn speedup(i: usize) -> SpeedupRow {
    common::speedup("run", "kill", format!("F-{i:06}"), (4, 64))
}

fn old_rows() -> Vec<FalsificationRow> {
    (0..20).map(|i| row("old", i)).collect()
}

fn new_rows() -> Vec<FalsificationRow> {
    (0..NEW_ROWS).map(|i| row("new", i)).collect()
}

fn new_speedups() -> Vec<SpeedupRow> {
    (0..50).map(speedup).collect()
}

/// Every trial name of both reports, so merging keeps the old rows.
fn known() -> HashSet<String> {
    let old = old_rows().into_iter();
    old.chain(new_rows())
        .map(|r| format!("{}::{}", r.contract, r.test_id))
        .collect()
}

fn write_old(dir: &Path) {
    ReportDir::new(dir)
        .merge_and_write(old_rows(), vec![], &known())
        .expect("old report");
}

fn write_new(dir: &Path) {
    ReportDir::new(dir)
        .merge_and_write(new_rows(), new_speedups(), &known())
        .expect("new report");
}

/// The child: rewrite the report until killed (or [`CHILD_LIFETIME`] ends).
/// Without [`CHILD_DIR`] (an ordinary `--ignored` run) it does nothing.
#[test]
#[ignore = "child process of a_killed_writer_never_tears_the_report"]
fn child_writes_reports() {
    let Some(dir) = std::env::var_os(CHILD_DIR) else {
        return;
    };
    let start = Instant::now();
    while start.elapsed() < CHILD_LIFETIME {
        write_new(Path::new(&dir));
    }
}

fn spawn_child(dir: &Path) -> Child {
    let exe = std::env::current_exe().expect("test executable");
    Command::new(exe)
        .args([
            "child_writes_reports",
            "--exact",
            "--ignored",
            "--test-threads=1",
            "--quiet",
        ])
        .env(CHILD_DIR, dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the child writer")
}

/// Waits until `path` exists or `limit` passes; true if it appeared.
fn wait_for(path: &Path, limit: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if path.exists() {
            return true;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    false
}

fn temp_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("read report dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "tmp"))
        .collect();
    files.sort();
    files
}

#[test]
fn a_killed_writer_never_tears_the_report() {
    // The two legal contents of each file, written without interruption.
    let expected = tempfile::tempdir().expect("tempdir");
    write_old(expected.path());
    let old_csv = std::fs::read(expected.path().join("falsification.csv")).expect("old");
    write_new(expected.path());
    let new_csv = std::fs::read(expected.path().join("falsification.csv")).expect("new");
    let new_speedups_csv = std::fs::read(expected.path().join("speedups.csv")).expect("speedups");
    assert_ne!(old_csv, new_csv);

    let dir = tempfile::tempdir().expect("tempdir");
    let report = ReportDir::new(dir.path());
    write_old(dir.path());
    let mut rng = ChaCha8Rng::seed_from_u64(0x5eed);
    let (mut saw_old, mut saw_new, mut mid_write) = (0, 0, 0);
    let mut kills = 0;
    for round in 0..KILLS + MORE_KILLS {
        if round >= KILLS && mid_write > 0 {
            break;
        }
        kills += 1;
        let mut child = spawn_child(dir.path());
        let pid = child.id();
        if round % 2 == 0 || round >= KILLS {
            // Right after the child opened its temp file, plus a little:
            // mid-write, or between the write and the rename.
            let tmp = dir.path().join(format!(".falsification.csv.{pid}.tmp"));
            let appeared = wait_for(&tmp, Duration::from_secs(5));
            assert!(appeared, "round {round}: the child never started writing");
            let wait = if round < KILLS { 15 } else { 1 };
            std::thread::sleep(Duration::from_millis(rng.random_range(0..wait)));
        } else {
            std::thread::sleep(Duration::from_millis(rng.random_range(5..250)));
        }
        child.kill().expect("SIGKILL the child");
        child.wait().expect("reap the child");
        // The next writer removes a dead writer's temp file, so look now.
        if temp_files(dir.path())
            .iter()
            .any(|p| p.to_string_lossy().contains(&format!(".{pid}.tmp")))
        {
            mid_write += 1;
        }

        let csv = std::fs::read(report.falsification_path()).expect("falsification.csv exists");
        assert!(
            csv == old_csv || csv == new_csv,
            "round {round}: falsification.csv is neither the old nor the new report ({} bytes)",
            csv.len()
        );
        if csv == new_csv {
            saw_new += 1;
        } else {
            saw_old += 1;
        }
        let rows: Vec<FalsificationRow> =
            read_rows(&report.falsification_path()).expect("the report parses completely");
        assert!(rows.len() == old_rows().len() || rows.len() == old_rows().len() + NEW_ROWS);
        if report.speedups_path().exists() {
            let speedups = std::fs::read(report.speedups_path()).expect("speedups.csv");
            assert_eq!(
                speedups, new_speedups_csv,
                "round {round}: torn speedups.csv"
            );
        }
    }

    println!(
        "{kills} kills: {saw_old} left the old report, {saw_new} the new one; \
         {mid_write} landed mid-write (a temp file was left behind)"
    );
    assert!(
        mid_write > 0,
        "no kill landed mid-write, so the test proved nothing"
    );
    // The report stays writable: a killed writer does not leave the lock held.
    write_new(dir.path());
    assert_eq!(
        std::fs::read(report.falsification_path()).expect("final"),
        new_csv
    );
    // ... and clears the temp files that killed writers left behind.
    assert_eq!(temp_files(dir.path()), Vec::<std::path::PathBuf>::new());
}
