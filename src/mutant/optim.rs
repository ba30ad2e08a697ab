//! Faulty variants of NF4, clipping, AdamW and the reference training step.
