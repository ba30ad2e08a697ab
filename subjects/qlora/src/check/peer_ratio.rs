//! `peer_ratio`: the training step against a peer run in the same trial, on
//! the same GPU.
//!
//! The peer is `scripts/peers/qwen2_lora_step.py`: the same LoRA step on the
//! same Qwen2 shape, written by hand in PyTorch the fast way (the loss
//! `torch.compile`d, the whole step captured in one CUDA graph, fused
//! AdamW), in bf16 or TF32 (`peer:`). The trial first times our step in
//! `mode` as `step_throughput` does, reads our process's device memory while
//! the trainer still holds it, and frees it; then starts the peer on the
//! same device, which times its steps and reads its own process's memory
//! after them. A check judges one claim, named by the bound it gives:
//!
//! - speed, `min_ratio`: `ratio = our tokens/s / the peer's tokens/s =
//!   median(t_peer) / median(t_ours) >= min_ratio`;
//! - memory, `max_memory_ratio`: `m_ours / m_peer <= max_memory_ratio`,
//!   where `m` is a process's device memory in MiB as the driver reports it
//!   ([`process_memory`]: `nvidia-smi --query-compute-apps`, the context
//!   included), read the same way for both: ours after our timed steps (our
//!   workspace is allocated when the trainer is built and a graphed step
//!   allocates nothing, so that is our peak), the peer's after its timed
//!   steps (PyTorch's caching allocator keeps what it reserved, so that is
//!   its peak). Each process is found by its id; our process keeps its
//!   context while the peer runs, which the peer's row does not count.
//!
//! The `speedups.csv` row holds the peer as its baseline and our mode as
//! its candidate, with the interval from both sets of step times, and each
//! side's driver-reported memory beside it. Without python3 and torch the
//! trial is skipped with the reason (found out when it runs, so listing the
//! trials starts no Python); a memory claim is skipped with the reason where
//! the driver does not report a process's memory (no `nvidia-smi`, `[N/A]`,
//! no row for the process), never judged without both figures.

use std::path::Path;
use std::process::Command;

use serde::Deserialize;

use super::doc::{ParamDefault::*, ParamDoc, Piece::*};
use super::doc::{DEFAULT_STEP_MODE, MODEL_BOUND, STEP_MODE_BOUND};
use super::params::{Count, ModelName, Positive, StepMode};
use super::python::{last_json_line, repo_root, require_python};
use super::step_throughput::{check_timed_steps, MAX_REPEATS, MAX_WARMUP};
use super::training::{
    time_steps_then, trainer_bytes, trainer_shortfall, TimedSteps, TRAINING_TIMEOUT_S,
};
use super::{require_gpu, Backend, Comparator, Here, Kind, Measurement, TrialContext, Validate};
use crate::check::stats::{median, ratio_ci, BOOTSTRAP_RESAMPLES};
use crate::check::{clocks, process_memory, MutantFaults, Speedup};
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
    /// The speed claim's bound (see [`Claim`]).
    #[serde(default)]
    pub min_ratio: Option<Positive>,
    /// The memory claim's bound (see [`Claim`]).
    #[serde(default)]
    pub max_memory_ratio: Option<Positive>,
}

fn default_warmup() -> Count {
    Count(5)
}

fn default_repeats() -> Count {
    Count(20)
}

/// What one `peer_ratio` check judges: the claim whose bound it gives.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Claim {
    /// `median(t_peer) / median(t_ours) >= bound`: our tokens/s over the
    /// peer's.
    Speed(f64),
    /// `m_ours / m_peer <= bound`: our process's device memory over the
    /// peer's, MiB as the driver reports each.
    Memory(f64),
}

impl Params {
    /// The claim of the one bound given; an error naming both bounds
    /// otherwise (a trial has one verdict).
    pub fn claim(&self) -> std::result::Result<Claim, String> {
        match (self.min_ratio, self.max_memory_ratio) {
            (Some(r), None) => Ok(Claim::Speed(r.0)),
            (None, Some(m)) => Ok(Claim::Memory(m.0)),
            (Some(_), Some(_)) => Err(format!("max_memory_ratio: {ONE_CLAIM}, not both")),
            (None, None) => Err(ONE_CLAIM.to_string()),
        }
    }
}

