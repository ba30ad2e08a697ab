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
pub mod terminal;

use std::collections::{BTreeSet, HashSet};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
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
    /// Why this trial was expected to be falsified: the `reason` of its
    /// test's `known_violation`, a claim the subject is known not to keep.
    /// Empty for every other trial (self-tests included), and in reports
    /// written before the column existed. The status still says what was
    /// measured; the report's gate reads this column (see
    /// [`compare::TrialDiff::is_known_violation`]).
    #[serde(default)]
    pub known_violation: String,
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

    /// Whether the trial's contract says it is expected to be falsified
    /// (see [`FalsificationRow::known_violation`]).
    pub fn expected_falsified(&self) -> bool {
        !self.known_violation.trim().is_empty()
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
/// columns `contract`, `status`, `threshold`, `peak_device_gib`,
/// `baseline_peak_device_gib` and `clocks` are absent from reports written
/// before they existed; such rows read with them empty, and
/// [`fill_from_trials`] fills what the trial rows know.
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
    /// The baseline's device memory, GiB, measured as `peak_device_gib` is:
    /// filled by `peer_ratio` (each process as the driver reports it),
    /// empty in every other row and in reports written before the column.
    #[serde(default)]
    pub baseline_peak_device_gib: Option<f64>,
    /// The GPU's SM and memory clocks and clock-event reasons before and
    /// after the timed region, as the trial's clock window describes them,
    /// `unknown (why)` where they could not be read; empty for rows of
    /// checks that do not read them and in reports written before the column.
    #[serde(default)]
    pub clocks: String,
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

/// The key that identifies a trial across runs: `{contract}::{test_id}`.
pub fn trial_key(contract: &str, test_id: &str) -> String {
    format!("{contract}::{test_id}")
}

/// What writing a run's reports did besides writing its rows: what a front
/// end tells the person who ran it ([`Written::messages`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Written {
    /// The trial report written (`falsification.csv`).
    pub path: PathBuf,
    /// Files found in the folder that did not parse, each kept beside the
    /// new one under another name rather than replaced.
    pub set_aside: Vec<SetAside>,
    /// `{contract}::{test_id}` of each row of an earlier run kept although
    /// this run's contracts do not define its trial: a row of another
    /// contract tree run into the same folder, or of a test since removed.
    /// Each keeps its own run id, so no report takes it for this run's.
    pub kept_other: Vec<String>,
    /// `{contract}::{test_id}` of each trial whose row from this run (its
    /// own process's result) was kept over this process's forecast that it
    /// would be skipped here: a trial cannot be both run and skipped in one
    /// run, and the process that ran it knew.
    pub kept_over_forecast: Vec<String>,
}

/// A report that did not parse, kept under another name.
#[derive(Debug, Clone, PartialEq)]
pub struct SetAside {
    /// Where it was.
    pub file: PathBuf,
    /// Where it is now.
    pub kept_as: PathBuf,
    /// Why it could not be read.
    pub why: String,
}

impl Written {
    /// What the front end says about this write, one line each: a warning
    /// per file set aside, a note about rows kept of trials this run does
    /// not define.
    pub fn messages(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .set_aside
            .iter()
            .map(|s| {
                format!(
                    "warning: {} does not parse ({}): it was kept, renamed to {}, and a new \
                     one holds this run's rows",
                    s.file.display(),
                    s.why,
                    s.kept_as.display()
                )
            })
            .collect();
        if !self.kept_other.is_empty() {
            let contracts: BTreeSet<&str> = self
                .kept_other
                .iter()
                .map(|k| k.split_once("::").map_or(k.as_str(), |(c, _)| c))
                .collect();
            let contracts: Vec<&str> = contracts.into_iter().collect();
            out.push(format!(
                "note: {} kept {} row(s) of earlier runs whose trials this run's contracts do \
                 not define (contracts: {}): another contract tree's, or tests since removed; \
                 each keeps its own run id",
                self.path.display(),
                self.kept_other.len(),
                contracts.join(", ")
            ));
        }
        if !self.kept_over_forecast.is_empty() {
            out.push(format!(
                "note: this process found {} trial(s) could not be judged here, but they ran in \
                 this run and their rows were kept: {}",
                self.kept_over_forecast.len(),
                self.kept_over_forecast.join(", ")
            ));
        }
        out
    }
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

