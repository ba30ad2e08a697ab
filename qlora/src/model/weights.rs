//! Seeded initialisation of the frozen base model.
//!
//! Nothing is downloaded: every weight is drawn from a ChaCha stream seeded by
//! `(seed, tensor)`, so any tensor can be regenerated on its own (the GPU step
//! can build its copy tensor by tensor) and two runs with one seed agree.
//!
//! Init (uniform, zero mean, standard deviation `std`, i.e. `U(-sqrt(3) std, sqrt(3) std)`):
//! projections `[out, in]` with `std = 1/sqrt(in)`, so each keeps the scale of
//! its (RMS-normalised) input; the embedding with `std = 1`; the LM head with
//! `std = 1/sqrt(hidden)`, so the initial logits are about unit-variance and
//! the initial loss is near `ln(vocab)`; the final norm is all ones; a q/k/v
//! bias is all zeros (as transformers initialises Qwen2). Where the head is
//! the embedding (`tied_embeddings`), the embedding takes the head's
//! `std = 1/sqrt(hidden)`: with `std = 1` the logits `h E^T` of a unit-RMS
//! `h` would have a standard deviation of `sqrt(hidden)`, and the first
//! RMSNorm makes the residual stream's scale irrelevant to the layers.
//!
//! Storage of the frozen projections follows [`BaseWeights`]: `Fp32` rounds
//! every value to f32 (what the GPU holds); `Nf4` quantises each projection
//! in blocks of 64 (QLoRA) and the forward pass multiplies by the dequantised
//! values. The embedding, LM head and final norm stay fp32 in both modes.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;

use super::ModelConfig;
use crate::error::Result;
use crate::model::nf4;
use crate::train::BaseWeights;

/// Which tensor of the model a seed is for (mixed into the tensor's seed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorId {
    Embedding,
    LmHead,
    /// A projection of layer `layer`: `0..7` = q, k, v, o, gate, up, down.
    Proj {
        layer: usize,
        which: usize,
    },
    /// A LoRA factor of layer `layer`: `0..4` = q.A, q.B, v.A, v.B.
    Lora {
        layer: usize,
        which: usize,
    },
    /// A trainable RMSNorm weight of layer `layer` (`0` attention, `1` MLP).
    Norm {
        layer: usize,
        which: usize,
    },
}

impl TensorId {
    fn code(self) -> u64 {
        match self {
            TensorId::Embedding => 1,
            TensorId::LmHead => 2,
            TensorId::Proj { layer, which } => 0x100 + (layer as u64) * 16 + which as u64,
            TensorId::Lora { layer, which } => 0x10_0000 + (layer as u64) * 16 + which as u64,
            TensorId::Norm { layer, which } => 0x20_0000 + (layer as u64) * 16 + which as u64,
        }
    }
}

/// The seed of one tensor: the run seed mixed with the tensor's identity
/// (SplitMix64 finaliser, so neighbouring ids give unrelated streams).
pub fn tensor_seed(seed: u64, id: TensorId) -> u64 {
    let mut z = seed ^ id.code().wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Values one thread draws at a time (see [`uniform`]).
const DRAW_CHUNK: usize = 1 << 16;

/// `len` values from `U(-sqrt(3) std, sqrt(3) std)` (mean 0, standard
/// deviation `std`): value `i` is the `i`-th draw of the tensor's stream.
///
/// Drawn in chunks on all cores: the larger presets draw hundreds of
/// millions of values, seconds on one thread. Each chunk seeks a copy of the
/// stream to its first value, so the values are exactly those of one
/// sequential draw: ChaCha is a counter-mode generator (any position can be
/// reached without drawing what comes before it), and a uniform f64 takes
/// exactly one `u64` of it, i.e. two 32-bit words.
pub fn uniform(seed: u64, id: TensorId, len: usize, std: f64) -> Vec<f64> {
    let mut values = vec![0.0; len];
    values
        .par_chunks_mut(DRAW_CHUNK)
        .enumerate()
        .for_each(|(chunk, out)| uniform_into(seed, id, std, chunk * DRAW_CHUNK, out, |v| v));
    values
}

/// `convert(v_i)` into `out[i - start]` for the values `v_i`, `i` in
/// `start..start + out.len()`, of [`uniform`]`(seed, id, _, std)`, drawn
/// from there: the stream is sought to value `start` (see [`uniform`]).
pub fn uniform_into<T>(
    seed: u64,
    id: TensorId,
    std: f64,
    start: usize,
    out: &mut [T],
    convert: impl Fn(f64) -> T,
) {
    let mut rng = ChaCha8Rng::seed_from_u64(tensor_seed(seed, id));
    rng.set_word_pos(2 * start as u128);
    let a = bound(std);
    for v in out {
        *v = convert(rng.random_range(-a..a));
    }
}

/// `a` of `U(-a, a)` for the standard deviation `std`: `sqrt(3) std`.
fn bound(std: f64) -> f64 {
    3f64.sqrt() * std
}

/// What another generator of a tensor's values (the device's,
/// `ops::draw`) needs to draw exactly those of [`uniform_into`]: the
/// ChaCha8 key of the tensor's stream (its 32-byte seed as eight
/// little-endian words) and the bound `a` of `U(-a, a)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stream {
    pub key: [u32; 8],
    pub bound: f64,
}

