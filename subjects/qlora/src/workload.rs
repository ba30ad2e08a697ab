//! The qlora subject's training workload, [`QloraTraining`], which the
//! core's driver-observed kinds (`driver_target_parity`, `driver_prewarm`,
//! `driver_capture`) drive: the GPU trainer of a model preset, trained
//! step by step under the driver observer.
//!
//! `prepare` builds a [`GpuTrainer`] on a cold in-memory kernel cache, so
//! every module the step uses is loaded inside the observed region: the
//! trainer pre-warms (loads every kernel module of the configuration's
//! step), then uploads its weights — the host-to-device copies
//! [`Workload::upload_bytes`] counts — and then builds its workspace. The
//! trainer is that of the preset's seeded model held on the host, as a
//! loaded checkpoint is ([`GpuTrainer::from_model`]): a trainer of the seed
//! alone draws its frozen weights on the device, which no host-to-device
//! copy would show the observer.
//! A step is [`GpuTrainer::step`]: with `graph`, the first step runs
//! eagerly, the second is captured and launched, later ones replay it; each
//! step synchronises the host once, to read the loss.
//!
//! The step runs the default mode of the training contracts: an fp32 base,
//! global clipping, the context's GEMM math, no kept `W^T` or f16 copies.

use falsify_core::{BoxError, OwnCounts, TrainSession, TrainSetup, Workload};
use qlora::gpu::{FaultScope, GpuContext};
use qlora::model::{BaseModel, ModelConfig, Trainable, PRESETS};
use qlora::train::{GpuTrainOptions, GpuTrainer, Hyper};
use qlora::Faults;

use crate::check::no_faults_left;
use crate::error::{Error, Result};
use crate::mutant::Mutant;
use crate::Qlora;

/// The names of the model presets, smallest first: the configurations the
/// workload trains.
pub const MODELS: [&str; PRESETS.len()] = {
    let mut names = [""; PRESETS.len()];
    let mut i = 0;
    while i < PRESETS.len() {
        names[i] = PRESETS[i].name;
        i += 1;
    }
    names
};

/// The GPU trainer of a model preset.
#[derive(Debug, Clone, Copy, Default)]
pub struct QloraTraining;

/// The preset `setup` names, at `setup.batch` samples per step and
/// `setup.seq_len` tokens per sample (the preset's own when none).
pub fn config(setup: &TrainSetup) -> Result<ModelConfig> {
    let preset = ModelConfig::preset(&setup.model).ok_or_else(|| Error::InvalidArgument {
        op: "workload",
        message: format!(
            "no model `{}`; the qlora workload trains {}",
            setup.model,
            MODELS.join(", ")
        ),
    })?;
    let cfg = preset.with_batch(setup.batch.max(1));
    Ok(match setup.seq_len {
        Some(seq_len) => cfg.with_seq_len(seq_len),
        None => cfg,
    })
}

/// The trainer's options for `setup`: the training contracts' default mode
/// (fp32 base, global clip, the context's GEMM math, nothing kept beside
/// the weights), graphed as `setup.graph` says, at `setup.learning_rate`
/// (the stack's default when none).
pub fn options(setup: &TrainSetup) -> GpuTrainOptions {
    let defaults = Hyper::default();
    GpuTrainOptions {
        graph: setup.graph,
        hyper: Hyper {
            lr: setup.learning_rate.unwrap_or(defaults.lr),
            ..defaults
        },
        ..GpuTrainOptions::default()
    }
}

/// Bytes [`GpuTrainer::from_model`] copies host to device for the host
/// model of `cfg` under [`options`] (an fp32 base, no kept `W^T` or f16
/// copy), all of them while it uploads the weights, after its pre-warm and
/// before its workspace:
///
/// ```text
/// 4 * ( layers * (projections + 2 r h)   q/k/v stack with the LoRA A rows (zeros), o, gate, up, down,
///                                        and the q/k/v bias where the model has one
///     + t vocab h + h                      embedding, LM head (t = 1 where tied, else 2), final norm
///     + trainable_params )                 LoRA A and B of q and v, both norms of every layer
/// ```
///
/// Gradients and AdamW moments are set on the device (memsets, no copy).
/// The workspace, the clip and optimizer tables and each step's batch are
/// copied after the weights, so the cumulative host-to-device bytes first
/// reach this count with the last weight copy.
pub fn weight_upload_bytes(cfg: &ModelConfig) -> u64 {
    let h = cfg.hidden;
    let projections = cfg.base_params_per_layer();
    let stacks_and_projections = cfg.layers * (projections + 2 * cfg.lora_rank * h);
    // The embedding, the head unless it is the embedding, the final norm.
    let tables = if cfg.tied_embeddings { 1 } else { 2 };
    let ends = tables * cfg.vocab * h + h;
    let floats = stacks_and_projections + ends + cfg.trainable_params();
    4 * floats as u64
}

