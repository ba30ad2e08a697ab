//! `graph_loss_parity`: the graphed step trains like the un-graphed one.
//!
//! Two arms of the subject's workload, each in its own process, train the
//! same setup from the same seed for `max(checkpoints)` steps, one with
//! `graph: false`, one with `graph: true`. At each checkpoint step `c`
//! (1-based) the losses must agree: `max_c |loss_graph(c) - loss_plain(c)|
//! <= tolerance`. A non-finite loss gives an infinite difference; so does a
//! graphed arm that stops early (a failed capture, a CPU fall-back), with
//! its failure as a violation. An un-graphed arm that stops early is an
//! error, never a pass; so is an un-graphed loss that never moves over the
//! checkpoints (both arms failing silently the same way would otherwise
//! agree).

use std::time::Duration;

use serde::Deserialize;

use super::{graphed_failure, run_arms, ArmFault, ArmPlan, Arms};
use crate::check::doc::{ParamDefault::*, ParamDoc, Piece::*};
use crate::check::params::{Count, NonNegative, Positive};
use crate::check::{Comparator, Measurement, Validate};
use crate::error::{Error, Result};
use crate::subject::{Subject, TrainSetup};

/// The most steps an arm trains.
pub const MAX_STEPS: usize = 1000;
/// The most samples per step.
pub const MAX_BATCH: usize = 64;

/// A trial's wall-time limit when its test states none, in seconds
/// (two arms of up to a few hundred steps each, a step falling back to the CPU taking most of a second); each arm gets the same limit.
pub const DEFAULT_TIMEOUT_S: f64 = 900.0;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    pub model: String,
    /// 1-based steps at which the losses are compared.
    pub checkpoints: Vec<Count>,
    #[serde(default = "default_tolerance")]
    pub tolerance: NonNegative,
    pub learning_rate: Positive,
    #[serde(default = "one")]
    pub batch: Count,
    #[serde(default)]
    pub seq_len: Option<Count>,
}

fn default_tolerance() -> NonNegative {
    NonNegative(0.1)
}

fn one() -> Count {
    Count(1)
}

pub const PARAMS: &[ParamDoc] = &[
    ParamDoc {
        name: "model",
        default: Required,
        bound: &[Text("one of the subject workload's models")],
        meaning: "configuration both arms train",
    },
    ParamDoc {
        name: "checkpoints",
        default: Required,
        bound: &[
            Text("1 to "),
            Int(MAX_STEPS),
            Text(", ascending, at least one"),
        ],
        meaning: "1-based steps whose losses are compared; the arms run to the last",
    },
    ParamDoc {
        name: "tolerance",
        default: Yaml("0.1"),
        bound: &[Text(">= 0")],
        meaning: "largest absolute difference of the graphed and un-graphed losses allowed",
    },
    ParamDoc {
        name: "learning_rate",
        default: Required,
        bound: &[Text("> 0")],
        meaning: "both arms' learning rate (the mutant doubles the graphed arm's)",
    },
    ParamDoc {
        name: "batch",
        default: Yaml("1"),
        bound: &[Text("1 to "), Int(MAX_BATCH)],
        meaning: "samples per step",
    },
    ParamDoc {
        name: "seq_len",
        default: Otherwise("the workload's"),
        bound: &[Text("a positive count")],
        meaning: "tokens per sample",
    },
];

pub const EXAMPLE: &[(&str, &str)] = &[
    ("model", "tiny"),
    ("checkpoints", "[10, 50, 100]"),
    ("learning_rate", "0.001"),
];

impl Validate for Params {
    fn validate(&self) -> std::result::Result<(), String> {
        let steps: Vec<usize> = self.checkpoints.iter().map(|c| c.0).collect();
        if steps.is_empty() {
            return Err("checkpoints: at least one step".into());
        }
        if !steps.windows(2).all(|w| w[0] < w[1]) {
            return Err(format!("checkpoints: {steps:?} are not strictly ascending"));
        }
        if self.steps() > MAX_STEPS {
            return Err(format!("checkpoints: step {} > {MAX_STEPS}", self.steps()));
        }
        if self.batch.0 > MAX_BATCH {
            return Err(format!("batch: {} > {MAX_BATCH}", self.batch.0));
        }
        Ok(())
    }
}

impl Params {
    /// Steps each arm trains: the last checkpoint.
    pub fn steps(&self) -> usize {
        self.checkpoints.last().map_or(0, |c| c.0)
    }

    /// The un-graphed arm's setup.
    pub fn setup(&self, seed: u64) -> TrainSetup {
        TrainSetup {
            model: self.model.clone(),
            batch: self.batch.0,
            seq_len: self.seq_len.map(|c| c.0),
            graph: false,
            steps: self.steps(),
            seed,
            learning_rate: Some(self.learning_rate.0),
        }
    }