/// `[out_dim, in_dim]` of a layer's projections q, k, v, o, gate, up, down,
/// in that order (`which` 0..7 of [`TensorId::Proj`]).
pub(super) fn projection_shapes(cfg: &ModelConfig) -> [(usize, usize); 7] {
    let (h, qd, kvd, inter) = (cfg.hidden, cfg.q_dim(), cfg.kv_dim(), cfg.intermediate);
    [
        (qd, h),
        (kvd, h),
        (kvd, h),
        (h, qd),
        (inter, h),
        (inter, h),
        (h, inter),
    ]
}

/// Standard deviation of a projection's initial weights: `1 / sqrt(in_dim)`.
fn projection_std(in_dim: usize) -> f64 {
    1.0 / (in_dim as f64).sqrt()
}

/// What one frozen tensor is drawn from: its stream, its number of values
/// and their standard deviation (the init in the module doc). The host model
/// and the GPU's copy draw from the same list, so they are the same model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Draw {
    pub id: TensorId,
    pub len: usize,
    pub std: f64,
}

impl Draw {
    /// The drawn values.
    pub fn values(self, seed: u64) -> Vec<f64> {
        uniform(seed, self.id, self.len, self.std)
    }

    /// `convert` of values `start..start + out.len()` of [`Draw::values`],
    /// into `out`, drawing only those.
    pub fn values_into<T>(
        self,
        seed: u64,
        start: usize,
        out: &mut [T],
        convert: impl Fn(f64) -> T,
    ) {
        uniform_into(seed, self.id, self.std, start, out, convert)
    }

    /// The stream [`Draw::values`] are drawn from.
    pub fn stream(self, seed: u64) -> Stream {
        let bytes = ChaCha8Rng::seed_from_u64(tensor_seed(seed, self.id)).get_seed();
        Stream {
            key: std::array::from_fn(|i| {
                u32::from_le_bytes([
                    bytes[4 * i],
                    bytes[4 * i + 1],
                    bytes[4 * i + 2],
                    bytes[4 * i + 3],
                ])
            }),
            bound: bound(self.std),
        }
    }
}

/// The draws of layer `layer`'s projections, q to down, each with its
/// `[out_dim, in_dim]`.
pub fn projection_draws(cfg: &ModelConfig, layer: usize) -> [(Draw, (usize, usize)); 7] {
    let shapes = projection_shapes(cfg);
    std::array::from_fn(|which| {
        let (out_dim, in_dim) = shapes[which];
        let id = TensorId::Proj { layer, which };
        let draw = Draw {
            id,
            len: out_dim * in_dim,
            std: projection_std(in_dim),
        };
        (draw, shapes[which])
    })
}

/// The draws of the embedding and the LM head, in that order (the module
/// doc says why a tied embedding is drawn at the head's scale).
pub fn end_draws(cfg: &ModelConfig) -> [Draw; 2] {
    let len = cfg.vocab * cfg.hidden;
    let head_std = projection_std(cfg.hidden);
    [
        Draw {
            id: TensorId::Embedding,
            len,
            std: if cfg.tied_embeddings { head_std } else { 1.0 },
        },
        Draw {
            id: TensorId::LmHead,
            len,
            std: head_std,
        },
    ]
}

/// Rounds to the nearest f32, the precision the GPU stores fp32 weights in.
pub(super) fn to_f32_precision(v: Vec<f64>) -> Vec<f64> {
    v.into_iter().map(|x| f64::from(x as f32)).collect()
}

/// Rounds to f32, then to the nearest bf16 (ties to even): the values a
/// bf16 base holds on the GPU, which rounds the same f32 values.
pub(super) fn to_bf16_precision(v: Vec<f64>) -> Vec<f64> {
    v.into_iter()
        .map(|x| f64::from(half::bf16::from_f32(x as f32).to_f32()))
        .collect()
}

