//! CSV reports: one row per trial in `falsification.csv`, one per throughput
//! measurement in `speedups.csv`, written atomically (temp file + rename);
//! failure artifacts; and the regression report that compares a run with a
//! baseline (`REPORT.md` with SVG charts).

pub mod artifacts;
pub mod baseline;
pub mod cells;
pub mod charts;
pub mod claim;
pub mod compare;
pub mod evidence;
pub mod markdown;
pub mod merge;
pub mod meta;

use std::collections::HashSet;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{de::DeserializeOwned, Deserialize, Serialize};

use crate::error::{Error, Result};
use meta::RunMeta;

/// Name of the per-trial report.
pub const FALSIFICATION_CSV: &str = "falsification.csv";
/// Name of the throughput report.
pub const SPEEDUPS_CSV: &str = "speedups.csv";

/// The outcome of a trial.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// The claim survived the measurement.
    Passed,
    /// The measurement contradicts the claim.
    Falsified,
    /// Not run, with the reason in `detail` (e.g. no CUDA driver).
    Skipped,
    /// The check could not measure (a launch failed, an op refused its input).
    Error,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Passed => "passed",
            Status::Falsified => "falsified",
            Status::Skipped => "skipped",
            Status::Error => "error",
        }
    }
}

/// One row of `falsification.csv` (column order as in the design brief).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FalsificationRow {
    pub run_id: String,
    pub timestamp: String,
    pub git_sha: String,
    pub contract: String,
    pub contract_version: String,
    /// The first 16 hex digits of the SHA-256 of the contract file's bytes
    /// as the run read them (once, when it planned its trials): two rows of
    /// one contract with different hashes were judged against different
    /// texts. Empty in reports written before the column existed.
    #[serde(default)]
    pub contract_hash: String,
    pub test_id: String,
    pub check_kind: String,
    pub backend: String,
    pub device: String,
    pub compute_capability: String,
    pub driver_version: String,
    pub status: Status,
    pub metric: String,
    pub observed: Option<f64>,
    pub comparator: String,
    pub threshold: Option<f64>,
    pub unit: String,
    pub duration_ms: f64,
    /// Time from the start of the trial's process to the start of the
    /// measurement (opening the CUDA context, loading the contracts): the
    /// price of a process per trial. Kernels a check compiles itself count
    /// in its measurement. Empty for a trial that never started measuring
    /// (skipped, or its process died), and in reports written before the
    /// column existed.
    #[serde(default)]
    pub setup_ms: Option<f64>,
    pub detail: String,
}

impl FalsificationRow {
    /// The row's headline as recorded.
    pub fn headline(&self) -> claim::Headline {
        claim::Headline {
            metric: self.metric.clone(),
            observed: self.observed,
            comparator: self.comparator.clone(),
            threshold: self.threshold,
            unit: self.unit.clone(),
            held: None,
        }
    }

    /// The mutant self-test of a test (its `test_id` ends in `::mutant`).
    pub fn is_mutant(&self) -> bool {
        self.test_id.ends_with(MUTANT_SUFFIX)
    }

    /// One line that reads as the verdict, e.g.
    /// `grad_rel_error 2.31 > 1e-6: falsified` (see [`claim::verdict_line`]).
    pub fn verdict_line(&self) -> Option<String> {
        claim::verdict_line(&self.headline(), self.status, self.is_mutant())
    }
}

/// What a self-test's `test_id` ends with.
pub const MUTANT_SUFFIX: &str = "::mutant";

/// One row of `speedups.csv` (column order as in the design brief). The
/// columns `contract`, `status`, `threshold` and `peak_device_gib` are
/// absent from reports written before they existed; such rows read with
/// them empty, and [`fill_from_trials`] fills what the trial rows know.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpeedupRow {
    pub run_id: String,
    #[serde(default)]
    pub contract: String,
    pub test_id: String,
    /// The status of the trial that measured this row.
    #[serde(default)]
    pub status: Option<Status>,
    /// The value `ratio` must reach for the trial to pass (see
    /// [`claim::ratio_threshold`]); empty for a row that is context, such
    /// as one part of a judged total.
    #[serde(default)]
    pub threshold: Option<f64>,
    pub subject: String,
    pub model: String,
    pub batch: usize,
    pub seq_len: usize,
    pub baseline: String,
    pub candidate: String,
    pub baseline_median_ms: f64,
    pub candidate_median_ms: f64,
    pub ratio: f64,
    pub ratio_ci_low: f64,
    pub ratio_ci_high: f64,
    pub repeats: usize,
    pub device: String,
    /// Peak device memory of the measured configuration, GiB: filled by
    /// `step_throughput`, empty in rows that compare two configurations or
    /// time a kernel.
    #[serde(default)]
    pub peak_device_gib: Option<f64>,
}

