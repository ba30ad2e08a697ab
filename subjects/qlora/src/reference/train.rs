//! The CPU reference training step: a Qwen2 decoder with LoRA on q and v, in
//! f64, built from the reference ops. RoPE theta, RMSNorm epsilon, the q/k/v
//! bias and the tying of the LM head to the embedding come from the model's
//! configuration.
//!
//! Forward, for tokens `[batch, seq + 1]` (inputs the first `seq`, targets the
//! last `seq`), `T = batch * seq` rows:
//!
//! ```text
//! x0 = embedding[inputs]                                       [T, hidden]
//! per layer l:
//!   n1 = rmsnorm(x, g1)
//!   q  = n1 Wq^T + bq + s (n1 Aq^T) Bq^T,  k = n1 Wk^T + bk,
//!   v  = n1 Wv^T + bv + s (n1 Av^T) Bv^T                        (b = 0 without qkv_bias)
//!   a  = attention(rope(q), rope(k), v)                         causal, GQA, 1/sqrt(d)
//!   x2 = x + a Wo^T
//!   n2 = rmsnorm(x2, g2)
//!   x  = x2 + (silu(n2 Wg^T) * (n2 Wu^T)) Wd^T
//! loss = cross_entropy(rmsnorm(x, g_final) Wlm^T, targets)     mean over T, Wlm = embedding if tied
//! ```
//!
//! Backward propagates `dx` through every op (frozen weights get no gradient,
//! so only `dx = dy W` is formed for them) and yields gradients for the
//! trainable tensors only: LoRA `A`, `B` of q and v and both norm weights of
//! every layer. With `u = n1 A^T`: `dB = s dy^T u`, `du = s dy B`,
//! `dA = du^T n1`, `dn1 += du A`.
//!
//! A step is: forward + backward, clip (global by default, per layer by
//! option), AdamW on every trainable tensor. Faults are options
//! ([`TrainOptions::faults`]), never environment variables.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::adamw::Variant;
use super::adamw::{AdamState, AdamW};
use super::attention::{self, AttnShape};
use super::clip;
use super::clip::GroupClip;
use super::{activation, cross_entropy, embedding, gemm, rmsnorm, rope};
use crate::error::{Error, Result};
use qlora::model::corpus::{self, Corpus};
use qlora::model::{BaseModel, FrozenLinear, ModelConfig, Slot, Trainable};
use qlora::train::{BaseWeights, ClipMode, Hyper};

pub use qlora::model::corpus::{BATCH_SALT, CORPUS_SALT};

/// What the reference step can be told to get wrong. Each faulty variant
/// reuses the clean code through one of these parameters; the default is the
/// real step.
#[derive(Debug, Clone, Copy)]
pub struct StepFaults {
    /// Clip in this mode whatever the options say (per-layer where global is claimed).
    pub clip_mode: Option<ClipMode>,
    /// The clip scale rule `scale(S, max_norm)`; [`clip::scale`] in the real step.
    pub clip_scale: fn(f64, f64) -> f64,
    /// The AdamW update rule.
    pub adamw: Variant,
    /// Run the optimizer twice on the same gradients.
    pub optimizer_step_twice: bool,
    /// Apply the LoRA scale twice in the backward.
    pub lora_backward_scale_twice: bool,
}

impl Default for StepFaults {
    fn default() -> Self {
        StepFaults {
            clip_mode: None,
            clip_scale: clip::scale,
            adamw: Variant::CORRECT,
            optimizer_step_twice: false,
            lora_backward_scale_twice: false,
        }
    }
}

/// How the reference step runs.
#[derive(Debug, Clone, Copy, Default)]
pub struct TrainOptions {
    pub clip: ClipMode,
    pub base: BaseWeights,
    pub hyper: Hyper,
    pub faults: StepFaults,
}

/// The model: frozen base plus trainable parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct Model {
    pub base: BaseModel,
    pub params: Trainable,
}