    /// The folder, created if it is not there yet; a file in the way (at
    /// the folder's path or above it) or a folder that cannot be created is
    /// a [`Error::ReportDir`] that says so once.
    fn ensure_folder(&self) -> Result<()> {
        let refused = |message: String| Error::ReportDir {
            path: self.dir.clone(),
            message,
        };
        let existing = self
            .dir
            .ancestors()
            .find(|p| !p.as_os_str().is_empty() && std::fs::metadata(p).is_ok());
        if let Some(p) = existing.filter(|p| !p.is_dir()) {
            return Err(refused(if p == self.dir {
                "not a folder (a file of that name is there)".into()
            } else {
                format!("not a folder: {} is a file", p.display())
            }));
        }
        std::fs::create_dir_all(&self.dir).map_err(|e| refused(format!("cannot be created: {e}")))
    }

    /// Checks, before a run starts, that its reports can be written here:
    /// the folder is one (or can be made one) that this process can take
    /// the writers' lock of and write into. A run refuses to start
    /// otherwise, rather than find out after its trials ran.
    pub fn check_writable(&self) -> Result<()> {
        self.ensure_folder()?;
        let probe = self
            .dir
            .join(format!(".{FALSIFICATION_CSV}.{}.tmp", std::process::id()));
        self.locked(|| {
            std::fs::write(&probe, b"probe").map_err(|e| Error::io(&probe, e))?;
            std::fs::remove_file(&probe).map_err(|e| Error::io(&probe, e))
        })
        .map_err(|e| Error::ReportDir {
            path: self.dir.clone(),
            message: format!("cannot be written: {e}"),
        })
    }

