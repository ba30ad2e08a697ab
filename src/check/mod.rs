//! The check kinds: a closed vocabulary of measurements a contract can ask for.
//!
//! Each kind lives in its own module with a strictly parsed `Params` struct, a
//! `validate` for cross-field rules, the backends it can run on, and an
//! `execute` that measures and returns a [`Measurement`]. [`CheckSpec`] is the
//! registry: the `kind:` key of a contract's `check:` block selects the variant.

pub mod bandwidth;
mod gpu_runtime;
pub mod gradient_check;
pub mod gradient_parity;
pub mod loss_descent;
mod measurement;
pub mod memory_budget;
pub mod op;
pub mod op_parity;
pub mod params;
pub mod prewarm;
pub mod property;
pub mod stats;
pub mod step_throughput;
pub mod sync_count;
pub mod target_parity;
pub mod throughput_ratio;
mod training;
pub mod trajectory_match;

use std::fmt;

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;

pub use measurement::{Comparator, Measurement, Speedup};

use crate::contract::Backend;
use crate::error::Result;
use crate::mutant::Mutant;
use qlora::gpu::GpuContext;
use qlora::Faults;

/// What a trial hands to a check.
pub struct TrialContext<'a> {
    /// Seed for every random input of this trial (recorded in the report).
    pub seed: u64,
    /// The fault to inject, for a mutant self-test trial.
    pub mutant: Option<Mutant>,
    /// The device, for `cuda` trials.
    pub gpu: Option<&'a mut GpuContext>,
}

/// One registered kind: its name, what it measures and where it runs.
pub struct KindInfo {
    pub name: &'static str,
    pub measures: &'static str,
    pub backends: &'static [Backend],
}

const CPU: &[Backend] = &[Backend::Cpu];
const CUDA: &[Backend] = &[Backend::Cuda];
const BOTH: &[Backend] = &[Backend::Cpu, Backend::Cuda];

/// The registry of check kinds, in the order the design brief lists them.
pub const KINDS: &[KindInfo] = &[
    KindInfo {
        name: "op_parity",
        measures: "rel-L2 error of an op on a backend vs the CPU reference",
        backends: CUDA,
    },
    KindInfo {
        name: "gradient_check",
        measures: "rel error of the reference backward vs central finite differences",
        backends: CPU,
    },
    KindInfo {
        name: "property",
        measures: "a named invariant over proptest-generated inputs",
        backends: CPU,
    },
    KindInfo {
        name: "target_parity",
        measures: "PTX .target of every cached module vs the device's sm_XY",
        backends: CUDA,
    },
    KindInfo {
        name: "prewarm",
        measures: "JIT compilations during training steps after pre-warm",
        backends: CUDA,
    },
    KindInfo {
        name: "trajectory_match",
        measures: "max abs loss difference of two training modes at checkpoints",
        backends: BOTH,
    },
    KindInfo {
        name: "sync_count",
        measures: "host syncs inside the captured region and per step",
        backends: CUDA,
    },
    KindInfo {
        name: "throughput_ratio",
        measures: "median-time ratio of baseline over candidate",
        backends: CUDA,
    },
    KindInfo {
        name: "step_throughput",
        measures: "training tokens per second of one step mode (median step time)",
        backends: CUDA,
    },
    KindInfo {
        name: "loss_descent",
        measures: "final loss as a fraction of the initial loss",
        backends: BOTH,
    },
    KindInfo {
        name: "gradient_parity",
        measures: "rel-L2 error of the GPU training step's gradients vs the CPU reference's",
        backends: CUDA,
    },
    KindInfo {
        name: "memory_budget",
        measures: "peak device memory of a configuration",
        backends: CUDA,
    },
    KindInfo {
        name: "bandwidth",
        measures: "a memory-bound kernel's bandwidth as a fraction of the d2d copy bandwidth",
        backends: CUDA,
    },
];