impl SpeedupRow {
    /// The mutant self-test's row: it times an injected fault, not the system.
    pub fn is_mutant(&self) -> bool {
        self.test_id.ends_with(MUTANT_SUFFIX)
    }
}

/// Fills the columns a report written before they existed lacks
/// (`contract`, `status`, `threshold`) from the trial rows of the same run.
/// Test ids are unique across contracts, so the test id finds the trial.
pub fn fill_from_trials(speedups: &mut [SpeedupRow], rows: &[FalsificationRow]) {
    for s in speedups.iter_mut().filter(|s| s.status.is_none()) {
        let Some(trial) = rows.iter().find(|r| r.test_id == s.test_id) else {
            continue;
        };
        if s.contract.is_empty() {
            s.contract = trial.contract.clone();
        }
        s.status = Some(trial.status);
        if let (None, Some(observed), Some(threshold)) =
            (s.threshold, trial.observed, trial.threshold)
        {
            s.threshold = claim::ratio_threshold(s.ratio, observed, &trial.comparator, threshold);
        }
    }
}

/// Reads a CSV file of `T` rows, undoing the formula neutralisation of
/// [`cells`]. A missing file is an empty report.
pub fn read_rows<T: DeserializeOwned>(path: &Path) -> Result<Vec<T>> {
    Ok(read_rows_located(path)?
        .into_iter()
        .map(|(_, row)| row)
        .collect())
}

/// [`read_rows`], each row with the 1-based line of the file it starts on.
/// An error names the file, and the line of the record it is about.
pub fn read_rows_located<T: DeserializeOwned>(path: &Path) -> Result<Vec<(u64, T)>> {
    if !path.exists() {
        return Ok(Vec::new());
    }
    let csv_err = |source| Error::Csv {
        path: path.to_path_buf(),
        source,
    };
    let mut reader = csv::Reader::from_path(path).map_err(csv_err)?;
    let headers = reader.headers().map_err(csv_err)?.clone();
    let mut rows = Vec::new();
    for record in reader.records() {
        let record = record.map_err(csv_err)?;
        let mut restored: csv::StringRecord = record.iter().map(cells::restore).collect();
        // The restored copy keeps the position, so an error names the line.
        restored.set_position(record.position().cloned());
        let line = record.position().map_or(0, csv::Position::line);
        rows.push((line, restored.deserialize(Some(&headers)).map_err(csv_err)?));
    }
    Ok(rows)
}

/// `rows` as CSV records, header first, every cell a spreadsheet would run
/// as a formula neutralised (see [`cells`]). Numbers are serialised by serde
/// and stay numbers. No rows give no records, not even a header.
fn neutralised_records<T: Serialize>(path: &Path, rows: &[T]) -> Result<Vec<csv::StringRecord>> {
    let csv_err = |source| Error::Csv {
        path: path.to_path_buf(),
        source,
    };
    let mut plain = csv::Writer::from_writer(Vec::new());
    for row in rows {
        plain.serialize(row).map_err(csv_err)?;
    }
    let bytes = plain
        .into_inner()
        .map_err(|e| Error::io(path, e.into_error()))?;
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .from_reader(bytes.as_slice());
    let mut records = Vec::new();
    for (i, record) in reader.records().enumerate() {
        let record = record.map_err(csv_err)?;
        records.push(if i == 0 {
            record
        } else {
            record.iter().map(cells::neutralise).collect()
        });
    }
    Ok(records)
}

