//! `graph_speedup`: the graphed step is at least `min_speedup` times faster.
//!
//! Two arms of the subject's workload, each in its own process, train the
//! same setup for `warmup_steps + steps` steps, one with `graph: false`,
//! one with `graph: true`; the first `warmup_steps` (compilation, capture,
//! first replay) are not timed. Metric: `median(plain ms/step) /
//! median(graphed ms/step) >= min_speedup`, with a seeded bootstrap 95%
//! interval, and a `speedups.csv` row (baseline `no_graph`, candidate
//! `graph`). A graphed arm that stops early (a failed capture, a CPU
//! fall-back) falsifies, with its failure as a violation; an un-graphed arm
//! that does is an error. Neither passes.

use std::time::Duration;

use serde::Deserialize;

use super::{graphed_failure, run_arms, ArmFault, ArmPlan, Arms};
use crate::check::doc::{ParamDefault::*, ParamDoc, Piece::*};
use crate::check::params::{Count, Positive};
use crate::check::stats::{median, ratio_ci, BOOTSTRAP_RESAMPLES};
use crate::check::{Comparator, Measurement, Speedup, Validate};
use crate::error::{Error, Result};
use crate::subject::{Subject, TrainSetup};

/// The most timed steps per arm.
pub const MAX_STEPS: usize = 1000;
/// The most warm-up steps per arm.
pub const MAX_WARMUP: usize = 100;
/// The most samples per step.
pub const MAX_BATCH: usize = 64;

/// A trial's wall-time limit when its test states none, in seconds
/// (two arms of warm-up and timed steps, a step falling back to the CPU taking most of a second); each arm gets the same limit.
pub const DEFAULT_TIMEOUT_S: f64 = 600.0;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    pub model: String,
    pub batch: Count,
    #[serde(default)]
    pub seq_len: Option<Count>,
    #[serde(default = "default_warmup")]
    pub warmup_steps: usize,
    #[serde(default = "default_steps")]
    pub steps: Count,
    #[serde(default = "default_min_speedup")]
    pub min_speedup: Positive,
    #[serde(default)]
    pub learning_rate: Option<Positive>,
}

fn default_warmup() -> usize {
    2
}

fn default_steps() -> Count {
    Count(20)
}

fn default_min_speedup() -> Positive {
    Positive(1.10)
}

pub const PARAMS: &[ParamDoc] = &[
    ParamDoc {
        name: "model",
        default: Required,
        bound: &[Text("one of the subject workload's models")],
        meaning: "configuration both arms train",
    },
    ParamDoc {
        name: "batch",
        default: Required,
        bound: &[Text("1 to "), Int(MAX_BATCH)],
        meaning: "samples per step (how the workload trains them is its own)",
    },
    ParamDoc {
        name: "seq_len",
        default: Otherwise("the workload's"),
        bound: &[Text("a positive count")],
        meaning: "tokens per sample",
    },
    ParamDoc {
        name: "warmup_steps",
        default: Yaml("2"),
        bound: &[Text("0 to "), Int(MAX_WARMUP)],
        meaning: "untimed steps first (compilation, capture, first replay)",
    },
    ParamDoc {
        name: "steps",
        default: Yaml("20"),
        bound: &[Text("1 to "), Int(MAX_STEPS)],
        meaning: "timed steps per arm",
    },
    ParamDoc {
        name: "min_speedup",
        default: Yaml("1.1"),
        bound: &[Text("> 0")],
        meaning: "median un-graphed ms/step over median graphed ms/step must reach it",
    },
    ParamDoc {
        name: "learning_rate",
        default: Otherwise("the workload's"),
        bound: &[Text("> 0")],
        meaning: "both arms' learning rate",
    },
];

pub const EXAMPLE: &[(&str, &str)] = &[("model", "tiny"), ("batch", "4")];

impl Validate for Params {
    fn validate(&self) -> std::result::Result<(), String> {
        if self.batch.0 > MAX_BATCH {
            return Err(format!("batch: {} > {MAX_BATCH}", self.batch.0));
        }
        if self.steps.0 > MAX_STEPS {
            return Err(format!("steps: {} > {MAX_STEPS}", self.steps.0));
        }
        if self.warmup_steps > MAX_WARMUP {
            return Err(format!(
                "warmup_steps: {} > {MAX_WARMUP}",
                self.warmup_steps
            ));
        }
        Ok(())
    }
}

impl Params {
    /// The un-graphed arm's setup: warm-up and timed steps.
    pub fn setup(&self, seed: u64) -> TrainSetup {
        TrainSetup {
            model: self.model.clone(),
            batch: self.batch.0,
            seq_len: self.seq_len.map(|c| c.0),
            graph: false,
            steps: self.warmup_steps + self.steps.0,
            seed,
            learning_rate: self.learning_rate.map(|r| r.0),
        }
    }

