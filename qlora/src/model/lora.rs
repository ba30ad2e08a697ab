//! The trainable parameters: LoRA adapters on the q and v projections and
//! both RMSNorm weights of every layer.
//!
//! A LoRA adapter on a frozen `W [out, in]` adds a rank-`r` branch:
//!
//! ```text
//! y = x W^T + s (x A^T) B^T,   A [r, in], B [out, r],   s = alpha / r
//! ```
//!
//! with `alpha = 2r`, so `s = 2` (a scale different from 1 makes a missing or
//! doubled scale in backward visible). `A` starts from `U(-1/sqrt(in),
//! 1/sqrt(in))` (the Kaiming-uniform bound PEFT uses) and `B` from zeros, so
//! the adapted model starts exactly at the base model. Norm weights start at 1.
//!
//! All trainable tensors live in one list in a fixed order, [`Slot`] by
//! [`Slot`] within each layer, so clipping and the optimizer can walk them
//! without knowing the model, and gradients use the same layout.

use super::weights::{uniform, TensorId};
use super::ModelConfig;

/// `alpha / r`: the LoRA scale `s`.
pub const ALPHA_OVER_RANK: f64 = 2.0;

/// The trainable tensors of one layer, in storage order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    /// RMSNorm weight before attention, `[hidden]`.
    AttnNorm,
    /// LoRA `A` of q, `[r, hidden]`.
    QA,
    /// LoRA `B` of q, `[heads * head_dim, r]`.
    QB,
    /// LoRA `A` of v, `[r, hidden]`.
    VA,
    /// LoRA `B` of v, `[kv_heads * head_dim, r]`.
    VB,
    /// RMSNorm weight before the MLP, `[hidden]`.
    MlpNorm,
}

impl Slot {
    /// Every slot, in storage order.
    pub const ALL: [Slot; 6] = [
        Slot::AttnNorm,
        Slot::QA,
        Slot::QB,
        Slot::VA,
        Slot::VB,
        Slot::MlpNorm,
    ];

    /// Name used in reports.
    pub fn name(self) -> &'static str {
        match self {
            Slot::AttnNorm => "attn_norm",
            Slot::QA => "q_lora_a",
            Slot::QB => "q_lora_b",
            Slot::VA => "v_lora_a",
            Slot::VB => "v_lora_b",
            Slot::MlpNorm => "mlp_norm",
        }
    }

    /// `[rows, cols]` of the slot's tensor for `cfg`.
    pub fn shape(self, cfg: &ModelConfig) -> (usize, usize) {
        let (r, h) = (cfg.lora_rank, cfg.hidden);
        match self {
            Slot::AttnNorm | Slot::MlpNorm => (1, h),
            Slot::QA | Slot::VA => (r, h),
            Slot::QB => (cfg.q_dim(), r),
            Slot::VB => (cfg.kv_dim(), r),
        }
    }

    fn index(self) -> usize {
        match self {
            Slot::AttnNorm => 0,
            Slot::QA => 1,
            Slot::QB => 2,
            Slot::VA => 3,
            Slot::VB => 4,
            Slot::MlpNorm => 5,
        }
    }
}

/// The trainable parameters (or, with the same layout, their gradients).
#[derive(Debug, Clone, PartialEq)]
pub struct Trainable {
    pub config: ModelConfig,
    /// `layers x Slot::ALL.len()` tensors, layer-major, in [`Slot::ALL`] order.
    pub tensors: Vec<Vec<f64>>,
    /// The LoRA scale `s = alpha / r`.
    pub scale: f64,
}

