//! Model configurations, weights, NF4 quantisation and LoRA adapters.

mod config;
pub mod corpus;
pub mod lora;
pub mod nf4;
pub mod weights;

pub use config::{ModelConfig, PRESETS};
pub use corpus::Corpus;
pub use lora::{Slot, Trainable};
pub use weights::{BaseModel, FrozenLayer, FrozenLinear};
