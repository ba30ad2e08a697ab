//! `bandwidth`: a memory-bound kernel's achieved bandwidth as a fraction of
//! the device-to-device copy bandwidth measured in the same trial.
//!
//! - bytes `B` = the fewest bytes the op must move: each input read once, each
//!   output written once ([`Params::bytes`], the one place this is defined);
//! - kernel time `t_k` = median over `repeats` of one launch, timed with CUDA
//!   events around a captured graph of launches that rotate over enough
//!   buffer sets (>= 256 MiB in all) that the L2 cache cannot serve them;
//! - copy bandwidth `C / t_c` = a device-to-device copy of the same bytes
//!   (`C = B` rounded up to 8: `B / 2` read, `B / 2` written), timed the same
//!   way: median `t_c` of one copy, over graph replays rotating over as many
//!   buffer sets as the op's, so the copy, too, starts with the L2 cache cold
//!   and pays the same launch and tail costs a kernel of that size pays;
//! - `fraction = (B / t_k) / (C / t_c)`; passes when `fraction >= min_fraction`.
//!
//! The op's graph replays `repeats` times, then the copy's: a fixed count, not
//! the adaptive, alternated pairs of `throughput_ratio`
//! ([`time_pairs`](super::repeats::time_pairs)). The bounds of the shipped
//! contracts were set with this graph-replay timing; timing each replay on
//! its own with the two graphs alternated moved fractions by up to 5% and
//! turned one verdict, with no reason known to prefer it. The GPU's clocks
//! are read around the whole measurement (`clock_watched`): a throttled
//! one is measured once more, then the trial is `skipped`.
//!
//! A mutant run needs only to show that the check fails, and its slowed
//! kernel makes every replay long: it times the copy's `repeats` replays
//! first, then the op's one by one, and from the
//! [`MUTANT_FIRST_LOOK`](super::repeats::MUTANT_FIRST_LOOK)th on stops as
//! soon as the fraction's 95% interval against the copy's times lies wholly
//! below the bound (`hi < min_fraction`); otherwise it times all `repeats`.

pub(crate) mod measure;

use serde::Deserialize;

use super::doc::PASSES;
use super::doc::{ParamDefault::*, ParamDoc, Piece::*};

use super::op::{bandwidth_kernels, BandwidthKernel, OpSpec, Pass};
use super::params::{at_most, gpu_shortfall, Count, Fraction, Shape};
use super::{clock_watched, Backend, Here, Kind, Measurement, TrialContext, Validate};
use crate::error::Result;

/// The contract spellings of `bandwidth`'s `op`: the kernels of the op
/// table ([`super::op::bandwidth_kernels`]), in the order the generated
/// reference lists them (a test compares the two).
pub const KERNEL_NAMES: &[&str] = &[
    "rmsnorm",
    "rmsnorm_residual",
    "rope",
    "silu",
    "swiglu",
    "residual_add",
    "scale",
    "cross_entropy",
    "squared_sum",
    "clip_apply",
    "adamw",
    "embedding",
    "nf4_dequantize",
];

/// A memory-bound kernel this check can time, named as in contracts: an
/// entry of the op table, with the op whose dims and shape rule it takes.
#[derive(Clone, Copy)]
pub struct BandwidthOp {
    pub op: &'static OpSpec,
    pub kernel: &'static BandwidthKernel,
}

impl BandwidthOp {
    /// The kernel named `name`, if the op table has one.
    pub fn named(name: &str) -> Option<BandwidthOp> {
        bandwidth_kernels()
            .find(|(_, k)| k.name == name)
            .map(|(op, kernel)| BandwidthOp { op, kernel })
    }

    pub fn name(self) -> &'static str {
        self.kernel.name
    }

    /// The named dimensions a shape for this kernel must give: its op's.
    pub fn dims(self) -> &'static [&'static str] {
        self.op.dims
    }

    /// The shape rules of this kernel: its op's ([`super::op::Op::check_stack_shape`]).
    pub fn check_stack_shape(self, s: &Shape) -> std::result::Result<(), String> {
        (self.op.stack_shape)(s)
    }

    /// Whether a backward kernel exists to time.
    pub fn has_backward(self) -> bool {
        self.kernel.backward.is_some()
    }
}

impl std::fmt::Debug for BandwidthOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl PartialEq for BandwidthOp {
    fn eq(&self, other: &BandwidthOp) -> bool {
        self.name() == other.name()
    }
}

