//! The frozen base model on the device, rebuilt tensor by tensor from the
//! same seeds as [`crate::model::BaseModel::init`] (so the GPU and the host
//! model are the same model) or copied from a host model (a loaded
//! checkpoint), and the trainable tensors with their gradients and AdamW
//! moments.

use cudarc::driver::{CudaSlice, DeviceRepr, ValidAsZeroBits};
use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::gpu::GpuContext;
use crate::model::nf4;
use crate::model::weights::{end_draws, projection_draws, Draw, Projections, TensorId};
use crate::model::{BaseModel, ModelConfig, Trainable};
use crate::ops::cast::{Bf16, HalfFloat};
use crate::ops::nf4::{self as nf4_ops, Nf4Device};
use crate::train::{BaseWeights, GpuTrainOptions};

/// Where the values of a model on the device come from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Values<'a> {
    /// Drawn from the seed, as the host model's, and copied to the device.
    Seeded(u64),
    /// The host model's own (a loaded checkpoint), copied to the device.
    Model(&'a BaseModel),
    /// Zeros set on the device: memsets, no host-to-device copy. The model
    /// of the pre-warm's rehearsal step, whose values do not matter, only
    /// its shapes.
    Zeros,
}

impl Values<'_> {
    /// The values of each of `draws` (zeros: none, only their lengths count).
    fn draw(self, draws: &[Draw]) -> Result<Vec<Vec<f64>>> {
        match self {
            Values::Seeded(seed) => Ok(draw_all(seed, draws)),
            Values::Model(model) => draws.iter().map(|d| model_tensor(model, *d)).collect(),
            Values::Zeros => Ok(vec![Vec::new(); draws.len()]),
        }
    }

    /// A device buffer of `len` elements: `host()` copied up, or zeros.
    fn put<T: DeviceRepr + ValidAsZeroBits>(
        self,
        gpu: &GpuContext,
        len: usize,
        host: impl FnOnce() -> Vec<T>,
    ) -> Result<CudaSlice<T>> {
        match self {
            Values::Seeded(_) | Values::Model(_) => gpu.upload(&host()),
            Values::Zeros => gpu.zeros(len),
        }
    }

    /// Layer `layer`'s `[b_q | b_k | b_v]` (`len` values): the host
    /// model's, or zeros where it has none (seeded models start their
    /// biases at zero, as [`BaseModel::init`] does).
    fn qkv_bias(self, gpu: &GpuContext, layer: usize, len: usize) -> Result<CudaSlice<f32>> {
        let Values::Model(model) = self else {
            return gpu.zeros(len);
        };
        let l = model
            .layers
            .get(layer)
            .ok_or_else(|| missing(layer, "layer"))?;
        match (&l.q.bias, &l.k.bias, &l.v.bias) {
            (Some(q), Some(k), Some(v)) => {
                let b: Vec<f64> = q.iter().chain(k).chain(v).copied().collect();
                expect_len(b.len(), len, "q/k/v bias")?;
                gpu.upload(&to_f32(&b))
            }
            _ => gpu.zeros(len),
        }
    }

    /// The final RMSNorm's weight (`len` values): the host model's, or ones.
    fn final_norm(self, gpu: &GpuContext, len: usize) -> Result<CudaSlice<f32>> {
        match self {
            Values::Model(model) => {
                expect_len(model.final_norm.len(), len, "final norm")?;
                gpu.upload(&to_f32(&model.final_norm))
            }
            _ => self.put(gpu, len, || vec![1.0f32; len]),
        }
    }
}

