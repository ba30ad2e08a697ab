//! Loading a Hugging Face Qwen2 checkpoint directory into the host model.
//!
//! A directory holds `config.json` and either `model.safetensors` or shards
//! `model-0000N-of-0000M.safetensors` listed by `model.safetensors.index.json`
//! (`{"weight_map": {tensor: shard file}}`). Files are memory-mapped and read
//! through the `safetensors` crate; tensors may be f32, bf16 or f16 and are
//! widened to f64 exactly (every f32, bf16 and f16 value is an f64 value),
//! then stored as the base format asks: the frozen projections rounded to f32
//! or quantised to NF4 ([`FrozenLinear`]), everything else in f32 precision.
//!
//! Tensor names are Hugging Face's: `model.embed_tokens.weight`,
//! `model.layers.{i}.self_attn.{q,k,v,o}_proj.weight` (and the q/k/v
//! `.bias`), `model.layers.{i}.mlp.{gate,up,down}_proj.weight`,
//! `model.layers.{i}.{input,post_attention}_layernorm.weight`,
//! `model.norm.weight` and, for an untied head, `lm_head.weight`. Weights
//! are `[out, in]`, the layout of [`FrozenLinear`].
//!
//! Every error names the file, and the tensor where one is at fault.

use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::tensor::{Dtype, SafeTensors};
use serde::Deserialize;

use super::weights::{to_f32_precision, FrozenLayer, FrozenLinear};
use super::{BaseModel, ModelConfig, Slot, Trainable};
use crate::error::{Error, Result};
use crate::train::BaseWeights;

/// The configuration file of a checkpoint directory.
pub const CONFIG_FILE: &str = "config.json";
/// The weights of an unsharded checkpoint.
pub const WEIGHTS_FILE: &str = "model.safetensors";
/// The index of a sharded checkpoint.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// The training settings a loaded configuration starts with (the
/// checkpoint has none): change them with [`ModelConfig::with_batch`],
/// [`ModelConfig::with_seq_len`] or `lora_rank`.
const LOADED: (usize, usize, usize) = (1, 128, 8);

/// The part of a Qwen2 `config.json` the model needs; the rest is ignored.
#[derive(Debug, Deserialize)]
struct HfConfig {
    model_type: String,
    hidden_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    /// Absent means no grouping: as many kv heads as heads.
    num_key_value_heads: Option<usize>,
    /// Absent means `hidden_size / num_attention_heads`.
    head_dim: Option<usize>,
    intermediate_size: usize,
    vocab_size: usize,
    rms_norm_eps: f64,
    /// transformers 4.x writes theta here ...
    rope_theta: Option<f64>,
    /// ... and transformers 5 here.
    rope_parameters: Option<RopeParameters>,
    #[serde(default)]
    rope_scaling: Option<serde_json::Value>,
    /// Qwen2's default is an untied head.
    #[serde(default)]
    tie_word_embeddings: bool,
    hidden_act: Option<String>,
    #[serde(default)]
    use_sliding_window: bool,
}

#[derive(Debug, Deserialize)]
struct RopeParameters {
    rope_theta: f64,
    rope_type: Option<String>,
}

/// Qwen2Config's RoPE theta where `config.json` names none.
const HF_DEFAULT_ROPE_THETA: f64 = 10_000.0;

