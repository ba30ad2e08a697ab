//! Compares a run's reports with a baseline's: which trials changed status,
//! which of those changes are regressions, which baseline trials did not run,
//! and which speedups dropped beyond their recorded noise.
//!
//! A trial regresses when it is `falsified` now, whatever the baseline says
//! (a new trial too), unless its row says it is a *known violation* (its
//! contract expects it falsified on this subject: see
//! [`FalsificationRow::known_violation`]); and when it `passed` in the
//! baseline and is `error` now. A known violation that passes now is
//! *fixed*: no regression, but its `known_violation` must go. A speedup regresses when its current confidence interval lies
//! wholly below the baseline's (`current.ratio_ci_high < baseline.ratio_ci_low`;
//! overlapping intervals are noise) *and* it dropped by more than
//! [`RUN_TO_RUN_NOISE`]: a bootstrap interval over one run's repeats is far
//! narrower than the spread between runs on the same GPU. A baseline trial that
//! is absent from the current run, or skipped without a reason, is *not run*:
//! a gap in the evidence, so the comparison cannot be called clean.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::baseline::{gpu_kind, host_description, host_kind};
use super::evidence::{self, Account, Side};
use super::{FalsificationRow, SpeedupRow, Status};
use crate::error::Result;
use crate::report::meta::RunMeta;

/// The evidence of one run directory (see [`super::evidence`]).
#[derive(Debug, Clone)]
pub struct RunData {
    pub dir: PathBuf,
    /// What the report calls this run: a baseline's GPU kind, or the folder name.
    pub name: String,
    /// `run.json`, when the run wrote one.
    pub meta: Option<RunMeta>,
    /// The judged rows: those of the run(s) the folder is evidence of.
    pub rows: Vec<FalsificationRow>,
    pub speedups: Vec<SpeedupRow>,
    /// What was read, judged and set aside.
    pub account: Account,
}

