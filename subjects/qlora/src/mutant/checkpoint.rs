//! Faulty variants of a loaded checkpoint: the model a loader with one
//! deliberate fault would hand to the oracle.

use super::Mutant;
use qlora::model::weights::end_draws;
use qlora::model::Checkpoint;

/// RoPE theta under [`Mutant::CheckpointWrongRopeTheta`].
pub const WRONG_ROPE_THETA: f64 = 10_000.0;

/// `ckpt` as a loader with `mutant`'s fault would have loaded it; unchanged
/// for any other mutant. The untied head is drawn with `seed` (the presets'
/// LM-head init).
pub fn apply(mutant: Option<Mutant>, ckpt: &mut Checkpoint, seed: u64) {
    let base = &mut ckpt.base;
    match mutant {
        Some(Mutant::CheckpointBiasDropped) => {
            base.config.qkv_bias = false;
            for layer in &mut base.layers {
                for linear in [&mut layer.q, &mut layer.k, &mut layer.v] {
                    linear.bias = None;
                }
            }
        }
        Some(Mutant::CheckpointUntiedHead) => {
            base.config.tied_embeddings = false;
            let [_, head] = end_draws(&base.config);
            base.lm_head = head.values(seed);
        }
        Some(Mutant::CheckpointWrongRopeTheta) => base.config.rope_theta = WRONG_ROPE_THETA,
        _ => {}
    }
}
