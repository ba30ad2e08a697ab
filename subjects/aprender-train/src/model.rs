//! Named model configurations and the setup of one trial, mapped to
//! aprender-train's `TransformerConfig` + `InstructConfig`.

use entrenar::finetune::InstructConfig;
use entrenar::transformer::{ModelArchitecture, TransformerConfig};

use crate::error::{Error, Result};

/// Sequence length when the setup names none. The forward pre-warm warms the
/// RoPE kernel only for seq_len 1 and `APR_DISTILL_SMOKE_SEQ_LEN` (default
/// 256, T:autograd/cuda_forward/cache.rs:344-360), so any other length adds
/// a compilation after the upload that is a property of that length.
pub const DEFAULT_SEQ_LEN: usize = 256;
/// Learning rate when the setup names none: large enough that the
/// un-graphed loss visibly moves within ten steps on the tiny model.
pub const DEFAULT_LEARNING_RATE: f64 = 1e-3;
/// LoRA rank on Q and V of every layer (T:finetune/instruct_pipeline/constructors.rs:336-380).
pub const LORA_RANK: usize = 16;
/// LoRA alpha: B is uploaded pre-scaled by alpha/rank = 2 (T:transformer/cuda_block.rs:3029).
pub const LORA_ALPHA: f32 = 32.0;
/// Gradient clipping norm. `Some` is what routes the backward through the
/// fused, sync-free clip (T:finetune/instruct_pipeline/backward.rs:195-203).
pub const GRADIENT_CLIP_NORM: f32 = 1.0;
/// The NF4 block: every projection's element count and the pre-warmed NF4
/// GEMM shapes need multiples of it (T:transformer/cuda_block.rs:2938-2941,
/// T:autograd/cuda_forward/cache.rs:496-527).
pub const NF4_BLOCK: usize = 64;

/// A Qwen2-style decoder shape: GQA, Q/K/V bias, tied embeddings, RoPE 1e6.
/// aprender-train initialises its weights at random (nothing is downloaded).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ModelShape {
    pub name: &'static str,
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub intermediate: usize,
    pub layers: usize,
    pub vocab: usize,
    pub max_positions: usize,
    pub rope_theta: f32,
    pub rms_norm_eps: f32,
    pub qkv_bias: bool,
    pub tied_embeddings: bool,
}

impl ModelShape {
    /// Q and O width: heads · head_dim.
    pub fn q_dim(&self) -> usize {
        self.heads * self.head_dim
    }

    /// K and V width: kv_heads · head_dim.
    pub fn kv_dim(&self) -> usize {
        self.kv_heads * self.head_dim
    }
}

const fn qwen2(
    name: &'static str,
    [hidden, heads, head_dim, intermediate, layers, vocab]: [usize; 6],
) -> ModelShape {
    ModelShape {
        name,
        hidden,
        heads,
        kv_heads: 2,
        head_dim,
        intermediate,
        layers,
        vocab,
        max_positions: 2048,
        rope_theta: 1.0e6,
        rms_norm_eps: 1.0e-6,
        qkv_bias: true,
        tied_embeddings: true,
    }
}

/// The configurations a setup can name. The two larger ones have the shapes
/// of Qwen2.5-0.5B and Qwen2.5-1.5B (the latter is the "28 layers" the
/// graphed backward's doc comment speaks of, T:finetune/instruct_pipeline/backward.rs:111-113).
const MODELS: [ModelShape; 3] = [
    qwen2("qwen2-tiny-4l", [512, 8, 64, 1408, 4, 1024]),
    qwen2("qwen2-0.5b-shape", [896, 14, 64, 4864, 24, 151_936]),
    qwen2("qwen2-1.5b-shape", [1536, 12, 128, 8960, 28, 151_936]),
];

/// [`MODELS`]' names, in order.
const MODEL_NAMES: [&str; MODELS.len()] = {
    let mut names = [""; MODELS.len()];
    let mut i = 0;
    while i < MODELS.len() {
        names[i] = MODELS[i].name;
        i += 1;
    }
    names
};

