//! Pre-warm: compile every kernel module a configuration's training step uses,
//! before the weights are uploaded, so no JIT compilation happens mid-training.

use std::collections::BTreeSet;
use std::time::Instant;

use super::context::GpuContext;
use crate::error::Result;
use crate::gpu::GemmMath;
use crate::model::ModelConfig;
use crate::ops::attention::{self, AttnKernels};
use crate::train::BaseWeights;

/// The module [`crate::Faults::module_left_out_of_prewarm`] leaves out (and
/// [`crate::Faults::module_evicted_after_prewarm`] evicts): the loss's, which
/// every configuration's step runs, whatever its base.
pub const LEFT_OUT_MODULE: &str = crate::ops::cross_entropy::MODULE;

/// The module of the casts: a step with f16 or bf16 GEMM operands runs it on
/// each such GEMM's input, and a base with q/k/v stacks of its own (fp32,
/// bf16) copies and rounds its LoRA A rows into them with it.
pub const CAST_MODULE: &str = crate::ops::cast::MODULE;

/// The kernel modules the forward + backward + optimizer step of `config` with
/// `base` weights uses (with `f16_operands`, a step with f16 GEMM operands),
/// and the draws of a seeded model's weights,
/// which the trainer makes on the device after pre-warm. The one place this
/// list is defined.
///
/// Every preset runs the same Qwen2-style decoder, so only the base format
/// (NF4 adds the quantise / NF4 GEMM kernels; a base computing in bf16 runs
/// attention on the flash modules `attention_flash_*`,
/// [`BaseWeights::attention_kernels`], and its q/k/v epilogue on the bf16
/// ones, [`crate::ops::rope::qkv_modules`], and its head's loss on
/// [`crate::ops::cross_entropy::BF16_MODULE`]),
/// the head dimension (the attention build: `attention_{fwd,dq,dkv}_d64` or
/// `_d128`), the GEMM math of each direction (`attn`, the kernels it picks:
/// TF32 runs attention on the tensor-core modules `attention_tc_*`, see
/// [`AttnKernels::for_math`]) and the hidden size (the
/// RMSNorm backward build) change the set. Not
/// in it: `softmax` (attention computes its own), `gemm` (the step's GEMMs are
/// cuBLAS), `adamw` and `elementwise` (the step's optimizer is in `train`,
/// its residual accumulation in the RMSNorm backward), `silu` (the MLP is SwiGLU), `embedding_bwd`
/// (the table is frozen) and `clip_single` (the step clips a tensor table).
/// `prewarm` checks reports list any module pre-warmed but unused, and any
/// used but not pre-warmed.
pub fn modules_for(
    config: &ModelConfig,
    base: BaseWeights,
    (fwd, bwd): (AttnKernels, AttnKernels),
    f16_operands: bool,
) -> Vec<&'static str> {
    let mut modules = vec![
        crate::ops::embedding::MODULE,
        crate::ops::rmsnorm::bwd_module_for(config.hidden),
        crate::ops::activation::SWIGLU_MODULE,
        crate::ops::cross_entropy::MODULE,
        crate::ops::clip::MODULE,
        crate::train::kernels::MODULE,
        crate::ops::draw::MODULE,
    ];
    modules.extend(crate::ops::rope::qkv_modules(base.computes_in_bf16()));
    let (fwd, bwd) = base.attention_kernels((fwd, bwd));
    modules.extend(attention::modules_for(config.head_dim, fwd, bwd));
    if base.is_nf4() {
        modules.push("nf4");
    }
    // A base computing in bf16 takes its head's loss with the fused bf16
    // kernel (and the mean of the f32 module).
    if base.computes_in_bf16() {
        modules.push(crate::ops::cross_entropy::BF16_MODULE);
    }
    // A base computing in bf16 writes every norm as a bf16 GEMM operand,
    // with the bf16 module's kernels; the others write f32.
    modules.push(if base.computes_in_bf16() {
        crate::ops::rmsnorm::BF16_MODULE
    } else {
        crate::ops::rmsnorm::MODULE
    });
    // NF4 computing in f32 keeps no stack of its own and rounds nothing.
    if f16_operands || base.computes_in_bf16() || !base.is_nf4() {
        modules.push(CAST_MODULE);
    }
    modules
}