impl<'de> Deserialize<'de> for BandwidthOp {
    /// Parsed as a unit-variant enum named by [`KERNEL_NAMES`] (as serde's
    /// derive parses one, with the same errors), then looked up in the table.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        d.deserialize_enum("BandwidthOp", KERNEL_NAMES, KernelVisitor)
    }
}

/// Reads `bandwidth`'s `op` as a unit variant of [`KERNEL_NAMES`].
struct KernelVisitor;

impl<'de> serde::de::Visitor<'de> for KernelVisitor {
    type Value = BandwidthOp;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("enum BandwidthOp")
    }

    fn visit_enum<A: serde::de::EnumAccess<'de>>(
        self,
        data: A,
    ) -> std::result::Result<BandwidthOp, A::Error> {
        use serde::de::VariantAccess;
        let (KernelName(op), variant) = data.variant()?;
        variant.unit_variant()?;
        Ok(op)
    }
}

/// The variant identifier: a name of [`KERNEL_NAMES`], looked up while it
/// is read, so an unknown one is reported where it stands.
struct KernelName(BandwidthOp);

impl<'de> Deserialize<'de> for KernelName {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        d.deserialize_identifier(KernelNameVisitor)
    }
}

struct KernelNameVisitor;

impl serde::de::Visitor<'_> for KernelNameVisitor {
    type Value = KernelName;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("variant identifier")
    }

    fn visit_str<E: serde::de::Error>(self, name: &str) -> std::result::Result<KernelName, E> {
        BandwidthOp::named(name)
            .map(KernelName)
            .ok_or_else(|| E::unknown_variant(name, KERNEL_NAMES))
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    pub op: BandwidthOp,
    #[serde(default)]
    pub pass: Pass,
    /// The op's dims; its largest tensor holds at most [`MAX_ELEMENTS`].
    pub shape: Shape,
    pub min_fraction: Fraction,
    /// Untimed graph replays first: at most [`MAX_WARMUP`].
    #[serde(default = "default_warmup")]
    pub warmup: Count,
    /// Timed replays: at least 5, at most [`MAX_REPEATS`].
    #[serde(default = "default_repeats")]
    pub repeats: Count,
}

/// Most elements of the op's largest tensor, 2^30 (4 GiB of f32); the
/// shipped largest is 1.6e8 (cross-entropy logits over qwen's vocabulary).
pub const MAX_ELEMENTS: f64 = (1u64 << 30) as f64;
/// Most untimed replays (the shipped checks take 3).
pub const MAX_WARMUP: usize = 100;
/// Most timed replays of the kernel and of the copy (the shipped checks take
/// 20): a replay is at least 8 launches, and at the element bound each
/// launch moves tens of GiB, so 1,000 and the warm-up stay around a minute.
pub const MAX_REPEATS: usize = 1_000;
/// Device bytes the check holds besides the buffer sets: the two 4 MiB
/// random patterns, one for the op's sets and one for the copy's.
const FIXED_DEVICE_BYTES: f64 = (2 * (8u64 << 20)) as f64;
/// The op's buffer sets together hold at least this many bytes (256 MiB)
/// and at most this more than one set.
const ROTATE_BYTES: f64 = (256u64 << 20) as f64;

fn default_warmup() -> Count {
    Count(3)
}

fn default_repeats() -> Count {
    Count(20)
}

/// The parameters of `bandwidth`, for the generated reference.
pub const PARAMS: &[ParamDoc] = &[
    ParamDoc {
        name: "op",
        default: Required,
        bound: &[OneOf(KERNEL_NAMES)],
        meaning: "the memory-bound kernel",
    },
    ParamDoc {
        name: "pass",
        default: Yaml("forward"),
        bound: &[OneOf(PASSES), Text("; `backward` where the op has one")],
        meaning: "which kernel of the op",
    },
    ParamDoc {
        name: "shape",
        default: Required,
        bound: &[
            Text("the op's dims; its largest tensor at most "),
            Real(MAX_ELEMENTS),
            Text(" elements"),
        ],
        meaning: "the invocation's dims",
    },
    ParamDoc {
        name: "min_fraction",
        default: Required,
        bound: &[Text("in (0, 1]")],
        meaning: "bound on kernel bandwidth / bandwidth of a d2d copy of the same bytes",
    },
    ParamDoc {
        name: "warmup",
        default: Yaml("3"),
        bound: &[Text("1 to "), Int(MAX_WARMUP)],
        meaning: "untimed graph replays first",
    },
    ParamDoc {
        name: "repeats",
        default: Yaml("20"),
        bound: &[Text("5 to "), Int(MAX_REPEATS)],
        meaning: "timed replays of the kernel's graph, then as many of the copy's; fixed, not adaptive (no `max_repeats`), except in a mutant run: the copy's first, then the kernel's, stopped, from the third, once the fraction's 95% interval lies below `min_fraction`",
    },
];