/// Names of the configurations this subject can train.
pub fn models() -> &'static [&'static str] {
    &MODEL_NAMES
}

/// The shape of a named configuration.
pub fn model_shape(name: &str) -> Result<&'static ModelShape> {
    MODELS
        .iter()
        .find(|m| m.name == name)
        .ok_or_else(|| Error::UnknownModel {
            name: name.to_string(),
            known: models().join(", "),
        })
}

/// One trial's training setup; the same fields as the seam's `TrainSetup`.
#[derive(Debug, Clone, PartialEq)]
pub struct Setup {
    /// A name from [`models`].
    pub model: String,
    /// Samples per step: a step is `batch` consecutive `train_step` calls,
    /// one sequence each (the public API trains one sequence per call).
    pub batch: usize,
    /// Tokens per sample (prompt + response); [`DEFAULT_SEQ_LEN`] when `None`.
    pub seq_len: Option<usize>,
    /// Run with `CUDA_GRAPH=1` (see [`crate::process_env`]).
    pub graph: bool,
    /// Steps the caller intends to run.
    pub steps: usize,
    /// Seeds the weights and the token ids.
    pub seed: u64,
    /// [`DEFAULT_LEARNING_RATE`] when `None`.
    pub learning_rate: Option<f64>,
}

impl Setup {
    /// One sample per step, default length and learning rate, un-graphed.
    pub fn new(model: &str) -> Self {
        Self {
            model: model.to_string(),
            batch: 1,
            seq_len: None,
            graph: false,
            steps: 1,
            seed: 0,
            learning_rate: None,
        }
    }

    /// The checked values a trial runs with.
    pub fn resolve(&self) -> Result<Resolved> {
        let shape = model_shape(&self.model)?;
        check_shape(shape)?;
        let seq_len = self.seq_len.unwrap_or(DEFAULT_SEQ_LEN);
        if !(2..=shape.max_positions).contains(&seq_len) {
            return Err(Error::Setup(format!(
                "seq_len {seq_len} is outside 2..={} of model `{}`",
                shape.max_positions, shape.name
            )));
        }
        if self.batch == 0 {
            return Err(Error::Setup("batch must be at least 1".into()));
        }
        let learning_rate = self.learning_rate.unwrap_or(DEFAULT_LEARNING_RATE);
        if !(learning_rate.is_finite() && learning_rate > 0.0) {
            return Err(Error::Setup(format!(
                "learning_rate {learning_rate} is not a positive number"
            )));
        }
        Ok(Resolved {
            shape,
            seq_len,
            batch: self.batch,
            learning_rate: learning_rate as f32,
            seed: self.seed,
        })
    }
}

/// A setup with its defaults filled in and checked.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Resolved {
    pub shape: &'static ModelShape,
    pub seq_len: usize,
    pub batch: usize,
    pub learning_rate: f32,
    pub seed: u64,
}

/// Refuses the dimensions aprender-train's NF4 path cannot take.
fn check_shape(shape: &ModelShape) -> Result<()> {
    let dims = [
        ("hidden_size", shape.hidden),
        ("q_dim", shape.q_dim()),
        ("kv_dim", shape.kv_dim()),
        ("intermediate_size", shape.intermediate),
    ];
    for (what, value) in dims {
        if !value.is_multiple_of(NF4_BLOCK) {
            return Err(Error::Shape {
                model: shape.name.to_string(),
                what,
                value,
                multiple: NF4_BLOCK,
            });
        }
    }
    Ok(())
}

/// aprender-train's configuration for a setup. `quantize_nf4: true` is what
/// selects the CUDA path (T:finetune/instruct_pipeline/constructors.rs:56-58);
/// `max_seq_len` is the sample length, so every step has the shape the
/// buffers, pre-warm keys and captured graphs were made for.
pub fn configs(setup: &Setup) -> Result<(TransformerConfig, InstructConfig)> {
    let run = setup.resolve()?;
    Ok((transformer_config(run.shape), instruct_config(&run)))
}

