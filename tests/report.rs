//! The regression report: `falsify report --baseline B --current C` against
//! small CSV fixtures under tests/fixtures/report/.
//!
//! - planted_*: a GPU parity test that passed in the baseline and is falsified
//!   now (what its mutant produces), and a speedup whose interval fell below
//!   the baseline's.
//! - gpu_baseline: a real baseline from an NVIDIA H200, compared with the same
//!   trials run on a machine without a CUDA driver.

use std::path::{Path, PathBuf};
use std::process::Command;

use falsify::report::artifacts::{ArtifactTensor, ArtifactWriter};
use falsify::report::compare::Verdict;
use falsify::report::markdown::{write_report, REPORT_MD};
use falsify::report::{read_rows, write_rows_atomic, FalsificationRow, SpeedupRow, Status};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/report")
        .join(name)
}

/// Copies a fixture directory into a temp dir, since the report is written
/// into the current run's directory.
fn copy_fixture(name: &str, into: &Path) -> PathBuf {
    let dst = into.join(name);
    std::fs::create_dir_all(&dst).unwrap();
    for entry in std::fs::read_dir(fixture(name)).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dst.join(entry.file_name())).unwrap();
    }
    dst
}

fn section<'a>(md: &'a str, heading: &str) -> &'a str {
    // Headings are whole lines; `## Speedups` must not match `### Speedups (...)`.
    let line = format!("\n{heading}\n");
    let start = md.find(&line).unwrap_or_else(|| panic!("no {heading}"));
    let rest = &md[start + line.len()..];
    let end = rest.find("\n## ").unwrap_or(rest.len());
    &rest[..end]
}

#[test]
fn a_planted_regression_is_named_at_the_top_and_regresses() {
    let tmp = tempfile::tempdir().unwrap();
    let baseline = copy_fixture("planted_baseline", tmp.path());
    let current = copy_fixture("planted_current", tmp.path());
    let outcome = write_report(&baseline, &current).unwrap();
    assert_eq!(outcome.verdict, Verdict::Regressed);
    assert_eq!(outcome.verdict.as_str(), "regressed");
    assert_eq!(
        outcome.regressions,
        vec!["rmsnorm-kernels-v1::F-RMS-GPU-001 (passed -> falsified)".to_string()]
    );
    assert_eq!(outcome.speedup_regressions.len(), 1);
    assert!(outcome.speedup_regressions[0].contains("F-NF4-SPEED-001"));

    let md = std::fs::read_to_string(current.join(REPORT_MD)).unwrap();
    assert!(md.contains("**Verdict: REGRESSED**"));
    // Metadata first, then the regressions, before anything else.
    let runs = md.find("## Runs").unwrap();
    let regressions = md.find("## Regressions").unwrap();
    let changes = md.find("## Changes of status").unwrap();
    assert!(runs < regressions && regressions < changes);
    let top = section(&md, "## Regressions");
    assert!(top.contains("rmsnorm-kernels-v1::F-RMS-GPU-001"), "{top}");
    assert!(
        top.contains("passed in the baseline, falsified now"),
        "{top}"
    );
    assert!(top.contains("speedup dropped"), "{top}");
    // The fixed test and the stable mutant self-test are not regressions.
    assert!(!top.contains("F-SOFTMAX-002"));
    assert!(!top.contains("::mutant"));
    let runs = section(&md, "## Runs");
    assert!(runs.contains("base-1") && runs.contains("cur-2"));
    assert!(runs.contains("aaaa11112222") && runs.contains("bbbb33334444-dirty"));
    assert!(runs.contains("NVIDIA H200"));
    let changes = section(&md, "## Changes of status");
    assert!(changes
        .contains("softmax-properties-v1::F-SOFTMAX-002 | cpu | falsified | passed | now passes"));
    let verdicts = section(&md, "## Verdicts by contract");
    assert!(verdicts.contains("### rmsnorm-kernels-v1"));
    assert!(verdicts.contains("rel_l2_error = 0.31 <= 1.000e-5 ratio"));
    let speedups = section(&md, "## Speedups");
    assert!(
        speedups.contains("0.91 [0.88, 0.95] | 1.25 [1.2, 1.3] | -27.2% **(regression)**"),
        "{speedups}"
    );
}

