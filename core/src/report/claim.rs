//! How a trial's result reads in a report: its headline (the bound that
//! decided it) and one line that says plainly whether the claim held, e.g.
//! `grad_rel_error 2.31 > 1e-6: falsified`. The CSV rows, the terminal
//! summary and `REPORT.md` all use these, so a failure reads as a failure
//! everywhere.

use super::trim_zeros;
use super::Status;

/// The measurement a report row leads with (empty: nothing was measured).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Headline {
    pub metric: String,
    pub observed: Option<f64>,
    pub comparator: String,
    pub threshold: Option<f64>,
    pub unit: String,
    /// When violations are the headline: the metric that held, as text, so
    /// the row's detail can still say what was measured.
    pub held: Option<String>,
}

impl Headline {
    /// What a check measured, as a row records it. The headline is the bound
    /// that decided the trial: the metric against its threshold, unless the
    /// metric held and violations (conditions that falsify the claim whatever
    /// the metric says, such as a time bound) did not. Then the violations
    /// are the headline and the metric moves to `held`: a row must never
    /// lead with a number that passed when something else failed.
    pub fn of(
        metric: &str,
        observed: f64,
        comparator: &str,
        threshold: f64,
        unit: &str,
        violations: &[String],
    ) -> Self {
        let measured = Headline {
            metric: metric.to_string(),
            observed: Some(observed),
            comparator: comparator.to_string(),
            threshold: Some(threshold),
            unit: unit.to_string(),
            held: None,
        };
        let metric_holds = measured.claim().is_some_and(|c| c.holds == Some(true));
        if violations.is_empty() || !metric_holds {
            return measured;
        }
        Headline {
            metric: violations.join("; "),
            observed: None,
            comparator: String::new(),
            threshold: None,
            unit: String::new(),
            held: measured.claim().map(|c| format!("{} held", c.text)),
        }
    }

    /// The claim as text with the relation that is true of the numbers, or
    /// the headline text alone when nothing numeric was recorded.
    pub fn claim(&self) -> Option<Claim> {
        let (Some(observed), Some(threshold)) = (self.observed, self.threshold) else {
            return (!self.metric.is_empty()).then(|| Claim {
                text: self.metric.clone(),
                holds: None,
            });
        };
        let unit = if self.unit.is_empty() {
            String::new()
        } else {
            format!(" {}", self.unit)
        };
        if !observed.is_finite() {
            return Some(Claim {
                text: format!(
                    "{} {} (not a finite number; claim {} {}{unit})",
                    self.metric,
                    short(observed),
                    self.comparator,
                    short(threshold)
                ),
                holds: Some(false),
            });
        }
        let (holds, relation) = relation(&self.comparator, observed, threshold);
        // Two numbers that differ must not print alike (`1 > 1`).
        let (o, t) = match (short(observed), short(threshold)) {
            (o, t) if o == t && observed != threshold => {
                (observed.to_string(), threshold.to_string())
            }
            pair => pair,
        };
        Some(Claim {
            text: format!("{} {o} {relation} {t}{unit}", self.metric),
            holds,
        })
    }
}

/// A claim as text, and whether its numbers satisfy it (`None`: no numbers,
/// or a comparator this version does not know).
#[derive(Debug, Clone, PartialEq)]
pub struct Claim {
    pub text: String,
    pub holds: Option<bool>,
}

/// Whether `observed comparator threshold` holds, and the relation to print:
/// the comparator when it holds, its negation when it does not.
fn relation(comparator: &str, observed: f64, threshold: f64) -> (Option<bool>, String) {
    let (holds, negation) = match comparator {
        "<=" => (observed <= threshold, ">"),
        ">=" => (observed >= threshold, "<"),
        "==" => (observed == threshold, "!="),
        other => return (None, other.to_string()),
    };
    let shown = if holds { comparator } else { negation };
    (Some(holds), shown.to_string())
}

