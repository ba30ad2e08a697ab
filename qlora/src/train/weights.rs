//! The frozen base model on the device, rebuilt tensor by tensor from the
//! same seeds as [`crate::model::BaseModel::init`] (so the GPU and the host
//! model are the same model) or copied from a host model (a loaded
//! checkpoint), and the trainable tensors with their gradients and AdamW
//! moments.

use bytemuck::Pod;
use cudarc::driver::{CudaSlice, ValidAsZeroBits};
use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::gpu::{GpuContext, Stager};
use crate::model::nf4;
use crate::model::weights::{end_draws, projection_draws, Draw, Projections, TensorId};
use crate::model::{BaseModel, ModelConfig, Trainable};
use crate::ops::cast::f32_to_f16;
use crate::ops::cast::Bf16;
use crate::ops::draw::{self, Drawn};
use crate::ops::gemm::transpose_f32;
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

impl<'a> Values<'a> {
    /// The seeded values of each of `draws`, drawn whole (each on all
    /// cores), where `whole` says something reads them whole; none
    /// otherwise (they are read from [`Values::source`]).
    fn draw_whole(self, draws: &[Draw], whole: bool) -> Vec<Vec<f64>> {
        match self {
            Values::Seeded(seed) if whole => draws.par_iter().map(|d| d.values(seed)).collect(),
            _ => Vec::new(),
        }
    }

    /// A device buffer of `len` values in the format `T`: those of `parts`
    /// one after another, then zeros; all zeros for [`Values::Zeros`].
    /// Parts that are all streams are drawn on the device
    /// ([`crate::ops::draw`]: the same values, no host work and no copy);
    /// held ones go up through the staging buffers ([`Stager::upload`]).
    fn put<T: Drawn + Pod + ValidAsZeroBits>(
        self,
        (gpu, stager): (&mut GpuContext, &mut Stager),
        len: usize,
        parts: &[Source],
    ) -> Result<CudaSlice<T>> {
        let streams = parts.iter().all(|p| matches!(p, Source::Stream { .. }));
        match self {
            Values::Zeros => gpu.zeros(len),
            _ if streams => draw_parts(gpu, len, parts),
            _ => stager.upload(gpu, len, |start, out| {
                read_concat(parts, start, out, T::from_f64)
            }),
        }
    }

    /// Where the values of the tensor `d` are read from: its stream, the
    /// host model's tensor, or nowhere (zeros).
    fn source(self, d: Draw) -> Result<Source<'a>> {
        Ok(match self {
            Values::Seeded(seed) => Source::Stream { seed, draw: d },
            Values::Model(model) => Source::Held(model_slice(model, d)?),
            Values::Zeros => Source::Held(&[]),
        })
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
            Values::Seeded(_) => gpu.upload(&vec![1.0f32; len]),
            Values::Zeros => gpu.zeros(len),
        }
    }
}

/// The host model's values of the tensor `d` stands for (a tied head is
/// the embedding).
fn model_slice(model: &BaseModel, d: Draw) -> Result<&[f64]> {
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
    Ok(values)
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
    /// [`BaseDevice::stacks_bf16`] for a bf16 base, or the NF4 tensor of
    /// [`BaseDevice::stacks_nf4`] for an NF4 base): q, k and v, which the
    /// step multiplies as one matrix; or, with a base computing in bf16,
    /// rows of its layer's gate/up stack ([`BaseDevice::gate_up`]).
    Stacked,
}

/// A layer's `[Wg; Wu]` `[2 intermediate, hidden]`, the MLP's input
/// projections as one matrix, for a base computing in bf16: gate and up
/// are one GEMM, and their input gradients another.
pub enum GateUpWeight {
    /// A bf16 base's, in bf16.
    Bf16(CudaSlice<Bf16>),
    /// An NF4 base's as one NF4 tensor, dequantised to bf16 in one launch
    /// before each use. Each part is a whole number of blocks, so its codes
    /// and block absmax are those of gate and up quantised apart.
    Nf4(Nf4Device),
}

