//! The toy subject's contract suite (`tests/toy/contracts/`), made with
//! `harness!{}` as any subject's test target is: its cpu trials run, its
//! mutant self-tests must catch `sum_drops_last`, and its cuda trial is
//! reported ignored (the toy has no device). Reports go to
//! `tests/toy/reports/latest/`.

mod toy;

falsify_core::harness! {
    contracts: "tests/toy/contracts",
    subject: toy::Toy,
}