impl RunData {
    /// Reads and checks `dir`'s reports as `side` of a comparison
    /// ([`evidence::load`]): `falsification.csv` (required), `speedups.csv`
    /// and `run.json` (both optional).
    pub fn load(dir: &Path, side: Side) -> Result<RunData> {
        let evidence = evidence::load(dir, side)?;
        Ok(RunData {
            dir: dir.to_path_buf(),
            name: dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| dir.display().to_string()),
            meta: evidence.meta,
            rows: evidence.rows,
            speedups: evidence.speedups,
            account: evidence.account,
        })
    }

    /// Why this run's evidence is short of what it selected: selected trials
    /// without a row, an interruption. Empty for a run that finished.
    pub fn gaps(&self) -> Vec<String> {
        let mut gaps = Vec::new();
        if let Some(why) = &self.account.interrupted {
            gaps.push(format!("the run did not finish: {why}"));
        }
        if !self.account.missing.is_empty() {
            gaps.push(format!(
                "{} trial(s) the run selected have no row of it",
                self.account.missing.len()
            ));
        }
        gaps
    }

    /// The GPU this run's `cuda` trials ran on (the device its rows name),
    /// or, failing that, the one its run record names; `None` for a run
    /// that used no GPU.
    pub fn used_gpu(&self) -> Option<String> {
        self.rows
            .iter()
            .filter(|r| r.backend == "cuda")
            .map(|r| r.device.trim())
            .find(|d| !d.is_empty() && *d != "none")
            .map(str::to_string)
            .or_else(|| self.meta.as_ref()?.gpu.as_ref().map(|g| g.name.clone()))
    }

    /// How many GPUs the run's host had: its record's count, or for a
    /// record from before the count was kept, the `x<N>` its folder's name
    /// puts after the GPU kind (`h200x2`), the way baselines are filed.
    pub fn gpu_count(&self) -> Option<u32> {
        let recorded = self
            .meta
            .as_ref()
            .and_then(|m| m.gpu.as_ref()?.device_count);
        recorded.or_else(|| {
            let kind = gpu_kind(&self.used_gpu()?);
            let folder = self.dir.file_name()?.to_str()?;
            folder
                .strip_prefix(kind.as_str())?
                .strip_prefix('x')?
                .parse()
                .ok()
        })
    }

    /// The host the run used, as a sentence names it (`2x NVIDIA H200`).
    pub fn used_host(&self) -> Option<String> {
        Some(host_description(&self.used_gpu()?, self.gpu_count()))
    }

    /// The baseline kind of the host the run used (`h200`, `h200x2`).
    pub fn used_host_kind(&self) -> Option<String> {
        Some(host_kind(&self.used_gpu()?, self.gpu_count()))
    }

    /// This run with only the rows `keep` accepts, and the speedups of the
    /// tests those rows belong to.
    pub fn filtered(&self, keep: impl Fn(&FalsificationRow) -> bool) -> RunData {
        let rows: Vec<FalsificationRow> = self.rows.iter().filter(|r| keep(r)).cloned().collect();
        let speedups = self
            .speedups
            .iter()
            .filter(|s| rows.iter().any(|r| r.test_id == s.test_id))
            .cloned()
            .collect();
        RunData {
            rows,
            speedups,
            ..self.clone()
        }
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

    /// Falsified now and not a known violation (whatever the baseline
    /// says: a falsified claim is news unless its contract says otherwise),
    /// or passed in the baseline and error now.
    pub fn is_regression(&self) -> bool {
        match self.current_status() {
            // A new violation: not one the contract expects, and not one
            // the baseline already recorded as a plain falsification.
            Some(Status::Falsified) => !self.is_known_violation() && !self.was_falsified_already(),
            Some(Status::Error) => self.baseline_status() == Some(Status::Passed),
            _ => false,
        }
    }

    /// Falsified in the baseline too, where no contract excused it then:
    /// the same violation, unchanged. (One the baseline's contract excused
    /// and the current one no longer does is new to the gate.)
    fn was_falsified_already(&self) -> bool {
        self.baseline
            .as_ref()
            .is_some_and(|b| b.status == Status::Falsified && !b.expected_falsified())
    }

    /// Falsified now, as its contract expects on this subject: a finding
    /// already recorded, not a regression.
    pub fn is_known_violation(&self) -> bool {
        self.current
            .as_ref()
            .is_some_and(|r| r.status == Status::Falsified && r.expected_falsified())
    }

    /// Passes now although its contract expects it falsified: the subject
    /// was fixed, and the test's `known_violation` must be removed (until
    /// then a new failure of it would be excused).
    pub fn is_fixed(&self) -> bool {
        self.current
            .as_ref()
            .is_some_and(|r| r.status == Status::Passed && r.expected_falsified())
    }

    /// Why the contract expects this trial falsified, when it does.
    pub fn known_reason(&self) -> Option<&str> {
        self.current
            .as_ref()
            .filter(|r| r.expected_falsified())
            .map(|r| r.known_violation.as_str())
    }

    /// The status differs (a trial present in only one report counts).
    pub fn status_changed(&self) -> bool {
        self.baseline_status() != self.current_status()
    }

    /// Skipped now, for a recorded reason (no GPU, no target for this GPU),
    /// although the baseline ran it.
    pub fn not_run_here(&self) -> bool {
        self.current.as_ref().is_some_and(skipped_with_reason)
            && matches!(self.baseline_status(), Some(s) if s != Status::Skipped)
    }

    /// In the baseline, and absent from the current run or skipped there
    /// without a reason: nothing says why it did not run, so the run is
    /// incomplete.
    pub fn not_run(&self) -> bool {
        self.baseline.is_some()
            && match &self.current {
                None => true,
                Some(r) => r.status == Status::Skipped && !skipped_with_reason(r),
            }
    }
}

fn skipped_with_reason(r: &FalsificationRow) -> bool {
    r.status == Status::Skipped && !r.detail.trim().is_empty()
}

