//! The model presets of the design brief: two small Qwen2-style test models
//! and the shapes of two real Qwen2 checkpoints, and the same configuration
//! read from a checkpoint's `config.json` ([`super::checkpoint`]).

/// Shape of a Qwen2-style decoder and of the batch it trains on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ModelConfig {
    pub name: &'static str,
    pub layers: usize,
    pub hidden: usize,
    pub heads: usize,
    /// Key/value heads (grouped-query attention: `heads % kv_heads == 0`).
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Width of the SwiGLU MLP.
    pub intermediate: usize,
    pub vocab: usize,
    pub seq_len: usize,
    pub batch: usize,
    pub lora_rank: usize,
    /// Whether q, k and v add a bias after their projection
    /// (`y = x W^T + b`; every Qwen2 checkpoint has one, the small test presets
    /// none).
    pub qkv_bias: bool,
    /// Whether the LM head is the embedding table itself
    /// (`logits = h E^T`, Hugging Face's `tie_word_embeddings`).
    pub tied_embeddings: bool,
    /// RoPE base frequency `theta`: pair `i` turns by `pos theta^(-2i / head_dim)`.
    pub rope_theta: f64,
    /// RMSNorm epsilon: `y = x / sqrt(mean(x^2) + eps) g`.
    pub rms_eps: f64,
}

/// What the two small test presets share beyond their shape: no q/k/v bias,
/// an LM head of their own, RoPE theta [`ModelConfig::ROPE_THETA`] and RMSNorm
/// epsilon [`ModelConfig::RMS_EPS`]. The shape fields here are placeholders
/// every preset overrides.
const PRESET_ARCH: ModelConfig = ModelConfig {
    name: "",
    layers: 0,
    hidden: 0,
    heads: 0,
    kv_heads: 0,
    head_dim: 0,
    intermediate: 0,
    vocab: 0,
    seq_len: 0,
    batch: 0,
    lora_rank: 0,
    qkv_bias: false,
    tied_embeddings: false,
    rope_theta: ModelConfig::ROPE_THETA,
    rms_eps: ModelConfig::RMS_EPS,
};

/// What the released Qwen2.5 checkpoints' `config.json` say beyond their
/// shape: a q/k/v bias, the LM head tied to the embedding, RoPE theta 1e6
/// and RMSNorm epsilon 1e-6.
const QWEN2_ARCH: ModelConfig = ModelConfig {
    qkv_bias: true,
    tied_embeddings: true,
    ..PRESET_ARCH
};

/// Every preset, smallest first.
pub const PRESETS: [ModelConfig; 4] = [
    ModelConfig {
        name: "tiny",
        layers: 2,
        hidden: 64,
        heads: 4,
        kv_heads: 2,
        head_dim: 16,
        intermediate: 176,
        vocab: 256,
        seq_len: 32,
        batch: 2,
        lora_rank: 8,
        ..PRESET_ARCH
    },
    ModelConfig {
        name: "small-4l",
        layers: 4,
        hidden: 256,
        heads: 4,
        kv_heads: 2,
        head_dim: 64,
        intermediate: 688,
        vocab: 4096,
        seq_len: 128,
        batch: 4,
        lora_rank: 8,
        ..PRESET_ARCH
    },
    ModelConfig {
        name: "qwen2.5-0.5b",
        layers: 24,
        hidden: 896,
        heads: 14,
        kv_heads: 2,
        head_dim: 64,
        intermediate: 4864,
        vocab: 151936,
        seq_len: 256,
        batch: 4,
        lora_rank: 16,
        ..QWEN2_ARCH
    },
    ModelConfig {
        name: "qwen2.5-coder-1.5b",
        layers: 28,
        hidden: 1536,
        heads: 12,
        kv_heads: 2,
        head_dim: 128,
        intermediate: 8960,
        vocab: 151936,
        seq_len: 256,
        batch: 4,
        lora_rank: 16,
        ..QWEN2_ARCH
    },
];

impl ModelConfig {
    /// RMSNorm epsilon of every preset.
    pub const RMS_EPS: f64 = 1e-6;
    /// RoPE base frequency of every preset.
    pub const ROPE_THETA: f64 = 1e6;

    /// The preset called `name`.
    pub fn preset(name: &str) -> Option<ModelConfig> {
        PRESETS.iter().copied().find(|p| p.name == name)
    }

    /// Names of all presets, for error messages.
    pub fn preset_names() -> Vec<&'static str> {
        PRESETS.iter().map(|p| p.name).collect()
    }

    /// Width of the query projection: `heads * head_dim`.
    pub fn q_dim(&self) -> usize {
        self.heads * self.head_dim
    }

    /// Width of the key and value projections: `kv_heads * head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.kv_heads * self.head_dim
    }

    /// Tokens in one batch: `batch * seq_len`.
    pub fn tokens(&self) -> usize {
        self.batch * self.seq_len
    }

    /// The same model with a different batch size.
    pub fn with_batch(self, batch: usize) -> ModelConfig {
        ModelConfig { batch, ..self }
    }

    /// The same model with a different sequence length.
    pub fn with_seq_len(self, seq_len: usize) -> ModelConfig {
        ModelConfig { seq_len, ..self }
    }

    /// Frozen parameters per layer: q, k, v, o, gate, up, down projections
    /// and, with `qkv_bias`, the biases of q, k and v.
    pub fn base_params_per_layer(&self) -> usize {
        let h = self.hidden;
        let bias = if self.qkv_bias {
            self.q_dim() + 2 * self.kv_dim()
        } else {
            0
        };
        h * self.q_dim()
            + 2 * h * self.kv_dim()
            + self.q_dim() * h
            + 3 * h * self.intermediate
            + bias
    }

    /// Trainable parameters: LoRA A (r x in) and B (out x r) on q and v of every
    /// layer, plus both RMSNorm weight vectors of every layer.
    pub fn trainable_params(&self) -> usize {
        let r = self.lora_rank;
        let h = self.hidden;
        let per_layer = r * h + self.q_dim() * r + r * h + self.kv_dim() * r + 2 * h;
        self.layers * per_layer
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_are_consistent() {
        for p in PRESETS {
            assert_eq!(p.heads % p.kv_heads, 0, "{}", p.name);
            assert_eq!(p.head_dim % 2, 0, "{}", p.name);
            assert!(ModelConfig::preset(p.name).is_some());
        }
        assert_eq!(
            ModelConfig::preset("qwen2.5-0.5b").map(|p| p.q_dim()),
            Some(896)
        );
    }
}
