//! The check kinds: a closed vocabulary of measurements a contract can ask for.
//!
//! Each kind lives in its own module with a strictly parsed `Params` struct
//! that implements [`Kind`]: `validate` for cross-field rules and `execute`,
//! which measures through the stack's public API and the oracle and returns a
//! [`Measurement`], and documents its parameters as data (`PARAMS`, see
//! [`doc`]) with a minimal check block (`EXAMPLE`). One line of the
//! `registry!` below registers a kind (name, backends, what it measures);
//! the `kind:` key of a contract's `check:` block selects it.

pub mod doc;
mod measurement;
pub mod op;
pub mod params;
pub mod stats;
mod training;

use std::fmt;

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;

pub use doc::{reference_markdown, ParamDefault, ParamDoc, Piece};
pub use measurement::{Comparator, Measurement, Speedup};

use crate::error::Result;
use crate::mutant::Mutant;
use qlora::gpu::GpuContext;
use qlora::Faults;

/// Where a trial executes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Backend {
    Cpu,
    Cuda,
}

impl Backend {
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Cpu => "cpu",
            Backend::Cuda => "cuda",
        }
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a trial hands to a check.
pub struct TrialContext<'a> {
    /// Seed for every random input of this trial (recorded in the report).
    pub seed: u64,
    /// The fault to inject, for a mutant self-test trial.
    pub mutant: Option<Mutant>,
    /// The device, for `cuda` trials.
    pub gpu: Option<&'a mut GpuContext>,
}

/// One registered kind: its name, what it measures, where it runs, its
/// parameters and a minimal check block.
pub struct KindInfo {
    pub name: &'static str,
    pub measures: &'static str,
    pub backends: &'static [Backend],
    /// Every key its `Params` accepts, with default, bound and meaning.
    pub params: &'static [ParamDoc],
    /// The `key: value` pairs (YAML) of a minimal valid check block, `kind` aside.
    pub example: &'static [(&'static str, &'static str)],
}

const CPU: &[Backend] = &[Backend::Cpu];
const CUDA: &[Backend] = &[Backend::Cuda];
const BOTH: &[Backend] = &[Backend::Cpu, Backend::Cuda];

/// What the machine a run is planned on offers, read once before any trial.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Here {
    /// Memory the host can give a trial, in bytes (`MemAvailable`).
    pub host_memory_bytes: u64,
    /// The GPU the cuda trials would run on, when one is usable.
    pub gpu: Option<GpuHere>,
}

/// The facts of the GPU a run is planned on.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GpuHere {
    /// As the driver reports it, e.g. "NVIDIA H200".
    pub name: String,
    pub total_memory_bytes: u64,
    /// Free device memory when the run was planned.
    pub free_memory_bytes: u64,
    /// CUDA devices this machine has (data-parallel trials need several).
    pub device_count: usize,
}

