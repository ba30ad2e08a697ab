//! The frozen base model on the device, rebuilt tensor by tensor from the
//! same seeds as [`crate::model::BaseModel::init`] (so the GPU and the host
//! model are the same model), and the trainable tensors with their
//! gradients and AdamW moments.

use cudarc::driver::CudaSlice;

use crate::error::{Error, Result};
use crate::gpu::GpuContext;
use crate::model::nf4;
use crate::model::weights::{end_draws, projection_draws, Draw, Projections};
use crate::model::{ModelConfig, Trainable};
use crate::ops::nf4::{self as nf4_ops, Nf4Device};
use crate::train::BaseWeights;

/// How a frozen projection is stored on the device.
pub enum Frozen {
    Fp32(CudaSlice<f32>),
    Nf4(Nf4Device),
    /// fp32 rows of its layer's q/k/v stack ([`BaseDevice::stacks`]): q, k
    /// and v of an fp32 base, which the step multiplies as one matrix.
    Stacked,
}

/// A frozen `[out_dim, in_dim]` projection.
pub struct Linear {
    pub out_dim: usize,
    pub in_dim: usize,
    pub w: Frozen,
}

impl Linear {
    /// Bytes on the device.
    pub fn bytes(&self) -> usize {
        match &self.w {
            Frozen::Fp32(w) => 4 * w.len(),
            Frozen::Nf4(t) => t.codes.len() + 4 * t.absmax.len(),
            Frozen::Stacked => 0,
        }
    }
}

/// The frozen projections of one layer: q, k, v, o, gate, up, down.
pub type LayerWeights = Projections<Linear>;

/// The frozen base model on the device.
pub struct BaseDevice {
    pub embedding: CudaSlice<f32>,
    pub layers: Vec<LayerWeights>,
    /// fp32 base only, one per layer: `[Wq; Wk; Wv; Aq; Av]`, `[width,
    /// hidden]` (see [`crate::ops::rope::QkvShape::width`]). The q, k, v rows
    /// are the frozen weights (their `Linear`s are [`Frozen::Stacked`]); the
    /// step copies the trainable LoRA A rows in before each forward, so the
    /// projections and both LoRA down-projections are one GEMM.
    pub stacks: Vec<CudaSlice<f32>>,
    pub final_norm: CudaSlice<f32>,
    pub lm_head: CudaSlice<f32>,
}

fn to_f32(v: &[f64]) -> Vec<f32> {
    v.iter().map(|&x| x as f32).collect()
}

/// The values of each of `draws`, each tensor on a thread
/// of its own. Every tensor has its own seeded stream, so the values are
/// those of drawing one after another, only sooner: the larger presets draw
/// hundreds of millions of values, which on one thread takes seconds.
fn draw_all(seed: u64, draws: &[Draw]) -> Result<Vec<Vec<f64>>> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = draws
            .iter()
            .map(|&d| scope.spawn(move || d.values(seed)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().map_err(|_| Error::InvalidArgument {
                    op: "weights",
                    message: "a weight-drawing thread panicked".into(),
                })
            })
            .collect()
    })
}

/// One `[out_dim, in_dim]` projection from its drawn values `w` (the draws
/// of [`projection_draws`], as the host model's). With `on_device`, an NF4 base is
/// quantised by the device kernel from the f32 values (block absmax rounded
/// to f32 first, so a code may differ from the host quantiser's f64 choice
/// at a rounding boundary).
fn linear(
    gpu: &mut GpuContext,
    w: &[f64],
    (out_dim, in_dim): (usize, usize),
    base: BaseWeights,
    on_device: bool,
) -> Result<Linear> {
    let w = match (base, on_device) {
        (BaseWeights::Fp32, _) => Frozen::Fp32(gpu.upload(&to_f32(w))?),
        (BaseWeights::Nf4, false) => {
            Frozen::Nf4(nf4_ops::upload(gpu, &nf4::quantize(w, nf4::BLOCK)?)?)
        }
        (BaseWeights::Nf4, true) => {
            let n = w.len();
            let mut t = Nf4Device::zeros(gpu, n)?;
            let src = gpu.upload(&to_f32(w))?;
            nf4_ops::quantize(gpu, &src, &mut t)?;
            gpu.synchronize()?;
            Frozen::Nf4(t)
        }
    };
    Ok(Linear { out_dim, in_dim, w })
}

impl BaseDevice {
    /// The base model of `cfg` for `seed`, stored as `base`. Each layer's
    /// seven projections are drawn at once, then uploaded in order.
    pub fn init(
        gpu: &mut GpuContext,
        cfg: &ModelConfig,
        base: BaseWeights,
        seed: u64,
        quantize_on_device: bool,
    ) -> Result<Self> {
        let mut layers = Vec::with_capacity(cfg.layers);
        let mut stacks = Vec::new();
        for layer in 0..cfg.layers {
            let draws = projection_draws(cfg, layer);
            let drawn = draw_all(seed, &draws.map(|(d, _)| d))?;
            let stacked = |which: usize| base == BaseWeights::Fp32 && which < 3;
            if base == BaseWeights::Fp32 {
                // q, k, v (draws 0..3) in order, then zeros for the A rows.
                let mut rows: Vec<f32> = drawn[..3].iter().flat_map(|w| to_f32(w)).collect();
                rows.resize(rows.len() + 2 * cfg.lora_rank * cfg.hidden, 0.0);
                stacks.push(gpu.upload(&rows)?);
            }
            layers.push(LayerWeights::try_from_fn(|which| {
                if stacked(which) {
                    let (out_dim, in_dim) = draws[which].1;
                    return Ok(Linear {
                        out_dim,
                        in_dim,
                        w: Frozen::Stacked,
                    });
                }
                linear(gpu, &drawn[which], draws[which].1, base, quantize_on_device)
            })?);
        }
        let ends = draw_all(seed, &end_draws(cfg))?;
        Ok(BaseDevice {
            embedding: gpu.upload(&to_f32(&ends[0]))?,
            layers,
            stacks,
            final_norm: gpu.upload(&vec![1.0f32; cfg.hidden])?,
            lm_head: gpu.upload(&to_f32(&ends[1]))?,
        })
    }

    /// Every frozen projection.
    pub fn linears(&self) -> Vec<&Linear> {
        self.layers.iter().flat_map(|l| l.all()).collect()
    }

    /// Bytes on the device.
    pub fn bytes(&self) -> usize {
        4 * (self.embedding.len() + self.final_norm.len() + self.lm_head.len())
            + 4 * self.stacks.iter().map(|s| s.len()).sum::<usize>()
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
        let p = t
            .tensors
            .iter()
            .map(|x| gpu.upload(&to_f32(x)))
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
