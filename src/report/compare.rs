//! Compares a run's reports with a baseline's: which trials changed status,
//! which of those changes are regressions, and which speedups dropped beyond
//! their recorded noise.
//!
//! A trial regresses when it `passed` in the baseline and is now `falsified` or
//! `error`. A speedup regresses when its current confidence interval lies
//! wholly below the baseline's: `current.ratio_ci_high < baseline.ratio_ci_low`
//! (overlapping intervals are noise, not a regression).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::{read_rows, FalsificationRow, SpeedupRow, Status, FALSIFICATION_CSV, SPEEDUPS_CSV};
use crate::error::{Error, Result};
use crate::report::meta::RunMeta;

/// The reports of one run directory.
#[derive(Debug, Clone)]
pub struct RunData {
    pub dir: PathBuf,
    /// `run.json`, when the run wrote one.
    pub meta: Option<RunMeta>,
    pub rows: Vec<FalsificationRow>,
    pub speedups: Vec<SpeedupRow>,
}

impl RunData {
    /// Reads `falsification.csv` (required), `speedups.csv` and `run.json`
    /// (both optional) from `dir`.
    pub fn load(dir: &Path) -> Result<RunData> {
        let csv = dir.join(FALSIFICATION_CSV);
        if !csv.exists() {
            return Err(Error::io(
                &csv,
                std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "no falsification report here; run `falsify run` first",
                ),
            ));
        }
        Ok(RunData {
            dir: dir.to_path_buf(),
            meta: RunMeta::read_json(dir)?,
            rows: read_rows(&csv)?,
            speedups: read_rows(&dir.join(SPEEDUPS_CSV))?,
        })
    }

    /// The distinct values of a column, in first-seen order, empty ones dropped.
    pub fn distinct(&self, column: impl Fn(&FalsificationRow) -> &str) -> Vec<String> {
        let mut seen = Vec::<String>::new();
        for r in &self.rows {
            let v = column(r);
            if !v.is_empty() && !seen.iter().any(|s| s == v) {
                seen.push(v.to_string());
            }
        }
        seen
    }

    /// The earliest and latest row timestamps (RFC 3339 sorts as text).
    pub fn time_span(&self) -> Option<(String, String)> {
        let first = self.rows.iter().map(|r| &r.timestamp).min()?;
        let last = self.rows.iter().map(|r| &r.timestamp).max()?;
        Some((first.clone(), last.clone()))
    }
}

/// One trial in either report.
#[derive(Debug, Clone)]
pub struct TrialDiff {
    pub contract: String,
    pub test_id: String,
    pub baseline: Option<FalsificationRow>,
    pub current: Option<FalsificationRow>,
}

impl TrialDiff {
    pub fn baseline_status(&self) -> Option<Status> {
        self.baseline.as_ref().map(|r| r.status)
    }

    pub fn current_status(&self) -> Option<Status> {
        self.current.as_ref().map(|r| r.status)
    }

    /// `cpu` or `cuda`, from whichever report has the trial.
    pub fn backend(&self) -> &str {
        self.current
            .as_ref()
            .or(self.baseline.as_ref())
            .map(|r| r.backend.as_str())
            .unwrap_or("")
    }

    /// Passed in the baseline, falsified or error now.
    pub fn is_regression(&self) -> bool {
        self.baseline_status() == Some(Status::Passed)
            && matches!(
                self.current_status(),
                Some(Status::Falsified | Status::Error)
            )
    }

    /// The status differs (a trial present in only one report counts).
    pub fn status_changed(&self) -> bool {
        self.baseline_status() != self.current_status()
    }

    /// Skipped now although the baseline ran it (typically: no GPU here).
    pub fn not_run_here(&self) -> bool {
        self.current_status() == Some(Status::Skipped)
            && matches!(self.baseline_status(), Some(s) if s != Status::Skipped)
    }
}

/// One throughput measurement in either report.
#[derive(Debug, Clone)]
pub struct SpeedupDiff {
    pub baseline: Option<SpeedupRow>,
    pub current: Option<SpeedupRow>,
}

impl SpeedupDiff {
    /// The row to describe the measurement by (current first).
    pub fn row(&self) -> Option<&SpeedupRow> {
        self.current.as_ref().or(self.baseline.as_ref())
    }

    /// The current interval lies wholly below the baseline's.
    pub fn is_regression(&self) -> bool {
        match (&self.baseline, &self.current) {
            (Some(b), Some(c)) => c.ratio_ci_high < b.ratio_ci_low,
            _ => false,
        }
    }