/// Floats of one layer's q/k/v bias `[b_q | b_k | b_v]`, which the device
/// holds for every model (zeros set there for a model without one).
fn qkv_bias_floats(cfg: &ModelConfig) -> usize {
    cfg.q_dim() + 2 * cfg.kv_dim()
}

impl Workload<Qlora> for QloraTraining {
    fn models(&self) -> &[&'static str] {
        &MODELS
    }

    /// [`weight_upload_bytes`] of the setup's configuration.
    fn upload_bytes(&self, setup: &TrainSetup) -> Result<u64, BoxError> {
        Ok(weight_upload_bytes(&config(setup)?))
    }

    fn prepare<'d>(
        &self,
        device: &'d mut GpuContext,
        setup: &TrainSetup,
        mutant: Option<&Mutant>,
    ) -> Result<Box<dyn TrainSession + 'd>, BoxError> {
        let faults = mutant.map_or(Faults::NONE, |m| m.faults());
        Ok(Box::new(prepare(device, setup, faults)?))
    }
}

/// Builds the trainer with `faults` on, on a cold in-memory cache, and
/// checks that what it uploaded is what [`weight_upload_bytes`] counted.
fn prepare<'d>(
    gpu: &'d mut GpuContext,
    setup: &TrainSetup,
    faults: Faults,
) -> Result<QloraSession<'d>> {
    let cfg = config(setup)?;
    no_faults_left(gpu)?;
    // Modules a former trial of this process loaded would make pre-warm
    // load nothing inside the observed region.
    gpu.reset_cache();
    let model = BaseModel::init(&cfg, options(setup).base, setup.seed)?;
    let trainable = Trainable::init(&cfg, setup.seed);
    let mut gpu = gpu.with_faults(faults);
    let trainer = GpuTrainer::from_model(&mut gpu, &model, options(setup), setup.seed, &trainable)?;
    let (base, trainable_state, _) = trainer.accounted_bytes();
    // Every base byte on the device was copied from the host model (a
    // model without a q/k/v bias holds zeros set on the device, which
    // `base_params_per_layer` does not count either); of the trainable
    // state (parameters, gradients, two moments) a quarter was.
    let bias = if cfg.qkv_bias {
        0
    } else {
        4 * cfg.layers * qkv_bias_floats(&cfg)
    };
    let copied = (base - bias + trainable_state / 4) as u64;
    let counted = weight_upload_bytes(&cfg);
    if copied != counted {
        return Err(Error::InvalidArgument {
            op: "workload",
            message: format!(
                "model {}: the trainer holds {copied} bytes copied from the host, the workload \
                 counts {counted}: the observer's upload point would be wrong",
                cfg.name
            ),
        });
    }
    Ok(QloraSession { trainer, gpu })
}

/// A prepared trainer on its context, with the mutant's fault knobs on
/// until it is dropped.
struct QloraSession<'d> {
    trainer: GpuTrainer,
    gpu: FaultScope<'d>,
}

