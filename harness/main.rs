//! The `cargo test` runner of the shipped contracts (`contracts/`) against
//! the qlora subject: one trial per falsification test and one per mutant
//! self-test. Everything it does is the core's runtime (see
//! `falsify_core::harness`); the contracts folder and the subject are all
//! this target says.

falsify_core::harness! {
    contracts: "contracts",
    subject: falsify_qlora::Qlora,
}
