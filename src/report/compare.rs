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
use crate::run::RunMeta;

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
    /// sequence length, baseline and candidate).
    pub fn new(baseline: &RunData, current: &RunData) -> Self {
        let mut trials: BTreeMap<(String, String), TrialDiff> = BTreeMap::new();
        for (row, is_current) in baseline
            .rows
            .iter()
            .map(|r| (r, false))
            .chain(current.rows.iter().map(|r| (r, true)))
        {
            let key = (row.contract.clone(), row.test_id.clone());
            let diff = trials.entry(key).or_insert_with(|| TrialDiff {
                contract: row.contract.clone(),
                test_id: row.test_id.clone(),
                baseline: None,
                current: None,
            });
            if is_current {
                diff.current = Some(row.clone());
            } else {
                diff.baseline = Some(row.clone());
            }
        }
        let mut speedups: BTreeMap<SpeedupKey, SpeedupDiff> = BTreeMap::new();
        for (row, is_current) in baseline
            .speedups
            .iter()
            .map(|r| (r, false))
            .chain(current.speedups.iter().map(|r| (r, true)))
        {
            let diff = speedups
                .entry(SpeedupKey::of(row))
                .or_insert_with(|| SpeedupDiff {
                    baseline: None,
                    current: None,
                });
            if is_current {
                diff.current = Some(row.clone());
            } else {
                diff.baseline = Some(row.clone());
            }
        }
        RunComparison {
            trials: trials.into_values().collect(),
            speedups: speedups.into_values().collect(),
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
        }
    }
}