/// A check kind's parameters: parsed strictly (serde, unknown keys refused),
/// checked across fields ([`Validate`]) and executed on a backend.
pub trait Kind: Validate {
    /// Runs the measurement. Errors (a kernel that fails to launch, a shape
    /// the op refuses) become `error` rows; they never abort the run.
    fn execute(&self, backend: Backend, cx: &mut TrialContext<'_>) -> Result<Measurement>;

    /// Why this check cannot be judged on `here` although it could run (no
    /// target stated for this GPU kind, a configuration that does not fit its
    /// memory), or `None`. Decided before the trial runs: such a trial is
    /// ignored with the reason and recorded `skipped`, never run and failed.
    fn unjudged_on(&self, _backend: Backend, _here: &Here) -> Option<String> {
        None
    }

    /// Whether running this check on `backend` stays within what `here` has
    /// and within the kind's documented bounds; the error says what it would
    /// need, e.g. "steps: 4000000000 needs ~128 GB on cpu; this machine has
    /// 24 GB". Checked when trials are planned, so a contract that validates
    /// can also run.
    fn check_budget(&self, _backend: Backend, _here: &Here) -> std::result::Result<(), String> {
        Ok(())
    }

    /// Seconds one trial of this kind may take before it is stopped and
    /// recorded as an `error` (a contract's `timeout_s` overrides it).
    fn default_timeout_s(&self) -> f64 {
        DEFAULT_TIMEOUT_S
    }
}

/// The wall-time limit of a trial whose kind states none, in seconds.
pub const DEFAULT_TIMEOUT_S: f64 = 300.0;

/// Declares every kind from one line each: `Variant(module) "name",
/// backends, "what it measures";`. The module holds the kind's `Params`
/// (which implement [`Kind`]); the line makes it a [`CheckSpec`] variant, a
/// [`KINDS`] entry (with the module's `PARAMS` and `EXAMPLE`), a name the
/// parser accepts and an `execute` arm.
macro_rules! registry {
    ($($variant:ident($module:ident) $name:literal, $backends:ident, $measures:literal;)*) => {
        $(pub mod $module;)*

        /// The registry of check kinds, in the order the design brief lists them.
        pub const KINDS: &[KindInfo] = &[
            $(KindInfo {
                name: $name,
                measures: $measures,
                backends: $backends,
                params: $module::PARAMS,
                example: $module::EXAMPLE,
            },)*
        ];

        /// The `check:` block of a falsification test.
        #[derive(Debug, Clone)]
        pub enum CheckSpec {
            $($variant($module::Params),)*
        }

        impl CheckSpec {
            /// The `kind:` name.
            pub fn kind_name(&self) -> &'static str {
                match self {
                    $(CheckSpec::$variant(_) => $name,)*
                }
            }

            /// See [`Kind::unjudged_on`].
            pub fn unjudged_on(&self, backend: Backend, here: &Here) -> Option<String> {
                match self {
                    $(CheckSpec::$variant(p) => p.unjudged_on(backend, here),)*
                }
            }

            /// See [`Kind::check_budget`].
            pub fn check_budget(&self, backend: Backend, here: &Here) -> std::result::Result<(), String> {
                match self {
                    $(CheckSpec::$variant(p) => p.check_budget(backend, here),)*
                }
            }

            /// See [`Kind::default_timeout_s`].
            pub fn default_timeout_s(&self) -> f64 {
                match self {
                    $(CheckSpec::$variant(p) => p.default_timeout_s(),)*
                }
            }

            /// Runs the measurement (see [`Kind::execute`]).
            pub fn execute(&self, backend: Backend, cx: &mut TrialContext<'_>) -> Result<Measurement> {
                match self {
                    $(CheckSpec::$variant(p) => p.execute(backend, cx),)*
                }
            }

            /// Parses the rest of a `check:` mapping as the parameters of kind `kind`.
            fn parse<'de, A: MapAccess<'de>>(kind: &str, map: A) -> std::result::Result<Self, A::Error> {
                Ok(match kind {
                    $($name => CheckSpec::$variant(parse_kind(map)?),)*
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
    };
}

registry! {
    OpParity(op_parity) "op_parity", CUDA, "rel-L2 error of an op on a backend vs the CPU reference";
    GradientCheck(gradient_check) "gradient_check", CPU, "rel error of the reference backward vs central finite differences";
    Property(property) "property", CPU, "a named invariant over proptest-generated inputs";
    TargetParity(target_parity) "target_parity", CUDA, "target of every cached module (PTX .target, cubin ELF flags) vs the device's sm_XY; planted PTX and disk entries refused";
    Prewarm(prewarm) "prewarm", CUDA, "modules loaded during training steps after pre-warm (also under memory pressure), setup order, cold and cached pre-warm time";
    TrajectoryMatch(trajectory_match) "trajectory_match", BOTH, "max abs loss difference of two training modes at checkpoints";
    SyncCount(sync_count) "sync_count", CUDA, "host syncs inside the captured region and per step";
    ThroughputRatio(throughput_ratio) "throughput_ratio", CUDA, "median-time ratio of baseline over candidate";
    StepThroughput(step_throughput) "step_throughput", CUDA, "training tokens per second of one step mode (median step time)";
    LossDescent(loss_descent) "loss_descent", BOTH, "final loss as a fraction of the initial loss";
    GradientParity(gradient_parity) "gradient_parity", CUDA, "rel-L2 error of the GPU training step's gradients vs the CPU reference's";
    MemoryBudget(memory_budget) "memory_budget", CUDA, "peak device memory of a configuration";
    Bandwidth(bandwidth) "bandwidth", CUDA, "a memory-bound kernel's bandwidth as a fraction of the d2d copy bandwidth";
    DataParallel(data_parallel) "data_parallel", CUDA, "the step on several GPUs (one rank process each, NCCL all-reduce) vs one GPU: losses, gradients, bytes reduced, host syncs, tokens/s";
}

impl CheckSpec {
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
        CheckSpec::parse(&kind, map)
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