    /// Runs both arms and judges them (see
    /// [`graph_loss_parity::Params::measure`](super::graph_loss_parity::Params::measure)).
    pub fn measure<S: Subject>(
        &self,
        seed: u64,
        device: &S::Options,
        mutant: Option<String>,
        fault: Option<ArmFault>,
        timeout: Duration,
    ) -> Result<Measurement> {
        let plan = ArmPlan::<S> {
            setup: self.setup(seed),
            device,
            mutant,
            fault,
            measured_from: self.warmup_steps,
            timeout,
        };
        self.judge(S::NAME, seed, &run_arms(&plan)?)
    }

    /// The verdict on two arms' step times; `subject` names the row.
    pub fn judge(&self, subject: &str, seed: u64, arms: &Arms) -> Result<Measurement> {
        if let Some(failure) = graphed_failure(arms)? {
            let mut m = Measurement::new(
                "graph_speedup",
                f64::NAN,
                Comparator::Ge,
                self.min_speedup.0,
                "x",
            );
            m.violate(failure.clone());
            return Ok(m.with_detail(failure));
        }
        let timed = |ms: &[f64]| -> Result<Vec<f64>> {
            ms.get(self.warmup_steps..)
                .filter(|t| !t.is_empty())
                .map(<[f64]>::to_vec)
                .ok_or_else(|| Error::Arm(format!("{} steps timed, none after warm-up", ms.len())))
        };
        let plain = timed(&arms.plain.step_ms)?;
        let graphed = timed(&arms.graphed.step_ms)?;
        let (plain_ms, graphed_ms) = (median(&plain), median(&graphed));
        let ratio = plain_ms / graphed_ms;
        let (low, high) = ratio_ci(&plain, &graphed, seed, BOOTSTRAP_RESAMPLES);
        let setup = self.setup(seed);
        let mut m = Measurement::new("graph_speedup", ratio, Comparator::Ge, self.min_speedup.0, "x")
            .with_detail(format!(
                "median ms/step: un-graphed {plain_ms:.3}, graphed {graphed_ms:.3}; ratio {ratio:.3} (95% CI {low:.3}..{high:.3}); batch {}, {} timed steps after {} warm-up",
                self.batch.0, self.steps.0, self.warmup_steps
            ));
        m.speedups.push(Speedup {
            subject: subject.to_string(),
            model: self.model.clone(),
            batch: self.batch.0,
            seq_len: setup.seq_len.unwrap_or(0),
            baseline: "no_graph".into(),
            candidate: "graph".into(),
            baseline_median_ms: plain_ms,
            candidate_median_ms: graphed_ms,
            ratio,
            ratio_ci_low: low,
            ratio_ci_high: high,
            repeats: plain.len().min(graphed.len()),
            peak_device_gib: None,
            baseline_peak_device_gib: None,
        });
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::arms::ArmReply;

    fn arm(warmup_ms: f64, ms: f64, steps: usize) -> ArmReply {
        let mut step_ms = vec![warmup_ms; 2];
        step_ms.extend(std::iter::repeat_n(ms, steps));
        ArmReply {
            losses: vec![1.0; step_ms.len()],
            step_ms,
            ..ArmReply::default()
        }
    }

    fn params() -> Params {
        let p: Params = serde_yaml::from_str("{model: m, batch: 4, steps: 5}").unwrap();
        p.validate().unwrap();
        p
    }

    #[test]
    fn the_ratio_of_timed_medians_is_judged_and_warm_up_is_ignored() {
        let p = params();
        let fast = Arms {
            plain: arm(5.0, 20.0, 5),
            graphed: arm(900.0, 10.0, 5),
        };
        let m = p.judge("s", 1, &fast).unwrap();
        assert!(m.passed() && (m.observed - 2.0).abs() < 1e-12, "{m:?}");
        assert_eq!(m.speedups.len(), 1);
        assert_eq!(m.speedups[0].baseline, "no_graph");
        assert_eq!(m.speedups[0].repeats, 5);
        let slow = Arms {
            plain: arm(5.0, 20.0, 5),
            graphed: arm(5.0, 19.0, 5),
        };
        assert!(!p.judge("s", 1, &slow).unwrap().passed());
    }

    #[test]
    fn an_arm_without_timed_steps_is_an_error() {
        let p = params();
        let short = Arms {
            plain: arm(5.0, 20.0, 5),
            graphed: ArmReply {
                losses: vec![1.0; 2],
                step_ms: vec![1.0; 2],
                ..ArmReply::default()
            },
        };
        assert!(p.judge("s", 1, &short).is_err());
        let mut failed = arm(5.0, 20.0, 0);
        failed.failure = Some(crate::workload::arms::ArmFailure {
            step: Some(0),
            error: "capture invalidated".into(),
        });
        let m = p
            .judge(
                "s",
                1,
                &Arms {
                    plain: arm(5.0, 20.0, 5),
                    graphed: failed,
                },
            )
            .unwrap();
        assert!(!m.passed() && m.violations[0].contains("capture invalidated"));
        let bad: Params = serde_yaml::from_str("{model: m, batch: 65}").unwrap();
        assert!(bad.validate().is_err());
        assert!(serde_yaml::from_str::<Params>("{model: m}").is_err());
    }
}
