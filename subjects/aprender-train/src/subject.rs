//! aprender-train on falsify's subject seam: [`AprenderTrain`] (the
//! subject), [`AprenderWorkload`] (what the core's driver-observed and
//! two-arm kinds train) and [`SeamSession`] (one prepared pipeline whose
//! stderr is read back after every step).
//!
//! The subject has no check kinds and no mutants of its own: its contracts
//! use the core's kinds, proven able to fail by the core's mutants.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use cudarc::driver::{sys, CudaContext};
use falsify_core::check::{Backend, Here, KindInfo, Measurement};
use falsify_core::{
    BasicOptions, BoxError, DeviceFacts, KindSet, OwnCounts, Subject, TrainSession, TrainSetup,
    TrialContext, Workload,
};
use serde::de::MapAccess;
use serde::{Deserialize, Deserializer};

use crate::env::{path_with_nvidia_smi, process_env};
use crate::error::{Error, Result};
use crate::model::{models, Setup};
use crate::session::Session;
use crate::stderr::StderrWitness;
use crate::tap::StderrTap;
use crate::upload::upload_bytes;

/// The published `aprender-train` 0.72.3, driven through its public API.
pub struct AprenderTrain;

/// The device a trial runs on: aprender-train opens its own context (the
/// same primary context), this one only answers what the report records.
pub struct Gpu {
    context: Arc<CudaContext>,
    facts: DeviceFacts,
}

impl Gpu {
    /// Opens device `ordinal` and reads its facts.
    pub fn open(ordinal: usize) -> Result<Self> {
        let context = CudaContext::new(ordinal)?;
        let (major, minor) = context.compute_capability()?;
        let sm_count =
            context.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        let mut version = 0i32;
        // SAFETY: cuDriverGetVersion writes one int through a valid pointer.
        unsafe { sys::cuDriverGetVersion(&mut version) }.result()?;
        let facts = DeviceFacts {
            name: context.name()?,
            compute_capability: (major as u32, minor as u32),
            sm_count: sm_count as u32,
            total_memory_bytes: context.total_mem()?,
            driver_version: format!("{}.{}", version / 1000, (version % 1000) / 10),
        };
        Ok(Self { context, facts })
    }
}

/// This subject's check kinds: none (its contracts use the core's).
#[derive(Debug, Clone)]
pub enum NoKinds {}

impl KindSet for NoKinds {
    type Subject = AprenderTrain;
    const KINDS: &'static [KindInfo] = &[];

    fn kind_name(&self) -> &'static str {
        match *self {}
    }
    fn unjudged_on(&self, _backend: Backend, _here: &Here) -> Option<String> {
        match *self {}
    }
    fn check_budget(&self, _backend: Backend, _here: &Here) -> std::result::Result<(), String> {
        match *self {}
    }
    fn default_timeout_s(&self) -> f64 {
        match *self {}
    }
    fn needs_the_gpu_alone(&self) -> bool {
        match *self {}
    }
    fn needs_the_whole_host(&self) -> bool {
        match *self {}
    }
    fn runs_on_one_stream(&self) -> bool {
        match *self {}
    }
    fn execute(
        &self,
        _backend: Backend,
        _cx: &mut TrialContext<'_, AprenderTrain>,
    ) -> Result<Measurement> {
        match *self {}
    }
    fn parse_kind<'de, A: MapAccess<'de>>(
        kind: &str,
        _map: A,
    ) -> std::result::Result<Self, A::Error> {
        Err(falsify_core::check::unknown_kind(kind, Self::KINDS))
    }
}

impl<'de> Deserialize<'de> for NoKinds {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        falsify_core::subject::deserialize_check(d)
    }
}

/// This subject's mutants: none (a fork or patch of the published crate is
/// not allowed; the core's mutants prove every check able to fail).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NoMutant {}

impl fmt::Display for NoMutant {
    fn fmt(&self, _f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {}
    }
}

impl Subject for AprenderTrain {
    const NAME: &'static str = "aprender-train";
    const ACCEPTS_KNOWN_VIOLATIONS: bool = true;
    type Device = Gpu;
    type Kinds = NoKinds;
    type Mutant = NoMutant;
    type Options = BasicOptions;
    type Error = Error;

    fn open_device(options: &BasicOptions) -> Result<Gpu> {
        Gpu::open(options.ordinal)
    }

    fn device_facts(device: &Gpu) -> DeviceFacts {
        device.facts.clone()
    }