impl GateUpWeight {
    /// Bytes on the device.
    pub fn bytes(&self) -> usize {
        match self {
            GateUpWeight::Bf16(w) => 2 * w.len(),
            GateUpWeight::Nf4(t) => t.bytes(),
        }
    }
}

/// The embedding table or the LM head, `[vocab, hidden]`, on the device.
pub enum Table {
    F32(CudaSlice<f32>),
    /// A bf16 base's.
    Bf16(CudaSlice<Bf16>),
}

impl Table {
    /// The `len` values of `src` stored as `base` says: bf16 for a base
    /// that computes in bf16, f32 otherwise (an NF4 base keeps its tables
    /// in its compute format).
    fn put(
        (gpu, stager): (&mut GpuContext, &mut Stager),
        values: Values,
        base: BaseWeights,
        src: Source,
        len: usize,
    ) -> Result<Self> {
        Ok(match base.computes_in_bf16() {
            true => Table::Bf16(values.put((gpu, stager), len, &[src])?),
            false => Table::F32(values.put((gpu, stager), len, &[src])?),
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
            Frozen::Nf4(t) => t.bytes(),
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
    /// Bases computing in bf16 only, one per layer: `[Wg; Wu]`, the MLP's
    /// input projections as one matrix (their `Linear`s are
    /// [`Frozen::Stacked`]).
    pub gate_up: Vec<GateUpWeight>,
    /// NF4 bases only, one per layer: the q, k and v rows `[Wq; Wk; Wv]`
    /// as one NF4 tensor, which each layer dequantises into the
    /// workspace's stack in one launch. Each part is a whole number of
    /// blocks, so its codes and block absmax are those of the parts
    /// quantised apart.
    pub stacks_nf4: Vec<Nf4Device>,
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

fn to_f32(v: &[f64]) -> Vec<f32> {
    v.iter().map(|&x| x as f32).collect()
}

/// `parts`, all streams, drawn on the device one after another into a
/// buffer of `len` values whose tail stays zero.
fn draw_parts<T: Drawn + ValidAsZeroBits>(
    gpu: &mut GpuContext,
    len: usize,
    parts: &[Source],
) -> Result<CudaSlice<T>> {
    let total: usize = parts.iter().map(|p| p.len()).sum();
    if total > len {
        return Err(Error::ShapeMismatch {
            op: "weights",
            expected: format!("at most {len} values"),
            got: format!("{total} drawn"),
        });
    }
    let mut y = gpu.zeros::<T>(len)?;
    let mut offset = 0;
    for part in parts {
        if let Source::Stream { seed, draw } = *part {
            let mut view = y.slice_mut(offset..offset + draw.len);
            draw::uniform(gpu, &draw.stream(seed), 0, &mut view)?;
        }
        offset += part.len();
    }
    Ok(y)
}

/// The f64 values of one frozen tensor, read a range at a time as the
/// staging buffers are filled (on all cores, see [`Stager::upload`]).
#[derive(Debug, Clone, Copy)]
enum Source<'a> {
    /// Held on the host: drawn whole where the transpose or the host NF4
    /// quantiser reads it whole, or a loaded model's tensor.
    Held(&'a [f64]),
    /// Drawn from the tensor's seeded stream, never held whole: on the
    /// device where every part of its buffer is a stream ([`draw_parts`]),
    /// else on the host, a range at a time.
    Stream { seed: u64, draw: Draw },
}

impl<'a> Source<'a> {
    /// Number of values.
    fn len(self) -> usize {
        match self {
            Source::Held(v) => v.len(),
            Source::Stream { draw, .. } => draw.len,
        }
    }

    /// `convert` of values `start..start + out.len()` into `out`.
    fn read<T>(self, start: usize, out: &mut [T], convert: fn(f64) -> T) {
        match self {
            Source::Held(v) => {
                for (o, &x) in out.iter_mut().zip(v.iter().skip(start)) {
                    *o = convert(x);
                }
            }
            Source::Stream { seed, draw } => draw.values_into(seed, start, out, convert),
        }
    }

    /// The values whole: held ones only (the layer's draws are held
    /// wherever something reads them whole, see [`BaseDevice::push_layer`]).
    fn held(self) -> Result<&'a [f64]> {
        match self {
            Source::Held(v) => Ok(v),
            Source::Stream { draw, .. } => Err(Error::InvalidArgument {
                op: "weights",
                message: format!("{:?} was not drawn whole", draw.id),
            }),
        }
    }
}

/// `convert` of values `start..start + out.len()` of the concatenation of
/// `parts`, followed by zeros, into `out`.
fn read_concat<T>(parts: &[Source], start: usize, out: &mut [T], convert: fn(f64) -> T) {
    let end = start + out.len();
    let total: usize = parts.iter().map(|p| p.len()).sum();
    for o in out.iter_mut().skip(total.saturating_sub(start)) {
        *o = convert(0.0);
    }
    let mut offset = 0;
    for part in parts {
        let (lo, hi) = (start.max(offset), end.min(offset + part.len()));
        if let Some(dst) = out.get_mut(lo.saturating_sub(start)..hi.saturating_sub(start)) {
            part.read(lo - offset, dst, convert);
        }
        offset += part.len();
    }
}

/// One `[out_dim, in_dim]` projection from its drawn values `w` (the draws
/// of [`projection_draws`], as the host model's). An NF4 base quantises it
/// as [`nf4_of`] says. An fp32 base keeps `W^T` too when
/// `options.transposed_weights`, transposed on the device from the uploaded
/// `W` (under the `backward_weights_untransposed` fault that copy holds `W`
/// itself, uploaded again), and an
/// f16 copy when `options.f16_projections`: cast on the device from the
/// uploaded `W` (round to nearest even, as the host's `f16::from_f32`),
/// or, under the `f16_gate_from_up` fault, uploaded from `half_source`.
/// With [`Values::Zeros`], `w` and `half_source` are empty and every buffer
/// is zeros.
fn linear(
    (gpu, stager): (&mut GpuContext, &mut Stager),
    values: Values,
    (w, half_source): (Source, Source),
    (out_dim, in_dim): (usize, usize),
    options: &GpuTrainOptions,
) -> Result<Linear> {
    let n = out_dim * in_dim;
    let frozen = match options.base {
        BaseWeights::Fp32 => Frozen::Fp32(values.put((gpu, stager), n, &[w])?),
        BaseWeights::Bf16 => Frozen::Bf16(values.put((gpu, stager), n, &[w])?),
        BaseWeights::Nf4 | BaseWeights::Nf4Bf16 => {
            Frozen::Nf4(nf4_of((gpu, stager), options, values, ([w], [n]))?)
        }
    };
    let transposed = match &frozen {
        Frozen::Fp32(_)
            if options.transposed_weights && gpu.faults().backward_weights_untransposed =>
        {
            Some(values.put((gpu, stager), n, &[w])?)
        }
        Frozen::Fp32(device_w) if options.transposed_weights => {
            Some(transpose_f32(gpu, device_w, (out_dim, in_dim))?)
        }
        _ => None,
    };
    let half = match &frozen {
        Frozen::Fp32(_) if options.f16_projections && gpu.faults().f16_gate_from_up => {
            Some(values.put::<u16>((gpu, stager), n, &[half_source])?)
        }
        Frozen::Fp32(device_w) if options.f16_projections => {
            let mut copy = gpu.zeros::<u16>(n)?;
            f32_to_f16(gpu, &device_w.as_view(), &mut copy.as_view_mut())?;
            Some(copy)
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

/// `parts` (of `lens` values, each a whole number of blocks) quantised to
/// one NF4 tensor: zeros for [`Values::Zeros`]; with
/// `options.device_quantize` by the device kernel from the f32 values
/// (block absmax rounded to f32 first, so a code may differ from the host
/// quantiser's f64 choice at a rounding boundary); else by the host's
/// quantiser from the held f64 values. No block
/// straddles two parts, so the codes are those of the parts quantised apart
/// (as the host model quantises them): an NF4 base's q/k/v rows are one
/// tensor, each other projection one of its own.
fn nf4_of<const N: usize>(
    (gpu, stager): (&mut GpuContext, &mut Stager),
    options: &GpuTrainOptions,
    values: Values,
    (parts, lens): ([Source; N], [usize; N]),
) -> Result<Nf4Device> {
    for len in lens {
        nf4_ops::check_len("nf4_quantize", len)?;
    }
    let len = lens.iter().sum();
    if values == Values::Zeros {
        return Nf4Device::zeros(gpu, len);
    }
    if options.device_quantize {
        let mut t = Nf4Device::zeros(gpu, len)?;
        let src = values.put::<f32>((gpu, stager), len, &parts)?;
        nf4_ops::quantize(gpu, &src, &mut t)?;
        // The f32 values are a temporary, freed in stream order before the
        // synchronisation so that the memory pool returns their memory
        // there. Freed after it, the trainer's next small buffers were
        // placed in that memory and kept it held: 32 MiB more for
        // qwen2.5-0.5b and 192 MiB for qwen2.5-coder-1.5b once built, on an
        // H100 (F-MEM-002, F-MEM-001).
        drop(src);
        gpu.synchronize()?;
        return Ok(t);
    }
    // One part is quantised where it is held; several are joined first.
    let quantized = match parts.as_slice() {
        [one] => nf4::quantize(one.held()?, nf4::BLOCK)?,
        _ => {
            let mut whole = Vec::with_capacity(len);
            for part in parts {
                whole.extend_from_slice(part.held()?);
            }
            nf4::quantize(&whole, nf4::BLOCK)?
        }
    };
    nf4_ops::upload(gpu, &quantized)
}

impl BaseDevice {
    /// Each layer's own q/k/v stacks (none for an NF4 base, which fills
    /// the workspace's), as [`super::layer::LoraARows`] takes them; empty
    /// when no layer has one.
    pub(super) fn own_stacks(&self) -> Vec<super::layer::OwnStacks<'_>> {
        let layers = self.stacks.len().max(self.stacks_bf16.len());
        (0..layers)
            .map(|l| super::layer::OwnStacks {
                f32: self.stacks.get(l),
                f16: self.stacks_f16.get(l),
                bf16: self.stacks_bf16.get(l),
            })
            .collect()
    }

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
        let stager = &mut Stager::new();
        let mut base = BaseDevice {
            // Empty until `put_ends` uploads it, after the layers.
            embedding: Table::F32(gpu.zeros(0)?),
            layers: Vec::with_capacity(cfg.layers),
            stacks: Vec::new(),
            stacks_f16: Vec::new(),
            stacks_bf16: Vec::new(),
            gate_up: Vec::new(),
            stacks_nf4: Vec::new(),
            qkv_bias: Vec::with_capacity(cfg.layers),
            final_norm: values.final_norm(gpu, cfg.hidden)?,
            lm_head: None,
            lm_head_f16: None,
        };
        for layer in 0..cfg.layers {
            base.push_layer((gpu, stager), cfg, options, values, layer)?;
        }
        base.put_ends((gpu, stager), cfg, options, values)?;
        Ok(base)
    }

    /// Layer `layer`'s projections (its seven drawn at once), its q/k/v
    /// stack and bias.
    fn push_layer(
        &mut self,
        (gpu, stager): (&mut GpuContext, &mut Stager),
        cfg: &ModelConfig,
        options: &GpuTrainOptions,
        values: Values,
        layer: usize,
    ) -> Result<()> {
        let base = options.base;
        let draws = projection_draws(cfg, layer);
        // The host NF4 quantiser reads a projection whole.
        let whole = base.is_nf4() && !options.device_quantize;
        let drawn = values.draw_whole(&draws.map(|(d, _)| d), whole);
        let sources = draws
            .iter()
            .enumerate()
            .map(|(which, (d, _))| match drawn.get(which) {
                Some(v) => Ok(Source::Held(v)),
                None => values.source(*d),
            })
            .collect::<Result<Vec<_>>>()?;
        // The draws' lengths: with zeros, the sources hold none.
        let qkv_lens = [0, 1, 2].map(|which| draws[which].0.len);
        let qkv = [sources[0], sources[1], sources[2]];
        if base.is_nf4() {
            let t = nf4_of((gpu, stager), options, values, (qkv, qkv_lens))?;
            self.stacks_nf4.push(t);
        } else {
            let qkv_len = qkv_lens.iter().sum();
            self.push_stack((gpu, stager), cfg, options, values, (qkv, qkv_len))?;
        }
        // Projection order q, k, v, o, gate, up, down: the fault's source.
        let (gate, up) = (4, 5);
        let gate_source = if gpu.faults().f16_gate_from_up {
            up
        } else {
            gate
        };
        // The gate and up of a base computing in bf16: one `[Wg; Wu]`.
        let gate_up_stacked = base.computes_in_bf16();
        if gate_up_stacked {
            let lens = [draws[gate].0.len, draws[up].0.len];
            let parts = [sources[gate], sources[up]];
            self.gate_up.push(match base.is_nf4() {
                true => GateUpWeight::Nf4(nf4_of((gpu, stager), options, values, (parts, lens))?),
                false => {
                    GateUpWeight::Bf16(values.put((gpu, stager), lens[0] + lens[1], &parts)?)
                }
            });
        }
        self.layers.push(LayerWeights::try_from_fn(|which| {
            let (out_dim, in_dim) = draws[which].1;
            if which < 3 || (gate_up_stacked && (which == gate || which == up)) {
                return Ok(Linear {
                    out_dim,
                    in_dim,
                    w: Frozen::Stacked,
                    transposed: None,
                    half: None,
                });
            }
            let half_source = if which == gate { gate_source } else { which };
            let w = (sources[which], sources[half_source]);
            linear((gpu, stager), values, w, (out_dim, in_dim), options)
        })?);
        let bias_len = cfg.q_dim() + 2 * cfg.kv_dim();
        self.qkv_bias.push(values.qkv_bias(gpu, layer, bias_len)?);
        Ok(())
    }

    /// A layer's q/k/v stack: `qkv` (q, k, v in order, `qkv_len` values),
    /// then zeros for the LoRA A rows; bf16 for a bf16 base, else f32 and,
    /// with `f16_projections`, an f16 copy.
    fn push_stack(
        &mut self,
        (gpu, stager): (&mut GpuContext, &mut Stager),
        cfg: &ModelConfig,
        options: &GpuTrainOptions,
        values: Values,
        (qkv, qkv_len): ([Source; 3], usize),
    ) -> Result<()> {
        let len = qkv_len + 2 * cfg.lora_rank * cfg.hidden;
        if options.base == BaseWeights::Bf16 {
            self.stacks_bf16.push(values.put((gpu, stager), len, &qkv)?);
            return Ok(());
        }
        if options.f16_projections {
            self.stacks_f16.push(values.put((gpu, stager), len, &qkv)?);
        }
        self.stacks.push(values.put((gpu, stager), len, &qkv)?);
        Ok(())
    }

    /// The embedding, then the head unless it is the embedding itself, and
    /// the head's f16 copy; read from their streams, never held whole.
    fn put_ends(
        &mut self,
        (gpu, stager): (&mut GpuContext, &mut Stager),
        cfg: &ModelConfig,
        options: &GpuTrainOptions,
        values: Values,
    ) -> Result<()> {
        let [embedding, head] = end_draws(cfg);
        let embedding = values.source(embedding)?;
        let head = match cfg.tied_embeddings {
            true => None,
            false => Some(values.source(head)?),
        };
        let len = cfg.vocab * cfg.hidden;
        // The fault rounds the embedding instead of the head.
        let f16_source = match head {
            Some(h) if !gpu.faults().f16_lm_head_from_embedding => h,
            _ => embedding,
        };
        if options.f16_lm_head {
            self.lm_head_f16 = Some(values.put::<u16>((gpu, stager), len, &[f16_source])?);
        }
        if let Some(h) = head {
            self.lm_head = Some(Table::put((gpu, stager), values, options.base, h, len)?);
        }
        self.embedding = Table::put((gpu, stager), values, options.base, embedding, len)?;
        Ok(())
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
            + self.gate_up.iter().map(GateUpWeight::bytes).sum::<usize>()
            + self.stacks_nf4.iter().map(Nf4Device::bytes).sum::<usize>()
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
        assert_eq!(model_slice(&model, head).unwrap(), &model.embedding[..]);
        assert_eq!(
            model_slice(&model, embedding).unwrap(),
            &model.embedding[..]
        );
        let (up, _) = projection_draws(&cfg, 1)[5];
        assert_eq!(
            model_slice(&model, up).unwrap(),
            &model.layers[1].up.weight[..]
        );
        let short = Draw {
            len: up.len - 1,
            ..up
        };
        assert!(model_slice(&model, short).is_err());
        let lora = Draw {
            id: TensorId::Lora { layer: 0, which: 0 },
            ..up
        };
        assert!(model_slice(&model, lora).is_err());
    }

    /// Reads `fill` in ranges of `step` values, as the stager does.
    fn read_in_steps<T: Default + Clone>(
        len: usize,
        step: usize,
        fill: impl Fn(usize, &mut [T]),
    ) -> Vec<T> {
        let mut out = vec![T::default(); len];
        for (k, chunk) in out.chunks_mut(step).enumerate() {
            fill(k * step, chunk);
        }
        out
    }

    /// A q/k/v stack reads its three parts in order (held or drawn where
    /// read), then zeros, across
    /// range boundaries (the staging buffer holds the last chunk's values
    /// until they are overwritten).
    #[test]
    fn read_concat_reads_the_parts_then_zeros() {
        let draw = Draw {
            id: TensorId::Proj { layer: 0, which: 1 },
            len: 5,
            std: 1.0,
        };
        let parts: [Vec<f64>; 3] = [vec![1.0, 2.0], draw.values(3), vec![4.0, 5.0, 6.0]];
        let stream = Source::Stream { seed: 3, draw };
        let refs = [Source::Held(&parts[0]), stream, Source::Held(&parts[2])];
        let want: Vec<f32> = parts
            .concat()
            .iter()
            .map(|&v| v as f32)
            .chain([0.0; 6])
            .collect();
        for step in [1, 3, 4, 16] {
            let fill = |s, o: &mut [f32]| {
                o.fill(f32::NAN);
                read_concat(&refs, s, o, f32::from_f64)
            };
            assert_eq!(read_in_steps(want.len(), step, fill), want, "step {step}");
        }
    }

    /// A tensor read from its stream is the drawn tensor, converted.
    #[test]
    fn a_stream_reads_the_drawn_values() {
        let cfg = ModelConfig::preset("tiny").unwrap();
        let [embedding, _] = end_draws(&cfg);
        let held = embedding.values(9);
        let want: Vec<Bf16> = held.iter().map(|&v| Bf16::from_f64(v)).collect();
        let stream = Source::Stream {
            seed: 9,
            draw: embedding,
        };
        let from_stream = |s, o: &mut [Bf16]| stream.read(s, o, Bf16::from_f64);
        assert_eq!(read_in_steps(held.len(), 1000, from_stream), want);
        let from_held = |s, o: &mut [Bf16]| Source::Held(&held).read(s, o, Bf16::from_f64);
        assert_eq!(read_in_steps(held.len(), 777, from_held), want);
    }
}
