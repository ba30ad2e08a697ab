//! The parameter reference of qlora's kinds: the core's documentation types
//! (see [`falsify_core::check::doc`]) and the bounds several of qlora's
//! kinds share (step modes, model presets, hyper-parameters).

pub use falsify_core::check::doc::*;

use super::training::CPU_MAX_BASE_PARAMS;
use Piece::{Int, Names, OneOf, Text};

/// The spellings of [`super::op::Pass`].
pub const PASSES: &[&str] = &["forward", "backward"];

/// The names of the stack's model presets ([`qlora::model::PRESETS`], in
/// its order; a test keeps the two in step).
pub const PRESET_NAMES: &[&str] = &["tiny", "small-4l", "qwen2.5-0.5b", "qwen2.5-coder-1.5b"];

/// A bound's piece that lists the model presets.
pub const ANY_PRESET: Piece = Names(PRESET_NAMES);

/// The spellings of a step mode's defaults, the default of every `mode`,
/// `baseline` and `candidate` that has one.
pub const DEFAULT_STEP_MODE: &str =
    "{graph: false, clip: global, base: fp32, backward_math: fp32, mlp_activations: recompute, backward_weights: shared, lm_head_operands: f32, projection_operands: f32}";

/// The contract spellings of the base-weight formats.
pub const BASES: &[&str] = &["fp32", "nf4", "bf16", "nf4_bf16"];

/// The bound of a step mode, written out once for every kind that takes one.
pub const STEP_MODE_BOUND: &[Piece] = &[
    Text("`{graph, clip, base, backward_math, mlp_activations, backward_weights, lm_head_operands, projection_operands}`; `clip`: "),
    OneOf(&["global", "per_layer"]),
    Text("; `base`: "),
    OneOf(BASES),
    Text("; `backward_math`: "),
    OneOf(&["fp32", "tf32"]),
    Text("; `mlp_activations`: "),
    OneOf(&["recompute", "keep"]),
    Text("; `backward_weights`: "),
    OneOf(&["shared", "transposed"]),
    Text("; `lm_head_operands`: "),
    OneOf(&["f32", "f16"]),
    Text("; `projection_operands`: "),
    OneOf(&["f32", "f16"]),
];

/// Most tokens per step or GEMM (`batch x seq_len`) a timing kind takes,
/// 2^20: 256x the presets' largest; the device memory decides below that.
pub const MAX_TIMED_TOKENS: usize = 1 << 20;

/// `batch` of a timing kind: the preset's, or this many samples.
pub const TIMED_BATCH_DOC: ParamDoc = ParamDoc {
    name: "batch",
    default: ParamDefault::Otherwise("the preset's"),
    bound: &[Text("`batch x seq_len` at most "), Int(MAX_TIMED_TOKENS)],
    meaning: "overrides the preset's batch",
};

/// `seq_len` of a timing kind: the preset's, or this many tokens a sample.
pub const TIMED_SEQ_LEN_DOC: ParamDoc = ParamDoc {
    name: "seq_len",
    default: ParamDefault::Otherwise("the preset's"),
    bound: &[Text("`batch x seq_len` at most "), Int(MAX_TIMED_TOKENS)],
    meaning: "overrides the preset's sequence length",
};

/// The bound of a `model`: any preset.
pub const MODEL_BOUND: &[Piece] = &[Text("a preset: "), ANY_PRESET];

/// The bound of a `model` a training check may also run on cpu.
pub const TRAINING_MODEL_BOUND: &[Piece] = &[
    Text("a preset: "),
    ANY_PRESET,
    Text("; on cpu at most "),
    Int(CPU_MAX_BASE_PARAMS),
    Text(" frozen parameters"),
];

/// The default optimiser hyper-parameters, as YAML.
pub const DEFAULT_HYPER: &str = "{lr: 0.001, max_grad_norm: 1, weight_decay: 0}";

/// The bound of `hyper`.
pub const HYPER_BOUND: &[Piece] = &[Text(
    "`{lr, max_grad_norm, weight_decay}`: `lr`, `max_grad_norm` > 0, `weight_decay` >= 0",
)];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_preset_names_are_the_stacks() {
        let stack: Vec<&str> = qlora::model::PRESETS.iter().map(|p| p.name).collect();
        assert_eq!(PRESET_NAMES, stack.as_slice());
    }
}