/// The host model's values of the tensor `d` stands for (a tied head is
/// the embedding).
fn model_tensor(model: &BaseModel, d: Draw) -> Result<Vec<f64>> {
    let values = match d.id {
        TensorId::Embedding => &model.embedding,
        TensorId::LmHead => model.head(),
        TensorId::Proj { layer, which } => {
            let l = model
                .layers
                .get(layer)
                .ok_or_else(|| missing(layer, "layer"))?;
            let lin = l.all().get(which).copied();
            &lin.ok_or_else(|| missing(which, "projection"))?.weight
        }
        TensorId::Lora { .. } | TensorId::Norm { .. } => {
            return Err(Error::InvalidArgument {
                op: "weights",
                message: format!("{:?} is trainable, not part of the frozen base", d.id),
            })
        }
    };
    expect_len(values.len(), d.len, &format!("{:?}", d.id))?;
    Ok(values.to_vec())
}

fn missing(at: usize, what: &str) -> Error {
    Error::InvalidArgument {
        op: "weights",
        message: format!("the host model has no {what} {at}"),
    }
}

fn expect_len(got: usize, want: usize, what: &str) -> Result<()> {
    if got == want {
        return Ok(());
    }
    Err(Error::ShapeMismatch {
        op: "weights",
        expected: format!("{want} values of {what}"),
        got: format!("{got}"),
    })
}

/// How a frozen projection is stored on the device.
pub enum Frozen {
    Fp32(CudaSlice<f32>),
    Nf4(Nf4Device),
    /// bf16 only (a bf16 base).
    Bf16(CudaSlice<Bf16>),
    /// Rows of its layer's q/k/v stack ([`BaseDevice::stacks`], or
    /// [`BaseDevice::stacks_bf16`] for a bf16 base): q, k and v, which the
    /// step multiplies as one matrix.
    Stacked,
}

/// The embedding table or the LM head, `[vocab, hidden]`, on the device.
pub enum Table {
    F32(CudaSlice<f32>),
    /// A bf16 base's.
    Bf16(CudaSlice<Bf16>),
}

impl Table {
    /// `values` (`len` of them) stored as `base` says: bf16 for a bf16
    /// base, f32 otherwise (an NF4 base keeps its tables in f32).
    fn put(
        gpu: &GpuContext,
        values: Values,
        base: BaseWeights,
        v: &[f64],
        len: usize,
    ) -> Result<Self> {
        Ok(match base {
            BaseWeights::Bf16 => Table::Bf16(values.put(gpu, len, || to_half(v))?),
            BaseWeights::Fp32 | BaseWeights::Nf4 => Table::F32(values.put(gpu, len, || to_f32(v))?),
        })
    }

    /// Bytes on the device.
    pub fn bytes(&self) -> usize {
        match self {
            Table::F32(t) => 4 * t.len(),
            Table::Bf16(t) => 2 * t.len(),
        }
    }
}

/// A frozen `[out_dim, in_dim]` projection.
pub struct Linear {
    pub out_dim: usize,
    pub in_dim: usize,
    pub w: Frozen,
    /// `W^T`, `[in_dim, out_dim]`, for the backward's input gradient when
    /// the step keeps it ([`crate::train::GpuTrainOptions::transposed_weights`]).
    pub transposed: Option<CudaSlice<f32>>,
    /// `W` rounded to f16 (raw bits), `[out_dim, in_dim]`, which the
    /// forward's GEMM reads instead of `W` when the step keeps it
    /// ([`crate::train::GpuTrainOptions::f16_projections`]).
    pub half: Option<CudaSlice<u16>>,
}

impl Linear {
    /// Bytes on the device.
    pub fn bytes(&self) -> usize {
        let kept = self.transposed.as_ref().map_or(0, |wt| 4 * wt.len())
            + self.half.as_ref().map_or(0, |w| 2 * w.len());
        kept + match &self.w {
            Frozen::Fp32(w) => 4 * w.len(),
            Frozen::Nf4(t) => t.codes.len() + 4 * t.absmax.len(),
            Frozen::Bf16(w) => 2 * w.len(),
            Frozen::Stacked => 0,
        }
    }
}

/// The frozen projections of one layer: q, k, v, o, gate, up, down.
pub type LayerWeights = Projections<Linear>;