/// What the forward pass keeps of one layer for the backward pass.
struct LayerCache {
    x: Vec<f64>,
    n1: Vec<f64>,
    uq: Vec<f64>,
    uv: Vec<f64>,
    qr: Vec<f64>,
    kr: Vec<f64>,
    v: Vec<f64>,
    probs: Vec<f64>,
    x2: Vec<f64>,
    gate: Vec<f64>,
    up: Vec<f64>,
}

struct ForwardCache {
    layers: Vec<LayerCache>,
    x_final: Vec<f64>,
    logits: Vec<f64>,
    targets: Vec<u32>,
}

/// `dx = dy W` for a frozen `W [out, in]` and `dy [rows, out]`: the input
/// gradient only, since frozen weights take no gradient.
fn frozen_dx(
    dy: &[f64],
    w: &[f64],
    rows: usize,
    in_dim: usize,
    out_dim: usize,
) -> Result<Vec<f64>> {
    gemm::matmul(dy, w, rows, in_dim, out_dim)
}

fn add_into(acc: &mut [f64], x: &[f64]) {
    for (a, b) in acc.iter_mut().zip(x) {
        *a += b;
    }
}

/// `y = x W^T (+ b)` of a frozen projection over `rows` rows.
fn frozen_linear(x: &[f64], w: &FrozenLinear, rows: usize) -> Result<Vec<f64>> {
    let mut y = gemm::linear(x, &w.weight, rows, w.in_dim, w.out_dim)?;
    if let Some(b) = &w.bias {
        if b.len() != w.out_dim {
            return Err(Error::ShapeMismatch {
                op: "train",
                expected: format!("a bias of {} values", w.out_dim),
                got: format!("{} values", b.len()),
            });
        }
        for row in y.chunks_exact_mut(w.out_dim) {
            add_into(row, b);
        }
    }
    Ok(y)
}

impl Model {
    /// Seeded base weights stored as `base`, and LoRA at its starting point.
    pub fn init(cfg: &ModelConfig, base: BaseWeights, seed: u64) -> Result<Self> {
        Ok(Model {
            base: BaseModel::init(cfg, base, seed)?,
            params: Trainable::init(cfg, seed),
        })
    }

    fn cfg(&self) -> &ModelConfig {
        &self.base.config
    }

    fn attn_shape(&self, batch: usize, seq: usize) -> AttnShape {
        let c = self.cfg();
        AttnShape {
            batch,
            seq,
            heads: c.heads,
            kv_heads: c.kv_heads,
            head_dim: c.head_dim,
        }
    }

    /// `x W^T (+ b) + s (x A^T) B^T`, also returning `u = x A^T`.
    fn lora_linear(
        &self,
        x: &[f64],
        w: &FrozenLinear,
        a: &[f64],
        b: &[f64],
        rows: usize,
    ) -> Result<(Vec<f64>, Vec<f64>)> {
        let (h, r, out_dim) = (self.cfg().hidden, self.cfg().lora_rank, w.out_dim);
        let mut y = frozen_linear(x, w, rows)?;
        let u = gemm::linear(x, a, rows, h, r)?;
        let branch = gemm::linear(&u, b, rows, r, out_dim)?;
        let s = self.params.scale;
        for (yi, bi) in y.iter_mut().zip(&branch) {
            *yi += s * bi;
        }
        Ok((y, u))
    }

