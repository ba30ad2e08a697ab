//! What a check reports: one headline metric compared with a threshold, plus any
//! violations that fail the trial regardless of the metric.

use super::clocks::ClockWindow;
use crate::report::artifacts::FailureDump;

/// How `observed` is compared with `threshold`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Comparator {
    /// observed <= threshold
    Le,
    /// observed >= threshold
    Ge,
    /// observed == threshold
    Eq,
}

impl Comparator {
    /// Whether `observed` satisfies the comparison. NaN never does.
    pub fn holds(self, observed: f64, threshold: f64) -> bool {
        match self {
            Comparator::Le => observed <= threshold,
            Comparator::Ge => observed >= threshold,
            Comparator::Eq => observed == threshold,
        }
    }

    pub fn symbol(self) -> &'static str {
        match self {
            Comparator::Le => "<=",
            Comparator::Ge => ">=",
            Comparator::Eq => "==",
        }
    }
}

/// One throughput comparison, written to `speedups.csv`.
#[derive(Debug, Clone, PartialEq)]
pub struct Speedup {
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
    /// Peak device memory of the one configuration the row measures, GiB
    /// (`step_throughput`), or of the candidate where the baseline's is
    /// measured the same way beside it (`peer_ratio`); `None` where the row
    /// compares two configurations or times a kernel.
    pub peak_device_gib: Option<f64>,
    /// The baseline's device memory, GiB, measured as the candidate's
    /// `peak_device_gib` is (`peer_ratio`: each process's as the driver
    /// reports it); `None` in every other row.
    pub baseline_peak_device_gib: Option<f64>,
}

/// The outcome of one check.
#[derive(Debug, Clone, PartialEq)]
pub struct Measurement {
    /// Name of the headline metric, e.g. `rel_l2_error`.
    pub metric: String,
    pub observed: f64,
    pub comparator: Comparator,
    pub threshold: f64,
    pub unit: String,
    /// Human-readable context: shapes, seed, worst case, per-checkpoint values.
    pub detail: String,
    /// Conditions that falsify the claim whatever the metric says (NaN, an
    /// unwritten output element, a refused planted PTX that loaded).
    pub violations: Vec<String>,
    /// Throughput rows, for `throughput_ratio` and `step_throughput`.
    pub speedups: Vec<Speedup>,
    /// The tensors of the worst failing case (inputs, output, reference), if
    /// the check captured them; the engine writes them as a safetensors
    /// artifact when the trial is falsified.
    pub failure: Option<FailureDump>,
    /// The GPU's clocks before and after the timed region, for timing
    /// checks; a throttled window makes the trial `skipped`, not judged.
    pub clocks: Option<ClockWindow>,
}

impl Measurement {
    /// A measurement with no violations, detail or speedups yet.
    pub fn new(
        metric: &str,
        observed: f64,
        comparator: Comparator,
        threshold: f64,
        unit: &str,
    ) -> Self {
        Measurement {
            metric: metric.to_string(),
            observed,
            comparator,
            threshold,
            unit: unit.to_string(),
            detail: String::new(),
            violations: Vec::new(),
            speedups: Vec::new(),
            failure: None,
            clocks: None,
        }
    }

    /// Attaches the tensors of the worst failing case (see [`FailureDump`]).
    pub fn with_failure(mut self, dump: FailureDump) -> Self {
        self.failure = Some(dump);
        self
    }

    /// Sets the detail text.
    pub fn with_detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = detail.into();
        self
    }

    /// Adds a violation.
    pub fn violate(&mut self, why: impl Into<String>) {
        self.violations.push(why.into());
    }

    /// The claim survives: the metric is finite, satisfies its comparator, and
    /// nothing else was violated.
    pub fn passed(&self) -> bool {
        self.observed.is_finite()
            && self.comparator.holds(self.observed, self.threshold)
            && self.violations.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nan_and_violations_never_pass() {
        assert!(Measurement::new("e", 0.5, Comparator::Le, 1.0, "").passed());
        assert!(!Measurement::new("e", f64::NAN, Comparator::Le, 1.0, "").passed());
        assert!(!Measurement::new("e", 2.0, Comparator::Le, 1.0, "").passed());
        let mut m = Measurement::new("e", 0.5, Comparator::Le, 1.0, "");
        m.violate("unwritten element");
        assert!(!m.passed());
        assert!(Measurement::new("r", 1.2, Comparator::Ge, 1.1, "x").passed());
    }
}