/// What a check without exactly one bound is told.
const ONE_CLAIM: &str = "a peer_ratio check judges one claim: give `min_ratio` (our tokens/s over the peer's) or `max_memory_ratio` (our process's device memory over the peer's)";

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
        default: Otherwise("none (give this or `max_memory_ratio`)"),
        bound: &[Text("> 0")],
        meaning: "the speed claim: bound on our tokens/s over the peer's",
    },
    ParamDoc {
        name: "max_memory_ratio",
        default: Otherwise("none (give this or `min_ratio`)"),
        bound: &[Text("> 0")],
        meaning: "the memory claim: bound on our process's device memory over the peer's process's, each as the driver reports it (`nvidia-smi`, the CUDA context included)",
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
        self.claim()?;
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
    /// `None` from a script that does not read it.
    #[serde(default)]
    driver_memory: Option<PeerDriverMemory>,
}

/// The peer's reading of its own process's device memory: its process id
/// and `nvidia-smi`'s rows ([`process_memory::QUERY`]), or why it has none.
#[derive(Debug, Deserialize)]
struct PeerDriverMemory {
    pid: u32,
    rows: Option<String>,
    error: Option<String>,
}

impl PeerResult {
    /// The peer process's device memory, MiB, read from its rows as ours
    /// is ([`process_memory::mib_of`]), or why there is none.
    fn driver_mib(&self) -> Mib {
        let Some(d) = &self.driver_memory else {
            return Err("the peer read no device memory of its process".into());
        };
        match (&d.rows, &d.error) {
            (Some(rows), _) => process_memory::mib_of(rows, d.pid),
            (None, why) => Err(why.clone().unwrap_or_else(|| "nvidia-smi not run".into())),
        }
    }
}

/// One process's device memory, MiB, as the driver reports it, or why it
/// does not.
type Mib = std::result::Result<u64, String>;

/// Each side's process's device memory.
#[derive(Debug, Clone)]
struct DriverMemory {
    ours: Mib,
    peer: Mib,
}

impl DriverMemory {
    /// Both figures, or why the memory claim cannot be judged here.
    fn both(&self) -> Result<(u64, u64)> {
        match (&self.ours, &self.peer) {
            (Ok(ours), Ok(peer)) => Ok((*ours, *peer)),
            (Err(why), _) => Err(not_reported("our", why)),
            (_, Err(why)) => Err(not_reported("the peer's", why)),
        }
    }
}

/// The error that leaves a memory claim unjudged: `whose` figure is absent.
fn not_reported(whose: &str, why: &str) -> Error {
    Error::NotReported(format!(
        "memory claim not judged: the driver reports no device memory of {whose} process ({why})"
    ))
}