/// The `check:` block of a falsification test.
#[derive(Debug, Clone)]
pub enum CheckSpec {
    OpParity(op_parity::Params),
    GradientCheck(gradient_check::Params),
    Property(property::Params),
    TargetParity(target_parity::Params),
    Prewarm(prewarm::Params),
    TrajectoryMatch(trajectory_match::Params),
    SyncCount(sync_count::Params),
    ThroughputRatio(throughput_ratio::Params),
    StepThroughput(step_throughput::Params),
    LossDescent(loss_descent::Params),
    MemoryBudget(memory_budget::Params),
    Bandwidth(bandwidth::Params),
    GradientParity(gradient_parity::Params),
}

impl CheckSpec {
    /// The `kind:` name.
    pub fn kind_name(&self) -> &'static str {
        match self {
            CheckSpec::OpParity(_) => "op_parity",
            CheckSpec::GradientCheck(_) => "gradient_check",
            CheckSpec::Property(_) => "property",
            CheckSpec::TargetParity(_) => "target_parity",
            CheckSpec::Prewarm(_) => "prewarm",
            CheckSpec::TrajectoryMatch(_) => "trajectory_match",
            CheckSpec::SyncCount(_) => "sync_count",
            CheckSpec::ThroughputRatio(_) => "throughput_ratio",
            CheckSpec::StepThroughput(_) => "step_throughput",
            CheckSpec::LossDescent(_) => "loss_descent",
            CheckSpec::MemoryBudget(_) => "memory_budget",
            CheckSpec::GradientParity(_) => "gradient_parity",
            CheckSpec::Bandwidth(_) => "bandwidth",
        }
    }

    fn info(&self) -> &'static KindInfo {
        let name = self.kind_name();
        KINDS.iter().find(|k| k.name == name).unwrap_or(&KINDS[0])
    }

    /// Whether this kind can run on `backend`.
    pub fn supports(&self, backend: Backend) -> bool {
        self.info().backends.contains(&backend)
    }

    /// The backends this kind runs on, for messages.
    pub fn backends_text(&self) -> String {
        let names: Vec<&str> = self.info().backends.iter().map(|b| b.as_str()).collect();
        names.join(", ")
    }

    /// Runs the measurement. Errors (a kernel that fails to launch, a shape the
    /// op refuses) become `error` rows; they never abort the run.
    pub fn execute(&self, backend: Backend, cx: &mut TrialContext<'_>) -> Result<Measurement> {
        match self {
            CheckSpec::OpParity(p) => p.execute(backend, cx),
            CheckSpec::GradientCheck(p) => p.execute(cx),
            CheckSpec::Property(p) => p.execute(cx),
            CheckSpec::TargetParity(p) => p.execute(cx),
            CheckSpec::Prewarm(p) => p.execute(cx),
            CheckSpec::TrajectoryMatch(p) => p.execute(backend, cx),
            CheckSpec::SyncCount(p) => p.execute(cx),
            CheckSpec::ThroughputRatio(p) => p.execute(cx),
            CheckSpec::StepThroughput(p) => p.execute(cx),
            CheckSpec::LossDescent(p) => p.execute(backend, cx),
            CheckSpec::MemoryBudget(p) => p.execute(cx),
            CheckSpec::GradientParity(p) => p.execute(cx),
            CheckSpec::Bandwidth(p) => p.execute(cx),
        }
    }
}

/// Parses `check:`. `kind` must be the first key; the rest of the mapping is
/// handed, still streaming, to that kind's strict `Params`, so serde_yaml keeps
/// the exact line of an unknown key or a bad value.
impl<'de> Deserialize<'de> for CheckSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        d.deserialize_map(CheckVisitor)
    }
}

struct CheckVisitor;

fn parse_kind<'de, A, P>(map: A) -> std::result::Result<P, A::Error>
where
    A: MapAccess<'de>,
    P: Deserialize<'de> + Validate,
{
    let params = P::deserialize(de::value::MapAccessDeserializer::new(map))?;
    params.validate().map_err(de::Error::custom)?;
    Ok(params)
}

