//! Faulty variants of NF4, clipping, AdamW and the reference training step.
//!
//! Each is the real code with one deliberate fault, reached through the same
//! block/grouping/moment logic as the correct version so that the fault is the
//! only difference. The reference training step takes them as
//! [`StepFaults`] ([`step_faults`]); the `property` checks select them from
//! the trial's mutant.

use super::Mutant;
use crate::error::Result;
use crate::reference::adamw::{AdamState, AdamW, Variant};
use crate::reference::clip::{self, GroupClip};
use crate::reference::nf4::{self, Nf4Tensor};
use crate::reference::train::StepFaults;
use qlora::train::ClipMode;

/// NF4 with [`Mutant::Nf4NeighbourCode`]: the code next to the nearest one
/// (one up, or one down from the top code).
pub fn nf4_quantize_neighbour_code(w: &[f64], block: usize) -> Result<Nf4Tensor> {
    fn neighbour(x: f64) -> u8 {
        let c = nf4::nearest_code(x);
        if c < 15 {
            c + 1
        } else {
            c - 1
        }
    }
    Ok(nf4::quantize_with(w, block, neighbour)?)
}

/// NF4 quantisation, faulty when `mutant` is [`Mutant::Nf4NeighbourCode`].
pub fn nf4_quantize(w: &[f64], block: usize, mutant: Option<Mutant>) -> Result<Nf4Tensor> {
    match mutant {
        Some(Mutant::Nf4NeighbourCode) => nf4_quantize_neighbour_code(w, block),
        _ => Ok(nf4::quantize(w, block)?),
    }
}

/// [`Mutant::ClipAlwaysScales`]: `scale = max_norm / (sqrt(S) + 1e-6)`
/// without the `min(1, ..)`, so small gradients are blown up to `max_norm`.
pub fn clip_scale_always(sq_sum: f64, max_norm: f64) -> f64 {
    max_norm / (sq_sum.sqrt() + clip::NORM_EPS)
}

/// Clipping as the step or a property asks for it (`mode`), with the faults
/// of `mutant` applied: [`Mutant::ClipPerLayer`] turns global clipping into
/// per-layer clipping, [`Mutant::ClipAlwaysScales`] drops the `min(1, ..)`,
/// and [`Mutant::ClipSkipped`] leaves the gradients alone (returning the
/// groups' norms with scale 1).
pub fn clip(
    tensors: &mut [Vec<f64>],
    group_of: &[usize],
    mode: ClipMode,
    max_norm: f64,
    mutant: Option<Mutant>,
) -> Result<Vec<GroupClip>> {
    match mutant {
        Some(Mutant::ClipPerLayer) => clip::clip(tensors, group_of, ClipMode::PerLayer, max_norm),
        Some(Mutant::ClipAlwaysScales) => {
            clip::clip_with(tensors, group_of, mode, max_norm, clip_scale_always)
        }
        Some(Mutant::ClipSkipped) => clip::clip_with(tensors, group_of, mode, max_norm, |_, _| 1.0),
        _ => clip::clip(tensors, group_of, mode, max_norm),
    }
}

/// The reference training step's faults under `mutant`: clipping, AdamW and
/// step-level faults reach the clean step through [`StepFaults`].
pub fn step_faults(mutant: Mutant) -> StepFaults {
    let clean = StepFaults::default();
    match mutant {
        Mutant::ClipPerLayer => StepFaults {
            clip_mode: Some(ClipMode::PerLayer),
            ..clean
        },
        Mutant::ClipAlwaysScales => StepFaults {
            clip_scale: clip_scale_always,
            ..clean
        },
        Mutant::ClipSkipped => StepFaults {
            clip_scale: |_, _| 1.0,
            ..clean
        },
        Mutant::AdamwWithoutBiasCorrection | Mutant::AdamwUpdateSignFlipped => StepFaults {
            adamw: adamw_variant(Some(mutant)),
            ..clean
        },
        Mutant::OptimizerStepTwice => StepFaults {
            optimizer_step_twice: true,
            ..clean
        },
        Mutant::LoraBackwardScaleTwice => StepFaults {
            lora_backward_scale_twice: true,
            ..clean
        },
        _ => clean,
    }
}

/// The AdamW update rule under `mutant`.
fn adamw_variant(mutant: Option<Mutant>) -> Variant {
    match mutant {
        Some(Mutant::AdamwWithoutBiasCorrection) => Variant {
            bias_correction: false,
            ..Variant::CORRECT
        },
        Some(Mutant::AdamwUpdateSignFlipped) => Variant {
            descend: false,
            ..Variant::CORRECT
        },
        _ => Variant::CORRECT,
    }
}

/// One AdamW step with the faults of `mutant`:
/// [`Mutant::AdamwWithoutBiasCorrection`] uses the raw moments `m, v`;
/// [`Mutant::AdamwUpdateSignFlipped`] adds the update instead of subtracting it.
pub fn adamw_step(
    opt: &AdamW,
    p: &mut [f64],
    g: &[f64],
    state: &mut AdamState,
    mutant: Option<Mutant>,
) -> Result<()> {
    opt.step_variant(p, g, state, adamw_variant(mutant))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_differ_from_the_real_code() {
        let w: Vec<f64> = (0..64).map(|i| (i as f64 - 31.5) / 32.0).collect();
        let good = nf4::quantize(&w, 64).unwrap();
        let bad = nf4_quantize(&w, 64, Some(Mutant::Nf4NeighbourCode)).unwrap();
        assert_ne!(good.codes, bad.codes);

        let mut small = vec![vec![0.1, 0.1]];
        clip(
            &mut small,
            &[0],
            ClipMode::Global,
            1.0,
            Some(Mutant::ClipAlwaysScales),
        )
        .unwrap();
        assert!(small[0][0] > 0.1);

        let opt = AdamW::new(0.1, 0.0);
        let mut p = vec![0.0];
        let mut st = AdamState::new(1);
        adamw_step(
            &opt,
            &mut p,
            &[1.0],
            &mut st,
            Some(Mutant::AdamwUpdateSignFlipped),
        )
        .unwrap();
        assert!(p[0] > 0.0);
    }
}
