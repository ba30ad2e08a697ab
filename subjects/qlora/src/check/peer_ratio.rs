//! `peer_ratio`: the training step against a peer run in the same trial, on
//! the same GPU.
//!
//! The peer is `scripts/peers/qwen2_lora_step.py`: the same LoRA step on the
//! same Qwen2 shape, written by hand in PyTorch the fast way (the loss
//! `torch.compile`d, the whole step captured in one CUDA graph, fused
//! AdamW), in bf16 or TF32 (`peer:`). The trial first times our step in
//! `mode` as `step_throughput` does and frees it, then starts the peer on
//! the same device and reads its step times. Passes when
//!
//! `ratio = our tokens/s / the peer's tokens/s = median(t_peer) / median(t_ours) >= min_ratio`.
//!
//! The `speedups.csv` row holds the peer as its baseline and our mode as
//! its candidate, with the interval from both sets of step times. Without
//! python3 and torch the trial is skipped with the reason (found out when it
//! runs, so listing the trials starts no Python).

use std::path::Path;
use std::process::Command;

use serde::Deserialize;

use super::doc::{ParamDefault::*, ParamDoc, Piece::*};
use super::doc::{DEFAULT_STEP_MODE, MODEL_BOUND, STEP_MODE_BOUND};
use super::params::{Count, ModelName, Positive, StepMode};
use super::python::{last_json_line, repo_root, require_python};
use super::step_throughput::{check_timed_steps, MAX_REPEATS, MAX_WARMUP};
use super::training::{
    time_steps, trainer_bytes, trainer_shortfall, TimedSteps, TRAINING_TIMEOUT_S,
};
use super::{require_gpu, Backend, Comparator, Here, Kind, Measurement, TrialContext, Validate};
use crate::check::stats::{median, ratio_ci, BOOTSTRAP_RESAMPLES};
use crate::check::{MutantFaults, Speedup};
use crate::error::{Error, Result};
use qlora::gpu::GpuContext;
use qlora::model::ModelConfig;

/// The peer, relative to the repository root.
const SCRIPT: &str = "scripts/peers/qwen2_lora_step.py";

/// The precision the peer trains in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PeerPrecision {
    /// Frozen weights in bf16, the forward under bf16 autocast.
    Bf16,
    /// Frozen weights in f32, TF32 matmuls.
    Tf32,
}