/// The embedding or LM head of a `base` model, as the GPU stores it: bf16
/// for a base that computes in bf16, f32 otherwise (NF4 quantises only the
/// projections).
fn table_precision(base: BaseWeights, v: Vec<f64>) -> Vec<f64> {
    if base.computes_in_bf16() {
        to_bf16_precision(v)
    } else {
        to_f32_precision(v)
    }
}

/// A frozen `[out_dim, in_dim]` projection, `y = x W^T (+ b)`.
#[derive(Debug, Clone, PartialEq)]
pub struct FrozenLinear {
    pub out_dim: usize,
    pub in_dim: usize,
    /// The values the forward pass multiplies by: f32- or bf16-rounded, or
    /// dequantised NF4 (rounded to bf16 for an NF4 base computing in bf16).
    pub weight: Vec<f64>,
    /// `[out_dim]`, added after the product (q, k and v of a configuration
    /// with `qkv_bias`); kept in f32 precision whatever the base format.
    pub bias: Option<Vec<f64>>,
}

impl FrozenLinear {
    /// The projection of drawn values `w`, stored as `base` says.
    pub(super) fn new(
        w: Vec<f64>,
        (out_dim, in_dim): (usize, usize),
        base: BaseWeights,
    ) -> Result<Self> {
        let weight = match base {
            BaseWeights::Fp32 => to_f32_precision(w),
            BaseWeights::Bf16 => to_bf16_precision(w),
            BaseWeights::Nf4 => nf4::dequantize(&nf4::quantize(&w, nf4::BLOCK)?),
            BaseWeights::Nf4Bf16 => {
                to_bf16_precision(nf4::dequantize(&nf4::quantize(&w, nf4::BLOCK)?))
            }
        };
        Ok(FrozenLinear {
            out_dim,
            in_dim,
            weight,
            bias: None,
        })
    }

    /// The same projection with bias `b` (`[out_dim]`, rounded to f32).
    pub fn with_bias(self, b: Vec<f64>) -> Self {
        FrozenLinear {
            bias: Some(to_f32_precision(b)),
            ..self
        }
    }
}

/// The seven projections of one decoder layer, on the host
/// ([`FrozenLayer`]) or on the device (`train::weights::LayerWeights`).
#[derive(Debug, Clone, PartialEq)]
pub struct Projections<T> {
    /// `[heads * head_dim, hidden]`
    pub q: T,
    /// `[kv_heads * head_dim, hidden]`
    pub k: T,
    /// `[kv_heads * head_dim, hidden]`
    pub v: T,
    /// `[hidden, heads * head_dim]`
    pub o: T,
    /// `[intermediate, hidden]`
    pub gate: T,
    /// `[intermediate, hidden]`
    pub up: T,
    /// `[hidden, intermediate]`
    pub down: T,
}

impl<T> Projections<T> {
    /// The projections `make(which)` builds, `which` 0..7 in the order of
    /// [`TensorId::Proj`].
    pub fn try_from_fn<E>(
        mut make: impl FnMut(usize) -> std::result::Result<T, E>,
    ) -> std::result::Result<Self, E> {
        Ok(Projections {
            q: make(0)?,
            k: make(1)?,
            v: make(2)?,
            o: make(3)?,
            gate: make(4)?,
            up: make(5)?,
            down: make(6)?,
        })
    }

    /// All seven, q to down.
    pub fn all(&self) -> [&T; 7] {
        [
            &self.q, &self.k, &self.v, &self.o, &self.gate, &self.up, &self.down,
        ]
    }
}

/// The frozen projections of one decoder layer.
pub type FrozenLayer = Projections<FrozenLinear>;

/// Every frozen weight of the model.
#[derive(Debug, Clone, PartialEq)]
pub struct BaseModel {
    pub config: ModelConfig,
    /// `[vocab, hidden]`
    pub embedding: Vec<f64>,
    pub layers: Vec<FrozenLayer>,
    /// `[hidden]`, all ones when seeded.
    pub final_norm: Vec<f64>,
    /// `[vocab, hidden]`; empty where the head is tied to the embedding
    /// (read it through [`BaseModel::head`]).
    pub lm_head: Vec<f64>,
}

