//! Faulty variants of the reference ops, selected by [`super::Mutant`].