fn transformer_config(shape: &ModelShape) -> TransformerConfig {
    TransformerConfig {
        hidden_size: shape.hidden,
        num_attention_heads: shape.heads,
        num_kv_heads: shape.kv_heads,
        intermediate_size: shape.intermediate,
        num_hidden_layers: shape.layers,
        vocab_size: shape.vocab,
        max_position_embeddings: shape.max_positions,
        rms_norm_eps: shape.rms_norm_eps,
        rope_theta: shape.rope_theta,
        use_bias: shape.qkv_bias,
        // Only where heads · head_dim differs from hidden (Qwen3-style).
        head_dim_override: (shape.q_dim() != shape.hidden).then_some(shape.head_dim),
        architecture: ModelArchitecture::Decoder,
        hf_architecture: None,
        hf_model_type: None,
        tie_word_embeddings: shape.tied_embeddings,
    }
}

fn instruct_config(run: &Resolved) -> InstructConfig {
    InstructConfig {
        lora_rank: LORA_RANK,
        lora_alpha: LORA_ALPHA,
        learning_rate: run.learning_rate,
        epochs: 1,
        max_seq_len: run.seq_len,
        gradient_clip_norm: Some(GRADIENT_CLIP_NORM),
        quantize_nf4: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_model_has_a_consistent_nf4_shape() {
        for shape in &MODELS {
            check_shape(shape).unwrap();
            assert_eq!(shape.hidden, shape.q_dim(), "{}", shape.name);
            assert!(shape.heads.is_multiple_of(shape.kv_heads), "{}", shape.name);
        }
        let names: Vec<_> = MODELS.iter().map(|m| m.name).collect();
        assert_eq!(models(), names);
    }

    #[test]
    fn the_tiny_model_maps_to_the_cuda_configuration() {
        let mut setup = Setup::new("qwen2-tiny-4l");
        setup.learning_rate = Some(5e-4);
        let (model, instruct) = configs(&setup).unwrap();
        assert_eq!(
            (
                model.hidden_size,
                model.num_attention_heads,
                model.num_kv_heads
            ),
            (512, 8, 2)
        );
        let kv_dim = model.num_kv_heads * model.head_dim();
        assert_eq!((model.head_dim(), model.q_dim(), kv_dim), (64, 512, 128));
        assert_eq!(model.head_dim_override, None);
        assert_eq!(
            (model.intermediate_size, model.num_hidden_layers),
            (1408, 4)
        );
        assert_eq!(model.vocab_size, 1024);
        assert!(model.use_bias && model.tie_word_embeddings);
        assert_eq!(model.rope_theta, 1.0e6);
        assert!(instruct.quantize_nf4);
        assert_eq!(
            (instruct.lora_rank, instruct.max_seq_len),
            (16, DEFAULT_SEQ_LEN)
        );
        assert_eq!(instruct.learning_rate, 5e-4);
        assert_eq!(instruct.gradient_clip_norm, Some(1.0));
    }

    #[test]
    fn unknown_models_and_bad_values_are_refused() {
        let err = configs(&Setup::new("llama-7b")).unwrap_err();
        assert!(err.to_string().contains("qwen2-tiny-4l"), "{err}");
        let mut setup = Setup::new("qwen2-tiny-4l");
        setup.seq_len = Some(1);
        assert!(matches!(setup.resolve(), Err(Error::Setup(_))));
        setup.seq_len = Some(4096);
        assert!(matches!(setup.resolve(), Err(Error::Setup(_))));
        setup.seq_len = None;
        setup.batch = 0;
        assert!(matches!(setup.resolve(), Err(Error::Setup(_))));
        setup.batch = 1;
        setup.learning_rate = Some(f64::NAN);
        assert!(matches!(setup.resolve(), Err(Error::Setup(_))));
    }

    #[test]
    fn a_shape_off_the_nf4_block_is_refused() {
        let shape = ModelShape {
            intermediate: 1400,
            ..MODELS[0]
        };
        let err = check_shape(&shape).unwrap_err();
        assert!(
            matches!(
                err,
                Error::Shape {
                    what: "intermediate_size",
                    value: 1400,
                    ..
                }
            ),
            "{err}"
        );
    }
}