impl BaseModel {
    /// Seeded frozen weights for `cfg`, stored as `base` says. With
    /// `qkv_bias` the biases start at zero (as Hugging Face initialises
    /// them); with `tied_embeddings` no head is drawn.
    pub fn init(cfg: &ModelConfig, base: BaseWeights, seed: u64) -> Result<Self> {
        let layers = (0..cfg.layers)
            .map(|layer| {
                let draws = projection_draws(cfg, layer);
                FrozenLayer::try_from_fn(|which| {
                    let (draw, shape) = draws[which];
                    let linear = FrozenLinear::new(draw.values(seed), shape, base)?;
                    let biased = cfg.qkv_bias && which < 3;
                    Ok(if biased {
                        linear.with_bias(vec![0.0; shape.0])
                    } else {
                        linear
                    })
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let [embedding, head] = end_draws(cfg);
        let embedding = table_precision(base, embedding.values(seed));
        let lm_head = if cfg.tied_embeddings {
            Vec::new()
        } else {
            table_precision(base, head.values(seed))
        };
        Ok(BaseModel {
            config: *cfg,
            embedding,
            layers,
            final_norm: vec![1.0; cfg.hidden],
            lm_head,
        })
    }

    /// The LM head `[vocab, hidden]`: the embedding table where the
    /// configuration ties them, the model's own head otherwise.
    pub fn head(&self) -> &[f64] {
        if self.config.tied_embeddings {
            &self.embedding
        } else {
            &self.lm_head
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The chunked draw is the sequential draw of the same stream, value
    /// for value, across chunk boundaries and in a last, short chunk.
    #[test]
    fn uniform_draws_the_sequential_stream() {
        let id = TensorId::Proj { layer: 3, which: 5 };
        let len = 3 * DRAW_CHUNK + 17;
        let mut rng = ChaCha8Rng::seed_from_u64(tensor_seed(11, id));
        let a = 3f64.sqrt() * 0.5;
        let sequential: Vec<f64> = (0..len).map(|_| rng.random_range(-a..a)).collect();
        assert_eq!(uniform(11, id, len, 0.5), sequential);
        let mut tail = vec![0.0f32; 40];
        uniform_into(11, id, 0.5, DRAW_CHUNK - 7, &mut tail, |v| v as f32);
        let want: Vec<f32> = sequential[DRAW_CHUNK - 7..][..40]
            .iter()
            .map(|&v| v as f32)
            .collect();
        assert_eq!(tail, want);
    }

    /// A bf16 base holds every projection, the embedding and the head as
    /// bf16 values: each is its own bf16 rounding, within half a bf16 step
    /// (at most 2^-8 of its magnitude) of the fp32 model's.
    #[test]
    fn a_bf16_base_holds_bf16_values() {
        let c = ModelConfig::preset("tiny").unwrap();
        let fp32 = BaseModel::init(&c, BaseWeights::Fp32, 5).unwrap();
        let bf16 = BaseModel::init(&c, BaseWeights::Bf16, 5).unwrap();
        let pairs = [
            (&fp32.embedding, &bf16.embedding),
            (&fp32.layers[0].q.weight, &bf16.layers[0].q.weight),
            (&fp32.layers[1].down.weight, &bf16.layers[1].down.weight),
        ];
        for (f, b) in pairs {
            assert_eq!(f.len(), b.len());
            for (&x, &y) in f.iter().zip(b.iter()) {
                assert_eq!(f64::from(half::bf16::from_f64(y).to_f32()), y);
                assert!((x - y).abs() <= x.abs() * 2f64.powi(-8), "{x} {y}");
            }
        }
    }

    #[test]
    fn init_is_seeded_and_nf4_stays_close_to_fp32() {
        let cfg = ModelConfig::preset("tiny").unwrap();
        let a = BaseModel::init(&cfg, BaseWeights::Fp32, 7).unwrap();
        let b = BaseModel::init(&cfg, BaseWeights::Fp32, 7).unwrap();
        let c = BaseModel::init(&cfg, BaseWeights::Fp32, 8).unwrap();
        assert_eq!(a, b);
        assert_ne!(a.embedding, c.embedding);
        assert_ne!(a.layers[0].q.weight, a.layers[1].q.weight);
        let n = BaseModel::init(&cfg, BaseWeights::Nf4, 7).unwrap();
        let (wf, wn) = (&a.layers[0].gate.weight, &n.layers[0].gate.weight);
        assert_eq!(wf.len(), cfg.intermediate * cfg.hidden);
        let err: f64 = wf
            .iter()
            .zip(wn)
            .map(|(x, y)| (x - y).powi(2))
            .sum::<f64>()
            .sqrt();
        let norm: f64 = wf.iter().map(|x| x * x).sum::<f64>().sqrt();
        assert!(err / norm < 0.15 && err > 0.0, "{}", err / norm);
        assert_eq!(n.embedding, a.embedding);
    }
}
