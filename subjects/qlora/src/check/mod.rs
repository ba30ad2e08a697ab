//! The qlora subject's check kinds: a closed vocabulary of measurements a
//! contract can ask of the stack.
//!
//! Each kind lives in its own module with a strictly parsed `Params` struct
//! that implements [`Kind`] for [`Qlora`]: `validate` for cross-field rules
//! and `execute`, which measures through the stack's public API and the
//! oracle and returns a [`Measurement`], and documents its parameters as
//! data (`PARAMS`, see [`doc`]) with a minimal check block (`EXAMPLE`). One
//! line of the `kinds!` below registers a kind (name, backends, what it
//! measures); the `kind:` key of a contract's `check:` block selects it.
//! The framework is the core's: what a kind is and how `check:` parses
//! ([`falsify_core::subject`]), the parameter types and docs
//! ([`falsify_core::check`]).

pub mod doc;
pub mod op;
pub mod params;
mod training;

pub mod attention_time;
pub mod bandwidth;
pub mod data_parallel;
pub mod gradient_check;
pub mod gradient_parity;
pub mod hf_parity;
pub mod loss_descent;
pub mod memory_budget;
pub mod op_parity;
pub mod peer_ratio;
pub mod peft_round_trip;
pub mod prewarm;
pub mod property;
mod python;
pub mod step_throughput;
pub mod sync_count;
pub mod target_parity;
pub mod throughput_ratio;
pub mod trajectory_match;

pub use falsify_core::check::{
    clocks, process_memory, repeats, stats, Backend, Comparator, GpuHere, Here, KindInfo,
    Measurement, ParamDefault, ParamDoc, Piece, Speedup, Validate, BOTH, CPU, CUDA,
    DEFAULT_TIMEOUT_S,
};
pub use falsify_core::subject::{Kind, KindSet};

use crate::error::Result;
use crate::Qlora;
use qlora::gpu::GpuContext;
use qlora::Faults;

/// What a trial hands to one of qlora's checks.
pub type TrialContext<'a> = falsify_core::subject::TrialContext<'a, Qlora>;

falsify_core::kinds! {
    /// The `check:` block of a falsification test of the qlora subject.
    pub enum CheckSpec for Qlora {
        OpParity(op_parity) "op_parity", CUDA, "rel-L2 error of an op on a backend vs the CPU reference";
        HfParity(hf_parity) "hf_parity", BOTH, "rel error of the CPU oracle's or the GPU step's logits, loss or LoRA gradients on a Hugging Face checkpoint vs transformers' and PEFT's";
        GradientCheck(gradient_check) "gradient_check", CPU, "rel error of the reference backward vs central finite differences";
        Property(property) "property", CPU, "a named invariant over proptest-generated inputs";
        TargetParity(target_parity) "target_parity", CUDA, "target of every cached module (PTX .target, cubin ELF flags) vs the device's sm_XY; planted PTX and disk entries refused";
        Prewarm(prewarm) "prewarm", CUDA, "modules loaded during training steps after pre-warm (also under memory pressure), setup order, cold and cached pre-warm time";
        TrajectoryMatch(trajectory_match) "trajectory_match", BOTH, "max abs loss difference of two training modes at checkpoints";
        SyncCount(sync_count) "sync_count", CUDA, "host syncs inside the captured region and per step";
        ThroughputRatio(throughput_ratio) "throughput_ratio", CUDA, "median-time ratio of baseline over candidate";
        StepThroughput(step_throughput) "step_throughput", CUDA, "training tokens per second of one step mode (median step time)";
        AttentionTime(attention_time) "attention_time", CUDA, "median time of one decoder layer's causal GQA attention, forward + backward, on one choice of kernels (graph replays over buffer sets the L2 cannot hold)";
        LossDescent(loss_descent) "loss_descent", BOTH, "final loss as a fraction of the initial loss";
        GradientParity(gradient_parity) "gradient_parity", CUDA, "rel-L2 error of the GPU training step's gradients vs the CPU reference's";
        MemoryBudget(memory_budget) "memory_budget", CUDA, "peak device memory of a configuration";
        Bandwidth(bandwidth) "bandwidth", CUDA, "a memory-bound kernel's bandwidth as a fraction of the d2d copy bandwidth";
        PeerRatio(peer_ratio) "peer_ratio", CUDA, "our step's tokens/s, or our process's device memory as the driver reports it, over a PyTorch peer's, the peer run in the same trial on the same GPU";
        PeftRoundTrip(peft_round_trip) "peft_round_trip", CUDA, "rel-L2 of PEFT's logits with the adapter the GPU step trained and wrote vs the step's own";
        DataParallel(data_parallel) "data_parallel", CUDA, "the step on several GPUs (one rank process each, NCCL all-reduce) vs one GPU: losses, gradients, bytes reduced, host syncs, tokens/s";
    }
}

