//! Many processes of one run write one report without losing or tearing a
//! row, as cargo-nextest's process per trial does.
//!
//! The parent test starts [`WRITERS`] copies of this test executable (the
//! ignored test `child_writes_its_rows`, told its index and directory through
//! [`CHILD_ENV`]); each records [`ROWS_EACH`] trials one at a time, each with
//! a speedup row, through `ReportDir::record_run`, all at once. Afterwards
//! every row of every writer must be in `falsification.csv` and
//! `speedups.csv` exactly as written, and `run.json` must keep what any
//! writer recorded (the GPU one of them used).

use std::collections::HashSet;
use std::path::Path;
use std::process::{Command, Stdio};

use falsify_core::report::meta::{GpuMeta, RunMeta};
mod common;

use falsify_core::report::{read_rows, FalsificationRow, ReportDir, SpeedupRow};

/// `index:dir` for a child writer.
const CHILD_ENV: &str = "FALSIFY_TEST_WRITER";
const WRITERS: usize = 8;
const ROWS_EACH: usize = 25;
const RUN_ID: &str = "nextest-run-1";

fn row(writer: usize, i: usize) -> FalsificationRow {
    common::row(
        RUN_ID,
        &format!("w{writer}"),
        format!("F-{writer}-{i:03}"),
        i,
    )
}

fn speedup(writer: usize, i: usize) -> SpeedupRow {
    let (contract, test_id) = (format!("w{writer}"), format!("F-{writer}-{i:03}"));
    common::speedup(RUN_ID, &contract, test_id, (writer, i))
}

fn known() -> HashSet<String> {
    (0..WRITERS)
        .flat_map(|w| (0..ROWS_EACH).map(move |i| format!("w{w}::F-{w}-{i:03}")))
        .collect()
}

/// The run record writer `writer` keeps: writer 3 is the one that used a GPU.
fn record(writer: usize) -> RunMeta {
    let mut meta = RunMeta::detect();
    meta.run_id = RUN_ID.into();
    meta.gpu = (writer == 3).then(|| GpuMeta {
        name: "NVIDIA H200".into(),
        compute_capability: "9.0".into(),
        cuda_driver_version: "13.0".into(),
        nvidia_driver: "580".into(),
        sm_count: 132,
        total_memory_bytes: 1 << 30,
        device_count: Some(1),
    });
    meta
}

/// A child writer; without [`CHILD_ENV`] (an ordinary `--ignored` run) it
/// does nothing.
#[test]
#[ignore = "child process of eight_writing_processes_lose_no_row"]
fn child_writes_its_rows() {
    let Some(spec) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let spec = spec.to_string_lossy().into_owned();
    let (index, dir) = spec.split_once(':').expect("index:dir");
    let writer: usize = index.parse().expect("writer index");
    let report = ReportDir::new(dir);
    let meta = record(writer);
    for i in 0..ROWS_EACH {
        report
            .record_run(
                (vec![row(writer, i)], &HashSet::new()),
                vec![speedup(writer, i)],
                &known(),
                &meta,
            )
            .expect("write");
    }
}

fn spawn(writer: usize, dir: &Path) -> std::process::Child {
    Command::new(std::env::current_exe().expect("test executable"))
        .args(["child_writes_its_rows", "--exact", "--ignored", "--quiet"])
        .env(CHILD_ENV, format!("{writer}:{}", dir.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn a writer")
}

#[test]
fn eight_writing_processes_lose_no_row() {
    let dir = tempfile::tempdir().expect("tempdir");
    let children: Vec<_> = (0..WRITERS).map(|w| spawn(w, dir.path())).collect();
    for mut child in children {
        assert!(child.wait().expect("wait").success(), "a writer failed");
    }
    let report = ReportDir::new(dir.path());
    let rows: Vec<FalsificationRow> = read_rows(&report.falsification_path()).expect("reads");
    let mut expected: Vec<FalsificationRow> = (0..WRITERS)
        .flat_map(|w| (0..ROWS_EACH).map(move |i| row(w, i)))
        .collect();
    expected.sort_by(|a, b| (&a.contract, &a.test_id).cmp(&(&b.contract, &b.test_id)));
    assert_eq!(rows.len(), WRITERS * ROWS_EACH, "one row per trial");
    assert_eq!(rows, expected, "every row as written");

    let mut speedups: Vec<SpeedupRow> = read_rows(&report.speedups_path()).expect("reads");
    speedups.sort_by_key(|s| (s.batch, s.seq_len));
    let expected: Vec<SpeedupRow> = (0..WRITERS)
        .flat_map(|w| (0..ROWS_EACH).map(move |i| speedup(w, i)))
        .collect();
    assert_eq!(speedups, expected, "every speedup row as written");

    let meta = RunMeta::read_json(dir.path())
        .expect("run.json reads")
        .expect("run.json exists");
    assert_eq!(meta.run_id, RUN_ID);
    assert_eq!(
        meta.gpu.map(|g| g.name).as_deref(),
        Some("NVIDIA H200"),
        "the GPU one writer used survives the writers after it"
    );
}