    /// Runs `write` with the directory's writer lock held. Writers in other
    /// processes (cargo-nextest runs one process per trial) wait their turn,
    /// so no writer reads the reports between another's read and rename and
    /// no row is lost. A killed writer's lock is released by the kernel.
    pub fn locked<T>(&self, write: impl FnOnce() -> Result<T>) -> Result<T> {
        self.ensure_folder()?;
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
    /// process per trial) replaces those trials' rows and keeps every other
    /// row, each with its own run id: rows of trials this run did not
    /// select, and rows of trials `known` (every trial name the contracts
    /// of this run define) does not name, which [`Written::kept_other`]
    /// lists. A report already there that does not parse is kept under
    /// another name ([`Written::set_aside`]), never replaced. An exclusive
    /// lock serialises concurrent writers.
    pub fn merge_and_write(
        &self,
        rows: Vec<FalsificationRow>,
        speedups: Vec<SpeedupRow>,
        known: &HashSet<String>,
    ) -> Result<Written> {
        self.locked(|| self.merge_rows((rows, &HashSet::new()), speedups, known))
    }

    /// [`ReportDir::merge_and_write`], and the run record beside the CSVs,
    /// under the same lock. A record of the same run already there (another
    /// process of one cargo-nextest run) is combined with this one; one that
    /// does not parse is kept under another name, as a report would be.
    /// `forecasts` names (`{contract}::{test_id}`) the trials among `rows`
    /// this process skipped without running them: such a row does not
    /// replace one of the same run whose trial ran (under cargo-nextest,
    /// in a process of its own that found it could be judged).
    pub fn record_run(
        &self,
        (rows, forecasts): (Vec<FalsificationRow>, &HashSet<String>),
        speedups: Vec<SpeedupRow>,
        known: &HashSet<String>,
        run: &RunMeta,
    ) -> Result<Written> {
        self.locked(|| {
            let mut written = self.merge_rows((rows, forecasts), speedups, known)?;
            let earlier = match RunMeta::read_json(&self.dir) {
                Ok(earlier) => earlier,
                Err(e) => {
                    let record = self.dir.join(meta::RUN_JSON);
                    written.set_aside.push(set_aside(&record, e.to_string())?);
                    None
                }
            };
            run.after(earlier.as_ref()).write_json(&self.dir)?;
            Ok(written)
        })
    }

    fn merge_rows(
        &self,
        (rows, forecasts): (Vec<FalsificationRow>, &HashSet<String>),
        speedups: Vec<SpeedupRow>,
        known: &HashSet<String>,
    ) -> Result<Written> {
        let mut written = Written {
            path: self.falsification_path(),
            ..Written::default()
        };
        let mut old: Vec<FalsificationRow> =
            read_or_set_aside(&self.falsification_path(), &mut written)?;
        if let Some(twice) = duplicated_trial(&old) {
            // Two rows of one trial (a bad hand merge): which one holds is
            // unknowable, so neither is merged; the file is kept beside.
            let why = format!("it holds trial {twice} twice");
            written
                .set_aside
                .push(set_aside(&self.falsification_path(), why)?);
            old.clear();
        }
        let (rows, kept) = drop_overruled_forecasts(rows, forecasts, &old);
        written.kept_over_forecast = kept;
        let replaced: HashSet<String> = rows
            .iter()
            .map(|r| trial_key(&r.contract, &r.test_id))
            .collect();
        let replaced_tests: HashSet<String> = rows.iter().map(|r| r.test_id.clone()).collect();

        let mut merged: Vec<FalsificationRow> = old
            .into_iter()
            .filter(|r| !replaced.contains(&trial_key(&r.contract, &r.test_id)))
            .collect();
        written.kept_other = merged
            .iter()
            .map(|r| trial_key(&r.contract, &r.test_id))
            .filter(|key| !known.contains(key))
            .collect();
        merged.extend(rows);
        sort_rows(&mut merged);
        write_rows_atomic(&self.falsification_path(), &merged)?;

        let old: Vec<SpeedupRow> = read_or_set_aside(&self.speedups_path(), &mut written)?;
        let mut merged: Vec<SpeedupRow> = old
            .into_iter()
            .filter(|r| !replaced_tests.contains(&r.test_id))
            .collect();
        merged.extend(speedups);
        if !merged.is_empty() || self.speedups_path().exists() {
            write_rows_atomic(&self.speedups_path(), &merged)?;
        }
        Ok(written)
    }
}

/// `rows` without the forecasts (skipped rows of the trials `forecasts`
/// names) that `old` overrules: a row of the same run whose trial ran
/// (any status but skipped, a provisional `error` included). Returns the
/// rows to merge and the names of the trials whose forecast was dropped.
fn drop_overruled_forecasts(
    rows: Vec<FalsificationRow>,
    forecasts: &HashSet<String>,
    old: &[FalsificationRow],
) -> (Vec<FalsificationRow>, Vec<String>) {
    let ran: HashSet<(String, &str)> = old
        .iter()
        .filter(|r| r.status != Status::Skipped)
        .map(|r| (trial_key(&r.contract, &r.test_id), r.run_id.as_str()))
        .collect();
    let mut kept = Vec::new();
    let rows = rows
        .into_iter()
        .filter(|r| {
            let key = trial_key(&r.contract, &r.test_id);
            let overruled = r.status == Status::Skipped
                && forecasts.contains(&key)
                && ran.contains(&(key.clone(), r.run_id.as_str()));
            if overruled {
                kept.push(key);
            }
            !overruled
        })
        .collect();
    (rows, kept)
}

/// The rows of the report at `path` (none when there is none); a report
/// that does not parse, or whose last line was cut short, is renamed
/// beside it and recorded in `written`, and reads as no rows.
fn read_or_set_aside<T: DeserializeOwned>(path: &Path, written: &mut Written) -> Result<Vec<T>> {
    let why = match read_rows(path) {
        Ok(rows) => match cut_short(path) {
            Ok(false) => return Ok(rows),
            Ok(true) => "its last line is cut short (the file does not end with a newline)".into(),
            Err(e) => e.to_string(),
        },
        Err(e) => e.to_string(),
    };
    written.set_aside.push(set_aside(path, why)?);
    Ok(Vec::new())
}

/// The first trial that has two rows in `rows`, as `{contract}::{test_id}`.
fn duplicated_trial(rows: &[FalsificationRow]) -> Option<String> {
    let mut seen = HashSet::new();
    rows.iter()
        .map(|r| trial_key(&r.contract, &r.test_id))
        .find(|key| !seen.insert(key.clone()))
}

/// Whether the file at `path` is not empty and does not end with a newline:
/// every record a writer writes ends with one, so such a file was cut short
/// (a crash mid-write, a copy that stopped), even where its last record
/// still parses. A missing file is not.
fn cut_short(path: &Path) -> Result<bool> {
    let mut file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(Error::io(path, e)),
    };
    let len = file.metadata().map_err(|e| Error::io(path, e))?.len();
    if len == 0 {
        return Ok(false);
    }
    let mut last = [0u8; 1];
    file.seek(SeekFrom::End(-1))
        .and_then(|_| file.read_exact(&mut last))
        .map_err(|e| Error::io(path, e))?;
    Ok(last[0] != b'\n')
}