/// The frozen base model on the device.
pub struct BaseDevice {
    pub embedding: Table,
    pub layers: Vec<LayerWeights>,
    /// fp32 base only, one per layer: `[Wq; Wk; Wv; Aq; Av]`, `[width,
    /// hidden]` (see [`crate::ops::rope::QkvShape::width`]). The q, k, v rows
    /// are the frozen weights (their `Linear`s are [`Frozen::Stacked`]); the
    /// step copies the trainable LoRA A rows in before each forward, so the
    /// projections and both LoRA down-projections are one GEMM.
    pub stacks: Vec<CudaSlice<f32>>,
    /// With `f16_projections`: each stack rounded to f16 (raw bits), which
    /// the forward's GEMM reads; the step casts the LoRA A rows in after
    /// copying them into the f32 stack.
    pub stacks_f16: Vec<CudaSlice<u16>>,
    /// bf16 base only, one per layer: the q/k/v stack `[Wq; Wk; Wv; Aq;
    /// Av]` in bf16, the step rounding the LoRA A rows in before each
    /// forward.
    pub stacks_bf16: Vec<CudaSlice<Bf16>>,
    /// Per layer, the frozen q/k/v bias `[b_q | b_k | b_v]`
    /// (`[q_dim + 2 kv_dim]`), zeros for a model without one: the fused
    /// q/k/v epilogue adds it.
    pub qkv_bias: Vec<CudaSlice<f32>>,
    pub final_norm: CudaSlice<f32>,
    /// The LM head `[vocab, hidden]`; `None` where it is tied to the
    /// embedding (read it through [`BaseDevice::head`]).
    pub lm_head: Option<Table>,
    /// With `f16_lm_head`: the head rounded to f16 (raw bits), which the
    /// head's GEMMs read instead.
    pub lm_head_f16: Option<CudaSlice<u16>>,
}

// The conversions below run on all cores (rayon): the larger presets hold
// hundreds of millions of values, and building a trainer converts each of
// them once or more before the upload.

fn to_f32(v: &[f64]) -> Vec<f32> {
    v.par_iter().map(|&x| x as f32).collect()
}

/// `v` as f32, then rounded to the nearest value of the 16-bit format `H`
/// (ties to even), as raw bits.
fn to_half<H: HalfFloat, T: Copy + Into<f64> + Sync>(v: &[T]) -> Vec<H> {
    v.par_iter().map(|&x| H::round(x.into() as f32)).collect()
}

/// `w^T` of a row-major `[rows, cols]` matrix, as f32: `[cols, rows]`. Each
/// task writes `TILE` rows of the transpose, in square tiles, so that both
/// the reads and the writes of a tile stay in cache.
fn transposed_f32(w: &[f64], rows: usize, cols: usize) -> Vec<f32> {
    const TILE: usize = 32;
    let mut t = vec![0.0f32; rows * cols];
    if rows == 0 {
        return t;
    }
    t.par_chunks_mut(TILE * rows)
        .enumerate()
        .for_each(|(tile, out)| {
            let c0 = tile * TILE;
            let c_end = (c0 + TILE).min(cols);
            for r0 in (0..rows).step_by(TILE) {
                for r in r0..(r0 + TILE).min(rows) {
                    for c in c0..c_end {
                        out[(c - c0) * rows + r] = w[r * cols + c] as f32;
                    }
                }
            }
        });
    t
}

/// The values of each of `draws` (each tensor drawn on all cores, see
/// [`crate::model::weights::uniform`]).
fn draw_all(seed: u64, draws: &[Draw]) -> Vec<Vec<f64>> {
    draws.par_iter().map(|d| d.values(seed)).collect()
}