/// A minimal `bandwidth` check.
pub const EXAMPLE: &[(&str, &str)] = &[
    ("op", "rmsnorm"),
    ("shape", "{rows: 1024, hidden: 896}"),
    ("min_fraction", "0.5"),
];

impl Validate for Params {
    fn validate(&self) -> std::result::Result<(), String> {
        self.shape.expect_dims(self.op.dims())?;
        // First, so the byte counts below cannot overflow.
        let largest = self.largest_tensor();
        if largest > MAX_ELEMENTS {
            return Err(format!(
                "shape {}: the largest tensor has {largest:.1e} elements; the bound is {MAX_ELEMENTS:.1e}",
                self.shape
            ));
        }
        at_most("warmup", self.warmup.0, MAX_WARMUP)?;
        at_most("repeats", self.repeats.0, MAX_REPEATS)?;
        if self.pass == Pass::Backward && !self.op.has_backward() {
            return Err(format!("`{}` has no backward kernel", self.op.name()));
        }
        if self.repeats.0 < 5 {
            return Err("`repeats` must be at least 5 for a median and its interval".into());
        }
        self.op
            .check_stack_shape(&self.shape)
            .map_err(|e| format!("shape {}: {e}", self.shape))
    }
}

impl Params {
    /// Elements of the kernel's largest tensor: the table or the gathered
    /// rows of an embedding, otherwise the product of the dims.
    fn largest_tensor(&self) -> f64 {
        (self.op.kernel.largest_tensor)(&self.shape)
    }

    /// Device bytes the check holds: the op's buffer sets and the copy's
    /// (each at least 256 MiB in all, at most that plus one set of
    /// [`Params::bytes`]), what the kernel holds once (an embedding's table
    /// `4 V H`), and the patterns.
    fn device_bytes(&self) -> f64 {
        let resident = (self.op.kernel.resident_bytes)(&self.shape);
        2.0 * (ROTATE_BYTES + self.bytes() as f64 + 8.0) + resident + FIXED_DEVICE_BYTES
    }

    /// `op pass`, e.g. `rmsnorm fwd`.
    pub fn subject(&self) -> String {
        format!("{} {}", self.op.name(), self.pass.as_str())
    }

    /// The fewest bytes one invocation must move: each input read once, each
    /// output written once; each kernel's formula is in the op table (the
    /// table of them all is on `check::op::size`).
    pub fn bytes(&self) -> usize {
        (self.op.kernel.bytes)(&self.shape, self.pass)
    }
}

impl Kind<crate::Qlora> for Params {
    fn execute(&self, _backend: Backend, cx: &mut TrialContext<'_>) -> Result<Measurement> {
        clock_watched(cx, |cx| measure::measure(self, cx))
    }

    /// Whether the buffers fit the GPU's free memory.
    fn unjudged_on(&self, backend: Backend, here: &Here) -> Option<String> {
        let what = format!("shape {}", self.shape);
        (backend == Backend::Cuda)
            .then(|| gpu_shortfall(&what, self.device_bytes(), here))
            .flatten()
    }

    /// Many times this kind's longest trial (its `duration_ms` in the
    /// committed baselines; the parameter bounds keep a trial within it):
    /// a stuck trial is stopped, a slow machine is not.
    fn default_timeout_s(&self) -> f64 {
        120.0
    }

    fn needs_the_gpu_alone(&self) -> bool {
        true
    }

