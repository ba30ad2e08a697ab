//! Reference adamw.