#[test]
fn charts_are_drawn_next_to_the_report_and_linked() {
    let tmp = tempfile::tempdir().unwrap();
    let baseline = copy_fixture("planted_baseline", tmp.path());
    let current = copy_fixture("planted_current", tmp.path());
    let outcome = write_report(&baseline, &current).unwrap();
    let md = std::fs::read_to_string(&outcome.path).unwrap();
    for file in ["speedups.svg", "bandwidth.svg", "tokens.svg"] {
        let svg = std::fs::read_to_string(current.join(file)).unwrap();
        assert!(svg.starts_with("<svg"), "{file}");
        assert!(
            md.contains(&format!("]({file})\n")) && md.contains(&format!("[{file}]({file})")),
            "{file}"
        );
    }
    let speedups = std::fs::read_to_string(current.join("speedups.svg")).unwrap();
    assert!(speedups.contains("F-NF4-SPEED-001"));
    // The copy-ceiling rows go to the bandwidth chart only.
    assert!(!speedups.contains("d2d copy"));
    let tokens = std::fs::read_to_string(current.join("tokens.svg")).unwrap();
    assert!(tokens.contains("qwen2.5-0.5b b4 s512 graph"));
}

/// The current run as a machine without a CUDA driver records it: every
/// `cuda` trial skipped with the reason, every `cpu` trial as before.
fn cpu_only(rows: &[FalsificationRow]) -> Vec<FalsificationRow> {
    rows.iter()
        .map(|r| {
            let mut r = r.clone();
            r.run_id = "cpu-only".into();
            if r.backend == "cuda" {
                r.status = Status::Skipped;
                r.device = "none".into();
                r.compute_capability.clear();
                r.driver_version.clear();
                r.metric.clear();
                r.observed = None;
                r.threshold = None;
                r.comparator.clear();
                r.detail = "no CUDA driver".into();
            }
            r
        })
        .collect()
}

#[test]
fn a_cpu_only_run_says_which_gpu_trials_were_not_run() {
    let tmp = tempfile::tempdir().unwrap();
    let baseline = fixture("gpu_baseline");
    let rows: Vec<FalsificationRow> = read_rows(&baseline.join("falsification.csv")).unwrap();
    let gpu_run = rows
        .iter()
        .filter(|r| r.backend == "cuda" && r.status != Status::Skipped)
        .count();
    assert!(gpu_run > 0);
    let current = tmp.path().join("latest");
    write_rows_atomic(&current.join("falsification.csv"), &cpu_only(&rows)).unwrap();

    let outcome = write_report(&baseline, &current).unwrap();
    // Skipped is not a regression: nothing that passed fails now.
    assert_eq!(outcome.verdict, Verdict::Clean, "{:?}", outcome.regressions);
    let md = std::fs::read_to_string(&outcome.path).unwrap();
    let sentence = format!(
        "{gpu_run} GPU trials were not run in this run (skipped: no CUDA driver) — their baseline verdicts are shown for reference."
    );
    assert!(
        md.contains(&sentence),
        "{}",
        section(&md, "## Changes of status")
    );
    let changes = section(&md, "## Changes of status");
    // Each of them is listed with its baseline verdict.
    assert!(changes.contains(
        "kernel-parity-matmul-v1::F-NF4-GPU-001 | cuda | falsified | skipped | not run here"
    ));
    assert!(section(&md, "## Runs").contains("NVIDIA H200"));
    assert!(section(&md, "## Regressions").contains("None."));
    // No speedup rows and no GPU: every chart omitted, with the reason.
    assert!(md.contains("so the speedup chart is omitted"));
    assert!(md.contains("so the bandwidth chart is omitted"));
    assert!(md.contains("so the tokens/s chart is omitted"));
    assert!(!current.join("speedups.svg").exists());
}

fn speedup(ratio: f64, low: f64, high: f64) -> SpeedupRow {
    SpeedupRow {
        run_id: "r".into(),
        test_id: "F-SPEED-001".into(),
        subject: "fusion".into(),
        model: "qwen2.5-0.5b".into(),
        batch: 1,
        seq_len: 128,
        baseline: "unfused".into(),
        candidate: "fused".into(),
        baseline_median_ms: 1.0,
        candidate_median_ms: 1.0 / ratio,
        ratio,
        ratio_ci_low: low,
        ratio_ci_high: high,
        repeats: 30,
        device: "NVIDIA H200".into(),
    }
}