    /// `current.ratio / baseline.ratio - 1`, when both exist.
    pub fn change(&self) -> Option<f64> {
        match (&self.baseline, &self.current) {
            (Some(b), Some(c)) if b.ratio > 0.0 => Some(c.ratio / b.ratio - 1.0),
            _ => None,
        }
    }
}

/// Whether the current run regressed against the baseline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Clean,
    Regressed,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Clean => "clean",
            Verdict::Regressed => "regressed",
        }
    }
}

/// The comparison of two runs, trial by trial and speedup by speedup.
#[derive(Debug, Clone)]
pub struct RunComparison {
    /// Every trial of either report, by contract then test id.
    pub trials: Vec<TrialDiff>,
    pub speedups: Vec<SpeedupDiff>,
}

impl RunComparison {
    /// Pairs the rows of `baseline` and `current` by `(contract, test_id)` and
    /// the speedups by what was measured (test, subject, model, batch,
    /// sequence length, baseline, candidate and device: a figure from another
    /// GPU is a different measurement, never a regression of this one).
    pub fn new(baseline: &RunData, current: &RunData) -> Self {
        let trials = pair(&baseline.rows, &current.rows, |r| {
            (r.contract.clone(), r.test_id.clone())
        })
        .into_iter()
        .map(|((contract, test_id), (baseline, current))| TrialDiff {
            contract,
            test_id,
            baseline,
            current,
        });
        let speedups = pair(&baseline.speedups, &current.speedups, SpeedupKey::of)
            .into_values()
            .map(|(baseline, current)| SpeedupDiff { baseline, current });
        RunComparison {
            trials: trials.collect(),
            speedups: speedups.collect(),
        }
    }

    /// Trials that passed in the baseline and are falsified or error now.
    pub fn regressions(&self) -> Vec<&TrialDiff> {
        self.trials.iter().filter(|t| t.is_regression()).collect()
    }

    /// Speedups whose interval now lies wholly below the baseline's.
    pub fn speedup_regressions(&self) -> Vec<&SpeedupDiff> {
        self.speedups.iter().filter(|s| s.is_regression()).collect()
    }

    /// Every trial whose status differs between the reports.
    pub fn status_changes(&self) -> Vec<&TrialDiff> {
        self.trials.iter().filter(|t| t.status_changed()).collect()
    }

    /// Trials the baseline ran and this run skipped, grouped by the skip
    /// reason (the current row's detail), reasons sorted.
    pub fn not_run_here(&self) -> Vec<(String, Vec<&TrialDiff>)> {
        let mut groups: BTreeMap<String, Vec<&TrialDiff>> = BTreeMap::new();
        for t in self.trials.iter().filter(|t| t.not_run_here()) {
            let reason = t
                .current
                .as_ref()
                .map(|r| r.detail.clone())
                .unwrap_or_default();
            groups.entry(reason).or_default().push(t);
        }
        groups.into_iter().collect()
    }

    /// The contracts of either report, sorted.
    pub fn contracts(&self) -> Vec<&str> {
        let set: BTreeSet<&str> = self.trials.iter().map(|t| t.contract.as_str()).collect();
        set.into_iter().collect()
    }

    /// `Regressed` when any trial or speedup regressed.
    pub fn verdict(&self) -> Verdict {
        if self.trials.iter().any(TrialDiff::is_regression)
            || self.speedups.iter().any(SpeedupDiff::is_regression)
        {
            Verdict::Regressed
        } else {
            Verdict::Clean
        }
    }
}

/// Rows of `baseline` and `current` paired by `key`, in key order (a key
/// repeated within one side keeps its last row).
fn pair<R: Clone, K: Ord>(
    baseline: &[R],
    current: &[R],
    key: impl Fn(&R) -> K,
) -> BTreeMap<K, (Option<R>, Option<R>)> {
    let mut pairs: BTreeMap<K, (Option<R>, Option<R>)> = BTreeMap::new();
    for r in baseline {
        pairs.entry(key(r)).or_default().0 = Some(r.clone());
    }
    for r in current {
        pairs.entry(key(r)).or_default().1 = Some(r.clone());
    }
    pairs
}

/// What a speedup row measured, for pairing across runs.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct SpeedupKey {
    test_id: String,
    subject: String,
    model: String,
    batch: usize,
    seq_len: usize,
    baseline: String,
    candidate: String,
    device: String,
}

impl SpeedupKey {
    fn of(r: &SpeedupRow) -> Self {
        SpeedupKey {
            test_id: r.test_id.clone(),
            subject: r.subject.clone(),
            model: r.model.clone(),
            batch: r.batch,
            seq_len: r.seq_len,
            baseline: r.baseline.clone(),
            candidate: r.candidate.clone(),
            device: r.device.clone(),
        }
    }
}