/// `mib` with thousands separators and its unit (`7,650 MiB`), or that it
/// was not reported.
fn mib_text(mib: &Mib) -> String {
    let Ok(n) = mib else {
        return "not reported".into();
    };
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    format!("{out} MiB")
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
/// GPU: the child inherits this process's environment), asking it to read
/// its process's memory from the GPU `bus_id` names, where known.
fn run_peer(
    p: &Params,
    cfg: &ModelConfig,
    (ordinal, bus_id): (usize, Option<&str>),
    seed: u64,
) -> Result<PeerResult> {
    let mut command = Command::new("python3");
    command
        .arg(repo_root().join(SCRIPT))
        .args(["--config", &peer_config(cfg)])
        .args(["--precision", p.peer.as_str()])
        .args(["--warmup", &p.warmup.0.to_string()])
        .args(["--repeats", &p.repeats.0.to_string()])
        .args(["--device", &ordinal.to_string()])
        .args(["--seed", &(seed >> 33).to_string()]);
    if let Some(id) = bus_id {
        command.args(["--bus-id", id]);
    }
    let output = command
        .output()
        .map_err(|e| Error::io(Path::new("python3"), e))?;
    last_json_line("peer_ratio", SCRIPT, &output)
}

/// Our process's device memory, MiB, on the GPU `bus_id` names.
fn our_driver_mib(bus_id: &std::result::Result<String, String>) -> Mib {
    let id = bus_id.as_deref().map_err(Clone::clone)?;
    process_memory::process_mib(id, std::process::id())
}

/// One trial: our steps timed and our process's memory read, the trainer
/// freed, then the peer run on the same GPU; [`judge`] decides `claim`.
fn peer_ratio(p: &Params, claim: Claim, cx: &mut TrialContext<'_>) -> Result<Measurement> {
    require_python(&["torch"], "needed to run the PyTorch peer")?;
    let cfg = p.model.sized(None, None);
    let (seed, faults) = (cx.seed, cx.faults());
    let gpu = require_gpu(cx)?;
    let device = gpu.facts().name.clone();
    let ordinal = gpu.options().ordinal;
    let bus_id = clocks::pci_bus_id(ordinal);
    let (ours, our_mib) = {
        let gpu: &mut GpuContext = &mut gpu.with_faults(faults);
        let options = p.mode.speed_options();
        let steps = (p.warmup.0, p.repeats.0);
        let read = || our_driver_mib(&bus_id);
        time_steps_then(gpu, &cfg, (options, seed), steps, None, read)?
    };
    if let (Claim::Memory(_), Err(why)) = (claim, &our_mib) {
        // Not worth the peer's minutes: the claim cannot be judged here.
        return Err(not_reported("our", why));
    }
    let peer = run_peer(p, &cfg, (ordinal, bus_id.as_deref().ok()), seed)?;
    if peer.device != device {
        return Err(Error::InvalidArgument {
            op: "peer_ratio",
            message: format!("the peer ran on {} instead of {device}", peer.device),
        });
    }
    let memory = DriverMemory {
        ours: our_mib,
        peer: peer.driver_mib(),
    };
    judge(p, claim, &cfg, &device, (&ours, &peer, &memory), seed)
}

/// The measurement of `ours` against `peer` for `claim`, with its
/// `speedups.csv` row; an [`Error::NotReported`] for a memory claim
/// without both figures.
fn judge(
    p: &Params,
    claim: Claim,
    cfg: &ModelConfig,
    device: &str,
    (ours, peer, memory): (&TimedSteps, &PeerResult, &DriverMemory),
    seed: u64,
) -> Result<Measurement> {
    let (t_ours, t_peer) = (median(&ours.ms), median(&peer.step_ms));
    let ratio = t_peer / t_ours;
    let (lo, hi) = ratio_ci(&peer.step_ms, &ours.ms, seed, BOOTSTRAP_RESAMPLES);
    let name = format!("PyTorch {} peer", p.peer.as_str());
    let timing = timing_detail(p, cfg, device, (ours, peer), (ratio, lo, hi));
    let (ours_mib, peer_mib) = (mib_text(&memory.ours), mib_text(&memory.peer));
    let mut m = match claim {
        Claim::Speed(bound) => {
            Measurement::new("tokens_per_s_ratio", ratio, Comparator::Ge, bound, "ratio")
                .with_detail(format!(
                    "{timing}; process device memory (driver): ours {ours_mib}, peer {peer_mib}"
                ))
        }
        Claim::Memory(bound) => {
            let (o, q) = memory.both()?;
            let mem_ratio = o as f64 / q as f64;
            Measurement::new("driver_memory_ratio", mem_ratio, Comparator::Le, bound, "ratio")
                .with_detail(format!(
                    "device memory of each process as the driver reports it (nvidia-smi, context included): ours {ours_mib}, {name} {peer_mib}, ratio {mem_ratio:.3}; {timing}"
                ))
        }
    };
    let gib = |mib: &Mib| mib.as_ref().ok().map(|&n| n as f64 / 1024.0);
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
        peak_device_gib: gib(&memory.ours),
        baseline_peak_device_gib: gib(&memory.peer),
    });
    Ok(m)
}

/// Both sides' step times, tokens/s and what each allocator reports, and
/// the tokens/s ratio with its 95% interval.
fn timing_detail(
    p: &Params,
    cfg: &ModelConfig,
    device: &str,
    (ours, peer): (&TimedSteps, &PeerResult),
    (ratio, lo, hi): (f64, f64, f64),
) -> String {
    let (t_ours, t_peer) = (median(&ours.ms), median(&peer.step_ms));
    let rate = |median_ms: f64| cfg.tokens() as f64 / median_ms * 1e3;
    let peak = ours.memory.peak_gib();
    let gib = |b: u64| b as f64 / f64::from(1u32 << 30);
    format!(
        "model {} batch {} seq {} on {device}: ours {} {:.0} tokens/s (median {t_ours:.3} ms, graph {}, device memory added {peak:.2} GiB); PyTorch {} peer ({}) {:.0} tokens/s (median {t_peer:.3} ms, setup (weights, compilation, capture) {:.0} s, allocator peak {:.2} GiB, device in use by both processes {:.2} GiB); ratio {ratio:.3}, 95% CI [{lo:.3}, {hi:.3}]",
        cfg.name,
        cfg.batch,
        cfg.seq_len,
        p.mode,
        rate(t_ours),
        if ours.replayed { "replayed" } else { "not used" },
        p.peer.as_str(),
        peer.versions,
        rate(t_peer),
        peer.setup_s,
        gib(peer.peak_reserved_bytes),
        gib(peer.device_used_bytes),
    )
}