/// What one pre-warm did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PrewarmReport {
    /// Modules pre-warm made sure are compiled and loaded, sorted.
    pub modules: Vec<&'static str>,
    /// Modules the configuration needs that pre-warm left out (only under a fault).
    pub skipped: Vec<&'static str>,
    /// Compilations pre-warm itself made (modules already cached cost none).
    pub compilations: usize,
    /// NVRTC time of those compilations.
    pub compile_ms: f64,
    /// Modules pre-warm read from the on-disk cache instead of compiling.
    pub disk_hits: usize,
    /// Entries on disk pre-warm refused (stale, torn or for another target)
    /// and compiled again.
    pub disk_refused: usize,
    /// Wall time of the whole pre-warm, loads included.
    pub wall_ms: f64,
    /// The module whose compilation took longest, and its NVRTC time: the
    /// critical path of a cold pre-warm (none when nothing was compiled).
    pub slowest: Option<(&'static str, f64)>,
}

impl GpuContext {
    /// [`GpuContext::prewarm_with_math`] with the context's GEMM math.
    pub fn prewarm(
        &mut self,
        config: &ModelConfig,
        bases: &[BaseWeights],
    ) -> Result<PrewarmReport> {
        let math = (self.options().forward_math, self.options().backward_math);
        self.prewarm_with_math(config, bases, math, false)
    }

