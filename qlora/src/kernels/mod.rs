//! CUDA C sources, one file per kernel family, compiled by NVRTC at run time
//! for the device's own architecture. Kernel symbols are `{op}_{pass}_{dtype}`.

pub mod abi;

/// One compilable module: a family of kernels in one `.cu` file.
#[derive(Debug, Clone, Copy)]
pub struct ModuleSource {
    /// Module name (the file stem).
    pub name: &'static str,
    pub source: &'static str,
    /// The `extern "C"` kernels the module defines.
    pub symbols: &'static [&'static str],
    /// How NVRTC weighs compile time against code speed for this module.
    pub compile: Compile,
}

/// NVRTC's trade between compile time and code speed, per module.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compile {
    /// NVRTC's default optimisation.
    Optimised,
    /// `--Ofast-compile=min`: NVRTC's mildest preference for compile time.
    /// For the tensor-core attention forward only: it is in every default
    /// pre-warm (forward GEMMs are TF32 by default) and fully optimised it
    /// was the slowest compilation of the parallel cold pre-warm (0.55 s
    /// against 0.45 s on one CI core; C-PREWARM-001 measured 1,005 ms on an
    /// H100). It costs the forward kernel some speed, still well ahead of
    /// the f32 forward (K-EFF-ATTN-001).
    FastMin,
}

macro_rules! module {
    ($name:literal, [$($sym:literal),* $(,)?]) => {
        ModuleSource {
            name: $name,
            // Every module is compiled with the shared helpers in front of it.
            source: concat!(include_str!("common.cuh"), "\n", include_str!(concat!($name, ".cu"))),
            symbols: &[$($sym),*],
            compile: Compile::Optimised,
        }
    };
}

/// A module compiled from `$file.cu` with `$prelude` (e.g. a `#define`)
/// between the shared helpers and the source; `$compile` defaults to
/// [`Compile::Optimised`].
macro_rules! module_with {
    ($name:literal, $file:literal, $prelude:literal, [$($sym:literal),* $(,)?]) => {
        module_with!($name, $file, $prelude, [$($sym),*], Compile::Optimised)
    };
    ($name:literal, $file:literal, $prelude:literal, [$($sym:literal),* $(,)?], $compile:expr) => {
        ModuleSource {
            name: $name,
            source: concat!(
                include_str!("common.cuh"),
                "\n",
                $prelude,
                "\n",
                include_str!(concat!($file, ".cu"))
            ),
            symbols: &[$($sym),*],
            compile: $compile,
        }
    };
}

