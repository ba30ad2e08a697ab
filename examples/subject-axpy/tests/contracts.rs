//! The axpy subject's contract suite: `cargo test` runs `contracts/` as
//! trials (cpu trials here and anywhere, cuda trials where a GPU is) and
//! writes `reports/latest/` beside it, as `falsify report` reads it.

falsify_core::harness! {
    contracts: "contracts",
    subject: falsify_axpy::Axpy,
}