impl Trainable {
    /// The starting point of fine-tuning: `A` random, `B = 0`, norms = 1.
    pub fn init(cfg: &ModelConfig, seed: u64) -> Self {
        let mut tensors = Vec::with_capacity(cfg.layers * Slot::ALL.len());
        for layer in 0..cfg.layers {
            for slot in Slot::ALL {
                let (rows, cols) = slot.shape(cfg);
                let t = match slot {
                    Slot::AttnNorm | Slot::MlpNorm => vec![1.0; rows * cols],
                    Slot::QB | Slot::VB => vec![0.0; rows * cols],
                    Slot::QA | Slot::VA => {
                        let which = if slot == Slot::QA { 0 } else { 2 };
                        // Bound 1/sqrt(in) is standard deviation 1/sqrt(3 in).
                        let std = 1.0 / (3.0 * cols as f64).sqrt();
                        uniform(seed, TensorId::Lora { layer, which }, rows * cols, std)
                    }
                };
                tensors.push(t);
            }
        }
        Trainable {
            config: *cfg,
            tensors,
            scale: ALPHA_OVER_RANK,
        }
    }

    /// A parameter point away from the init, for gradient checks: `B` drawn
    /// with standard deviation `b_std` (with `B = 0` the gradient of `A` is
    /// exactly zero and a relative error says nothing), norm weights `1 + U(-0.1, 0.1)`-ish.
    pub fn perturbed(cfg: &ModelConfig, seed: u64, b_std: f64) -> Self {
        let mut t = Trainable::init(cfg, seed);
        for layer in 0..cfg.layers {
            for slot in [Slot::QB, Slot::VB, Slot::AttnNorm, Slot::MlpNorm] {
                let which = match slot {
                    Slot::QB => 1,
                    Slot::VB => 3,
                    Slot::AttnNorm => 0,
                    _ => 1,
                };
                let idx = Trainable::index(layer, slot);
                let len = t.tensors[idx].len();
                t.tensors[idx] = match slot {
                    Slot::QB | Slot::VB => {
                        uniform(seed, TensorId::Lora { layer, which }, len, b_std)
                    }
                    _ => uniform(seed, TensorId::Norm { layer, which }, len, 0.06)
                        .into_iter()
                        .map(|v| 1.0 + v)
                        .collect(),
                };
            }
        }
        t
    }

    /// Position of `(layer, slot)` in [`Trainable::tensors`].
    pub fn index(layer: usize, slot: Slot) -> usize {
        layer * Slot::ALL.len() + slot.index()
    }

    /// The tensor of `(layer, slot)`; empty if there is no such tensor, which
    /// every op then refuses with a shape error.
    pub fn get(&self, layer: usize, slot: Slot) -> &[f64] {
        self.tensors
            .get(Trainable::index(layer, slot))
            .map_or(&[], Vec::as_slice)
    }

    /// Zeros in the same layout (a gradient accumulator).
    pub fn zeros_like(&self) -> Vec<Vec<f64>> {
        self.tensors.iter().map(|t| vec![0.0; t.len()]).collect()
    }

    /// The layer of every tensor, for per-layer clipping.
    pub fn layer_of(&self) -> Vec<usize> {
        (0..self.tensors.len())
            .map(|i| i / Slot::ALL.len())
            .collect()
    }

    /// `layer{l}.{slot}` of tensor `i`, for reports.
    pub fn name(i: usize) -> String {
        let slot = Slot::ALL[i % Slot::ALL.len()];
        format!("layer{}.{}", i / Slot::ALL.len(), slot.name())
    }

    /// Number of trainable values.
    pub fn len(&self) -> usize {
        self.tensors.iter().map(Vec::len).sum()
    }

    /// Whether there is nothing to train.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_matches_the_config_count() {
        let cfg = ModelConfig::preset("tiny").unwrap();
        let t = Trainable::init(&cfg, 1);
        assert_eq!(t.len(), cfg.trainable_params());
        assert!(t.get(1, Slot::QB).iter().all(|&v| v == 0.0));
        assert!(t.get(0, Slot::QA).iter().any(|&v| v != 0.0));
        assert_eq!(t.get(0, Slot::VB).len(), cfg.kv_dim() * cfg.lora_rank);
        assert_eq!(
            Trainable::name(Trainable::index(1, Slot::VA)),
            "layer1.v_lora_a"
        );
        let p = Trainable::perturbed(&cfg, 1, 0.02);
        assert!(p.get(0, Slot::VB).iter().any(|&v| v != 0.0));
        assert_eq!(p.get(0, Slot::QA), t.get(0, Slot::QA));
    }
}