fn bad_file(path: &Path, message: impl Into<String>) -> Error {
    Error::Checkpoint {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

fn bad_tensor(path: &Path, tensor: &str, message: impl Into<String>) -> Error {
    Error::CheckpointTensor {
        path: path.to_path_buf(),
        tensor: tensor.to_string(),
        message: message.into(),
    }
}

fn read_text(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|e| bad_file(path, format!("cannot read: {e}")))
}

/// The model configuration of `config.json` at `path` (a Qwen2 decoder:
/// q/k/v bias, SiLU MLP, plain RoPE, full attention).
pub fn read_config(path: &Path) -> Result<ModelConfig> {
    let hf: HfConfig =
        serde_json::from_str(&read_text(path)?).map_err(|e| bad_file(path, e.to_string()))?;
    to_model_config(&hf).map_err(|m| bad_file(path, m))
}

/// The Qwen2 configuration `hf` describes, or what this model does not compute.
fn to_model_config(hf: &HfConfig) -> std::result::Result<ModelConfig, String> {
    if hf.model_type != "qwen2" {
        return Err(format!(
            "model_type {:?}: only \"qwen2\" is supported",
            hf.model_type
        ));
    }
    if hf.hidden_act.as_deref().is_some_and(|a| a != "silu") {
        return Err(format!("hidden_act {:?}: only \"silu\"", hf.hidden_act));
    }
    if hf.use_sliding_window {
        return Err("use_sliding_window: only full attention is supported".into());
    }
    let rope_type = hf
        .rope_parameters
        .as_ref()
        .and_then(|r| r.rope_type.as_deref());
    if hf.rope_scaling.as_ref().is_some_and(|v| !v.is_null())
        || rope_type.is_some_and(|t| t != "default")
    {
        return Err("RoPE scaling: only the default RoPE is supported".into());
    }
    let heads = hf.num_attention_heads;
    let kv_heads = hf.num_key_value_heads.unwrap_or(heads);
    let head_dim = hf
        .head_dim
        .unwrap_or(hf.hidden_size.checked_div(heads).unwrap_or(0));
    if kv_heads == 0
        || !heads.is_multiple_of(kv_heads)
        || head_dim == 0
        || !head_dim.is_multiple_of(2)
    {
        return Err(format!(
            "{heads} heads, {kv_heads} kv heads, head_dim {head_dim}: need kv heads dividing heads and an even head_dim"
        ));
    }
    let rope_theta = match (&hf.rope_parameters, hf.rope_theta) {
        (Some(r), _) => r.rope_theta,
        (None, Some(t)) => t,
        (None, None) => HF_DEFAULT_ROPE_THETA,
    };
    let (batch, seq_len, lora_rank) = LOADED;
    Ok(ModelConfig {
        name: "checkpoint",
        layers: hf.num_hidden_layers,
        hidden: hf.hidden_size,
        heads,
        kv_heads,
        head_dim,
        intermediate: hf.intermediate_size,
        vocab: hf.vocab_size,
        seq_len,
        batch,
        lora_rank,
        qkv_bias: true,
        tied_embeddings: hf.tie_word_embeddings,
        rope_theta,
        rms_eps: hf.rms_norm_eps,
    })
}

/// A loaded checkpoint: the frozen base and the per-layer norm weights,
/// which this stack trains and so keeps with the trainable tensors.
#[derive(Debug, Clone, PartialEq)]
pub struct Checkpoint {
    pub base: BaseModel,
    /// Per layer: the weights of `input_layernorm` and
    /// `post_attention_layernorm`, `[hidden]` each.
    pub norms: Vec<[Vec<f64>; 2]>,
}

impl Checkpoint {
    /// Loads the checkpoint directory `dir`, storing the projections as
    /// `base` says. Nothing is returned unless every tensor loaded.
    pub fn load(dir: &Path, base: BaseWeights) -> Result<Checkpoint> {
        let cfg = read_config(&dir.join(CONFIG_FILE))?;
        let files = Files::open(dir)?;
        let tensors = Tensors::parse(&files)?;
        load_model(&cfg, &tensors, base)
    }

    /// The trainable tensors at their start ([`Trainable::init`] with
    /// `seed`), with the checkpoint's norm weights in place of ones.
    pub fn trainable(&self, seed: u64) -> Trainable {
        let mut t = Trainable::init(&self.base.config, seed);
        for (layer, [attn, mlp]) in self.norms.iter().enumerate() {
            t.tensors[Trainable::index(layer, Slot::AttnNorm)] = attn.clone();
            t.tensors[Trainable::index(layer, Slot::MlpNorm)] = mlp.clone();
        }
        t
    }

    /// The same checkpoint with LoRA rank `r` (the trainable layout depends on it).
    pub fn with_lora_rank(mut self, r: usize) -> Checkpoint {
        self.base.config.lora_rank = r;
        self
    }
}

/// The memory-mapped safetensors files of a directory, and which file holds
/// each tensor (`None`: the one file of an unsharded checkpoint).
struct Files {
    maps: Vec<(PathBuf, Mmap)>,
    /// With an index: tensor name to position in `maps`, and the index's path.
    index: Option<(PathBuf, HashMap<String, usize>)>,
}

#[derive(Debug, Deserialize)]
struct Index {
    weight_map: HashMap<String, String>,
}

fn map(path: &Path) -> Result<Mmap> {
    let file = File::open(path).map_err(|e| bad_file(path, format!("cannot open: {e}")))?;
    // SAFETY: the map is read-only and private to this load; it is only
    // read through `SafeTensors`, which bounds-checks every tensor against
    // its length, and it is dropped before the load returns. The one
    // hazard of a file map, another process truncating or rewriting the
    // checkpoint during the load, is outside what a reader can prevent
    // (the same holds for every safetensors reader that maps).
    unsafe { Mmap::map(&file) }.map_err(|e| bad_file(path, format!("cannot map: {e}")))
}

impl Files {
    fn open(dir: &Path) -> Result<Files> {
        let index_path = dir.join(INDEX_FILE);
        if !index_path.exists() {
            let path = dir.join(WEIGHTS_FILE);
            let m = map(&path)?;
            return Ok(Files {
                maps: vec![(path, m)],
                index: None,
            });
        }
        let index: Index = serde_json::from_str(&read_text(&index_path)?)
            .map_err(|e| bad_file(&index_path, e.to_string()))?;
        let shards: BTreeSet<&String> = index.weight_map.values().collect();
        let mut maps = Vec::with_capacity(shards.len());
        for shard in &shards {
            let path = dir.join(shard);
            if !path.is_file() {
                let msg = format!("names shard {shard}, which is missing ({})", path.display());
                return Err(bad_file(&index_path, msg));
            }
            maps.push((path.clone(), map(&path)?));
        }
        // Every shard named in the map is in `shards`, so each tensor finds its file.
        let of = index
            .weight_map
            .iter()
            .filter_map(|(t, s)| shards.iter().position(|x| *x == s).map(|i| (t.clone(), i)))
            .collect();
        Ok(Files {
            maps,
            index: Some((index_path, of)),
        })
    }
}

/// The parsed headers of [`Files`]: every tensor readable by name.
struct Tensors<'a> {
    files: &'a Files,
    parsed: Vec<SafeTensors<'a>>,
}

