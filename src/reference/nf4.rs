//! Reference nf4.
