//! Contracts: the YAML schema, discovery and validation.

#[cfg(test)]
mod core_kinds_tests;
mod discover;
mod load;
mod number;
mod schema;
mod tree;

pub use crate::check::Backend;
pub use load::{discover, load_dir, load_file, locate, parse, MAX_CONTRACT_BYTES};
pub use schema::{
    is_safe_id, Contract, ContractOf, Equation, FalsificationTest, KnownViolation, Metadata,
    ObligationKind, ProofObligation, Requirement, TestOf, MAX_ID_LEN, SAFE_ID_RULE,
};