impl<'a> Tensors<'a> {
    fn parse(files: &'a Files) -> Result<Tensors<'a>> {
        let parsed = files
            .maps
            .iter()
            .map(|(path, m)| {
                SafeTensors::deserialize(m)
                    .map_err(|e| bad_file(path, format!("not a complete safetensors file: {e}")))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Tensors { files, parsed })
    }

    /// Tensor `name` of shape `shape`, widened to f64.
    fn get(&self, name: &str, shape: &[usize]) -> Result<Vec<f64>> {
        let at = match &self.files.index {
            None => 0,
            Some((index_path, of)) => *of
                .get(name)
                .ok_or_else(|| bad_tensor(index_path, name, "missing from the index"))?,
        };
        let path = &self.files.maps[at].0;
        let view = self.parsed[at]
            .tensor(name)
            .map_err(|_| bad_tensor(path, name, "missing"))?;
        if view.shape() != shape {
            let msg = format!("shape {:?}, expected {shape:?}", view.shape());
            return Err(bad_tensor(path, name, msg));
        }
        widen(view.dtype(), view.data()).map_err(|m| bad_tensor(path, name, m))
    }
}

/// A tensor read from a safetensors file: its shape and its values, widened to f64.
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    pub shape: Vec<usize>,
    pub values: Vec<f64>,
}

/// Every tensor of the safetensors file at `path` (f32, bf16 or f16), by name.
pub fn read_tensors(path: &Path) -> Result<HashMap<String, HostTensor>> {
    let m = map(path)?;
    let st = SafeTensors::deserialize(&m)
        .map_err(|e| bad_file(path, format!("not a complete safetensors file: {e}")))?;
    st.iter()
        .map(|(name, v)| {
            let values = widen(v.dtype(), v.data()).map_err(|e| bad_tensor(path, name, e))?;
            let shape = v.shape().to_vec();
            Ok((name.to_string(), HostTensor { shape, values }))
        })
        .collect()
}

/// Little-endian `bytes` of `dtype` as f64: f32, bf16 (the top half of an
/// f32) and f16 are all exact in f64.
fn widen(dtype: Dtype, bytes: &[u8]) -> std::result::Result<Vec<f64>, String> {
    let pairs = || {
        bytes
            .chunks_exact(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    match dtype {
        Dtype::F32 => Ok(bytes
            .chunks_exact(4)
            .map(|b| f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])))
            .collect()),
        Dtype::BF16 => Ok(pairs()
            .map(|h| f64::from(half::bf16::from_bits(h)))
            .collect()),
        Dtype::F16 => Ok(pairs()
            .map(|h| f64::from(half::f16::from_bits(h)))
            .collect()),
        other => Err(format!("dtype {other:?}, expected F32, BF16 or F16")),
    }
}

