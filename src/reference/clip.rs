//! Reference clip.