    fn forward(&self, tokens: &[u32], batch: usize) -> Result<ForwardCache> {
        let c = *self.cfg();
        if batch == 0 || !tokens.len().is_multiple_of(batch) || tokens.len() / batch < 2 {
            return Err(Error::ShapeMismatch {
                op: "train",
                expected: format!("[{batch}, seq + 1] tokens with seq >= 1"),
                got: format!("{} tokens", tokens.len()),
            });
        }
        if self.params.config != c
            || self.base.layers.len() != c.layers
            || self.params.tensors.len() != c.layers * Slot::ALL.len()
        {
            return Err(Error::ShapeMismatch {
                op: "train",
                expected: format!("base and trainable parameters of model {}", c.name),
                got: format!(
                    "{} base layers, {} trainable tensors of model {}",
                    self.base.layers.len(),
                    self.params.tensors.len(),
                    self.params.config.name
                ),
            });
        }
        let seq = tokens.len() / batch - 1;
        let (inputs, targets) = corpus::inputs_targets(tokens, batch, seq)?;
        let rows = batch * seq;
        let (h, qd, inter) = (c.hidden, c.q_dim(), c.intermediate);
        let shape = self.attn_shape(batch, seq);
        let (eps, theta) = (c.rms_eps, c.rope_theta);

        let mut x = embedding::forward(&self.base.embedding, c.vocab, h, &inputs)?;
        let mut layers = Vec::with_capacity(c.layers);
        for (l, w) in self.base.layers.iter().enumerate() {
            let p = &self.params;
            let n1 = rmsnorm::forward(&x, p.get(l, Slot::AttnNorm), rows, h, eps)?;
            let (q, uq) =
                self.lora_linear(&n1, &w.q, p.get(l, Slot::QA), p.get(l, Slot::QB), rows)?;
            let k = frozen_linear(&n1, &w.k, rows)?;
            let (v, uv) =
                self.lora_linear(&n1, &w.v, p.get(l, Slot::VA), p.get(l, Slot::VB), rows)?;
            let qr = rope::forward(&q, batch, seq, c.heads, c.head_dim, theta)?;
            let kr = rope::forward(&k, batch, seq, c.kv_heads, c.head_dim, theta)?;
            let (att, probs) = attention::forward(&qr, &kr, &v, &shape)?;
            let o = gemm::linear(&att, &w.o.weight, rows, qd, h)?;
            let mut x2 = x.clone();
            add_into(&mut x2, &o);
            let n2 = rmsnorm::forward(&x2, p.get(l, Slot::MlpNorm), rows, h, eps)?;
            let gate = gemm::linear(&n2, &w.gate.weight, rows, h, inter)?;
            let up = gemm::linear(&n2, &w.up.weight, rows, h, inter)?;
            let act = activation::swiglu_forward(&gate, &up)?;
            let down = gemm::linear(&act, &w.down.weight, rows, inter, h)?;
            let mut x3 = x2.clone();
            add_into(&mut x3, &down);
            layers.push(LayerCache {
                x,
                n1,
                uq,
                uv,
                qr,
                kr,
                v,
                probs,
                x2,
                gate,
                up,
            });
            x = x3;
        }
        let nf = rmsnorm::forward(&x, &self.base.final_norm, rows, h, eps)?;
        let logits = gemm::linear(&nf, self.base.head(), rows, h, c.vocab)?;
        Ok(ForwardCache {
            layers,
            x_final: x,
            logits,
            targets,
        })
    }

    /// The logits `[batch * seq, vocab]` of the inputs of `tokens`
    /// (`[batch, seq + 1]`: every row but its last token).
    pub fn logits(&self, tokens: &[u32], batch: usize) -> Result<Vec<f64>> {
        Ok(self.forward(tokens, batch)?.logits)
    }

    /// The mean cross-entropy of `tokens` (`[batch, seq + 1]`).
    pub fn loss(&self, tokens: &[u32], batch: usize) -> Result<f64> {
        let f = self.forward(tokens, batch)?;
        cross_entropy::forward(&f.logits, f.targets.len(), self.cfg().vocab, &f.targets)
    }