/// One `[out_dim, in_dim]` projection from its drawn values `w` (the draws
/// of [`projection_draws`], as the host model's). With
/// `options.device_quantize`, an NF4 base is quantised by the device kernel
/// from the f32 values (block absmax rounded to f32 first, so a code may
/// differ from the host quantiser's f64 choice at a rounding boundary). An
/// fp32 base keeps `W^T` too when `options.transposed_weights` (under the
/// `backward_weights_untransposed` fault that copy holds `W` itself), and an
/// f16 copy made from `half_source` when `options.f16_projections` (`w`
/// itself but under the `f16_gate_from_up` fault).
/// With [`Values::Zeros`], `w` and `half_source` are empty and every buffer
/// is zeros.
fn linear(
    gpu: &mut GpuContext,
    values: Values,
    (w, half_source): (&[f64], &[f64]),
    (out_dim, in_dim): (usize, usize),
    options: &GpuTrainOptions,
) -> Result<Linear> {
    let n = out_dim * in_dim;
    let frozen = match (options.base, options.device_quantize) {
        (BaseWeights::Fp32, _) => Frozen::Fp32(values.put(gpu, n, || to_f32(w))?),
        (BaseWeights::Bf16, _) => Frozen::Bf16(values.put(gpu, n, || to_half(w))?),
        (BaseWeights::Nf4, _) if values == Values::Zeros => Frozen::Nf4(Nf4Device::zeros(gpu, n)?),
        (BaseWeights::Nf4, false) => {
            Frozen::Nf4(nf4_ops::upload(gpu, &nf4::quantize(w, nf4::BLOCK)?)?)
        }
        (BaseWeights::Nf4, true) => {
            let mut t = Nf4Device::zeros(gpu, n)?;
            let src = gpu.upload(&to_f32(w))?;
            nf4_ops::quantize(gpu, &src, &mut t)?;
            gpu.synchronize()?;
            Frozen::Nf4(t)
        }
    };
    let transposed = match frozen {
        Frozen::Fp32(_) if options.transposed_weights => {
            let untransposed = gpu.faults().backward_weights_untransposed;
            Some(values.put(gpu, n, || {
                if untransposed {
                    to_f32(w)
                } else {
                    transposed_f32(w, out_dim, in_dim)
                }
            })?)
        }
        _ => None,
    };
    let half = match frozen {
        Frozen::Fp32(_) if options.f16_projections => {
            Some(values.put(gpu, n, || to_half::<u16, _>(half_source))?)
        }
        _ => None,
    };
    Ok(Linear {
        out_dim,
        in_dim,
        w: frozen,
        transposed,
        half,
    })
}

impl BaseDevice {
    /// The base model of `cfg` for `seed`, stored as `options.base` says.
    /// Each layer's seven projections are drawn at once, then uploaded in
    /// order.
    pub fn init(
        gpu: &mut GpuContext,
        cfg: &ModelConfig,
        options: &GpuTrainOptions,
        seed: u64,
    ) -> Result<Self> {
        Self::with_values(gpu, cfg, options, Values::Seeded(seed))
    }