impl PeerPrecision {
    fn as_str(self) -> &'static str {
        match self {
            PeerPrecision::Bf16 => "bf16",
            PeerPrecision::Tf32 => "tf32",
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    pub model: ModelName,
    #[serde(default)]
    pub mode: StepMode,
    pub peer: PeerPrecision,
    #[serde(default = "default_warmup")]
    pub warmup: Count,
    #[serde(default = "default_repeats")]
    pub repeats: Count,
    pub min_ratio: Positive,
}

fn default_warmup() -> Count {
    Count(5)
}

fn default_repeats() -> Count {
    Count(20)
}

/// The parameters of `peer_ratio`, for the generated reference.
pub const PARAMS: &[ParamDoc] = &[
    ParamDoc {
        name: "model",
        default: Required,
        bound: MODEL_BOUND,
        meaning: "the preset both sides train, at its batch and sequence length",
    },
    ParamDoc {
        name: "mode",
        default: Yaml(DEFAULT_STEP_MODE),
        bound: STEP_MODE_BOUND,
        meaning: "our step's mode",
    },
    ParamDoc {
        name: "peer",
        default: Required,
        bound: &[Text("`bf16` or `tf32`")],
        meaning: "the precision the PyTorch peer trains in",
    },
    ParamDoc {
        name: "warmup",
        default: Yaml("5"),
        bound: &[Text("1 to "), Int(MAX_WARMUP), Text(" (at least 2 run)")],
        meaning: "untimed steps first, on each side",
    },
    ParamDoc {
        name: "repeats",
        default: Yaml("20"),
        bound: &[Text("5 to "), Int(MAX_REPEATS)],
        meaning: "timed steps on each side",
    },
    ParamDoc {
        name: "min_ratio",
        default: Required,
        bound: &[Text("> 0")],
        meaning: "bound on our tokens/s over the peer's",
    },
];

/// A minimal `peer_ratio` check.
pub const EXAMPLE: &[(&str, &str)] = &[
    ("model", "small-4l"),
    ("peer", "tf32"),
    ("min_ratio", "1.0"),
];

impl Validate for Params {
    fn validate(&self) -> std::result::Result<(), String> {
        check_timed_steps(self.warmup, self.repeats)?;
        self.model.check_sized(None, None)
    }
}

/// What the peer prints as its last line (the script's doc says more).
#[derive(Debug, Deserialize)]
struct PeerResult {
    step_ms: Vec<f64>,
    setup_s: f64,
    versions: String,
    device: String,
    peak_reserved_bytes: u64,
    device_used_bytes: u64,
}

/// The model as the peer's `--config` JSON.
fn peer_config(cfg: &ModelConfig) -> String {
    serde_json::json!({
        "layers": cfg.layers,
        "hidden": cfg.hidden,
        "heads": cfg.heads,
        "kv_heads": cfg.kv_heads,
        "head_dim": cfg.head_dim,
        "intermediate": cfg.intermediate,
        "vocab": cfg.vocab,
        "seq_len": cfg.seq_len,
        "batch": cfg.batch,
        "lora_rank": cfg.lora_rank,
        "qkv_bias": cfg.qkv_bias,
        "tied_embeddings": cfg.tied_embeddings,
        "rope_theta": cfg.rope_theta,
        "rms_eps": cfg.rms_eps,
    })
    .to_string()
}

/// Runs the peer on CUDA device `ordinal` (the same ordinal names the same
/// GPU: the child inherits this process's environment).
fn run_peer(p: &Params, cfg: &ModelConfig, ordinal: usize, seed: u64) -> Result<PeerResult> {
    let output = Command::new("python3")
        .arg(repo_root().join(SCRIPT))
        .args(["--config", &peer_config(cfg)])
        .args(["--precision", p.peer.as_str()])
        .args(["--warmup", &p.warmup.0.to_string()])
        .args(["--repeats", &p.repeats.0.to_string()])
        .args(["--device", &ordinal.to_string()])
        .args(["--seed", &(seed >> 33).to_string()])
        .output()
        .map_err(|e| Error::io(Path::new("python3"), e))?;
    last_json_line("peer_ratio", SCRIPT, &output)
}

fn peer_ratio(p: &Params, cx: &mut TrialContext<'_>) -> Result<Measurement> {
    require_python(&["torch"], "needed to run the PyTorch peer")?;
    let cfg = p.model.sized(None, None);
    let (seed, faults) = (cx.seed, cx.faults());
    let gpu = require_gpu(cx)?;
    let device = gpu.facts().name.clone();
    let ordinal = gpu.options().ordinal;
    let ours = {
        let gpu: &mut GpuContext = &mut gpu.with_faults(faults);
        let options = p.mode.speed_options();
        time_steps(gpu, &cfg, (options, seed), (p.warmup.0, p.repeats.0))?
    };
    let peer = run_peer(p, &cfg, ordinal, seed)?;
    if peer.device != device {
        return Err(Error::InvalidArgument {
            op: "peer_ratio",
            message: format!("the peer ran on {} instead of {device}", peer.device),
        });
    }
    Ok(judge(p, &cfg, &device, (&ours, &peer), seed))
}

/// The measurement of `ours` against `peer`, with its `speedups.csv` row.
fn judge(
    p: &Params,
    cfg: &ModelConfig,
    device: &str,
    (ours, peer): (&TimedSteps, &PeerResult),
    seed: u64,
) -> Measurement {
    let (t_ours, t_peer) = (median(&ours.ms), median(&peer.step_ms));
    let rate = |median_ms: f64| cfg.tokens() as f64 / median_ms * 1e3;
    let ratio = t_peer / t_ours;
    let (lo, hi) = ratio_ci(&peer.step_ms, &ours.ms, seed, BOOTSTRAP_RESAMPLES);
    let peak = ours.memory.peak_gib();
    let gib = |b: u64| b as f64 / f64::from(1u32 << 30);
    let name = format!("PyTorch {} peer", p.peer.as_str());
    let detail = format!(
        "model {} batch {} seq {} on {device}: ours {} {:.0} tokens/s (median {t_ours:.3} ms, graph {}, device memory added {peak:.2} GiB); {name} ({}) {:.0} tokens/s (median {t_peer:.3} ms, setup (weights, compilation, capture) {:.0} s, allocator peak {:.2} GiB, device in use by both processes {:.2} GiB); ratio {ratio:.3}, 95% CI [{lo:.3}, {hi:.3}]",
        cfg.name,
        cfg.batch,
        cfg.seq_len,
        p.mode,
        rate(t_ours),
        if ours.replayed { "replayed" } else { "not used" },
        peer.versions,
        rate(t_peer),
        peer.setup_s,
        gib(peer.peak_reserved_bytes),
        gib(peer.device_used_bytes),
    );
    let mut m = Measurement::new(
        "tokens_per_s_ratio",
        ratio,
        Comparator::Ge,
        p.min_ratio.0,
        "ratio",
    )
    .with_detail(detail);
    m.speedups.push(Speedup {
        subject: "peer".into(),
        model: cfg.name.into(),
        batch: cfg.batch,
        seq_len: cfg.seq_len,
        baseline: format!("{name} ({})", peer.versions),
        candidate: p.mode.to_string(),
        baseline_median_ms: t_peer,
        candidate_median_ms: t_ours,
        ratio,
        ratio_ci_low: lo,
        ratio_ci_high: hi,
        repeats: p.repeats.0,
        peak_device_gib: Some(peak),
    });
    m
}

impl Kind<crate::Qlora> for Params {
    fn execute(&self, _backend: Backend, cx: &mut TrialContext<'_>) -> Result<Measurement> {
        super::clock_watched(cx, |cx| peer_ratio(self, cx))
    }