/// Writes `rows` to `path` through a temporary file in the same directory and
/// a rename, so a reader (or a crash) never sees a torn file.
pub fn write_rows_atomic<T: Serialize>(path: &Path, rows: &[T]) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let file_name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("report.csv");
    let tmp = dir.join(format!(".{file_name}.{}.tmp", std::process::id()));
    let result = write_then_rename(&tmp, path, rows);
    if result.is_err() {
        // Best effort: the temp file is ours and is useless after a failure.
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

fn write_then_rename<T: Serialize>(tmp: &Path, path: &Path, rows: &[T]) -> Result<()> {
    let csv_err = |source| Error::Csv {
        path: tmp.to_path_buf(),
        source,
    };
    let records = neutralised_records(tmp, rows)?;
    let file = File::create(tmp).map_err(|e| Error::io(tmp, e))?;
    let mut writer = csv::Writer::from_writer(file);
    for record in &records {
        writer.write_record(record).map_err(csv_err)?;
    }
    let mut file = writer
        .into_inner()
        .map_err(|e| Error::io(tmp, e.into_error()))?;
    file.flush().map_err(|e| Error::io(tmp, e))?;
    file.sync_all().map_err(|e| Error::io(tmp, e))?;
    std::fs::rename(tmp, path).map_err(|e| Error::io(path, e))
}

/// Writes `bytes` to `path` through a temporary file in the same directory and
/// a rename (atomic on one file system), so a reader never sees a torn file.
pub fn write_bytes_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let result = (|| {
        let mut file = File::create(&tmp).map_err(|e| Error::io(&tmp, e))?;
        file.write_all(bytes).map_err(|e| Error::io(&tmp, e))?;
        file.sync_all().map_err(|e| Error::io(&tmp, e))?;
        std::fs::rename(&tmp, path).map_err(|e| Error::io(path, e))
    })();
    if result.is_err() {
        // Best effort: the temp file is ours and is useless after a failure.
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// The key that identifies a trial across runs.
fn trial_key(contract: &str, test_id: &str) -> String {
    format!("{contract}::{test_id}")
}

/// Where a run writes, and how it merges with what is already there.
pub struct ReportDir {
    pub dir: PathBuf,
}

impl ReportDir {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        ReportDir { dir: dir.into() }
    }

    pub fn falsification_path(&self) -> PathBuf {
        self.dir.join(FALSIFICATION_CSV)
    }

    pub fn speedups_path(&self) -> PathBuf {
        self.dir.join(SPEEDUPS_CSV)
    }

    /// Removes temp files left by writers that were killed mid-write. Called
    /// with the lock held, so any temp file present belongs to a dead writer.
    fn remove_stale_temp_files(&self) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            let ours = [FALSIFICATION_CSV, SPEEDUPS_CSV, meta::RUN_JSON]
                .iter()
                .any(|csv| name.starts_with(&format!(".{csv}.")));
            if ours && name.ends_with(".tmp") {
                // Best effort: a file we cannot remove is only clutter.
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }

    /// Runs `write` with the directory's writer lock held. Writers in other
    /// processes (cargo-nextest runs one process per trial) wait their turn,
    /// so no writer reads the reports between another's read and rename and
    /// no row is lost. A killed writer's lock is released by the kernel.
    pub fn locked<T>(&self, write: impl FnOnce() -> Result<T>) -> Result<T> {
        std::fs::create_dir_all(&self.dir).map_err(|e| Error::io(&self.dir, e))?;
        let lock_path = self.dir.join(".lock");
        let lock = File::create(&lock_path).map_err(|e| Error::io(&lock_path, e))?;
        lock.lock().map_err(|e| Error::io(&lock_path, e))?;
        self.remove_stale_temp_files();
        let result = write();
        lock.unlock().map_err(|e| Error::io(&lock_path, e))?;
        result
    }

    /// Merges this run's rows into the reports and writes them atomically.
    ///
    /// A run that executed only some trials (a filter, or cargo-nextest's one
    /// process per trial) replaces those trials' rows and keeps the others, so
    /// nothing measured earlier is lost; rows of trials that no longer exist
    /// (`known` is every trial name the contracts define) are dropped. An
    /// exclusive lock serialises concurrent writers.
    pub fn merge_and_write(
        &self,
        rows: Vec<FalsificationRow>,
        speedups: Vec<SpeedupRow>,
        known: &HashSet<String>,
    ) -> Result<()> {
        self.locked(|| self.merge_rows(rows, speedups, known))
    }

    /// [`ReportDir::merge_and_write`], and the run record beside the CSVs,
    /// under the same lock. A record of the same run already there (another
    /// process of one cargo-nextest run) is combined with this one.
    pub fn record_run(
        &self,
        rows: Vec<FalsificationRow>,
        speedups: Vec<SpeedupRow>,
        known: &HashSet<String>,
        run: &RunMeta,
    ) -> Result<()> {
        self.locked(|| {
            self.merge_rows(rows, speedups, known)?;
            // An unreadable record belongs to no run this one continues.
            let earlier = RunMeta::read_json(&self.dir).ok().flatten();
            run.after(earlier.as_ref()).write_json(&self.dir)
        })
    }

    fn merge_rows(
        &self,
        rows: Vec<FalsificationRow>,
        speedups: Vec<SpeedupRow>,
        known: &HashSet<String>,
    ) -> Result<()> {
        let replaced: HashSet<String> = rows
            .iter()
            .map(|r| trial_key(&r.contract, &r.test_id))
            .collect();
        let replaced_tests: HashSet<String> = rows.iter().map(|r| r.test_id.clone()).collect();

        // An unreadable old report (e.g. written by an older column layout) is
        // replaced rather than allowed to stop the run from recording results.
        let old: Vec<FalsificationRow> = read_rows(&self.falsification_path()).unwrap_or_default();
        let mut merged: Vec<FalsificationRow> = old
            .into_iter()
            .filter(|r| {
                let key = trial_key(&r.contract, &r.test_id);
                !replaced.contains(&key) && known.contains(&key)
            })
            .collect();
        merged.extend(rows);
        sort_rows(&mut merged);
        write_rows_atomic(&self.falsification_path(), &merged)?;

        let old: Vec<SpeedupRow> = read_rows(&self.speedups_path()).unwrap_or_default();
        let mut merged: Vec<SpeedupRow> = old
            .into_iter()
            .filter(|r| !replaced_tests.contains(&r.test_id))
            .collect();
        merged.extend(speedups);
        if !merged.is_empty() || self.speedups_path().exists() {
            write_rows_atomic(&self.speedups_path(), &merged)?;
        }
        Ok(())
    }
}

/// The report's row order: by contract, then test id.
pub(crate) fn sort_rows(rows: &mut [FalsificationRow]) {
    rows.sort_by(|a, b| (&a.contract, &a.test_id).cmp(&(&b.contract, &b.test_id)));
}

/// Compact number formatting for summaries: `1.2e-7`, `0.034`, `1234.5`.
pub fn format_number(x: f64) -> String {
    if x == 0.0 || !x.is_finite() {
        return format!("{x}");
    }
    let a = x.abs();
    if !(1e-3..1e6).contains(&a) {
        format!("{x:.3e}")
    } else {
        trim_zeros(&format!("{x:.4}")).to_string()
    }
}

/// `s` without the trailing zeros of its fraction (and the point itself when
/// nothing is left of it): `1.500` -> `1.5`, `2.000` -> `2`, `450` stays.
pub(crate) fn trim_zeros(s: &str) -> &str {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        s
    }
}