/// Renames the file at `path` to `<name>.unreadable-<UTC time>-<pid>` in the
/// same folder (with `-2`, `-3`, ... should that name be taken), so that
/// what could not be read is kept rather than overwritten.
fn set_aside(path: &Path, why: String) -> Result<SetAside> {
    let name = path
        .file_name()
        .map_or_else(|| "report".into(), |n| n.to_string_lossy().into_owned());
    let base = format!(
        "{name}.unreadable-{}-{}",
        meta::compact_utc_now(),
        std::process::id()
    );
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut kept_as = dir.join(&base);
    let mut n = 1;
    while kept_as.exists() {
        n += 1;
        kept_as = dir.join(format!("{base}-{n}"));
    }
    std::fs::rename(path, &kept_as).map_err(|e| Error::io(path, e))?;
    Ok(SetAside {
        file: path.to_path_buf(),
        kept_as,
        why,
    })
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
        known_violation: String::new(),
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
    fn merge_replaces_reruns_and_keeps_every_other_row() {
        let dir = tempfile::tempdir().expect("tempdir");
        let report = ReportDir::new(dir.path());
        let known: HashSet<String> = ["c::A", "c::B"].iter().map(|s| s.to_string()).collect();
        let first = report
            .merge_and_write(
                vec![
                    test_row("c", "A", Status::Passed),
                    test_row("c", "B", Status::Passed),
                    test_row("other", "Gone", Status::Passed),
                ],
                vec![],
                &known,
            )
            .expect("first write");
        assert_eq!(first.kept_other, Vec::<String>::new(), "nothing was there");
        let second = report
            .merge_and_write(vec![test_row("c", "B", Status::Falsified)], vec![], &known)
            .expect("second write");
        let rows: Vec<FalsificationRow> = read_rows(&report.falsification_path()).expect("read");
        let got: Vec<(&str, Status)> = rows
            .iter()
            .map(|r| (r.test_id.as_str(), r.status))
            .collect();
        assert_eq!(
            got,
            vec![
                ("A", Status::Passed),
                ("B", Status::Falsified),
                ("Gone", Status::Passed)
            ]
        );
        assert_eq!(rows[0].detail, "a, \"quoted\" detail");
        assert_eq!(second.kept_other, ["other::Gone"]);
        assert_eq!(second.set_aside, []);
        let messages = second.messages();
        assert_eq!(messages.len(), 1);
        assert!(
            messages[0].contains("kept 1 row(s)") && messages[0].contains("contracts: other"),
            "{messages:?}"
        );
    }

    /// Under cargo-nextest every process records the trials it finds it
    /// cannot judge as skipped. A process that sees less of the machine
    /// (a GPU busy with others' memory, fewer GPUs) must not turn the row of
    /// a trial that ran in this run into `skipped`; a forecast of another
    /// run's trial, or of one with no row, is written.
    #[test]
    fn a_forecast_skip_never_replaces_a_row_of_the_same_run_that_ran() {
        let dir = tempfile::tempdir().expect("tempdir");
        let report = ReportDir::new(dir.path());
        let known: HashSet<String> = ["c::A", "c::B", "c::C", "c::D"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let ran = |id: &str, status| FalsificationRow {
            run_id: "this".into(),
            ..test_row("c", id, status)
        };
        let earlier = FalsificationRow {
            run_id: "earlier".into(),
            ..test_row("c", "C", Status::Passed)
        };
        let first = vec![ran("A", Status::Passed), ran("B", Status::Error), earlier];
        report
            .merge_and_write(first, vec![], &known)
            .expect("first");
        // Every trial forecast skipped.
        let forecasts = known.clone();
        let skips = ["A", "B", "C", "D"]
            .map(|id| ran(id, Status::Skipped))
            .to_vec();
        let written = report
            .record_run((skips, &forecasts), vec![], &known, &RunMeta::detect())
            .expect("second");
        let rows: Vec<FalsificationRow> = read_rows(&report.falsification_path()).expect("read");
        let got: Vec<(&str, &str, Status)> = rows
            .iter()
            .map(|r| (r.test_id.as_str(), r.run_id.as_str(), r.status))
            .collect();
        assert_eq!(
            got,
            [
                ("A", "this", Status::Passed),
                ("B", "this", Status::Error),
                ("C", "this", Status::Skipped),
                ("D", "this", Status::Skipped),
            ]
        );
        assert_eq!(written.kept_over_forecast, ["c::A", "c::B"]);
        assert!(written.messages().iter().any(|m| m.contains("2 trial(s)")));
        // A row that is not a forecast (the trial's own result) replaces.
        let own = vec![ran("A", Status::Skipped)];
        report
            .record_run((own, &HashSet::new()), vec![], &known, &RunMeta::detect())
            .expect("third");
        let rows: Vec<FalsificationRow> = read_rows(&report.falsification_path()).expect("read");
        assert_eq!(rows[0].status, Status::Skipped);
    }

    #[test]
    fn the_known_violation_column_round_trips_and_is_empty_in_older_reports() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(FALSIFICATION_CSV);
        let known = FalsificationRow {
            known_violation: "=loads a module after the upload, \"late\"".into(),
            ..test_row("c", "K", Status::Falsified)
        };
        write_rows_atomic(&path, &[known.clone(), test_row("c", "A", Status::Passed)]).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text
            .lines()
            .next()
            .unwrap()
            .ends_with(",detail,known_violation"));
        let rows: Vec<FalsificationRow> = read_rows(&path).unwrap();
        assert_eq!(rows[0], known);
        assert!(rows[0].expected_falsified() && !rows[1].expected_falsified());

        // A report written before the column: no trial expected falsified.
        let mut old = csv::Reader::from_path(&path).unwrap();
        let headers = old.headers().unwrap().clone();
        let keep = headers.len() - 1;
        let mut writer = csv::Writer::from_path(dir.path().join("old.csv")).unwrap();
        writer.write_record(headers.iter().take(keep)).unwrap();
        for record in old.records() {
            writer
                .write_record(record.unwrap().iter().take(keep))
                .unwrap();
        }
        writer.flush().unwrap();
        let rows: Vec<FalsificationRow> = read_rows(&dir.path().join("old.csv")).unwrap();
        assert_eq!(rows.len(), 2);
        assert!(rows.iter().all(|r| r.known_violation.is_empty()));
        assert_eq!(rows[0].status, Status::Falsified);
    }

    #[test]
    fn a_report_that_does_not_parse_is_renamed_never_replaced() {
        let dir = tempfile::tempdir().expect("tempdir");
        let report = ReportDir::new(dir.path());
        let known = HashSet::new();
        let damaged = "run_id,status\nr,Passed\n";
        std::fs::write(report.falsification_path(), damaged).unwrap();
        std::fs::write(dir.path().join(meta::RUN_JSON), "{").unwrap();
        let written = report
            .record_run(
                (vec![test_row("c", "A", Status::Passed)], &HashSet::new()),
                vec![],
                &known,
                &RunMeta::detect(),
            )
            .expect("written");
        assert_eq!(written.set_aside.len(), 2, "{written:?}");
        let csv = &written.set_aside[0];
        assert_eq!(csv.file, report.falsification_path());
        assert_eq!(std::fs::read_to_string(&csv.kept_as).unwrap(), damaged);
        assert!(csv
            .kept_as
            .to_string_lossy()
            .contains("falsification.csv.unreadable-"));
        assert_eq!(
            std::fs::read_to_string(&written.set_aside[1].kept_as).unwrap(),
            "{"
        );
        let rows: Vec<FalsificationRow> = read_rows(&report.falsification_path()).unwrap();
        assert_eq!(rows.len(), 1);
        assert!(RunMeta::read_json(dir.path()).unwrap().is_some());
        assert!(written.messages()[0].starts_with("warning: "));

        // A report whose last record parses but lost its final newline was
        // cut short: kept aside as well.
        let full = std::fs::read_to_string(report.falsification_path()).unwrap();
        std::fs::write(report.falsification_path(), full.trim_end()).unwrap();
        let written = report
            .merge_and_write(vec![test_row("c", "B", Status::Passed)], vec![], &known)
            .unwrap();
        assert_eq!(written.set_aside.len(), 1);
        assert!(written.set_aside[0].why.contains("cut short"));
    }

    /// A hand merge that left one trial twice (one row falsified, one
    /// passed) is damaged evidence: kept beside, never merged.
    #[test]
    fn a_report_with_a_trial_twice_is_kept_beside_never_merged() {
        let dir = tempfile::tempdir().expect("tempdir");
        let report = ReportDir::new(dir.path());
        let twice = vec![
            test_row("c", "A", Status::Falsified),
            test_row("c", "A", Status::Passed),
            test_row("c", "B", Status::Passed),
        ];
        write_rows_atomic(&report.falsification_path(), &twice).unwrap();
        let damaged = std::fs::read(report.falsification_path()).unwrap();
        let written = report
            .merge_and_write(
                vec![test_row("c", "C", Status::Passed)],
                vec![],
                &HashSet::new(),
            )
            .unwrap();
        assert_eq!(written.set_aside.len(), 1, "{written:?}");
        assert!(written.set_aside[0].why.contains("c::A twice"));
        assert_eq!(
            std::fs::read(&written.set_aside[0].kept_as).unwrap(),
            damaged
        );
        let rows: Vec<FalsificationRow> = read_rows(&report.falsification_path()).unwrap();
        assert_eq!(rows.len(), 1);
    }

    #[test]
    fn a_file_in_the_way_of_the_folder_is_said_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("f");
        std::fs::write(&file, "x").unwrap();
        for (path, says) in [
            (
                file.clone(),
                "not a folder (a file of that name is there)".to_string(),
            ),
            (
                file.join("below"),
                format!("not a folder: {} is a file", file.display()),
            ),
        ] {
            let e = ReportDir::new(&path).check_writable().unwrap_err();
            assert_eq!(e.to_string(), format!("{}: {says}", path.display()));
            assert!(std::error::Error::source(&e).is_none());
        }
        let fine = ReportDir::new(dir.path().join("new/folder"));
        fine.check_writable().expect("a folder that can be made");
        let left: Vec<_> = std::fs::read_dir(&fine.dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(left, [std::ffi::OsString::from(".lock")], "no probe left");
    }
}
