//! Reference embedding.
