//! The `cargo test` runner of the aprender-train subject's contracts
//! (`contracts/` beside this crate's manifest): one trial per falsification
//! test and one per mutant self-test, each in a process of its own (the
//! core's runtime, see `falsify_core::harness`). Without a GPU every cuda
//! trial is ignored with the reason.

falsify_core::harness! {
    contracts: "contracts",
    subject: falsify_aprender_train::AprenderTrain,
}
