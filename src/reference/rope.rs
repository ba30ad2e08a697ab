//! Reference rope.