    /// Runs both arms and judges them. `mutant` is a subject mutant's name
    /// for both arms' `prepare`; `fault` a core mutant of the graphed arm.
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
            measured_from: 0,
            timeout,
        };
        self.judge(&run_arms(&plan)?)
    }

    /// The verdict on two arms' losses.
    pub fn judge(&self, arms: &Arms) -> Result<Measurement> {
        if let Some(failure) = graphed_failure(arms)? {
            let mut m = Measurement::new(
                "max_abs_loss_diff",
                f64::INFINITY,
                Comparator::Le,
                self.tolerance.0,
                "",
            );
            m.violate(failure.clone());
            return Ok(m.with_detail(failure));
        }
        let plain = &arms.plain.losses;
        let at = |losses: &[f32], step: usize| losses.get(step - 1).copied();
        let mut worst = 0.0f64;
        let mut rows = Vec::new();
        for step in self.checkpoints.iter().map(|c| c.0) {
            let (Some(p), Some(g)) = (at(plain, step), at(&arms.graphed.losses, step)) else {
                return Err(Error::Arm(format!("no loss at checkpoint step {step}")));
            };
            let diff = (f64::from(g) - f64::from(p)).abs();
            let diff = if diff.is_finite() {
                diff
            } else {
                f64::INFINITY
            };
            worst = worst.max(diff);
            rows.push(format!(
                "step {step}: graphed {g} vs un-graphed {p} (|diff| {diff:.6})"
            ));
        }
        let first = plain.first().copied();
        let moved = self.checkpoints.iter().any(|c| at(plain, c.0) != first);
        if !moved {
            return Err(Error::Arm(format!(
                "the un-graphed loss never moved from step 1 to the checkpoints ({}): the comparison cannot discriminate",
                rows.join("; ")
            )));
        }
        Ok(Measurement::new(
            "max_abs_loss_diff",
            worst,
            Comparator::Le,
            self.tolerance.0,
            "",
        )
        .with_detail(rows.join("; ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::arms::{ArmFailure, ArmReply};

    fn params(yaml: &str) -> Params {
        let p: Params = serde_yaml::from_str(yaml).unwrap();
        p.validate().unwrap();
        p
    }

    fn arm(losses: &[f32]) -> ArmReply {
        ArmReply {
            losses: losses.to_vec(),
            step_ms: vec![1.0; losses.len()],
            ..ArmReply::default()
        }
    }

    fn falling(n: usize, rate: f32) -> Vec<f32> {
        (0..n).map(|i| 7.0 - rate * i as f32).collect()
    }

    #[test]
    fn close_losses_pass_and_far_ones_fail_with_each_checkpoint_named() {
        let p = params("{model: m, checkpoints: [2, 4], learning_rate: 0.001}");
        assert_eq!((p.steps(), p.tolerance.0), (4, 0.1));
        let close = Arms {
            plain: arm(&falling(4, 0.1)),
            graphed: arm(&falling(4, 0.11)),
        };
        let m = p.judge(&close).unwrap();
        assert!(m.passed(), "{m:?}");
        let far = Arms {
            plain: arm(&falling(4, 0.1)),
            graphed: arm(&falling(4, 0.2)),
        };
        let m = p.judge(&far).unwrap();
        assert!(!m.passed());
        assert!((m.observed - 0.3).abs() < 1e-5, "{m:?}");
        assert!(m.detail.contains("step 2:") && m.detail.contains("step 4:"));
    }

    #[test]
    fn a_non_finite_loss_is_an_infinite_difference() {
        let p = params("{model: m, checkpoints: [3], learning_rate: 0.001}");
        let mut graphed = falling(3, 0.1);
        graphed[2] = f32::NAN;
        let m = p
            .judge(&Arms {
                plain: arm(&falling(3, 0.1)),
                graphed: arm(&graphed),
            })
            .unwrap();
        assert!(!m.passed() && m.observed.is_infinite());
    }

    #[test]
    fn a_failed_graphed_arm_falsifies_and_a_failed_or_frozen_reference_is_an_error() {
        let p = params("{model: m, checkpoints: [2, 3], learning_rate: 0.001}");
        let mut failed = arm(&falling(1, 0.1));
        failed.failure = Some(ArmFailure {
            step: Some(1),
            error: "fell back to the CPU".into(),
        });
        let m = p
            .judge(&Arms {
                plain: arm(&falling(3, 0.1)),
                graphed: failed.clone(),
            })
            .unwrap();
        assert!(!m.passed() && m.observed.is_infinite());
        assert!(
            m.violations[0].contains("graphed arm failed at step 2"),
            "{m:?}"
        );
        let err = p
            .judge(&Arms {
                plain: failed,
                graphed: arm(&falling(3, 0.1)),
            })
            .unwrap_err();
        assert!(
            err.to_string().contains("un-graphed arm failed at step 2"),
            "{err}"
        );
        let frozen = Arms {
            plain: arm(&[6.99, 6.99, 6.99]),
            graphed: arm(&[6.99, 6.99, 6.99]),
        };
        let err = p.judge(&frozen).unwrap_err();
        assert!(err.to_string().contains("never moved"), "{err}");
    }

    #[test]
    fn bad_checkpoints_are_refused() {
        for yaml in [
            "{model: m, checkpoints: [], learning_rate: 0.001}",
            "{model: m, checkpoints: [5, 5], learning_rate: 0.001}",
            "{model: m, checkpoints: [2000], learning_rate: 0.001}",
            "{model: m, checkpoints: [1], learning_rate: 0.001, batch: 65}",
        ] {
            let p: Params = serde_yaml::from_str(yaml).unwrap();
            assert!(p.validate().is_err(), "{yaml}");
        }
        assert!(serde_yaml::from_str::<Params>("{model: m, checkpoints: [1]}").is_err());
    }
}