    /// The loss and its gradient for every trainable tensor (layout of
    /// [`Trainable::tensors`]). `lora_scale_twice` applies the LoRA scale
    /// twice in the backward (a fault).
    pub fn loss_and_grads(
        &self,
        tokens: &[u32],
        batch: usize,
        lora_scale_twice: bool,
    ) -> Result<(f64, Vec<Vec<f64>>)> {
        let c = *self.cfg();
        let f = self.forward(tokens, batch)?;
        let rows = f.targets.len();
        let seq = rows / batch;
        let (h, qd, kvd, inter, r) = (c.hidden, c.q_dim(), c.kv_dim(), c.intermediate, c.lora_rank);
        let shape = self.attn_shape(batch, seq);
        let (eps, theta) = (c.rms_eps, c.rope_theta);
        // The LoRA branch scale as backward applies it; the fault applies it twice.
        let s = self.params.scale;
        let s_bwd = if lora_scale_twice { s * s } else { s };

        let loss = cross_entropy::forward(&f.logits, rows, c.vocab, &f.targets)?;
        let dlogits = cross_entropy::backward(&f.logits, rows, c.vocab, &f.targets)?;
        let dnf = frozen_dx(&dlogits, self.base.head(), rows, h, c.vocab)?;
        let (mut dx, _) = rmsnorm::backward(&f.x_final, &self.base.final_norm, &dnf, rows, h, eps)?;

        let mut grads = self.params.zeros_like();
        for (l, (w, lc)) in self.base.layers.iter().zip(&f.layers).enumerate().rev() {
            let p = &self.params;
            // MLP branch: x3 = x2 + down(swiglu(gate(n2), up(n2))).
            let dact = frozen_dx(&dx, &w.down.weight, rows, inter, h)?;
            let (dgate, dup) = activation::swiglu_backward(&lc.gate, &lc.up, &dact)?;
            let mut dn2 = frozen_dx(&dgate, &w.gate.weight, rows, h, inter)?;
            add_into(&mut dn2, &frozen_dx(&dup, &w.up.weight, rows, h, inter)?);
            let (dx2_norm, dg2) =
                rmsnorm::backward(&lc.x2, p.get(l, Slot::MlpNorm), &dn2, rows, h, eps)?;
            let mut dx2 = dx;
            add_into(&mut dx2, &dx2_norm);

            // Attention branch: x2 = x + o(attention(rope(q), rope(k), v)).
            let datt = frozen_dx(&dx2, &w.o.weight, rows, qd, h)?;
            let (dqr, dkr, dv) =
                attention::backward(&lc.qr, &lc.kr, &lc.v, &lc.probs, &datt, &shape)?;
            let dq = rope::backward(&dqr, batch, seq, c.heads, c.head_dim, theta)?;
            let dk = rope::backward(&dkr, batch, seq, c.kv_heads, c.head_dim, theta)?;
            let mut dn1 = frozen_dx(&dq, &w.q.weight, rows, h, qd)?;
            add_into(&mut dn1, &frozen_dx(&dk, &w.k.weight, rows, h, kvd)?);
            add_into(&mut dn1, &frozen_dx(&dv, &w.v.weight, rows, h, kvd)?);

            // LoRA branches: y += s (n1 A^T) B^T.
            for (dy, u, sa, sb, out_dim) in [
                (&dq, &lc.uq, Slot::QA, Slot::QB, qd),
                (&dv, &lc.uv, Slot::VA, Slot::VB, kvd),
            ] {
                let (du, db) = gemm::linear_backward(u, p.get(l, sb), dy, rows, r, out_dim)?;
                let du: Vec<f64> = du.iter().map(|v| v * s_bwd).collect();
                let (dn1_lora, da) = gemm::linear_backward(&lc.n1, p.get(l, sa), &du, rows, h, r)?;
                add_into(&mut dn1, &dn1_lora);
                grads[Trainable::index(l, sa)] = da;
                grads[Trainable::index(l, sb)] = db.iter().map(|v| v * s_bwd).collect();
            }
            let (dx_norm, dg1) =
                rmsnorm::backward(&lc.x, p.get(l, Slot::AttnNorm), &dn1, rows, h, eps)?;
            dx = dx2;
            add_into(&mut dx, &dx_norm);
            grads[Trainable::index(l, Slot::AttnNorm)] = dg1;
            grads[Trainable::index(l, Slot::MlpNorm)] = dg2;
        }
        Ok((loss, grads))
    }
}

/// What one training step did.
#[derive(Debug, Clone, PartialEq)]
pub struct StepReport {
    /// The loss of this step's batch, before the update.
    pub loss: f64,
    /// One entry per clip group (one for global clipping, one per layer otherwise).
    pub clip: Vec<GroupClip>,
}

/// A model, its optimizer state and its data stream.
pub struct Trainer {
    pub model: Model,
    pub options: TrainOptions,
    opt: AdamW,
    states: Vec<AdamState>,
    corpus: Corpus,
    data_rng: ChaCha8Rng,
}