/// One line that reads as the verdict of a trial, e.g.
/// `grad_rel_error 2.31 > 1e-6: falsified`,
/// `rel_l2_error 3.1e-7 <= 1e-5 ratio: holds`,
/// `rel_l2_error 0.31 > 1e-5 ratio: mutant caught`. `None` when nothing was
/// measured (the caller shows the reason instead).
pub fn verdict_line(headline: &Headline, status: Status, mutant: bool) -> Option<String> {
    let claim = headline.claim()?;
    let word = match (status, mutant) {
        (Status::Skipped, _) => "not judged",
        (Status::Error, _) => "error",
        (Status::Passed, true) => "mutant caught",
        (Status::Falsified, true) => "mutant survived",
        (Status::Passed, false) => "holds",
        // A row written before violations became the headline.
        (Status::Falsified, false) if claim.holds == Some(true) => {
            "falsified by a violation (see detail)"
        }
        (Status::Falsified, false) => "falsified",
    };
    Some(format!("{}: {word}", claim.text))
}

/// Short number formatting for claims: three significant digits, `1e-6`
/// rather than `1.000e-6`, whole numbers from 100 up (`54701`), and
/// scientific notation from a million.
pub fn short(x: f64) -> String {
    if x == 0.0 || !x.is_finite() {
        return format!("{x}");
    }
    let a = x.abs();
    if !(1e-3..1e6).contains(&a) {
        let s = format!("{x:.2e}");
        return match s.split_once('e') {
            Some((mantissa, exp)) => format!("{}e{exp}", trim_zeros(mantissa)),
            None => s,
        };
    }
    if a >= 100.0 {
        return format!("{x:.0}");
    }
    let decimals = (2 - a.log10().floor() as i32).max(0) as usize;
    trim_zeros(&format!("{x:.decimals$}")).to_string()
}

/// Relative tolerance for recognising a ratio as `observed / threshold`:
/// the two are computed along different paths, so they may differ in the
/// last bits, never by more.
const SAME_VALUE: f64 = 1e-9;

