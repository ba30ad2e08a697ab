//! Reference rmsnorm.
