//! Reference cross_entropy.