/// Hugging Face's names of a layer's projections, q to down (the order of
/// [`FrozenLayer::try_from_fn`]).
const PROJECTIONS: [&str; 7] = [
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
];

fn load_model(cfg: &ModelConfig, t: &Tensors, base: BaseWeights) -> Result<Checkpoint> {
    let (h, v) = (cfg.hidden, cfg.vocab);
    let shapes = super::weights::projection_shapes(cfg);
    let mut layers = Vec::with_capacity(cfg.layers);
    let mut norms = Vec::with_capacity(cfg.layers);
    for l in 0..cfg.layers {
        let p = format!("model.layers.{l}");
        layers.push(FrozenLayer::try_from_fn(|which| {
            let (out_dim, in_dim) = shapes[which];
            let name = format!("{p}.{}", PROJECTIONS[which]);
            let w = t.get(&format!("{name}.weight"), &[out_dim, in_dim])?;
            let linear = FrozenLinear::new(w, (out_dim, in_dim), base)?;
            if cfg.qkv_bias && which < 3 {
                return Ok(linear.with_bias(t.get(&format!("{name}.bias"), &[out_dim])?));
            }
            Ok::<_, Error>(linear)
        })?);
        let norm =
            |n: &str| Ok::<_, Error>(to_f32_precision(t.get(&format!("{p}.{n}.weight"), &[h])?));
        norms.push([norm("input_layernorm")?, norm("post_attention_layernorm")?]);
    }
    let embedding = to_f32_precision(t.get("model.embed_tokens.weight", &[v, h])?);
    let lm_head = if cfg.tied_embeddings {
        Vec::new()
    } else {
        to_f32_precision(t.get("lm_head.weight", &[v, h])?)
    };
    let base = BaseModel {
        config: *cfg,
        embedding,
        layers,
        final_norm: to_f32_precision(t.get("model.norm.weight", &[h])?),
        lm_head,
    };
    Ok(Checkpoint { base, norms })
}

#[cfg(test)]
mod tests {
    use super::*;
    use safetensors::tensor::TensorView;