#[test]
fn only_a_speedup_interval_wholly_below_the_baseline_regresses() {
    let tmp = tempfile::tempdir().unwrap();
    let rows: Vec<FalsificationRow> =
        read_rows(&fixture("planted_baseline").join("falsification.csv")).unwrap();
    let run = |name: &str, s: SpeedupRow| {
        let dir = tmp.path().join(name);
        write_rows_atomic(&dir.join("falsification.csv"), &rows).unwrap();
        write_rows_atomic(&dir.join("speedups.csv"), &[s]).unwrap();
        dir
    };
    let baseline = run("baseline", speedup(1.3, 1.2, 1.4));
    // Lower, but the intervals overlap: noise.
    let overlapping = run("overlap", speedup(1.18, 1.1, 1.21));
    assert_eq!(
        write_report(&baseline, &overlapping).unwrap().verdict,
        Verdict::Clean
    );
    let below = run("below", speedup(1.1, 1.05, 1.19));
    let outcome = write_report(&baseline, &below).unwrap();
    assert_eq!(outcome.verdict, Verdict::Regressed);
    assert!(outcome.speedup_regressions[0].contains("1.1 [1.05, 1.19] now"));
    // The same low figure from another GPU is another measurement, not a regression.
    let elsewhere = run(
        "elsewhere",
        SpeedupRow {
            device: "NVIDIA H100 80GB HBM3".into(),
            ..speedup(1.1, 1.05, 1.19)
        },
    );
    let outcome = write_report(&baseline, &elsewhere).unwrap();
    assert_eq!(outcome.verdict, Verdict::Clean);
    assert!(outcome.speedup_regressions.is_empty());
}

#[test]
fn artifacts_present_are_shown_with_how_to_load_them() {
    let tmp = tempfile::tempdir().unwrap();
    let baseline = copy_fixture("planted_baseline", tmp.path());
    let current = copy_fixture("planted_current", tmp.path());
    ArtifactWriter::write(
        &current.join("artifacts"),
        "rmsnorm-kernels-v1__F-RMS-GPU-001",
        &[ArtifactTensor::f32("output", vec![1.0, 2.0], vec![2])],
        &[],
    )
    .unwrap();
    let outcome = write_report(&baseline, &current).unwrap();
    let md = std::fs::read_to_string(&outcome.path).unwrap();
    let section = section(&md, "## Failure artifacts");
    let path = "artifacts/rmsnorm-kernels-v1__F-RMS-GPU-001.safetensors";
    assert!(section.contains(&format!(
        "from safetensors.numpy import load_file\ntensors = load_file(\"{path}\")"
    )));
    assert!(section.contains(&format!("safetensors.torch.load_file(\"{path}\")")));
}

#[test]
fn the_cli_exits_non_zero_on_a_regression_and_zero_without() {
    let tmp = tempfile::tempdir().unwrap();
    let baseline = copy_fixture("planted_baseline", tmp.path());
    let current = copy_fixture("planted_current", tmp.path());
    let report = |current: &Path| {
        Command::new(env!("CARGO_BIN_EXE_falsify"))
            .arg("report")
            .arg("--baseline")
            .arg(&baseline)
            .arg("--current")
            .arg(current)
            .output()
            .unwrap()
    };
    let out = report(&current);
    assert!(!out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("REGRESSION rmsnorm-kernels-v1::F-RMS-GPU-001"),
        "{stdout}"
    );
    assert!(stdout.contains("verdict: regressed"));
    // The baseline against itself: clean, exit 0.
    let same = copy_fixture("planted_baseline", &tmp.path().join("again"));
    let out = report(&same);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // A missing baseline is an error, not a clean report.
    let out = Command::new(env!("CARGO_BIN_EXE_falsify"))
        .args(["report", "--baseline"])
        .arg(tmp.path().join("nowhere"))
        .arg("--current")
        .arg(&current)
        .output()
        .unwrap();
    assert!(!out.status.success());
}

/// The release rehearsal end to end: a real trial run with its mutant injected
/// (`falsify run --inject`) is named as a regression against the committed
/// GPU baseline, and `report` exits non-zero.
#[test]
fn an_injected_mutant_is_reported_as_a_regression_against_the_baseline() {
    let tmp = tempfile::tempdir().unwrap();
    let current = tmp.path().join("latest");
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let run = Command::new(env!("CARGO_BIN_EXE_falsify"))
        .current_dir(manifest)
        .args(["run", "--filter", "F-GRAD-GEMM-001", "--no-mutants"])
        .args(["--inject", "F-GRAD-GEMM-001", "--out"])
        .arg(&current)
        .output()
        .unwrap();
    assert!(
        !run.status.success(),
        "the injected mutant falsifies the trial"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_falsify"))
        .current_dir(manifest)
        .args(["report", "--baseline", "reports/baseline", "--current"])
        .arg(&current)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{stdout}");
    assert!(
        stdout.contains("REGRESSION reference-gradients-v1::F-GRAD-GEMM-001"),
        "{stdout}"
    );
    let md = std::fs::read_to_string(current.join("REPORT.md")).unwrap();
    let regressions = section(&md, "## Regressions");
    assert!(regressions.contains("F-GRAD-GEMM-001"), "{regressions}");
    assert!(md.find("## Regressions") < md.find("## Changes of status"));
}