    /// Every launch, copy and graph of the stack goes to its context's one
    /// stream (`GpuContext::stream`).
    fn runs_on_one_stream(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(yaml: &str) -> std::result::Result<Params, String> {
        crate::check::params::tests::parse(yaml)
    }

    #[test]
    fn every_kernel_of_the_op_table_is_named_once() {
        let mut table: Vec<&str> = bandwidth_kernels().map(|(_, k)| k.name).collect();
        let mut names = KERNEL_NAMES.to_vec();
        table.sort_unstable();
        names.sort_unstable();
        assert_eq!(table, names);
        for name in KERNEL_NAMES {
            assert_eq!(BandwidthOp::named(name).unwrap().name(), *name);
        }
        let e = parse("op: gemm\nshape: {m: 1, n: 1, k: 1}\nmin_fraction: 0.5").unwrap_err();
        assert!(
            e.contains("unknown variant `gemm`, expected one of `rmsnorm`, `rmsnorm_residual`"),
            "{e}"
        );
    }

    #[test]
    fn bytes_follow_the_formula() {
        let p = parse("op: rmsnorm\nshape: {rows: 1024, hidden: 896}\nmin_fraction: 0.7").unwrap();
        assert_eq!(p.bytes(), 4 * (2 * 1024 * 896 + 896));
        let p = parse("op: swiglu\npass: backward\nshape: {rows: 2, cols: 3}\nmin_fraction: 0.7")
            .unwrap();
        assert_eq!(p.bytes(), 4 * 5 * 6);
        let p = parse("op: adamw\nshape: {n: 10}\nmin_fraction: 0.5").unwrap();
        assert_eq!(p.bytes(), 280);
        assert_eq!(p.subject(), "adamw fwd");
    }

    #[test]
    fn bad_params_are_refused() {
        assert!(parse("op: rmsnorm\nshape: {rows: 4}\nmin_fraction: 0.7").is_err());
        assert!(parse("op: adamw\npass: backward\nshape: {n: 4}\nmin_fraction: 0.7").is_err());
        assert!(parse("op: adamw\nshape: {n: 4}\nmin_fraction: 1.5").is_err());
        assert!(parse("op: adamw\nshape: {n: 4}\nmin_fraction: 0.7\nrepeats: 3").is_err());
        assert!(parse("op: adamw\nshape: {n: 4}\nmin_fraction: 0.7\nspeed: 3").is_err());
        // The repeats are fixed: no adaptive cap to set.
        let e = parse("op: adamw\nshape: {n: 4}\nmin_fraction: 0.7\nmax_repeats: 40").unwrap_err();
        assert!(e.contains("max_repeats"), "{e}");
        // The kernels' own shape rules, from the stack.
        let rope = "op: rope\nshape: {batch: 1, seq: 2, heads: 1, head_dim: 3}\nmin_fraction: 0.7";
        let e = parse(rope).unwrap_err();
        assert!(e.contains("head_dim must be even"), "{e}");
        let nf4 = "op: nf4_dequantize\nshape: {rows: 3, cols: 33}\nmin_fraction: 0.7";
        assert!(parse(nf4).unwrap_err().contains("multiple of 64"));
        let wide = "op: rmsnorm\nshape: {rows: 4, hidden: 9000}\nmin_fraction: 0.7";
        assert!(parse(wide)
            .unwrap_err()
            .contains("hidden must be in 1..=8192"));
    }

    #[test]
    fn sizes_and_counts_are_bounded() {
        let e = parse("op: swiglu\nshape: {rows: 1e6, cols: 1e6}\nmin_fraction: 0.7").unwrap_err();
        assert_eq!(
            e,
            "shape {cols=1000000, rows=1000000}: the largest tensor has 1.0e12 elements; the bound is 1.1e9"
        );
        // The embedding's table counts, not just the rows it gathers.
        let e =
            parse("op: embedding\nshape: {tokens: 4, vocab: 1e9, hidden: 1024}\nmin_fraction: 0.7")
                .unwrap_err();
        assert!(e.contains("1.0e12 elements"), "{e}");
        let e =
            parse("op: adamw\nshape: {n: 4}\nmin_fraction: 0.7\nrepeats: 100000000").unwrap_err();
        assert_eq!(e, "repeats: 100000000 is above its bound of 1000");
        let e = parse("op: adamw\nshape: {n: 4}\nmin_fraction: 0.7\nwarmup: 100000").unwrap_err();
        assert_eq!(e, "warmup: 100000 is above its bound of 100");
    }

    #[test]
    fn buffers_beyond_the_free_memory_are_not_judged() {
        let p = parse("op: adamw\nshape: {n: 268435456}\nmin_fraction: 0.5").unwrap();
        let mut here = crate::check::params::tests::with_gpu("NVIDIA H200", 141);
        assert_eq!(p.unjudged_on(Backend::Cuda, &here), None);
        here.gpu.as_mut().unwrap().free_memory_bytes = 4 << 30;
        // 7 GiB of adamw buffers and 256 MiB of sets, twice (the op's and
        // the copy's), and 16 MiB of patterns.
        assert_eq!(
            p.unjudged_on(Backend::Cuda, &here).unwrap(),
            "shape {n=268435456} needs ~14.5 GiB, NVIDIA H200 has 4.0 GiB free"
        );
        assert_eq!(p.default_timeout_s(), 120.0);
    }
}
