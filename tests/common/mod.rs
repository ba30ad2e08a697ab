//! Shared by the integration tests that write or read reports: rows with
//! every column filled (and a detail with the characters CSV must quote),
//! and the lookup of a trial's row.

// Each test crate compiles this module and uses only some of it.
#![allow(dead_code)]

use falsify_core::report::{FalsificationRow, SpeedupRow, Status};

/// The row of trial `test_id` in `rows`; a test that expects one and finds
/// none fails here, naming the trial.
pub fn row_named<'a>(rows: &'a [FalsificationRow], test_id: &str) -> &'a FalsificationRow {
    rows.iter()
        .find(|r| r.test_id == test_id)
        .unwrap_or_else(|| panic!("no row for {test_id}"))
}

/// Row `i` of trial `test_id` in `contract` (every fifth one falsified).
pub fn row(run_id: &str, contract: &str, test_id: String, i: usize) -> FalsificationRow {
    FalsificationRow {
        run_id: run_id.into(),
        timestamp: "2026-01-01T00:00:00Z".into(),
        git_sha: "abc123".into(),
        contract: contract.into(),
        contract_version: "1.0.0".into(),
        contract_hash: String::new(),
        detail: format!("{test_id} row {i}: commas, \"quotes\"\nand a newline"),
        test_id,
        check_kind: "property".into(),
        backend: "cpu".into(),
        device: "cpu".into(),
        compute_capability: String::new(),
        driver_version: String::new(),
        status: if i % 5 == 2 {
            Status::Falsified
        } else {
            Status::Passed
        },
        metric: "max_abs_err".into(),
        observed: Some(i as f64 * 1e-9),
        comparator: "<=".into(),
        threshold: Some(1e-6),
        unit: String::new(),
        duration_ms: i as f64 + 0.5,
        setup_ms: Some(0.25),
        known_violation: String::new(),
    }
}

/// A speedup row of trial `test_id` in `contract` at `batch` x `seq_len`.
pub fn speedup(
    run_id: &str,
    contract: &str,
    test_id: String,
    (batch, seq_len): (usize, usize),
) -> SpeedupRow {
    SpeedupRow {
        run_id: run_id.into(),
        contract: contract.into(),
        test_id,
        status: Some(Status::Passed),
        threshold: Some(1.1),
        subject: "train_step".into(),
        model: "tiny".into(),
        batch,
        seq_len,
        baseline: "eager".into(),
        candidate: "graphed".into(),
        baseline_median_ms: 10.0,
        candidate_median_ms: 8.0,
        ratio: 1.25,
        ratio_ci_low: 1.2,
        ratio_ci_high: 1.3,
        repeats: 9,
        device: "cpu".into(),
        peak_device_gib: None,
        baseline_peak_device_gib: None,
        clocks: String::new(),
    }
}