impl Trainer {
    /// A fresh model (seeded by `seed`), the arithmetic corpus and a batch
    /// stream, all from `seed`: two trainers with one seed see the same
    /// weights and the same batches whatever their options.
    pub fn new(cfg: &ModelConfig, options: TrainOptions, seed: u64) -> Result<Self> {
        let model = Model::init(cfg, options.base, seed)?;
        let states = model
            .params
            .tensors
            .iter()
            .map(|t| AdamState::new(t.len()))
            .collect();
        Ok(Trainer {
            model,
            opt: AdamW::new(options.hyper.lr, options.hyper.weight_decay),
            options,
            states,
            corpus: Corpus::arithmetic(seed ^ CORPUS_SALT, corpus::DEFAULT_LEN),
            data_rng: ChaCha8Rng::seed_from_u64(seed ^ BATCH_SALT),
        })
    }

    /// The next training batch, `[batch, seq_len + 1]`.
    pub fn next_batch(&mut self) -> Result<Vec<u32>> {
        let c = self.model.base.config;
        Ok(self.corpus.batch(&mut self.data_rng, c.batch, c.seq_len)?)
    }

    /// `n` batches from a stream of their own (seeded by `seed`), for evaluation.
    pub fn eval_batches(&self, n: usize, seed: u64) -> Result<Vec<Vec<u32>>> {
        let c = self.model.base.config;
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        (0..n)
            .map(|_| Ok(self.corpus.batch(&mut rng, c.batch, c.seq_len)?))
            .collect()
    }

    /// The mean loss over `batches`, without training.
    pub fn eval_loss(&self, batches: &[Vec<u32>]) -> Result<f64> {
        let b = self.model.base.config.batch;
        let mut sum = 0.0;
        for t in batches {
            sum += self.model.loss(t, b)?;
        }
        Ok(sum / batches.len().max(1) as f64)
    }

    /// One step on the next batch: forward, backward, clip, AdamW.
    pub fn step(&mut self) -> Result<StepReport> {
        let tokens = self.next_batch()?;
        self.step_on(&tokens)
    }

    /// One step on `tokens` (`[batch, seq_len + 1]`).
    pub fn step_on(&mut self, tokens: &[u32]) -> Result<StepReport> {
        let faults = self.options.faults;
        let batch = self.model.base.config.batch;
        let (loss, mut grads) =
            self.model
                .loss_and_grads(tokens, batch, faults.lora_backward_scale_twice)?;
        let layer_of = self.model.params.layer_of();
        let clip = clip::clip_with(
            &mut grads,
            &layer_of,
            faults.clip_mode.unwrap_or(self.options.clip),
            self.options.hyper.max_grad_norm,
            faults.clip_scale,
        )?;
        // The fault runs the optimizer twice on the same gradients, as a
        // replayed graph that also holds the optimizer would.
        let repeats = if faults.optimizer_step_twice { 2 } else { 1 };
        for _ in 0..repeats {
            for ((p, g), st) in self
                .model
                .params
                .tensors
                .iter_mut()
                .zip(&grads)
                .zip(&mut self.states)
            {
                self.opt.step_variant(p, g, st, faults.adamw)?;
            }
        }
        Ok(StepReport { loss, clip })
    }
}

/// `steps` training steps of a fresh trainer; one report per step.
pub fn train(
    cfg: &ModelConfig,
    options: TrainOptions,
    steps: usize,
    seed: u64,
) -> Result<Vec<StepReport>> {
    let mut t = Trainer::new(cfg, options, seed)?;
    (0..steps).map(|_| t.step()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options() -> TrainOptions {
        TrainOptions::default()
    }

    #[test]
    fn loss_starts_near_uniform() {
        let cfg = ModelConfig::preset("tiny").unwrap();
        let mut t = Trainer::new(&cfg, options(), 1).unwrap();
        let r = t.step().unwrap();
        assert!((r.loss - (256f64).ln()).abs() < 1.5, "{}", r.loss);
    }
}