    fn free_memory(device: &Gpu) -> Result<(u64, u64)> {
        let (free, total) = device.context.mem_get_info()?;
        Ok((free as u64, total as u64))
    }

    fn workload() -> Option<&'static dyn Workload<Self>> {
        Some(&AprenderWorkload)
    }
}

/// The QLoRA `InstructPipeline` on aprender-train's CUDA path: a step is
/// `batch` consecutive `train_step` calls, one sequence each (the public
/// API trains one sequence per call, see [`Setup::batch`]).
pub struct AprenderWorkload;

/// The subject's setup for the seam's.
pub fn setup_of(seam: &TrainSetup) -> Setup {
    Setup {
        model: seam.model.clone(),
        batch: seam.batch,
        seq_len: seam.seq_len,
        graph: seam.graph,
        steps: seam.steps,
        seed: seam.seed,
        learning_rate: seam.learning_rate,
    }
}

impl Workload<AprenderTrain> for AprenderWorkload {
    fn models(&self) -> &[&'static str] {
        models()
    }

    fn upload_bytes(&self, setup: &TrainSetup) -> std::result::Result<u64, BoxError> {
        Ok(upload_bytes(&setup_of(setup))?)
    }

    fn prepare<'d>(
        &self,
        _device: &'d mut Gpu,
        setup: &TrainSetup,
        mutant: Option<&NoMutant>,
    ) -> std::result::Result<Box<dyn TrainSession + 'd>, BoxError> {
        if let Some(mutant) = mutant {
            match *mutant {}
        }
        Ok(Box::new(SeamSession::prepare(&setup_of(setup))?))
    }

    /// `CUDA_GRAPH` from the setup, a fresh `HOME` (cold module cache,
    /// private VRAM ledger) in `scratch`, aprender-train's other switches
    /// pinned, and `nvidia-smi` on `PATH` (without it aprender-train
    /// silently trains on the CPU).
    fn process_env(&self, setup: &TrainSetup, scratch: &Path) -> Vec<(String, String)> {
        let mut vars = process_env(&setup_of(setup), scratch);
        let inherited = std::env::var_os("PATH");
        if let Some(path) = path_with_nvidia_smi(inherited.as_deref()) {
            vars.push(("PATH".into(), path));
        }
        vars
    }
}

/// A prepared pipeline, its stderr tapped from before `InstructPipeline::new`
/// to the end: after `prepare` and after every step the text is read as a
/// [`StderrWitness`], and a line that means the GPU path was left (a CPU
/// fall-back, a failed CUDA call, a skipped sample, no cuBLAS) makes that
/// call an error: a subject that fell back to the CPU never passes.
pub struct SeamSession {
    session: Session,
    tap: StderrTap,
}

impl SeamSession {
    /// Taps stderr, then prepares the session (pre-warm, upload).
    pub fn prepare(setup: &Setup) -> Result<Self> {
        let tap = StderrTap::start()?;
        let session = Session::prepare(setup)?;
        let seam = Self { session, tap };
        seam.witness()?;
        Ok(seam)
    }

    /// What stderr said so far; the first line that makes the trial an
    /// error is returned as the error.
    pub fn witness(&self) -> Result<StderrWitness> {
        let witness = StderrWitness::parse(&self.tap.text()?);
        let first = witness.problems.iter().find(|p| p.kind.is_trial_error());
        match first {
            Some(problem) => Err(Error::Stderr {
                line: problem.line,
                kind: problem.kind,
                text: problem.text.clone(),
            }),
            None => Ok(witness),
        }
    }

    /// The session driven.
    pub fn session(&self) -> &Session {
        &self.session
    }
}

impl TrainSession for SeamSession {
    fn step(&mut self) -> std::result::Result<f32, BoxError> {
        let loss = self.session.step()?;
        self.witness()?;
        Ok(loss)
    }

    /// Device-to-host bytes of the steps, from aprender-gpu's counter.
    /// Compilations are not given: stderr reports the forward and backward
    /// caches' only (the optimizer cache compiles silently, see
    /// [`crate::StderrWitness`]), a lower bound that would disagree with
    /// the observer by construction; [`SeamSession::witness`] has them.
    fn own_counts(&self) -> Option<OwnCounts> {
        let device_to_host_bytes = self
            .session
            .own_counts()
            .per_train_step
            .iter()
            .map(|c| c.device_to_host_bytes)
            .sum();
        Some(OwnCounts {
            device_to_host_bytes: Some(device_to_host_bytes),
            ..OwnCounts::default()
        })
    }
}