/// Every kernel module of the system under test.
pub const MODULES: &[ModuleSource] = &[
    // A training step runs the embedding forward only (the table is frozen),
    // SwiGLU and not SiLU, and the table-wide squared sum and the scale of
    // clipping: each of those sources is split so a pre-warm compiles only
    // the part the step runs (NVRTC's work, not its slowest module, sets a
    // cold pre-warm's wall).
    module_with!(
        "embedding",
        "embedding",
        "#define EMB_PART 0",
        ["embedding_fwd_f32", "embedding_fwd_bf16"]
    ),
    module_with!(
        "embedding_bwd",
        "embedding",
        "#define EMB_PART 1",
        ["embedding_bwd_f32"]
    ),
    // One source, eight modules: the f32 forwards, the bf16 step's
    // forwards, and the backward in its warp-per-row (four widths),
    // one-pack and eight-pack builds (a configuration compiles the one its
    // hidden size needs). Small modules keep the parallel cold pre-warm short.
    module_with!(
        "rmsnorm",
        "rmsnorm",
        "#define RMS_PART 0",
        ["rmsnorm_fwd_f32", "rmsnorm_residual_fwd_f32"]
    ),
    module_with!(
        "rmsnorm_bf16",
        "rmsnorm",
        "#define RMS_PART 2",
        ["rmsnorm_fwd_f32_bf16", "rmsnorm_fwd_bf16"]
    ),
    module_with!(
        "rmsnorm_bwd_warp1",
        "rmsnorm",
        "#define RMS_PART 32\n#define RMS_WARP_PACKS 1",
        [
            "rmsnorm_bwd_warp1_f32",
            "rmsnorm_bwd_dgamma_final_f32",
            "rmsnorm_bwd_dgamma_table_f32"
        ]
    ),
    module_with!(
        "rmsnorm_bwd_warp2",
        "rmsnorm",
        "#define RMS_PART 32\n#define RMS_WARP_PACKS 2",
        [
            "rmsnorm_bwd_warp2_f32",
            "rmsnorm_bwd_dgamma_final_f32",
            "rmsnorm_bwd_dgamma_table_f32"
        ]
    ),
    module_with!(
        "rmsnorm_bwd_warp4",
        "rmsnorm",
        "#define RMS_PART 32\n#define RMS_WARP_PACKS 4",
        [
            "rmsnorm_bwd_warp4_f32",
            "rmsnorm_bwd_dgamma_final_f32",
            "rmsnorm_bwd_dgamma_table_f32"
        ]
    ),
    module_with!(
        "rmsnorm_bwd_warp8",
        "rmsnorm",
        "#define RMS_PART 32\n#define RMS_WARP_PACKS 8",
        [
            "rmsnorm_bwd_warp8_f32",
            "rmsnorm_bwd_dgamma_final_f32",
            "rmsnorm_bwd_dgamma_table_f32"
        ]
    ),
    module_with!(
        "rmsnorm_bwd_block",
        "rmsnorm",
        "#define RMS_PART 1",
        [
            "rmsnorm_bwd_f32",
            "rmsnorm_bwd_dgamma_final_f32",
            "rmsnorm_bwd_dgamma_table_f32"
        ]
    ),
    module_with!(
        "rmsnorm_bwd_wide",
        "rmsnorm",
        "#define RMS_PART 8",
        [
            "rmsnorm_bwd_wide_f32",
            "rmsnorm_bwd_dgamma_final_f32",
            "rmsnorm_bwd_dgamma_table_f32"
        ]
    ),
    module!("rope", ["rope_fwd_f32", "rope_bwd_f32"]),
    // The training step's fused q/k/v epilogue (RoPE with the LoRA
    // up-projections) and its backward, from the same source, a module
    // each for an f32 step and for a bf16 one (a step pre-warms two).
    module_with!(
        "rope_qkv_fwd",
        "rope",
        "#define ROPE_QKV 1",
        ["rope_qkv_fwd_f32"]
    ),
    module_with!(
        "rope_qkv_fwd_bf16",
        "rope",
        "#define ROPE_QKV 1\n#define ROPE_QKV_BF16",
        ["rope_qkv_fwd_bf16"]
    ),
    module_with!(
        "rope_qkv_bwd",
        "rope",
        "#define ROPE_QKV 2",
        ["rope_qkv_bwd_f32"]
    ),
    module_with!(
        "rope_qkv_bwd_bf16",
        "rope",
        "#define ROPE_QKV 2\n#define ROPE_QKV_BF16",
        ["rope_qkv_bwd_f32_bf16"]
    ),
    module!("softmax", ["softmax_fwd_f32", "softmax_bwd_f32"]),
    module_with!(
        "swiglu",
        "activation",
        "#define ACT_PART 0",
        [
            "swiglu_fwd_f32",
            "swiglu_bwd_f32",
            "swiglu_fwd_bf16",
            "swiglu_bwd_bf16"
        ]
    ),
    module_with!(
        "silu",
        "activation",
        "#define ACT_PART 1",
        ["silu_fwd_f32", "silu_bwd_f32"]
    ),
    module!(
        "elementwise",
        [
            "residual_add_fwd_f32",
            "residual_add_bwd_f32",
            "scale_fwd_f32",
            "scale_bwd_f32"
        ]
    ),
    module_with!(
        "cross_entropy",
        "cross_entropy",
        "#define XENT_PART 0",
        [
            "cross_entropy_fwd_f32",
            "cross_entropy_mean_f32",
            "cross_entropy_bwd_f32",
            "cross_entropy_bwd_f16"
        ]
    ),
    module_with!(
        "cross_entropy_bf16",
        "cross_entropy",
        "#define XENT_PART 1",
        ["cross_entropy_fused_bf16"]
    ),
    module_with!(
        "clip",
        "clip",
        "#define CLIP_PART 0",
        [
            "squared_sum_multi_partial_f32",
            "squared_sum_final_f64",
            "clip_scale_f32"
        ]
    ),
    module_with!(
        "clip_single",
        "clip",
        "#define CLIP_PART 1",
        [
            "squared_sum_partial_f32",
            "squared_sum_final_f64",
            "clip_apply_f32"
        ]
    ),
    module!("adamw", ["adamw_step_f32"]),
    module!("gemm", ["gemm_fwd_f32"]),
    module!(
        "nf4",
        [
            "nf4_quantize_f32",
            "nf4_dequantize_f32",
            "nf4_dequantize_bf16",
            "nf4_gemm_fwd_f32",
            "nf4_gemm_bwd_f32"
        ]
    ),
    module!(
        "cast",
        [
            "cast_fwd_f32_f16",
            "cast_fwd_f16_f32",
            "cast_fwd_f32_bf16",
            "cast_fwd_bf16_f32",
            "cast_multi_f32_f16",
            "cast_multi_f32_bf16"
        ]
    ),
    module!(
        "draw",
        ["draw_uniform_f32", "draw_uniform_f16", "draw_uniform_bf16"]
    ),
    module!(
        "train",
        [
            "step_count_advance_i32",
            "lora_grads_partial_tf32",
            "lora_grads_final_f32",
            "adamw_multi_devt_f32"
        ]
    ),
    // One source, eighteen modules: each attention kernel, f32 (parts 0-2),
    // tensor-core (parts 3-5) and bf16 flash (6-8), in the build for head_dim <= 64 and for
    // <= 128. A configuration compiles the three its head_dim and GEMM math
    // need, in parallel (one module with all three would be the slowest
    // compilation of the cold pre-warm).
    module_with!(
        "attention_fwd_d64",
        "attention",
        "#define ATT_BUILD 64\n#define ATT_PART 0",
        ["attention_fwd_d64_f32"]
    ),
    module_with!(
        "attention_dq_d64",
        "attention",
        "#define ATT_BUILD 64\n#define ATT_PART 1",
        ["attention_bwd_dq_d64_f32"]
    ),
    module_with!(
        "attention_dkv_d64",
        "attention",
        "#define ATT_BUILD 64\n#define ATT_PART 2",
        ["attention_bwd_dkv_d64_f32", "attention_bwd_kv_sum_f32"]
    ),
    module_with!(
        "attention_fwd_d128",
        "attention",
        "#define ATT_BUILD 128\n#define ATT_PART 0",
        ["attention_fwd_d128_f32"]
    ),
    module_with!(
        "attention_dq_d128",
        "attention",
        "#define ATT_BUILD 128\n#define ATT_PART 1",
        ["attention_bwd_dq_d128_f32"]
    ),
    module_with!(
        "attention_dkv_d128",
        "attention",
        "#define ATT_BUILD 128\n#define ATT_PART 2",
        ["attention_bwd_dkv_d128_f32", "attention_bwd_kv_sum_f32"]
    ),
    module_with!(
        "attention_tc_fwd_d64",
        "attention",
        "#define ATT_BUILD 64\n#define ATT_PART 3",
        ["attention_tc_fwd_d64_f32"],
        Compile::FastMin
    ),
    module_with!(
        "attention_tc_dq_d64",
        "attention",
        "#define ATT_BUILD 64\n#define ATT_PART 4",
        ["attention_tc_bwd_dq_d64_f32"]
    ),
    module_with!(
        "attention_tc_dkv_d64",
        "attention",
        "#define ATT_BUILD 64\n#define ATT_PART 5",
        ["attention_tc_bwd_dkv_d64_f32", "attention_bwd_kv_sum_f32"]
    ),
    module_with!(
        "attention_tc_fwd_d128",
        "attention",
        "#define ATT_BUILD 128\n#define ATT_PART 3",
        ["attention_tc_fwd_d128_f32"],
        Compile::FastMin
    ),
    module_with!(
        "attention_tc_dq_d128",
        "attention",
        "#define ATT_BUILD 128\n#define ATT_PART 4",
        ["attention_tc_bwd_dq_d128_f32"]
    ),
    module_with!(
        "attention_tc_dkv_d128",
        "attention",
        "#define ATT_BUILD 128\n#define ATT_PART 5",
        ["attention_tc_bwd_dkv_d128_f32", "attention_bwd_kv_sum_f32"]
    ),
    module_with!(
        "attention_flash_fwd_d64",
        "attention",
        "#define ATT_BUILD 64\n#define ATT_PART 6\n#define FL_ALIGNED 1",
        ["attention_flash_fwd_d64_bf16"]
    ),
    module_with!(
        "attention_flash_dq_d64",
        "attention",
        "#define ATT_BUILD 64\n#define ATT_PART 7\n#define FL_ALIGNED 1",
        ["attention_flash_bwd_dq_d64_bf16"]
    ),
    module_with!(
        "attention_flash_dkv_d64",
        "attention",
        "#define ATT_BUILD 64\n#define ATT_PART 8\n#define FL_ALIGNED 1",
        ["attention_flash_bwd_dkv_d64_bf16"]
    ),
    module_with!(
        "attention_flash_dots_d64",
        "attention",
        "#define ATT_BUILD 64\n#define ATT_PART 9",
        ["attention_flash_bwd_dots_f32", "attention_bwd_kv_sum_f32"]
    ),
    module_with!(
        "attention_flash_any_d64",
        "attention",
        "#define ATT_BUILD 64\n#define ATT_PART 10",
        [
            "attention_flash_fwd_d64_bf16",
            "attention_flash_bwd_dq_d64_bf16",
            "attention_flash_bwd_dkv_d64_bf16"
        ]
    ),
    module_with!(
        "attention_flash_fwd_d128",
        "attention",
        "#define ATT_BUILD 128\n#define ATT_PART 6\n#define FL_ALIGNED 1",
        ["attention_flash_fwd_d128_bf16"]
    ),
    module_with!(
        "attention_flash_dq_d128",
        "attention",
        "#define ATT_BUILD 128\n#define ATT_PART 7\n#define FL_ALIGNED 1",
        ["attention_flash_bwd_dq_d128_bf16"]
    ),
    module_with!(
        "attention_flash_dkv_d128",
        "attention",
        "#define ATT_BUILD 128\n#define ATT_PART 8\n#define FL_ALIGNED 1",
        ["attention_flash_bwd_dkv_d128_bf16"]
    ),
    module_with!(
        "attention_flash_dots_d128",
        "attention",
        "#define ATT_BUILD 128\n#define ATT_PART 9",
        ["attention_flash_bwd_dots_f32", "attention_bwd_kv_sum_f32"]
    ),
    module_with!(
        "attention_flash_any_d128",
        "attention",
        "#define ATT_BUILD 128\n#define ATT_PART 10",
        [
            "attention_flash_fwd_d128_bf16",
            "attention_flash_bwd_dq_d128_bf16",
            "attention_flash_bwd_dkv_d128_bf16"
        ]
    ),
    module!("faults", ["fault_oob_write_f32", "fault_round_bf16_f32"]),
];