/// A plain cpu row of `test` in `contract`, for the report's unit tests.
#[cfg(test)]
pub(crate) fn test_row(contract: &str, test: &str, status: Status) -> FalsificationRow {
    FalsificationRow {
        run_id: "r".into(),
        timestamp: "t".into(),
        git_sha: "g".into(),
        contract: contract.into(),
        contract_version: "1".into(),
        contract_hash: String::new(),
        test_id: test.into(),
        check_kind: "property".into(),
        backend: "cpu".into(),
        device: "cpu".into(),
        compute_capability: String::new(),
        driver_version: String::new(),
        status,
        metric: "m".into(),
        observed: Some(1.0),
        comparator: "<=".into(),
        threshold: Some(2.0),
        unit: String::new(),
        duration_ms: 1.0,
        setup_ms: Some(0.5),
        detail: "a, \"quoted\" detail".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_compact() {
        assert_eq!(format_number(0.034), "0.034");
        assert_eq!(format_number(1.5e-7), "1.500e-7");
        assert_eq!(format_number(2.0), "2");
        assert_eq!(trim_zeros("450"), "450");
        assert_eq!(trim_zeros("1.500"), "1.5");
    }

    #[test]
    fn merge_replaces_reruns_keeps_others_and_drops_unknown() {
        let dir = tempfile::tempdir().expect("tempdir");
        let report = ReportDir::new(dir.path());
        let known: HashSet<String> = ["c::A", "c::B"].iter().map(|s| s.to_string()).collect();
        report
            .merge_and_write(
                vec![
                    test_row("c", "A", Status::Passed),
                    test_row("c", "B", Status::Passed),
                    test_row("c", "Gone", Status::Passed),
                ],
                vec![],
                &known,
            )
            .expect("first write");
        report
            .merge_and_write(vec![test_row("c", "B", Status::Falsified)], vec![], &known)
            .expect("second write");
        let rows: Vec<FalsificationRow> = read_rows(&report.falsification_path()).expect("read");
        let got: Vec<(&str, Status)> = rows
            .iter()
            .map(|r| (r.test_id.as_str(), r.status))
            .collect();
        assert_eq!(got, vec![("A", Status::Passed), ("B", Status::Falsified)]);
        assert_eq!(rows[0].detail, "a, \"quoted\" detail");
    }
}