/// The Markdown reference of the kinds qlora's contracts may use, its own
/// and then the core's (`falsify kinds`).
pub fn reference_markdown() -> String {
    falsify_core::core_kinds::kinds_markdown::<CheckSpec>()
}

/// The stack's fault knobs of a trial's mutant.
pub trait MutantFaults {
    /// The knobs of this trial's mutant (none for a clean trial or a
    /// mutant of the oracle). A check turns them on with
    /// `gpu.with_faults(..)` around exactly the code the claim is about.
    fn faults(&self) -> Faults;
}

impl MutantFaults for TrialContext<'_> {
    fn faults(&self) -> Faults {
        self.mutant.map_or(Faults::NONE, |m| m.faults())
    }
}

/// The GPU context of a `cuda` trial, or an error saying it is missing.
///
/// Every trial starts with no fault on: the guard of `with_faults` makes
/// this hold. Should it ever fail (an earlier trial of this process left a
/// knob on), the knobs are turned off and this trial is an error.
pub(crate) fn require_gpu<'a, 'b>(cx: &'a mut TrialContext<'b>) -> Result<&'a mut GpuContext> {
    let Some(gpu) = cx.device.as_deref_mut() else {
        return Err(crate::Error::CudaUnavailable(
            "this check needs a GPU context".into(),
        ));
    };
    no_faults_left(gpu)?;
    Ok(gpu)
}

/// Runs a timing measurement between two readings of the trial's GPU clocks
/// ([`clocks::watched`]): once more when the GPU throttled, and the window
/// recorded with the measurement (a window still throttled makes the trial
/// `skipped`). Without a GPU context the clocks are unknown.
pub(crate) fn clock_watched(
    cx: &mut TrialContext<'_>,
    mut measure: impl FnMut(&mut TrialContext<'_>) -> Result<Measurement>,
) -> Result<Measurement> {
    let mut read = cx
        .device
        .as_deref()
        .map(|gpu| clocks::reader(gpu.options().ordinal));
    let read = move || match read.as_mut() {
        Some(read) => read(),
        None => Err("no GPU context".to_string()),
    };
    let (mut m, window) = clocks::watched(read, || measure(cx))?;
    m.clocks = Some(window);
    Ok(m)
}

/// An error if a fault knob is on before a trial's work starts (the knobs
/// are turned off then, and the trial is not trusted).
pub(crate) fn no_faults_left(gpu: &mut GpuContext) -> Result<()> {
    let left = gpu.faults();
    if left.any() {
        drop(gpu.with_faults(Faults::NONE));
        return Err(crate::Error::FaultsLeftOn(format!("{left:?}")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use falsify_core::core_kinds::Check;

    use super::*;

    /// The registry, the parser and `kind_name` name the same kinds: each
    /// registered name parses as a kind (its missing parameters aside), and
    /// each check of the shipped contracts has a registry entry (the
    /// subject's, or the core's for a core kind).
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
        for test in crate::shipped_contracts()
            .iter()
            .flat_map(|c| &c.falsification_tests)
        {
            let name = test.check.kind_name();
            let registry = match &test.check {
                Check::Core(_) => falsify_core::core_kinds::CORE_KINDS,
                Check::Subject(_) => KINDS,
            };
            assert!(
                registry.iter().any(|k| k.name == name),
                "{name} is not registered"
            );
        }
    }

    /// A throughput target for other GPU kinds leaves the trial unjudged
    /// there, with the reason (the engine then ignores it before it runs).
    #[test]
    fn a_throughput_test_with_no_target_for_this_gpu_is_unjudged() {
        let contracts = crate::shipped_contracts();
        let test = contracts
            .iter()
            .flat_map(|c| &c.falsification_tests)
            .find(|t| t.id == "F-TPUT-003")
            .expect("F-TPUT-003 is shipped");
        let on = |name: &str| params::tests::with_gpu(name, 80);
        let why = test
            .check
            .unjudged_on(Backend::Cuda, &on("NVIDIA A100-SXM4-80GB"))
            .unwrap();
        assert!(why.starts_with("no target for NVIDIA A100"), "{why}");
        for judged in ["NVIDIA H200", "NVIDIA H100 80GB HBM3"] {
            assert_eq!(test.check.unjudged_on(Backend::Cuda, &on(judged)), None);
        }
    }
}
