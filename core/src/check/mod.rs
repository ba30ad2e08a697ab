//! The vocabulary of a check: where it runs ([`Backend`]), what the
//! machine offers ([`Here`]), what it reports ([`Measurement`]), its
//! validated parameter types ([`params`]) and their documentation
//! ([`doc`]), the statistics timing checks share ([`stats`]) and their adaptive
//! repeats ([`repeats`]), the GPU clocks around a timed region
//! ([`clocks`]), and a process's device memory as the driver reports it
//! ([`process_memory`]).
//!
//! Each kind lives in a module of its subject with a strictly parsed
//! `Params` struct that implements `subject::Kind`:
//! `validate` ([`Validate`]) for cross-field rules and `execute`, which
//! measures through the subject and returns a [`Measurement`], and
//! documents its parameters as data (`PARAMS`, see [`doc`]) with a minimal
//! check block (`EXAMPLE`). One line of the subject's
//! [`kinds!`](crate::kinds) registers a kind (name, backends, what it
//! measures); the `kind:` key of a contract's `check:` block selects it.

pub mod clocks;
pub mod doc;
mod measurement;
pub mod params;
pub mod process_memory;
pub mod repeats;
pub mod stats;

use serde::de::{self, MapAccess};
use serde::Deserialize;

pub use doc::{ParamDefault, ParamDoc, Piece};
pub use measurement::{Comparator, Measurement, Speedup};

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

/// A kind that runs on the CPU only.
pub const CPU: &[Backend] = &[Backend::Cpu];
/// A kind that runs on a CUDA device only.
pub const CUDA: &[Backend] = &[Backend::Cuda];
/// A kind that runs on either.
pub const BOTH: &[Backend] = &[Backend::Cpu, Backend::Cuda];

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

/// The wall-time limit of a trial whose kind states none, in seconds.
pub const DEFAULT_TIMEOUT_S: f64 = 300.0;

/// Cross-field rules a kind checks after parsing (e.g. checkpoints <= steps).
pub trait Validate {
    fn validate(&self) -> Result<(), String>;
}

/// Parses a kind's `Params` from the rest of a `check:` mapping and
/// validates it (for [`kinds!`](crate::kinds)).
pub fn parse_params<'de, A, P>(map: A) -> Result<P, A::Error>
where
    A: MapAccess<'de>,
    P: Deserialize<'de> + Validate,
{
    let params = P::deserialize(de::value::MapAccessDeserializer::new(map))?;
    params.validate().map_err(de::Error::custom)?;
    Ok(params)
}

/// The error for an unknown `kind:` name, listing the known ones.
pub fn unknown_kind<E: de::Error>(name: &str, kinds: &[KindInfo]) -> E {
    let known: Vec<&str> = kinds.iter().map(|k| k.name).collect();
    E::custom(format!(
        "unknown check kind `{name}`; known kinds: {}",
        known.join(", ")
    ))
}

/// Whether a CUDA driver library can be loaded here (and, if so, loaded and
/// kept). Never panics.
pub use falsify_observer::driver_present;