    fn fixture() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/qwen2-tiny")
    }

    /// The fixture's tensors: name, dtype, shape, bytes.
    type Raw = Vec<(String, Dtype, Vec<usize>, Vec<u8>)>;

    fn fixture_tensors() -> Raw {
        let bytes = std::fs::read(fixture().join(WEIGHTS_FILE)).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let mut raw: Raw = st
            .iter()
            .map(|(n, v)| {
                (
                    n.to_string(),
                    v.dtype(),
                    v.shape().to_vec(),
                    v.data().to_vec(),
                )
            })
            .collect();
        raw.sort_by(|a, b| a.0.cmp(&b.0));
        raw
    }

    fn write_tensors(path: &Path, raw: &Raw) {
        let views = raw
            .iter()
            .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()));
        std::fs::write(path, safetensors::serialize(views, None).unwrap()).unwrap();
    }

    /// A checkpoint directory with the fixture's config and `raw` as its one file.
    fn checkpoint_with(raw: &Raw) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(fixture().join(CONFIG_FILE), dir.path().join(CONFIG_FILE)).unwrap();
        write_tensors(&dir.path().join(WEIGHTS_FILE), raw);
        dir
    }

    fn load_err(dir: &Path) -> String {
        Checkpoint::load(dir, BaseWeights::Fp32)
            .unwrap_err()
            .to_string()
    }

    /// f32 values as bf16 or f16 bytes (round to nearest).
    fn narrow(raw: &Raw, dtype: Dtype) -> Raw {
        let to = |x: f32| match dtype {
            Dtype::BF16 => half::bf16::from_f32(x).to_bits(),
            _ => half::f16::from_f32(x).to_bits(),
        };
        let conv = |b: &[u8]| -> Vec<u8> {
            b.chunks_exact(4)
                .flat_map(|c| to(f32::from_le_bytes([c[0], c[1], c[2], c[3]])).to_le_bytes())
                .collect()
        };
        raw.iter()
            .map(|(n, _, s, b)| (n.clone(), dtype, s.clone(), conv(b)))
            .collect()
    }

    #[test]
    fn the_fixture_loads_with_its_configuration() {
        let c = Checkpoint::load(&fixture(), BaseWeights::Fp32).unwrap();
        let cfg = c.base.config;
        assert_eq!(
            (cfg.layers, cfg.hidden, cfg.heads, cfg.kv_heads),
            (2, 64, 4, 2)
        );
        assert_eq!((cfg.head_dim, cfg.intermediate, cfg.vocab), (16, 128, 256));
        assert!(cfg.qkv_bias && cfg.tied_embeddings);
        assert_eq!((cfg.rope_theta, cfg.rms_eps), (25_000.0, 1e-3));
        assert!(c.base.lm_head.is_empty() && c.base.head() == c.base.embedding.as_slice());
        let q = &c.base.layers[1].q;
        assert_eq!(q.bias.as_ref().map(Vec::len), Some(64));
        assert!(q.bias.iter().flatten().any(|&b| b != 0.0));
        assert!(c.norms[0][1].iter().any(|&g| g != 1.0));
        let t = c.trainable(3);
        assert_eq!(t.get(1, Slot::MlpNorm), c.norms[1][1].as_slice());
        assert!(t.get(1, Slot::QB).iter().all(|&b| b == 0.0));
    }

    /// Two shards with an index load to the same model as one file.
    #[test]
    fn a_sharded_checkpoint_loads_like_one_file() {
        let raw = fixture_tensors();
        let dir = checkpoint_with(&raw);
        std::fs::remove_file(dir.path().join(WEIGHTS_FILE)).unwrap();
        let (a, b) = raw.split_at(raw.len() / 2);
        let mut map = serde_json::Map::new();
        for (i, part) in [a, b].into_iter().enumerate() {
            let file = format!("model-0000{}-of-00002.safetensors", i + 1);
            write_tensors(&dir.path().join(&file), &part.to_vec());
            for (n, ..) in part {
                map.insert(n.clone(), file.clone().into());
            }
        }
        let index = serde_json::json!({ "metadata": {}, "weight_map": map });
        std::fs::write(dir.path().join(INDEX_FILE), index.to_string()).unwrap();
        let sharded = Checkpoint::load(dir.path(), BaseWeights::Fp32).unwrap();
        assert_eq!(
            sharded,
            Checkpoint::load(&fixture(), BaseWeights::Fp32).unwrap()
        );
    }

    /// bf16 and f16 tensors load to the f32 values rounded to their format
    /// (relative error at most their unit roundoff, 2^-8 and 2^-11, and not zero).
    #[test]
    fn bf16_and_f16_tensors_widen_exactly() {
        let f32s = Checkpoint::load(&fixture(), BaseWeights::Fp32).unwrap();
        for (dtype, bound) in [(Dtype::BF16, 2f64.powi(-8)), (Dtype::F16, 2f64.powi(-11))] {
            let dir = checkpoint_with(&narrow(&fixture_tensors(), dtype));
            let c = Checkpoint::load(dir.path(), BaseWeights::Fp32).unwrap();
            let (w, w32) = (
                &c.base.layers[0].gate.weight,
                &f32s.base.layers[0].gate.weight,
            );
            let worst = w
                .iter()
                .zip(w32)
                .filter(|(_, b)| b.abs() > 1e-3)
                .map(|(a, b)| ((a - b) / b).abs())
                .fold(0.0, f64::max);
            assert!(worst <= bound && worst > 0.0, "{dtype:?}: {worst}");
        }
    }

    /// The fixture with tensor `name` changed by `f` (removed where `f` returns `None`).
    fn edited(name: &str, f: impl Fn(&mut (String, Dtype, Vec<usize>, Vec<u8>)) -> bool) -> Raw {
        let mut raw = fixture_tensors();
        raw.retain_mut(|t| t.0 != name || f(t));
        raw
    }

    /// Each bad checkpoint gives an error that names its file and, where
    /// one tensor is at fault, that tensor.
    #[test]
    fn bad_checkpoints_give_located_errors() {
        let v_bias = "model.layers.1.self_attn.v_proj.bias";
        let q = "model.layers.0.self_attn.q_proj.weight";
        let missing = checkpoint_with(&edited(v_bias, |_| false));
        let shape = checkpoint_with(&edited(q, |t| {
            t.2 = vec![32, 128];
            true
        }));
        let dtype = checkpoint_with(&edited(q, |t| {
            t.1 = Dtype::I32;
            true
        }));
        let cases: Vec<(&Path, Vec<&str>)> = vec![
            (missing.path(), vec!["model.safetensors", v_bias, "missing"]),
            (
                shape.path(),
                vec!["model.safetensors", q, "shape [32, 128], expected [64, 64]"],
            ),
            (
                dtype.path(),
                vec![
                    "model.safetensors",
                    q,
                    "dtype I32, expected F32, BF16 or F16",
                ],
            ),
        ];
        for (dir, want) in cases {
            let e = load_err(dir);
            assert!(want.iter().all(|w| e.contains(w)), "{e}");
        }
    }

    /// A truncated file, a bad config.json and a broken index are each
    /// refused naming the file (and serde_json's line and column).
    #[test]
    fn bad_files_give_located_errors() {
        let truncated = checkpoint_with(&fixture_tensors());
        let weights = truncated.path().join(WEIGHTS_FILE);
        let bytes = std::fs::read(&weights).unwrap();
        std::fs::write(&weights, &bytes[..bytes.len() - 100]).unwrap();
        let e = load_err(truncated.path());
        assert!(
            e.contains("model.safetensors: not a complete safetensors file"),
            "{e}"
        );

        let config = checkpoint_with(&fixture_tensors());
        let text = std::fs::read_to_string(fixture().join(CONFIG_FILE)).unwrap();
        let broken = text.replacen("\"hidden_size\": 64", "\"hidden_size\": sixty-four", 1);
        std::fs::write(config.path().join(CONFIG_FILE), broken).unwrap();
        let e = load_err(config.path());
        assert!(
            e.contains("config.json: expected value at line 10 column"),
            "{e}"
        );

        let index = checkpoint_with(&fixture_tensors());
        let map = serde_json::json!({ "weight_map": {
            "model.norm.weight": "model.safetensors",
            "model.embed_tokens.weight": "model-00002-of-00002.safetensors",
        } });
        std::fs::write(index.path().join(INDEX_FILE), map.to_string()).unwrap();
        let e = load_err(index.path());
        let want = "model.safetensors.index.json: names shard model-00002-of-00002.safetensors, which is missing";
        assert!(e.contains(want), "{e}");
        let shard = index.path().join("model-00002-of-00002.safetensors");
        std::fs::copy(fixture().join(WEIGHTS_FILE), shard).unwrap();
        let e = load_err(index.path());
        let want = "model.safetensors.index.json: tensor model.layers.0.self_attn.q_proj.weight: missing from the index";
        assert!(e.contains(want), "{e}");
    }
}