/// The value a speedup row's `ratio` must reach for its trial to pass, in
/// the ratio's own scale, or `None` when the row is context (one part of a
/// judged total, say) rather than what the trial judged:
///
/// - the ratio is the trial's metric: the trial's threshold;
/// - the ratio is the metric relative to its threshold (a measured rate over
///   a target rate): 1.0;
/// - under a `<=` claim, the threshold relative to the metric (a bound on a
///   time over the measured time, so that a larger ratio is faster, as in
///   every row): 1.0.
///
/// A `>=` claim bounds its ratio from below in the first two forms; a `<=`
/// claim only in the third; anything else bounds nothing here.
pub fn ratio_threshold(ratio: f64, observed: f64, comparator: &str, threshold: f64) -> Option<f64> {
    if !ratio.is_finite() {
        return None;
    }
    let same = |relative: f64| (ratio - relative).abs() <= SAME_VALUE * relative.abs();
    match comparator {
        ">=" if ratio == observed => Some(threshold),
        ">=" => (threshold != 0.0 && same(observed / threshold)).then_some(1.0),
        "<=" => (observed != 0.0 && same(threshold / observed)).then_some(1.0),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headline(observed: f64, comparator: &str, threshold: f64, violations: &[&str]) -> Headline {
        let violations: Vec<String> = violations.iter().map(|v| v.to_string()).collect();
        Headline::of("m", observed, comparator, threshold, "", &violations)
    }

    #[test]
    fn a_falsified_claim_prints_the_relation_that_is_true() {
        let h = Headline::of("grad_rel_error", 2.3093, "<=", 1e-6, "", &[]);
        assert_eq!(
            verdict_line(&h, Status::Falsified, false).unwrap(),
            "grad_rel_error 2.31 > 1e-6: falsified"
        );
        let h = Headline::of("rel_l2_error", 3.1e-7, "<=", 1e-5, "ratio", &[]);
        assert_eq!(
            verdict_line(&h, Status::Passed, false).unwrap(),
            "rel_l2_error 3.1e-7 <= 1e-5 ratio: holds"
        );
        let h = Headline::of("tokens_per_s", 30000.4, ">=", 41000.0, "tokens/s", &[]);
        assert_eq!(
            verdict_line(&h, Status::Skipped, false).unwrap(),
            "tokens_per_s 30000 < 41000 tokens/s: not judged"
        );
        // Numbers that differ by less than three digits show are printed whole.
        let h = headline(1.0000004, "<=", 1.0, &[]);
        assert_eq!(
            verdict_line(&h, Status::Falsified, false).unwrap(),
            "m 1.0000004 > 1: falsified"
        );
        let h = headline(f64::NAN, "<=", 1e-5, &[]);
        assert_eq!(
            verdict_line(&h, Status::Falsified, false).unwrap(),
            "m NaN (not a finite number; claim <= 1e-5): falsified"
        );
    }

    #[test]
    fn a_violation_is_the_headline_when_the_metric_held() {
        let bound = "small-4l/fp32: pre-warm took 2400 ms, over the bound of 2000 ms";
        let h = Headline::of(
            "compilations_after_prewarm",
            0.0,
            "<=",
            0.0,
            "compilations",
            &[bound.to_string()],
        );
        assert_eq!(h.metric, bound);
        assert_eq!((h.observed, h.threshold), (None, None));
        assert_eq!(
            h.held.as_deref(),
            Some("compilations_after_prewarm 0 <= 0 compilations held")
        );
        assert_eq!(
            verdict_line(&h, Status::Falsified, false).unwrap(),
            format!("{bound}: falsified")
        );
        // A metric that failed stays the headline; the violations go to the detail.
        let h = headline(2.0, "<=", 1.0, &["NaN in output"]);
        assert_eq!((h.metric.as_str(), h.observed), ("m", Some(2.0)));
    }

    #[test]
    fn mutant_rows_say_whether_the_mutant_was_caught() {
        let h = headline(0.31, "<=", 1e-5, &[]);
        assert_eq!(
            verdict_line(&h, Status::Passed, true).unwrap(),
            "m 0.31 > 1e-5: mutant caught"
        );
        let h = headline(0.0, "<=", 1e-5, &[]);
        assert_eq!(
            verdict_line(&h, Status::Falsified, true).unwrap(),
            "m 0 <= 1e-5: mutant survived"
        );
    }

    #[test]
    fn a_legacy_row_falsified_by_a_violation_does_not_read_as_holding() {
        let h = headline(0.0, "<=", 0.0, &[]);
        assert_eq!(
            verdict_line(&h, Status::Falsified, false).unwrap(),
            "m 0 <= 0: falsified by a violation (see detail)"
        );
    }

    #[test]
    fn numbers_are_short() {
        assert_eq!(short(1e-6), "1e-6");
        assert_eq!(short(9.986488129776205e-7), "9.99e-7");
        assert_eq!(short(2.3093), "2.31");
        assert_eq!(short(0.7), "0.7");
        assert_eq!(short(0.0371), "0.0371");
        assert_eq!(short(54700.66), "54701");
        assert_eq!(short(-0.5), "-0.5");
        assert_eq!(short(2.5e6), "2.5e6");
    }

    #[test]
    fn a_ratio_threshold_is_found_only_for_what_was_judged() {
        // The ratio is the metric.
        assert_eq!(ratio_threshold(1.22, 1.22, ">=", 1.1), Some(1.1));
        // The ratio is a rate over its target: pass at 1.0.
        let (rate, target) = (54700.66, 41000.0);
        assert_eq!(
            ratio_threshold(rate / target, rate, ">=", target),
            Some(1.0)
        );
        // One part of a judged total.
        assert_eq!(ratio_threshold(1.0004, 0.9999, ">=", 0.9), None);
        assert_eq!(ratio_threshold(1.0, 1.0, "<=", 2.0), None);
        // A bound on a time over the measured time: pass at 1.0.
        let (us, bound) = (56.4, 30.0);
        assert_eq!(ratio_threshold(bound / us, us, "<=", bound), Some(1.0));
        assert_eq!(ratio_threshold(us / bound, us, "<=", bound), None);
        assert_eq!(ratio_threshold(f64::INFINITY, 0.0, "<=", bound), None);
        assert_eq!(ratio_threshold(1.0, 1.0, "==", 1.0), None);
    }
}
