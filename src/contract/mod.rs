//! Contracts: the YAML schema, discovery and validation.

mod load;
mod schema;

pub use crate::check::Backend;
pub use load::{discover, load_dir, load_file, locate, parse, MAX_CONTRACT_BYTES};
pub use schema::{
    Contract, Equation, FalsificationTest, Metadata, ObligationKind, ProofObligation, Requirement,
};
