//! `gradient_check` of the whole reference training step.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::Params;
use crate::check::{Comparator, Measurement, TrialContext};
use crate::error::{Error, Result};
use crate::mutant::Mutant;
use crate::reference::train::Model;
use qlora::model::{BaseModel, Corpus, Trainable};
use qlora::train::BaseWeights;

/// Mixed into the trial seed for the gradient check's batch and coordinates.
const GRADCHECK_SALT: u64 = 0x0000_97ad;

/// Whether `mutant` applies the LoRA scale twice in the backward.
fn lora_scale_twice(mutant: Option<Mutant>) -> bool {
    mutant.is_some_and(|m| m.step_faults().lora_backward_scale_twice)
}

/// `gradient_check` with `model`: the analytic gradients of the training loss
/// for every trainable tensor against central differences
/// `(L(p + h e_i) - L(p - h e_i)) / 2h` at `samples` seeded coordinates per
/// tensor, in f64, on one seeded batch. The parameters are moved off the
/// init first (`B != 0`, norms != 1): at `B = 0` the gradient of `A` is
/// exactly zero and a relative error of it means nothing. Metric: the largest
/// per-tensor `||g - g_fd|| / ||g_fd||` over the sampled coordinates.
pub(super) fn measure(p: &Params, cx: &mut TrialContext<'_>) -> Result<Measurement> {
    let cfg = match &p.model {
        // Planning refuses big models already; this keeps a direct call from
        // allocating one.
        Some(m) => crate::check::training::cpu_model(&m.0)?,
        None => {
            return Err(Error::InvalidArgument {
                op: "gradient_check",
                message: "the training-step gradient check needs `model`".into(),
            })
        }
    };
    let mut model = Model {
        base: BaseModel::init(&cfg, BaseWeights::Fp32, cx.seed)?,
        params: Trainable::perturbed(&cfg, cx.seed, 0.05),
    };
    let corpus = Corpus::arithmetic(cx.seed, 4096);
    let mut rng = ChaCha8Rng::seed_from_u64(cx.seed ^ GRADCHECK_SALT);
    let tokens = corpus.batch(&mut rng, cfg.batch, cfg.seq_len)?;
    let (_, grads) = model.loss_and_grads(&tokens, cfg.batch, lora_scale_twice(cx.mutant))?;
    let h = p.step.0;

    let mut worst = 0.0f64;
    let mut worst_name = String::from("none");
    let mut probed = 0usize;
    for (ti, g) in grads.iter().enumerate() {
        let n = g.len();
        let k = p.samples.0.min(n);
        let mut coords: Vec<usize> = Vec::with_capacity(k);
        while coords.len() < k {
            let i = rng.random_range(0..n);
            if !coords.contains(&i) {
                coords.push(i);
            }
        }
        let (mut diff2, mut ref2) = (0.0f64, 0.0f64);
        for &i in &coords {
            let orig = model.params.tensors[ti][i];
            model.params.tensors[ti][i] = orig + h;
            let lp = model.loss(&tokens, cfg.batch)?;
            model.params.tensors[ti][i] = orig - h;
            let lm = model.loss(&tokens, cfg.batch)?;
            model.params.tensors[ti][i] = orig;
            let fd = (lp - lm) / (2.0 * h);
            diff2 += (g[i] - fd).powi(2);
            ref2 += fd * fd;
            probed += 1;
        }
        let rel = if ref2 > 0.0 {
            (diff2 / ref2).sqrt()
        } else if diff2 == 0.0 {
            0.0
        } else {
            f64::INFINITY
        };
        if rel > worst || rel.is_nan() {
            worst = rel;
            worst_name = format!("{} (|g_fd| {:.3e})", Trainable::name(ti), ref2.sqrt());
        }
    }
    Ok(Measurement::new("max_tensor_rel_error", worst, Comparator::Le, p.tolerance.0, "rel").with_detail(format!(
        "model {}, {} trainable tensors, {probed} coordinates probed, h = {h:e}; worst {worst_name}",
        cfg.name,
        grads.len()
    )))
}