/// Cross-field rules a kind checks after parsing (e.g. checkpoints <= steps).
pub trait Validate {
    fn validate(&self) -> std::result::Result<(), String>;
}

impl<'de> Visitor<'de> for CheckVisitor {
    type Value = CheckSpec;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a mapping whose first key is `kind`")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<CheckSpec, A::Error> {
        match map.next_key::<String>()?.as_deref() {
            Some("kind") => {}
            Some(other) => {
                return Err(de::Error::custom(format!(
                    "`kind` must be the first key of `check`, found `{other}`"
                )))
            }
            None => return Err(de::Error::missing_field("kind")),
        }
        let kind: String = map.next_value()?;
        Ok(match kind.as_str() {
            "op_parity" => CheckSpec::OpParity(parse_kind(map)?),
            "gradient_check" => CheckSpec::GradientCheck(parse_kind(map)?),
            "property" => CheckSpec::Property(parse_kind(map)?),
            "target_parity" => CheckSpec::TargetParity(parse_kind(map)?),
            "prewarm" => CheckSpec::Prewarm(parse_kind(map)?),
            "trajectory_match" => CheckSpec::TrajectoryMatch(parse_kind(map)?),
            "sync_count" => CheckSpec::SyncCount(parse_kind(map)?),
            "throughput_ratio" => CheckSpec::ThroughputRatio(parse_kind(map)?),
            "step_throughput" => CheckSpec::StepThroughput(parse_kind(map)?),
            "loss_descent" => CheckSpec::LossDescent(parse_kind(map)?),
            "memory_budget" => CheckSpec::MemoryBudget(parse_kind(map)?),
            "gradient_parity" => CheckSpec::GradientParity(parse_kind(map)?),
            "bandwidth" => CheckSpec::Bandwidth(parse_kind(map)?),
            other => {
                let known: Vec<&str> = KINDS.iter().map(|k| k.name).collect();
                return Err(de::Error::custom(format!(
                    "unknown check kind `{other}`; known kinds: {}",
                    known.join(", ")
                )));
            }
        })
    }
}

impl TrialContext<'_> {
    /// The stack's fault knobs of this trial's mutant (none for a clean trial
    /// or a mutant of the oracle). A check turns them on with
    /// `gpu.with_faults(..)` around exactly the code the claim is about.
    pub fn faults(&self) -> Faults {
        self.mutant.map_or(Faults::NONE, |m| m.faults())
    }
}

/// The GPU context of a `cuda` trial, or an error saying it is missing.
pub(crate) fn require_gpu<'a, 'b>(cx: &'a mut TrialContext<'b>) -> Result<&'a mut GpuContext> {
    match cx.gpu.as_deref_mut() {
        Some(gpu) => Ok(gpu),
        None => Err(crate::Error::CudaUnavailable(
            "this check needs a GPU context".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The registry, the parser and `kind_name` name the same kinds: each
    /// registered name parses as a kind (its missing parameters aside), and
    /// each check of the shipped contracts has a registry entry, so `info`
    /// never falls back.
    #[test]
    fn the_registry_and_the_parser_agree() {
        for kind in KINDS {
            let err = serde_yaml::from_str::<CheckSpec>(&format!("kind: {}\n", kind.name))
                .map(|c| c.kind_name().to_string())
                .map_err(|e| e.to_string());
            match err {
                Ok(name) => assert_eq!(name, kind.name),
                Err(e) => assert!(!e.contains("unknown check kind"), "{}: {e}", kind.name),
            }
        }
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("contracts");
        let contracts = crate::contract::load_dir(&dir).expect("the shipped contracts load");
        for test in contracts.iter().flat_map(|c| &c.falsification_tests) {
            let name = test.check.kind_name();
            assert!(
                KINDS.iter().any(|k| k.name == name),
                "{name} is not registered"
            );
        }
    }
}