/// The relative drop a speedup may show between two runs of the same code on
/// the same GPU kind without being a regression. Measured: F-TPUT-003's step
/// time spread 18.72–19.57 ms (4.5%) over five H200 runs of one commit.
pub const RUN_TO_RUN_NOISE: f64 = 0.05;

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

    /// The current interval lies wholly below the baseline's, the ratio
    /// dropped by more than [`RUN_TO_RUN_NOISE`], and the candidate side got
    /// slower (see [`SpeedupDiff::baseline_side_faster`]). Only a judged row
    /// (one with a threshold) can regress: a mutant's row times an injected
    /// fault, a row that is one part of a judged total is context, and a
    /// `skipped` row (a throttled GPU) is unjudged.
    pub fn is_regression(&self) -> bool {
        match (&self.baseline, &self.current) {
            (Some(b), Some(c)) => {
                !c.is_mutant()
                    && c.threshold.is_some()
                    && c.status != Some(Status::Skipped)
                    && c.ratio_ci_high < b.ratio_ci_low
                    && c.ratio < b.ratio * (1.0 - RUN_TO_RUN_NOISE)
                    && !self.baseline_side_faster()
            }
            _ => false,
        }
    }

    /// The ratio `baseline time / candidate time` fell only because its
    /// baseline side got faster: the candidate's median is no slower than in
    /// the baseline run (within [`RUN_TO_RUN_NOISE`]). Measured: the eager
    /// small-4l step that F-GRAPH-BWD-003 divides by the graphed one took
    /// 1.590 ms in one H100 baseline and 1.325 ms in the next, the graphed
    /// step 0.980 ms in both (host launch time differs from machine to
    /// machine). A trial whose claim this breaks still fails on its own.
    pub fn baseline_side_faster(&self) -> bool {
        match (&self.baseline, &self.current) {
            (Some(b), Some(c)) => {
                c.baseline_median_ms < b.baseline_median_ms
                    && c.candidate_median_ms <= b.candidate_median_ms * (1.0 + RUN_TO_RUN_NOISE)
            }
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

/// Whether the current run regressed against the baseline. Ordered by
/// severity: a report over several baselines takes the worst.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Verdict {
    /// Every baseline trial ran (or was skipped for a recorded reason) and
    /// nothing regressed.
    Clean,
    /// Nothing that ran regressed, but some baseline trials did not run.
    Incomplete,
    /// A trial or a speedup regressed.
    Regressed,
}

/// `falsify report`'s exit code for a run that regressed.
pub const EXIT_REGRESSED: u8 = 1;
/// `falsify report`'s exit code when no verdict could be reached (a missing
/// report or baseline, a refused output folder, a usage error).
pub const EXIT_NO_VERDICT: u8 = 2;
/// `falsify report`'s exit code for a run that left baseline trials unrun.
pub const EXIT_INCOMPLETE: u8 = 3;

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Clean => "clean",
            Verdict::Incomplete => "incomplete",
            Verdict::Regressed => "regressed",
        }
    }

    /// The exit code `falsify report` ends with: 0 clean, [`EXIT_REGRESSED`],
    /// [`EXIT_INCOMPLETE`].
    pub fn exit_code(self) -> u8 {
        match self {
            Verdict::Clean => 0,
            Verdict::Incomplete => EXIT_INCOMPLETE,
            Verdict::Regressed => EXIT_REGRESSED,
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

    /// Trials falsified now and not known violations, and trials that
    /// passed in the baseline and are error now.
    pub fn regressions(&self) -> Vec<&TrialDiff> {
        self.trials.iter().filter(|t| t.is_regression()).collect()
    }

    /// Trials falsified now as their contracts expect (never regressions).
    pub fn known_violations(&self) -> Vec<&TrialDiff> {
        self.trials
            .iter()
            .filter(|t| t.is_known_violation())
            .collect()
    }

    /// Known violations that pass now: fixed (never regressions).
    pub fn fixed(&self) -> Vec<&TrialDiff> {
        self.trials.iter().filter(|t| t.is_fixed()).collect()
    }

    /// Trials that are error now and were not passed in the baseline:
    /// not regressions, but no evidence either way. The report lists them
    /// so that a clean verdict never hides a claim nobody could judge.
    pub fn unjudged(&self) -> Vec<&TrialDiff> {
        self.trials
            .iter()
            .filter(|t| t.current_status() == Some(Status::Error) && !t.is_regression())
            .collect()
    }

    /// Speedups whose interval now lies wholly below the baseline's.
    pub fn speedup_regressions(&self) -> Vec<&SpeedupDiff> {
        self.speedups.iter().filter(|s| s.is_regression()).collect()
    }

    /// Baseline trials absent from the current run, or skipped there without
    /// a reason.
    pub fn not_run(&self) -> Vec<&TrialDiff> {
        self.trials.iter().filter(|t| t.not_run()).collect()
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

    /// `Regressed` when any trial or speedup regressed, else `Incomplete`
    /// when a baseline trial did not run, else `Clean`.
    pub fn verdict(&self) -> Verdict {
        if self.trials.iter().any(TrialDiff::is_regression)
            || self.speedups.iter().any(SpeedupDiff::is_regression)
        {
            Verdict::Regressed
        } else if self.trials.iter().any(TrialDiff::not_run) {
            Verdict::Incomplete
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::test_row;

    fn run(rows: Vec<FalsificationRow>) -> RunData {
        RunData {
            dir: PathBuf::from("run"),
            name: "run".into(),
            meta: None,
            rows,
            speedups: Vec::new(),
            account: Account::default(),
        }
    }

    fn compare(baseline: Vec<FalsificationRow>, current: Vec<FalsificationRow>) -> RunComparison {
        RunComparison::new(&run(baseline), &run(current))
    }

    fn ids(trials: Vec<&TrialDiff>) -> Vec<&str> {
        trials.iter().map(|t| t.test_id.as_str()).collect()
    }

    #[test]
    fn a_falsified_trial_without_a_baseline_row_regresses() {
        let cmp = compare(
            vec![test_row("c", "OLD", Status::Passed)],
            vec![
                test_row("c", "OLD", Status::Passed),
                test_row("c", "NEW", Status::Falsified),
                test_row("c", "NEW::mutant", Status::Passed),
            ],
        );
        assert_eq!(ids(cmp.regressions()), ["NEW"]);
        assert_eq!(cmp.verdict(), Verdict::Regressed);
    }

    #[test]
    fn a_trial_falsified_in_the_baseline_too_is_unchanged() {
        let cmp = compare(
            vec![test_row("c", "T", Status::Falsified)],
            vec![test_row("c", "T", Status::Falsified)],
        );
        assert_eq!(ids(cmp.regressions()), Vec::<&str>::new());
    }

    fn known(status: Status) -> FalsificationRow {
        FalsificationRow {
            known_violation: "compiles after the upload".into(),
            ..test_row("c", "K", status)
        }
    }

    #[test]
    fn a_known_violation_still_falsified_is_not_a_regression() {
        for baseline in [vec![known(Status::Falsified)], vec![]] {
            let cmp = compare(baseline, vec![known(Status::Falsified)]);
            assert_eq!(ids(cmp.regressions()), Vec::<&str>::new());
            assert_eq!(ids(cmp.known_violations()), ["K"]);
            assert_eq!(
                cmp.trials[0].known_reason(),
                Some("compiles after the upload")
            );
            assert_eq!(cmp.verdict(), Verdict::Clean);
        }
    }

    #[test]
    fn a_known_violation_that_passes_now_is_fixed_not_a_regression() {
        let cmp = compare(vec![known(Status::Falsified)], vec![known(Status::Passed)]);
        assert_eq!(ids(cmp.fixed()), ["K"]);
        assert_eq!(ids(cmp.known_violations()), Vec::<&str>::new());
        assert_eq!(cmp.verdict(), Verdict::Clean);
    }

    #[test]
    fn a_violation_the_contract_no_longer_expects_regresses() {
        // Known in the baseline; the current contract dropped it.
        let cmp = compare(
            vec![known(Status::Falsified)],
            vec![test_row("c", "K", Status::Falsified)],
        );
        assert_eq!(ids(cmp.regressions()), ["K"]);
        assert_eq!(cmp.verdict(), Verdict::Regressed);
    }

    #[test]
    fn passed_to_error_regresses_and_a_pass_does_not() {
        let cmp = compare(
            vec![
                test_row("c", "A", Status::Passed),
                test_row("c", "B", Status::Falsified),
            ],
            vec![
                test_row("c", "A", Status::Error),
                test_row("c", "B", Status::Passed),
            ],
        );
        assert_eq!(ids(cmp.regressions()), ["A"]);
    }

    #[test]
    fn an_error_that_did_not_pass_before_is_unjudged_not_a_regression() {
        let cmp = compare(
            vec![
                test_row("c", "A", Status::Error),
                test_row("c", "B", Status::Passed),
                test_row("c", "C", Status::Falsified),
            ],
            vec![
                test_row("c", "A", Status::Error),
                test_row("c", "B", Status::Error),
                test_row("c", "C", Status::Error),
                test_row("c", "D", Status::Error),
            ],
        );
        assert_eq!(ids(cmp.regressions()), ["B"]);
        assert_eq!(ids(cmp.unjudged()), ["A", "C", "D"]);
    }
}
