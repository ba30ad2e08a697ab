//! Core kinds that compare two arms of a subject's training workload, each
//! arm in a process of its own ([`arms`]): the graphed step against the
//! un-graphed one.
//!
//! - [`graph_loss_parity`]: the losses of the two arms at checkpoint steps
//!   agree within a tolerance.
//! - [`graph_speedup`]: the graphed arm's median step time is at least
//!   `min_speedup` times faster.
//!
//! Each has a core mutant that makes it fail on any subject
//! ([`ArmFault`]), applied to the graphed arm only.

pub mod arms;
pub mod graph_loss_parity;
pub mod graph_speedup;

use crate::error::{Error, Result};
use crate::subject::{Subject, TrainSetup};
use arms::{run_arm, ArmJob, ArmReply, Slowdown};

/// The faults the two-arm kinds' core mutants inject into the graphed arm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArmFault {
    /// The graphed arm trains with twice the learning rate: its losses
    /// leave the un-graphed arm's (falsifies `graph_loss_parity`).
    WorkloadGraphArmLearningRateDoubled,
    /// The graphed arm sleeps [`SLOWED_DELAY_MS`] inside every measured
    /// step (falsifies `graph_speedup`).
    WorkloadGraphArmSlowed,
}

impl ArmFault {
    /// Its name in a contract's `mutant:`.
    pub fn name(self) -> &'static str {
        match self {
            Self::WorkloadGraphArmLearningRateDoubled => "workload_graph_arm_learning_rate_doubled",
            Self::WorkloadGraphArmSlowed => "workload_graph_arm_slowed",
        }
    }
}

impl std::fmt::Display for ArmFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The host delay `workload_graph_arm_slowed` adds to each measured graphed
/// step: longer than any step a workload of these kinds takes, so the
/// graphed arm is at least twice as slow whatever the true speedup.
pub const SLOWED_DELAY_MS: f64 = 2000.0;

/// The two arms' replies: un-graphed first.
pub struct Arms {
    pub plain: ArmReply,
    pub graphed: ArmReply,
}

/// What both arms share, and how the graphed one differs.
pub struct ArmPlan<'a, S: Subject> {
    /// The un-graphed arm's setup (`graph` is set per arm).
    pub setup: TrainSetup,
    pub device: &'a S::Options,
    /// A subject mutant, by name, for both arms' `prepare`.
    pub mutant: Option<String>,
    pub fault: Option<ArmFault>,
    /// Steps from which the slowed mutant delays (the measured ones).
    pub measured_from: usize,
    /// Each arm's wall-time limit.
    pub timeout: std::time::Duration,
}

/// Runs the un-graphed arm, then the graphed one (one after the other: they
/// share the device), each in a process of its own.
pub fn run_arms<S: Subject>(plan: &ArmPlan<'_, S>) -> Result<Arms> {
    let plain = ArmJob::<S> {
        setup: TrainSetup {
            graph: false,
            ..plan.setup.clone()
        },
        device: plan.device.clone(),
        mutant: plan.mutant.clone(),
        slowdown: None,
    };
    let mut graphed = ArmJob::<S> {
        setup: TrainSetup {
            graph: true,
            ..plan.setup.clone()
        },
        device: plan.device.clone(),
        mutant: plan.mutant.clone(),
        slowdown: None,
    };
    match plan.fault {
        Some(ArmFault::WorkloadGraphArmLearningRateDoubled) => {
            let rate = plan.setup.learning_rate.ok_or_else(|| {
                Error::Arm("the learning-rate mutant needs an explicit learning_rate".into())
            })?;
            graphed.setup.learning_rate = Some(2.0 * rate);
        }
        Some(ArmFault::WorkloadGraphArmSlowed) => {
            graphed.slowdown = Some(Slowdown {
                from_step: plan.measured_from,
                delay_ms: SLOWED_DELAY_MS,
            });
        }
        None => {}
    }
    Ok(Arms {
        plain: run_arm(&plain, plan.timeout)?,
        graphed: run_arm(&graphed, plan.timeout)?,
    })
}

/// An un-graphed arm that stopped early makes the trial an error (the
/// reference could not be measured; a subject that fell back to the CPU
/// never passes). A graphed arm that stopped early (a failed capture, a
/// CPU fall-back) is evidence against the claim: its failure, as a
/// violation, with what it measured before.
fn graphed_failure(arms: &Arms) -> Result<Option<String>> {
    let describe = |name: &str, arm: &ArmReply| {
        arm.failure.as_ref().map(|failure| {
            format!(
                "the {name} arm failed at {} after {} steps (losses {}): {}",
                failure.place(),
                arm.losses.len(),
                losses_text(&arm.losses),
                failure.error
            )
        })
    };
    if let Some(text) = describe("un-graphed", &arms.plain) {
        return Err(Error::Arm(text));
    }
    Ok(describe("graphed", &arms.graphed))
}

/// The first and last few losses, for messages.
fn losses_text(losses: &[f32]) -> String {
    let shown: Vec<String> = if losses.len() <= 6 {
        losses.iter().map(|l| format!("{l}")).collect()
    } else {
        let head = losses[..3].iter().map(|l| format!("{l}"));
        let tail = losses[losses.len() - 2..].iter().map(|l| format!("{l}"));
        head.chain(std::iter::once("...".to_string()))
            .chain(tail)
            .collect()
    };
    format!("[{}]", shown.join(", "))
}
