//! The two-arm kinds of [`crate::workload`] as core kinds:
//! `graph_loss_parity` and `graph_speedup`. Each runs the subject's
//! workload twice, un-graphed and graphed, each arm a process of its own
//! started with the workload's process environment; their core mutants
//! act on the graphed arm only.

use std::time::Duration;

use super::train::Training;
use super::{CoreCheck, CoreMutant, CoreTrial};
use crate::check::params::Count;
use crate::check::{Backend, Measurement};
use crate::subject::{DeviceOptions, Subject};
use crate::workload::{graph_loss_parity, graph_speedup, ArmFault};

/// Whether `S` has a workload that trains `model` (located at `kind` or
/// `model`).
fn validate_model<S: Subject>(model: &str) -> Result<(), (&'static str, String)> {
    Training {
        model,
        steps: Count(1),
        batch: Count(1),
        seq_len: None,
        graph: false,
    }
    .validate_for::<S>()
}

/// The arm fault a core mutant stands for; a mutant that is not one of the
/// two-arm kinds' never reaches them ([`CoreMutant::refuses`]).
fn arm_fault(mutant: Option<CoreMutant>) -> Option<ArmFault> {
    match mutant? {
        CoreMutant::WorkloadGraphArmLearningRateDoubled => {
            Some(ArmFault::WorkloadGraphArmLearningRateDoubled)
        }
        CoreMutant::WorkloadGraphArmSlowed => Some(ArmFault::WorkloadGraphArmSlowed),
        _ => None,
    }
}

/// What both kinds hand the arms: the trial's seed, the device options
/// (the subject's defaults: a trial's context does not carry the run's
/// options, so an arm opens device 0), the subject's mutant by name.
fn arm_inputs<S: Subject>(trial: &CoreTrial<'_, '_, S>) -> (u64, S::Options, Option<String>) {
    let mutant = trial.cx.mutant.as_ref().map(ToString::to_string);
    (trial.cx.seed, S::Options::default(), mutant)
}

impl CoreCheck for graph_loss_parity::Params {
    fn execute<S: Subject>(
        &self,
        _backend: Backend,
        trial: CoreTrial<'_, '_, S>,
    ) -> crate::Result<Measurement> {
        let (seed, options, mutant) = arm_inputs(&trial);
        let timeout = Duration::from_secs_f64(self.default_timeout_s());
        self.measure::<S>(seed, &options, mutant, arm_fault(trial.mutant), timeout)
    }

    fn validate_for<S: Subject>(&self) -> Result<(), (&'static str, String)> {
        validate_model::<S>(&self.model)
    }

    fn default_timeout_s(&self) -> f64 {
        graph_loss_parity::DEFAULT_TIMEOUT_S
    }
}

impl CoreCheck for graph_speedup::Params {
    fn execute<S: Subject>(
        &self,
        _backend: Backend,
        trial: CoreTrial<'_, '_, S>,
    ) -> crate::Result<Measurement> {
        let (seed, options, mutant) = arm_inputs(&trial);
        let timeout = Duration::from_secs_f64(self.default_timeout_s());
        let fault = arm_fault(trial.mutant);
        // Both arms time on the options' GPU: its clocks around them say
        // whether the ratio can be trusted (retried once when throttled).
        let (mut m, window) =
            crate::check::clocks::watched(crate::check::clocks::reader(options.ordinal()), || {
                self.measure::<S>(seed, &options, mutant.clone(), fault, timeout)
            })?;
        m.clocks = Some(window);
        Ok(m)
    }

    fn validate_for<S: Subject>(&self) -> Result<(), (&'static str, String)> {
        validate_model::<S>(&self.model)
    }

    fn default_timeout_s(&self) -> f64 {
        graph_speedup::DEFAULT_TIMEOUT_S
    }

    fn needs_the_gpu_alone(&self) -> bool {
        true
    }
}
