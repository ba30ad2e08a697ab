//! Reference activation.