    /// The base model of `cfg` with `values`, stored as `options.base` says.
    /// A host model's projections are taken as they are (an NF4 base
    /// quantises them on the way up: load a checkpoint in fp32 for that).
    pub fn with_values(
        gpu: &mut GpuContext,
        cfg: &ModelConfig,
        options: &GpuTrainOptions,
        values: Values,
    ) -> Result<Self> {
        if let Values::Model(model) = values {
            if model.config != *cfg {
                return Err(Error::ShapeMismatch {
                    op: "weights",
                    expected: format!("a host model of configuration {}", cfg.name),
                    got: format!("one of {}", model.config.name),
                });
            }
        }
        let base = options.base;
        let mut layers = Vec::with_capacity(cfg.layers);
        let mut stacks = Vec::new();
        let mut stacks_f16 = Vec::new();
        let mut stacks_bf16 = Vec::new();
        // Projection order q, k, v, o, gate, up, down: the fault's source.
        let (gate, up) = (4, 5);
        let gate_source = if gpu.faults().f16_gate_from_up {
            up
        } else {
            gate
        };
        for layer in 0..cfg.layers {
            let draws = projection_draws(cfg, layer);
            let drawn = values.draw(&draws.map(|(d, _)| d))?;
            let stacked = |which: usize| base != BaseWeights::Nf4 && which < 3;
            if base != BaseWeights::Nf4 {
                // q, k, v (draws 0..3) in order, then zeros for the A rows.
                let len = draws[..3].iter().map(|(d, _)| d.len).sum::<usize>()
                    + 2 * cfg.lora_rank * cfg.hidden;
                let rows = || {
                    let mut rows: Vec<f32> = drawn[..3].iter().flat_map(|w| to_f32(w)).collect();
                    rows.resize(len, 0.0);
                    rows
                };
                if base == BaseWeights::Bf16 {
                    stacks_bf16.push(values.put(gpu, len, || to_half(&rows()))?);
                } else {
                    if options.f16_projections {
                        stacks_f16.push(values.put(gpu, len, || to_half::<u16, _>(&rows()))?);
                    }
                    stacks.push(values.put(gpu, len, rows)?);
                }
            }
            layers.push(LayerWeights::try_from_fn(|which| {
                if stacked(which) {
                    let (out_dim, in_dim) = draws[which].1;
                    return Ok(Linear {
                        out_dim,
                        in_dim,
                        w: Frozen::Stacked,
                        transposed: None,
                        half: None,
                    });
                }
                let half_source = if which == gate { gate_source } else { which };
                let (w, half) = (&drawn[which], &drawn[half_source]);
                linear(gpu, values, (w, half), draws[which].1, options)
            })?);
        }
        let bias_len = cfg.q_dim() + 2 * cfg.kv_dim();
        let qkv_bias = (0..cfg.layers)
            .map(|layer| values.qkv_bias(gpu, layer, bias_len))
            .collect::<Result<Vec<_>>>()?;
        // The embedding, then the head unless it is the embedding itself.
        let ends = end_draws(cfg);
        let drawn = if cfg.tied_embeddings {
            &ends[..1]
        } else {
            &ends[..]
        };
        let mut drawn = values.draw(drawn)?.into_iter();
        let embedding = drawn.next().ok_or_else(|| missing(0, "embedding"))?;
        let head = drawn.next();
        let end_len = cfg.vocab * cfg.hidden;
        // The fault rounds the embedding instead of the head.
        let f16_source = match &head {
            Some(h) if !gpu.faults().f16_lm_head_from_embedding => h,
            _ => &embedding,
        };
        let lm_head_f16 = if options.f16_lm_head {
            Some(values.put(gpu, end_len, || to_half::<u16, _>(f16_source))?)
        } else {
            None
        };
        let lm_head = match &head {
            Some(h) => Some(Table::put(gpu, values, base, h, end_len)?),
            None => None,
        };
        Ok(BaseDevice {
            embedding: Table::put(gpu, values, base, &embedding, end_len)?,
            layers,
            stacks,
            stacks_f16,
            stacks_bf16,
            qkv_bias,
            final_norm: values.final_norm(gpu, cfg.hidden)?,
            lm_head,
            lm_head_f16,
        })
    }

    /// The LM head `[vocab, hidden]`: the embedding table where the
    /// configuration ties them, the model's own head otherwise.
    pub fn head(&self) -> &Table {
        self.lm_head.as_ref().unwrap_or(&self.embedding)
    }

    /// Every frozen projection.
    pub fn linears(&self) -> Vec<&Linear> {
        self.layers.iter().flat_map(|l| l.all()).collect()
    }

    /// Bytes on the device.
    pub fn bytes(&self) -> usize {
        let head = self.lm_head.as_ref().map_or(0, Table::bytes);
        let bias: usize = self.qkv_bias.iter().map(|b| b.len()).sum();
        self.embedding.bytes()
            + head
            + 4 * (self.final_norm.len() + bias)
            + 2 * self.lm_head_f16.as_ref().map_or(0, |w| w.len())
            + 4 * self.stacks.iter().map(|s| s.len()).sum::<usize>()
            + 2 * self.stacks_f16.iter().map(|s| s.len()).sum::<usize>()
            + 2 * self.stacks_bf16.iter().map(|s| s.len()).sum::<usize>()
            + self.linears().iter().map(|l| l.bytes()).sum::<usize>()
    }
}

