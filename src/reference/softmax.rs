//! Reference softmax.