    /// Our trainer does not fit the GPU's free memory.
    fn unjudged_on(&self, backend: Backend, here: &Here) -> Option<String> {
        here.gpu.as_ref().filter(|_| backend == Backend::Cuda)?;
        let cfg = self.model.sized(None, None);
        let needed = trainer_bytes(&cfg, &self.mode.speed_options());
        trainer_shortfall(backend, &cfg, needed, here)
    }

    /// The peer compiles its step with Inductor first: about a minute and a
    /// half on a fresh machine for qwen2.5-0.5b, beside our own trial.
    fn default_timeout_s(&self) -> f64 {
        3.0 * TRAINING_TIMEOUT_S
    }

    fn needs_the_gpu_alone(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(extra: &str) -> std::result::Result<Params, String> {
        crate::check::params::tests::parse(&format!("model: small-4l\n{extra}"))
    }

    #[test]
    fn the_peer_and_the_bound_are_required_and_checked() {
        let p = params("peer: bf16\nmin_ratio: 1.5").unwrap();
        assert_eq!(p.peer, PeerPrecision::Bf16);
        assert_eq!((p.warmup.0, p.repeats.0), (5, 20));
        let e = params("peer: fp8\nmin_ratio: 1").unwrap_err();
        assert!(e.contains("unknown variant `fp8`"), "{e}");
        let e = params("peer: tf32\nmin_ratio: 0").unwrap_err();
        assert!(e.contains("> 0"), "{e}");
        let e = params("peer: tf32\nmin_ratio: 1\nrepeats: 3").unwrap_err();
        assert!(e.contains("at least 5"), "{e}");
        let e = params("min_ratio: 1").unwrap_err();
        assert!(e.contains("missing field `peer`"), "{e}");
    }

    /// The peer gets every field of the configuration its script requires.
    #[test]
    fn the_peer_config_has_every_key_the_script_reads() {
        let cfg = ModelConfig::preset("qwen2.5-0.5b").unwrap();
        let json: serde_json::Value = serde_json::from_str(&peer_config(&cfg)).unwrap();
        let script = std::fs::read_to_string(repo_root().join(SCRIPT)).unwrap();
        let keys = script
            .split("CONFIG_KEYS = (")
            .nth(1)
            .and_then(|rest| rest.split(')').next())
            .unwrap();
        let keys: Vec<&str> = keys
            .split(',')
            .map(|k| k.trim().trim_matches('"'))
            .filter(|k| !k.is_empty())
            .collect();
        assert_eq!(keys.len(), 14);
        for k in keys {
            assert!(json.get(k).is_some(), "{k}");
        }
        assert_eq!(json["tied_embeddings"], true);
        assert_eq!(json["vocab"], 151936);
    }

    #[test]
    fn the_ratio_is_the_peer_time_over_ours_and_the_row_names_the_peer() {
        let p = params("peer: tf32\nmin_ratio: 1.5").unwrap();
        let cfg = ModelConfig::preset("small-4l").unwrap();
        let ours = TimedSteps {
            ms: vec![10.0; 5],
            replayed: true,
            memory: super::super::training::DeviceMemory::zero(),
        };
        let peer = PeerResult {
            step_ms: vec![15.0; 5],
            setup_s: 60.0,
            versions: "torch 2.11.0".into(),
            device: "NVIDIA H100 80GB HBM3".into(),
            peak_reserved_bytes: 1 << 30,
            device_used_bytes: 2 << 30,
        };
        let m = judge(&p, &cfg, "NVIDIA H100 80GB HBM3", (&ours, &peer), 1);
        assert!((m.observed - 1.5).abs() < 1e-12);
        // small-4l trains 512 tokens a step: 10 ms is 51,200 tokens/s, 15 ms 34,133.
        assert!(
            m.detail.contains("51200 tokens/s (median 10.000 ms")
                && m.detail.contains("34133 tokens/s (median 15.000 ms"),
            "{}",
            m.detail
        );
        assert_eq!(m.threshold, 1.5);
        let row = &m.speedups[0];
        assert_eq!(row.baseline, "PyTorch tf32 peer (torch 2.11.0)");
        assert_eq!(
            (row.baseline_median_ms, row.candidate_median_ms),
            (15.0, 10.0)
        );
    }
}