impl TrainSession for QloraSession<'_> {
    fn step(&mut self) -> Result<f32, BoxError> {
        let report = self
            .trainer
            .step(&mut self.gpu)
            .map_err(|e| Box::new(Error::from(e)) as BoxError)?;
        Ok(report.loss as f32)
    }

    /// `compilations_after_prewarm`: the modules the kernel cache loaded
    /// after pre-warm as PTX, which the driver JIT-compiles (the count the
    /// observer's JIT loads after the upload are held to); the cache
    /// compiles cubins for the device, so a module compiled late is a late
    /// load the driver sees, not a JIT. The sync counts are the trainer's
    /// own: every host read is one stream synchronisation. Modules loaded
    /// in all are not given: cuBLAS loads its own, which the cache does not
    /// see.
    fn own_counts(&self) -> Option<OwnCounts> {
        let jit_after_prewarm = self
            .gpu
            .compile_records()
            .iter()
            .filter(|r| r.after_prewarm && r.accepted && !r.arch.starts_with("sm_"))
            .count() as u64;
        let syncs = self.trainer.syncs();
        let steps = syncs.per_step.len();
        let per_step = syncs.per_step.iter().sum::<usize>() as f64 / steps.max(1) as f64;
        Some(OwnCounts {
            compilations_after_prewarm: Some(jit_after_prewarm),
            syncs_inside_capture: Some(syncs.inside_capture as u64),
            syncs_per_step: (steps > 0).then_some(per_step),
            modules_loaded: None,
            device_to_host_bytes: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use qlora::model::weights::{end_draws, projection_draws};
    use qlora::model::Trainable;
    use qlora::train::BaseWeights;

    use super::*;

    fn setup(model: &str, batch: usize, seq_len: Option<usize>) -> TrainSetup {
        TrainSetup {
            model: model.into(),
            batch,
            seq_len,
            graph: true,
            steps: 3,
            seed: 7,
            learning_rate: None,
        }
    }

    /// The floats of the host buffers `BaseDevice::init` (fp32 base) and
    /// `Params::upload` copy to the device, from the same draws and
    /// trainable tensors they are built from.
    fn host_buffer_floats(cfg: &ModelConfig, seed: u64) -> usize {
        let mut floats = 0;
        for layer in 0..cfg.layers {
            let draws = projection_draws(cfg, layer);
            // q, k, v stacked with two LoRA A blocks of zeros, then o,
            // gate, up, down on their own.
            floats += draws[..3].iter().map(|(d, _)| d.len).sum::<usize>();
            floats += 2 * cfg.lora_rank * cfg.hidden;
            floats += draws[3..].iter().map(|(d, _)| d.len).sum::<usize>();
            // The host model's q/k/v bias, where it has one.
            if cfg.qkv_bias {
                floats += qkv_bias_floats(cfg);
            }
        }
        let [embedding, lm_head] = end_draws(cfg);
        let head = if cfg.tied_embeddings { 0 } else { lm_head.len };
        floats += embedding.len + head + cfg.hidden;
        floats += Trainable::init(cfg, seed)
            .tensors
            .iter()
            .map(Vec::len)
            .sum::<usize>();
        floats
    }

    /// The upload the observer waits for is the bytes of the host buffers
    /// the trainer copies, for every preset.
    #[test]
    fn upload_bytes_are_the_host_buffers_the_trainer_copies() {
        for name in MODELS {
            let s = setup(name, 1, None);
            let cfg = config(&s).unwrap();
            let bytes = QloraTraining.upload_bytes(&s).unwrap();
            assert_eq!(bytes, 4 * host_buffer_floats(&cfg, s.seed) as u64, "{name}");
        }
        // small-4l: 4 layers of 256 wide (q 256, k and v 128, MLP 688),
        // vocab 4096, rank 8.
        let small = QloraTraining
            .upload_bytes(&setup("small-4l", 4, None))
            .unwrap();
        let per_layer = 3 * 256 * 256 + 3 * 256 * 688 + 2 * 8 * 256;
        let trainable_per_layer = 8 * 256 + 256 * 8 + 8 * 256 + 128 * 8 + 2 * 256;
        let floats = 4 * per_layer + 2 * 4096 * 256 + 256 + 4 * trainable_per_layer;
        assert_eq!(small, 4 * floats);
        assert_eq!(small, 20_177_920);
    }

    /// A Qwen2 with a q/k/v bias and a tied head copies one table, not
    /// two, and its biases.
    #[test]
    fn a_tied_head_is_one_table_and_the_bias_is_copied() {
        let small = ModelConfig::preset("small-4l").unwrap();
        let qwen2 = ModelConfig {
            qkv_bias: true,
            tied_embeddings: true,
            ..small
        };
        assert_eq!(
            weight_upload_bytes(&qwen2),
            4 * host_buffer_floats(&qwen2, 7) as u64
        );
        let one_table = 4 * (small.vocab * small.hidden) as u64;
        let biases = 4 * (small.layers * qkv_bias_floats(&small)) as u64;
        assert_eq!(
            weight_upload_bytes(&small) - weight_upload_bytes(&qwen2),
            one_table - biases
        );
    }

    /// The formula holds only for the mode it was derived for: a base or
    /// a kept copy the options turned on would copy other bytes.
    #[test]
    fn the_options_are_the_mode_the_byte_count_is_for() {
        let mut s = setup("small-4l", 4, Some(64));
        s.learning_rate = Some(2e-3);
        let o = options(&s);
        assert_eq!(o.base, BaseWeights::Fp32);
        assert!(!o.transposed_weights && !o.f16_lm_head && !o.f16_projections);
        assert!(o.graph);
        assert_eq!(o.hyper.lr, 2e-3);
        s.graph = false;
        assert!(!options(&s).graph);
        // Batch and sequence length change the workspace, not the weights.
        let cfg = config(&s).unwrap();
        assert_eq!((cfg.batch, cfg.seq_len), (4, 64));
        assert_eq!(
            QloraTraining.upload_bytes(&s).unwrap(),
            QloraTraining
                .upload_bytes(&setup("small-4l", 1, None))
                .unwrap()
        );
    }

    #[test]
    fn the_models_are_the_presets_and_others_are_refused_by_name() {
        assert_eq!(
            QloraTraining.models(),
            ModelConfig::preset_names().as_slice()
        );
        let e = QloraTraining
            .upload_bytes(&setup("gpt-17", 1, None))
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("no model `gpt-17`; the qlora workload trains tiny, small-4l"),
            "{e}"
        );
    }
}