/// Trainable tensors (layout of [`Trainable::tensors`]) with their gradients
/// and AdamW moments.
pub struct Params {
    pub p: Vec<CudaSlice<f32>>,
    pub g: Vec<CudaSlice<f32>>,
    pub m: Vec<CudaSlice<f32>>,
    pub v: Vec<CudaSlice<f32>>,
    /// The LoRA scale `s`.
    pub scale: f64,
}

impl Params {
    /// `t` on the device, with zero gradients and moments.
    pub fn upload(gpu: &GpuContext, t: &Trainable) -> Result<Self> {
        Self::holding(gpu, t, |x| gpu.upload(&to_f32(x)))
    }

    /// `t`'s shapes on the device, all zeros (memsets, no copy): the
    /// trainable state of the pre-warm's rehearsal step.
    pub fn zeroed(gpu: &GpuContext, t: &Trainable) -> Result<Self> {
        Self::holding(gpu, t, |x| gpu.zeros(x.len()))
    }

    /// The parameters `put` makes of each of `t`'s tensors, with zero
    /// gradients and moments.
    fn holding(
        gpu: &GpuContext,
        t: &Trainable,
        put: impl Fn(&[f64]) -> Result<CudaSlice<f32>>,
    ) -> Result<Self> {
        let p = t
            .tensors
            .iter()
            .map(|x| put(x))
            .collect::<Result<Vec<_>>>()?;
        let zeros = || {
            t.tensors
                .iter()
                .map(|x| gpu.zeros::<f32>(x.len()))
                .collect::<Result<Vec<_>>>()
        };
        Ok(Params {
            p,
            g: zeros()?,
            m: zeros()?,
            v: zeros()?,
            scale: t.scale,
        })
    }

    /// Bytes on the device (parameters, gradients, two moments).
    pub fn bytes(&self) -> usize {
        16 * self.p.iter().map(|x| x.len()).sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A host model's tensors are found by the draws' ids: a tied head is
    /// the embedding, a projection its layer's, and a trainable id or a
    /// length the draw does not state is refused.
    #[test]
    fn a_host_models_tensors_are_found_by_id() {
        let tiny = ModelConfig::preset("tiny").unwrap();
        let cfg = ModelConfig {
            tied_embeddings: true,
            ..tiny
        };
        let model = BaseModel::init(&cfg, BaseWeights::Fp32, 3).unwrap();
        let [embedding, head] = end_draws(&cfg);
        assert_eq!(model_tensor(&model, head).unwrap(), model.embedding);
        assert_eq!(model_tensor(&model, embedding).unwrap(), model.embedding);
        let (up, _) = projection_draws(&cfg, 1)[5];
        assert_eq!(model_tensor(&model, up).unwrap(), model.layers[1].up.weight);
        let short = Draw {
            len: up.len - 1,
            ..up
        };
        assert!(model_tensor(&model, short).is_err());
        let lora = Draw {
            id: TensorId::Lora { layer: 0, which: 0 },
            ..up
        };
        assert!(model_tensor(&model, lora).is_err());
    }

    /// The tiled transpose moves element (r, c) to (c, r), across tile
    /// edges and for shapes that are not multiples of the tile.
    #[test]
    fn transposed_f32_swaps_rows_and_columns() {
        let (rows, cols) = (37, 70);
        let w: Vec<f64> = (0..rows * cols).map(|i| i as f64).collect();
        let t = transposed_f32(&w, rows, cols);
        for r in 0..rows {
            for c in 0..cols {
                assert_eq!(t[c * rows + r], w[r * cols + c] as f32);
            }
        }
    }
}