impl Kind<crate::Qlora> for Params {
    /// A speed claim is timed between two readings of the GPU's clocks
    /// (a throttled window is measured again, then skipped); a memory
    /// claim does not depend on the clocks.
    fn execute(&self, _backend: Backend, cx: &mut TrialContext<'_>) -> Result<Measurement> {
        let claim = self.claim().map_err(|message| Error::InvalidArgument {
            op: "peer_ratio",
            message,
        })?;
        match claim {
            Claim::Speed(_) => super::clock_watched(cx, |cx| peer_ratio(self, claim, cx)),
            Claim::Memory(_) => peer_ratio(self, claim, cx),
        }
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

    /// The PyTorch peer compiles its step on every core.
    fn needs_the_whole_host(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Qlora;
    use falsify_core::Subject;

    fn params(extra: &str) -> std::result::Result<Params, String> {
        crate::check::params::tests::parse(&format!("model: small-4l\n{extra}"))
    }

    #[test]
    fn the_peer_and_the_bound_are_required_and_checked() {
        let p = params("peer: bf16\nmin_ratio: 1.5").unwrap();
        assert_eq!(p.peer, PeerPrecision::Bf16);
        assert_eq!((p.warmup.0, p.repeats.0), (5, 20));
        assert_eq!(p.claim(), Ok(Claim::Speed(1.5)));
        let e = params("peer: fp8\nmin_ratio: 1").unwrap_err();
        assert!(e.contains("unknown variant `fp8`"), "{e}");
        let e = params("peer: tf32\nmin_ratio: 0").unwrap_err();
        assert!(e.contains("> 0"), "{e}");
        let e = params("peer: tf32\nmin_ratio: 1\nrepeats: 3").unwrap_err();
        assert!(e.contains("at least 5"), "{e}");
        let e = params("min_ratio: 1").unwrap_err();
        assert!(e.contains("missing field `peer`"), "{e}");
    }

    /// One bound names the claim: the memory bound alone, the speed bound
    /// alone, never both or neither, and a memory bound > 0.
    #[test]
    fn a_check_gives_exactly_one_bound_and_it_names_the_claim() {
        let p = params("peer: bf16\nmax_memory_ratio: 1.0").unwrap();
        assert_eq!(p.claim(), Ok(Claim::Memory(1.0)));
        let e = params("peer: bf16\nmin_ratio: 1.5\nmax_memory_ratio: 1.0").unwrap_err();
        assert!(e.starts_with("max_memory_ratio: "), "{e}");
        assert!(e.contains("not both"), "{e}");
        let e = params("peer: bf16").unwrap_err();
        assert!(e.starts_with(ONE_CLAIM), "{e}");
        for (bad, why) in [("0", "0 is out of range"), ("-1", "-1 is out of range")] {
            let e = params(&format!("peer: bf16\nmax_memory_ratio: {bad}")).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
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

    /// Both sides' memory is the same query: the script asks nvidia-smi
    /// what [`process_memory`] asks for ours.
    #[test]
    fn the_peer_reads_its_memory_with_our_query() {
        let script = std::fs::read_to_string(repo_root().join(SCRIPT)).unwrap();
        for arg in process_memory::QUERY {
            assert!(script.contains(&format!("\"{arg}\"")), "{arg}");
        }
        assert!(script.contains("os.getpid()") && script.contains("\"--bus-id\""));
    }

    fn ours(ms: f64) -> TimedSteps {
        TimedSteps {
            ms: vec![ms; 5],
            replayed: true,
            memory: super::super::training::DeviceMemory::zero(),
        }
    }

    const H100: &str = "NVIDIA H100 80GB HBM3";

    /// A peer's result as the script prints it, 15 ms a step, its memory
    /// read as `rows` (or not, with the reason `error`).
    fn peer(rows: Option<&str>, error: Option<&str>) -> PeerResult {
        let json = serde_json::json!({
            "step_ms": vec![15.0; 5],
            "setup_s": 60.0,
            "versions": "torch 2.11.0",
            "device": H100,
            "peak_reserved_bytes": 1u64 << 30,
            "device_used_bytes": 2u64 << 30,
            "driver_memory": {"pid": 430, "rows": rows, "error": error},
        });
        serde_json::from_value(json).unwrap()
    }

    /// The judgement of `p` on small-4l: ours 10 ms a step and `ours_mib`.
    fn judged(p: &Params, peer: &PeerResult, ours_mib: Mib) -> Result<Measurement> {
        let cfg = ModelConfig::preset("small-4l").unwrap();
        let memory = DriverMemory {
            ours: ours_mib,
            peer: peer.driver_mib(),
        };
        judge(
            p,
            p.claim().unwrap(),
            &cfg,
            H100,
            (&ours(10.0), peer, &memory),
            1,
        )
    }

    #[test]
    fn the_ratio_is_the_peer_time_over_ours_and_the_row_names_the_peer() {
        let p = params("peer: tf32\nmin_ratio: 1.5").unwrap();
        let m = judged(&p, &peer(Some("430, 2850\n"), None), Ok(7650)).unwrap();
        assert!((m.observed - 1.5).abs() < 1e-12);
        assert_eq!((m.comparator, m.threshold), (Comparator::Ge, 1.5));
        // small-4l trains 512 tokens a step: 10 ms is 51,200 tokens/s, 15 ms 34,133.
        assert!(
            m.detail.contains("51200 tokens/s (median 10.000 ms")
                && m.detail.contains("34133 tokens/s (median 15.000 ms")
                && m.detail.contains("ours 7,650 MiB, peer 2,850 MiB"),
            "{}",
            m.detail
        );
        let row = &m.speedups[0];
        assert_eq!(row.baseline, "PyTorch tf32 peer (torch 2.11.0)");
        assert_eq!(
            (row.baseline_median_ms, row.candidate_median_ms),
            (15.0, 10.0)
        );
        assert_eq!(
            (row.peak_device_gib, row.baseline_peak_device_gib),
            (Some(7650.0 / 1024.0), Some(2850.0 / 1024.0))
        );
    }

    /// The memory claim holds at and below its bound, not above, with both
    /// figures in the detail and the timing still in the row.
    #[test]
    fn the_memory_claim_is_ours_over_the_peers_at_most_the_bound() {
        let p = params("peer: bf16\nmax_memory_ratio: 1.0").unwrap();
        let peer = peer(Some("12, 900\n430, 2850\n"), None);
        for (ours_mib, passes) in [(2850, true), (1425, true), (2851, false), (7650, false)] {
            let m = judged(&p, &peer, Ok(ours_mib)).unwrap();
            assert_eq!(m.metric, "driver_memory_ratio");
            assert_eq!((m.comparator, m.threshold), (Comparator::Le, 1.0));
            assert!((m.observed - ours_mib as f64 / 2850.0).abs() < 1e-12);
            assert_eq!(m.passed(), passes, "{ours_mib} MiB: {}", m.observed);
        }
        let m = judged(&p, &peer, Ok(7650)).unwrap();
        let both = "ours 7,650 MiB, PyTorch bf16 peer 2,850 MiB, ratio 2.684";
        assert!(m.detail.contains(both), "{}", m.detail);
        assert_eq!(m.speedups[0].ratio, 1.5);
        assert_eq!(
            m.speedups[0].baseline_peak_device_gib,
            Some(2850.0 / 1024.0)
        );
    }

    /// Without either figure the memory claim is not judged (the trial is
    /// skipped with the reason, never passed); the speed claim still is.
    #[test]
    fn the_memory_claim_is_unjudged_without_both_figures() {
        let memory = params("peer: bf16\nmax_memory_ratio: 1.0").unwrap();
        let speed = params("peer: bf16\nmin_ratio: 1.0").unwrap();
        let smi_absent = "nvidia-smi not run: No such file or directory";
        let cases = [
            (peer(Some("430, [N/A]\n"), None), Ok(100), "[N/A]"),
            (
                peer(Some("431, 2850\n"), None),
                Ok(100),
                "lists no process 430",
            ),
            (peer(None, Some(smi_absent)), Ok(100), smi_absent),
            (
                peer(Some("430, 2850\n"), None),
                Err("no nvidia-smi".into()),
                "of our process",
            ),
        ];
        for (peer, ours_mib, why) in cases {
            let e = judged(&memory, &peer, ours_mib.clone()).unwrap_err();
            assert!(Qlora::does_not_fit(&e), "{e}");
            let e = e.to_string();
            assert!(
                e.starts_with("memory claim not judged") && e.contains(why),
                "{e}"
            );
            let m = judged(&speed, &peer, ours_mib).unwrap();
            assert!(
                m.passed() && m.detail.contains("not reported"),
                "{}",
                m.detail
            );
        }
        // A script that reads no memory (or ran on the CPU) gives none.
        let mut quiet = peer(None, None);
        assert_eq!(quiet.driver_mib(), Err("nvidia-smi not run".into()));
        quiet.driver_memory = None;
        assert!(quiet
            .driver_mib()
            .unwrap_err()
            .contains("read no device memory"));
    }

    #[test]
    fn mib_are_written_with_thousands_separators() {
        assert_eq!(mib_text(&Ok(7650)), "7,650 MiB");
        assert_eq!(mib_text(&Ok(850)), "850 MiB");
        assert_eq!(mib_text(&Ok(1_234_567)), "1,234,567 MiB");
        assert_eq!(mib_text(&Err("x".into())), "not reported");
    }
}