/// The module called `name`.
pub fn module(name: &str) -> Option<&'static ModuleSource> {
    MODULES.iter().find(|m| m.name == name)
}

/// NVRTC's time to compile each module to a cubin, in milliseconds on one
/// core of the CI machine, the best of three (`cargo run --release -p qlora
/// --example compile_costs` measures them again and prints this table).
/// Only their order is used: a cold pre-warm starts its longest
/// compilations first (`gpu::cache`). A source's length, which it went by
/// before, put some of the slower modules (`draw`, `swiglu`) among the
/// last to start.
pub const COMPILE_COST_MS: &[(&str, u32)] = &[
    ("embedding", 35),
    ("embedding_bwd", 61),
    ("rmsnorm", 129),
    ("rmsnorm_bf16", 233),
    ("rmsnorm_bwd_warp1", 177),
    ("rmsnorm_bwd_warp2", 184),
    ("rmsnorm_bwd_warp4", 211),
    ("rmsnorm_bwd_warp8", 275),
    ("rmsnorm_bwd_block", 234),
    ("rmsnorm_bwd_wide", 652),
    ("rope", 147),
    ("rope_qkv_fwd", 120),
    ("rope_qkv_fwd_bf16", 118),
    ("rope_qkv_bwd", 152),
    ("rope_qkv_bwd_bf16", 158),
    ("softmax", 67),
    ("swiglu", 189),
    ("silu", 96),
    ("elementwise", 102),
    ("cross_entropy", 185),
    ("cross_entropy_bf16", 476),
    ("clip", 70),
    ("clip_single", 82),
    ("adamw", 86),
    ("gemm", 43),
    ("nf4", 209),
    ("cast", 93),
    ("draw", 228),
    ("train", 161),
    ("attention_fwd_d64", 320),
    ("attention_dq_d64", 255),
    ("attention_dkv_d64", 185),
    ("attention_fwd_d128", 314),
    ("attention_dq_d128", 284),
    ("attention_dkv_d128", 319),
    ("attention_tc_fwd_d64", 382),
    ("attention_tc_dq_d64", 405),
    ("attention_tc_dkv_d64", 536),
    ("attention_tc_fwd_d128", 349),
    ("attention_tc_dq_d128", 477),
    ("attention_tc_dkv_d128", 493),
    ("attention_flash_fwd_d64", 286),
    ("attention_flash_dq_d64", 206),
    ("attention_flash_dkv_d64", 327),
    ("attention_flash_dots_d64", 151),
    ("attention_flash_any_d64", 1137),
    ("attention_flash_fwd_d128", 379),
    ("attention_flash_dq_d128", 173),
    ("attention_flash_dkv_d128", 341),
    ("attention_flash_dots_d128", 168),
    ("attention_flash_any_d128", 1624),
    ("faults", 27),
];

/// [`COMPILE_COST_MS`] of the module `name`; 0 for one it does not list
/// (the unit tests hold it to every module).
pub fn compile_cost_ms(name: &str) -> u32 {
    COMPILE_COST_MS
        .iter()
        .find(|(m, _)| *m == name)
        .map_or(0, |&(_, ms)| ms)
}

/// The value of `#define name` in a kernel source, for the launchers' tests
/// that their constants are the kernels'.
#[cfg(test)]
pub(crate) fn cu_define(source: &str, name: &str) -> Option<usize> {
    let prefix = format!("#define {name} ");
    source
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_module_has_one_compile_cost() {
        for m in MODULES {
            let listed = COMPILE_COST_MS.iter().filter(|(n, _)| *n == m.name).count();
            assert_eq!(listed, 1, "{} in COMPILE_COST_MS", m.name);
            assert!(compile_cost_ms(m.name) > 0, "{}", m.name);
        }
        for (name, _) in COMPILE_COST_MS {
            assert!(module(name).is_some(), "{name} is no module");
        }
    }
}
