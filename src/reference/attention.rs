//! Reference attention.