    /// Loads every module that `config`'s training step uses with each of
    /// `bases`, the forward and backward GEMM math `math` and `f16_operands` (from the disk
    /// cache, or compiled concurrently), then marks the cache pre-warmed:
    /// any later load counts as `loaded_after_prewarm`. Allocates no model
    /// memory.
    pub fn prewarm_with_math(
        &mut self,
        config: &ModelConfig,
        bases: &[BaseWeights],
        (fwd, bwd): (GemmMath, GemmMath),
        f16_operands: bool,
    ) -> Result<PrewarmReport> {
        let started = Instant::now();
        let faults = self.faults();
        let attn = (
            AttnKernels::for_math(fwd, faults),
            AttnKernels::for_math(bwd, faults),
        );
        let mut wanted = BTreeSet::new();
        for &base in bases {
            wanted.extend(modules_for(config, base, attn, f16_operands));
        }
        let mut skipped = Vec::new();
        if self.faults().module_left_out_of_prewarm && wanted.remove(LEFT_OUT_MODULE) {
            skipped.push(LEFT_OUT_MODULE);
        }
        let before = self.cache_stats().clone();
        let first_record = self.cache().records().len();
        let list: Vec<&str> = wanted.iter().copied().collect();
        self.ensure_modules(&list)?;
        let after = self.cache_stats().clone();
        let slowest = self.cache().records()[first_record..]
            .iter()
            .filter(|r| r.compile_ms > 0.0)
            .map(|r| (r.module, r.compile_ms))
            .max_by(|a, b| a.1.total_cmp(&b.1));
        let mut prewarmed = self.cache().prewarmed().cloned().unwrap_or_default();
        prewarmed.extend(wanted.iter().copied());
        self.cache_mut().mark_prewarmed(prewarmed);
        if self.faults().module_evicted_after_prewarm {
            self.cache_mut().evict(LEFT_OUT_MODULE);
        }
        Ok(PrewarmReport {
            modules: wanted.into_iter().collect(),
            skipped,
            compilations: after.compilations - before.compilations,
            compile_ms: after.compile_ms - before.compile_ms,
            disk_hits: after.disk_hits - before.disk_hits,
            disk_refused: after.disk_refused - before.disk_refused,
            wall_ms: started.elapsed().as_secs_f64() * 1e3,
            slowest,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels;

    #[test]
    fn every_listed_module_exists() {
        let (f32k, tc) = (AttnKernels::F32, AttnKernels::TensorCores);
        for config in crate::model::PRESETS {
            for base in [BaseWeights::Fp32, BaseWeights::Nf4] {
                for attn in [(f32k, f32k), (tc, f32k), (tc, tc), (f32k, tc)] {
                    for m in modules_for(&config, base, attn, true) {
                        assert!(kernels::module(m).is_some(), "{m}");
                    }
                }
            }
            let default = modules_for(&config, BaseWeights::Fp32, (tc, f32k), false);
            assert!(default.contains(&LEFT_OUT_MODULE));
            // Its own stacks take their LoRA A rows through the cast module.
            assert!(default.contains(&CAST_MODULE));
            let nf4 = modules_for(&config, BaseWeights::Nf4, (tc, f32k), false);
            assert!(!nf4.contains(&CAST_MODULE));
            for base in [BaseWeights::Bf16, BaseWeights::Nf4Bf16] {
                assert!(modules_for(&config, base, (tc, f32k), false).contains(&CAST_MODULE));
            }
        }
    }

    /// The module the pre-warm mutants leave out or evict is one the step
    /// of every base uses, so a load after pre-warm catches them on every
    /// base, not a bound they happen to cross; and a base computing in
    /// bf16 does not pre-warm the f32 norm it never runs.
    #[test]
    fn the_left_out_module_is_in_every_step() {
        let (f32k, tc) = (AttnKernels::F32, AttnKernels::TensorCores);
        for config in crate::model::PRESETS {
            for base in [
                BaseWeights::Fp32,
                BaseWeights::Nf4,
                BaseWeights::Bf16,
                BaseWeights::Nf4Bf16,
            ] {
                for attn in [(f32k, f32k), (tc, f32k), (tc, tc)] {
                    let modules = modules_for(&config, base, attn, false);
                    assert!(modules.contains(&LEFT_OUT_MODULE), "{base:?}");
                    let f32_norm = modules.contains(&crate::ops::rmsnorm::MODULE);
                    assert_eq!(f32_norm, !base.computes_in_bf16(), "{base:?}");
                }
            }
        }
    }

    /// A step pre-warms the q/k/v epilogue's modules of its own compute
    /// type only, and every kernel of it is in one of them.
    #[test]
    fn the_qkv_epilogue_modules_follow_the_compute_type() {
        use crate::ops::rope;
        let attn = (AttnKernels::TensorCores, AttnKernels::F32);
        let config = &crate::model::PRESETS[0];
        for base in [
            BaseWeights::Fp32,
            BaseWeights::Nf4,
            BaseWeights::Bf16,
            BaseWeights::Nf4Bf16,
        ] {
            let modules = modules_for(config, base, attn, false);
            let bf16 = base.computes_in_bf16();
            for (module, wanted) in [
                (rope::QKV_FWD_MODULE, !bf16),
                (rope::QKV_BWD_MODULE, !bf16),
                (rope::QKV_FWD_BF16_MODULE, bf16),
                (rope::QKV_BWD_BF16_MODULE, bf16),
            ] {
                assert_eq!(modules.contains(&module), wanted, "{base:?} {module}");
            }
        }
        let symbols: Vec<&str> = [
            rope::QKV_FWD_MODULE,
            rope::QKV_BWD_MODULE,
            rope::QKV_FWD_BF16_MODULE,
            rope::QKV_BWD_BF16_MODULE,
        ]
        .iter()
        .flat_map(|m| {
            kernels::module(m)
                .map_or(&[][..], |s| s.symbols)
                .iter()
                .copied()
        })
        .collect();
        for kernel in [
            "rope_qkv_fwd_f32",
            "rope_qkv_fwd_bf16",
            "rope_qkv_bwd_f32",
            "rope_qkv_bwd_f32_bf16",
        ] {
            assert!(symbols.contains(&kernel), "{kernel}");
        }
    }
}
