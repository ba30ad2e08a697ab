//! Model configurations, weights, NF4 quantisation and LoRA adapters.

mod config;

pub use config::{ModelConfig, PRESETS};
