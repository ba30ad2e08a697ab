//! Reference elementwise.
