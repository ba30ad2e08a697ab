//! Model configurations, weights, NF4 quantisation, LoRA adapters and
//! Hugging Face checkpoints.

pub mod adapter;
pub mod checkpoint;
mod config;
pub mod corpus;
pub mod lora;
pub mod nf4;
pub mod weights;

pub use checkpoint::Checkpoint;
pub use config::{ModelConfig, PRESETS};
pub use corpus::Corpus;
pub use lora::{Slot, Trainable};
pub use weights::{BaseModel, FrozenLayer, FrozenLinear};
