//! The regression report: `falsify report --baseline B --current C` against
//! small CSV fixtures under tests/fixtures/report/, and against the
//! committed baselines under reports/baseline/<subject>/.
//!
//! - planted_*: a GPU parity test that passed in the baseline and is falsified
//!   now (what its mutant produces), and a speedup whose interval fell below
//!   the baseline's. planted_baseline is in the layout of older reports
//!   (speedups.csv without contract, status and threshold; run.json with the
//!   tree state inside `git_sha`); planted_current is in today's.
//! - gpu_baseline: a real baseline from an NVIDIA H200, compared with the same
//!   trials run on a machine without a CUDA driver.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use falsify_core::report::artifacts::{ArtifactTensor, ArtifactWriter};
use falsify_core::report::compare::{Verdict, EXIT_INCOMPLETE, EXIT_NO_VERDICT, EXIT_REGRESSED};
use falsify_core::report::markdown::{write_report, ReportOutcome, REPORT_MD};
use falsify_core::report::meta::RunMeta;
use falsify_core::report::{read_rows, write_rows_atomic, FalsificationRow, SpeedupRow, Status};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/report")
        .join(name)
}

/// Copies a fixture directory into `into`, since the report is written
/// into the current run's directory.
fn copy_fixture(name: &str, into: &Path) -> PathBuf {
    copy_dir(&fixture(name), &into.join(name))
}

fn copy_dir(from: &Path, to: &Path) -> PathBuf {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        if entry.path().is_file() {
            std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
        }
    }
    to.to_path_buf()
}

fn rows_of(dir: &Path) -> Vec<FalsificationRow> {
    read_rows(&dir.join("falsification.csv")).unwrap()
}

fn section<'a>(md: &'a str, heading: &str) -> &'a str {
    // Headings are whole lines; `## Speedups` must not match `### Speedups (...)`.
    let line = format!("\n{heading}\n");
    let start = md.find(&line).unwrap_or_else(|| panic!("no {heading}"));
    let rest = &md[start + line.len()..];
    let end = rest.find("\n## ").unwrap_or(rest.len());
    &rest[..end]
}

/// `falsify report --baseline <baseline> --current <current>`.
fn report_cli(baseline: &Path, current: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_falsify"))
        .arg("report")
        .arg("--baseline")
        .arg(baseline)
        .arg("--current")
        .arg(current)
        .output()
        .unwrap()
}

/// The text elements of an SVG, trimmed.
fn svg_texts(svg: &str) -> Vec<String> {
    svg.split("<text")
        .skip(1)
        .filter_map(|t| {
            let body = t.split_once('>')?.1;
            Some(body.split("</text>").next()?.trim().to_string())
        })
        .collect()
}

fn has_text(svg: &str, text: &str) -> bool {
    svg_texts(svg).iter().any(|t| t == text)
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
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
        top.contains(
            "passed in the baseline, falsified now: rel_l2_error 0.31 > 1e-5 ratio: falsified"
        ),
        "{top}"
    );
    assert!(top.contains("speedup dropped"), "{top}");
    // The fixed test and the stable mutant self-test are not regressions.
    assert!(!top.contains("F-SOFTMAX-002"));
    assert!(!top.contains("::mutant"));
    let changes = section(&md, "## Changes of status");
    assert!(changes
        .contains("softmax-properties-v1::F-SOFTMAX-002 | cpu | falsified | passed | now passes"));
    let verdicts = section(&md, "## Verdicts by contract");
    assert!(verdicts.contains("### rmsnorm-kernels-v1"));
    assert!(verdicts.contains("rel_l2_error 0.31 > 1e-5 ratio: falsified"));
    // A mutant self-test says whether its mutant was caught.
    assert!(verdicts.contains("rel_l2_error 0.31 > 1e-5 ratio: mutant caught"));
    let speedups = section(&md, "## Speedups");
    assert!(
        speedups.contains("0.91 [0.88, 0.95] | 1.25 [1.2, 1.3] | -27.2% **(regression)**"),
        "{speedups}"
    );
}

#[test]
fn a_falsified_result_never_reads_as_a_pass() {
    let tmp = tempfile::tempdir().unwrap();
    let baseline = copy_fixture("planted_baseline", tmp.path());
    let current = copy_fixture("planted_current", tmp.path());
    let outcome = write_report(&baseline, &current).unwrap();
    let md = std::fs::read_to_string(&outcome.path).unwrap();
    // The old form put the claim's own comparator beside a failed number.
    assert!(!md.contains("0.31 <= 1"), "{md}");
    assert!(!md.contains("= 0.31"), "{md}");
    // A trial falsified by a violation while its metric held leads with the
    // violation (as the engine now writes it), never with the metric.
    let mut rows = rows_of(&current);
    let bound = "small-4l/fp32: pre-warm took 2400 ms, over the bound of 2000 ms";
    rows.push(FalsificationRow {
        contract: "kernel-prewarm-v1".into(),
        test_id: "C-PREWARM-001".into(),
        status: Status::Falsified,
        metric: bound.into(),
        observed: None,
        comparator: String::new(),
        threshold: None,
        unit: String::new(),
        detail: "seed 1; headline metric: compilations_after_prewarm 0 <= 0 compilations held"
            .into(),
        ..rows[0].clone()
    });
    write_rows_atomic(&current.join("falsification.csv"), &rows).unwrap();
    let mut base = rows_of(&baseline);
    base.push(FalsificationRow {
        contract: "kernel-prewarm-v1".into(),
        test_id: "C-PREWARM-001".into(),
        metric: "compilations_after_prewarm".into(),
        observed: Some(0.0),
        threshold: Some(0.0),
        ..base[0].clone()
    });
    write_rows_atomic(&baseline.join("falsification.csv"), &base).unwrap();
    let outcome = write_report(&baseline, &current).unwrap();
    let md = std::fs::read_to_string(&outcome.path).unwrap();
    let top = section(&md, "## Regressions");
    assert!(
        top.contains(&format!(
            "passed in the baseline, falsified now: {bound}: falsified"
        )),
        "{top}"
    );
    assert!(
        !top.contains("compilations_after_prewarm 0 <= 0: holds"),
        "{top}"
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
        // Every chart draws its pass threshold, and names it in its legend.
        assert!(has_text(&svg, "pass threshold"), "{file}");
    }
    let speedups = std::fs::read_to_string(current.join("speedups.svg")).unwrap();
    assert!(speedups.contains("F-NF4-SPEED-001"));
    // The copy-ceiling rows go to the bandwidth chart only, targets to tokens.svg.
    assert!(!speedups.contains("d2d copy") && !speedups.contains("F-TPUT-003"));
    let bandwidth = std::fs::read_to_string(current.join("bandwidth.svg")).unwrap();
    assert!(bandwidth.contains("F-BW-RMSNORM-001 rmsnorm fwd"));
    let tokens = std::fs::read_to_string(current.join("tokens.svg")).unwrap();
    assert!(has_text(&tokens, "qwen2.5-0.5b, batch 4 x seq 512") && has_text(&tokens, "graph"));
    // A target is the threshold of the mode it judges, never a bar of its own.
    assert!(has_text(&tokens, "graphed/fast"));
    assert!(!tokens.contains("target 41000"), "a target drawn as a bar");
    // The legend names only what is drawn: no dot that is not on the chart.
    assert!(has_text(&tokens, "baseline run"));
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
fn a_cpu_only_run_is_judged_on_its_cpu_trials() {
    let tmp = tempfile::tempdir().unwrap();
    let baseline = fixture("gpu_baseline");
    let rows = rows_of(&baseline);
    let gpu_trials = rows.iter().filter(|r| r.backend == "cuda").count();
    assert!(gpu_trials > 0);
    let current = tmp.path().join("latest");
    write_rows_atomic(&current.join("falsification.csv"), &cpu_only(&rows)).unwrap();

    let outcome = write_report(&baseline, &current).unwrap();
    // Skipped for a recorded reason is neither a regression nor a gap.
    assert_eq!(outcome.verdict, Verdict::Clean, "{:?}", outcome.regressions);
    let md = std::fs::read_to_string(&outcome.path).unwrap();
    let sentence = format!(
        "This run used no GPU (its {gpu_trials} `cuda` trials were skipped: no CUDA driver), so it is judged on its `cpu` trials against the `cpu` rows of the baseline: `h200` (`{}`).",
        baseline.display()
    );
    assert!(md.contains(&sentence), "{md}");
    assert_eq!(outcome.baseline, sentence);
    // The GPU trials are not listed as changes: they were not compared.
    let changes = section(&md, "## Changes of status");
    assert!(changes.contains("No trial changed status."), "{changes}");
    assert!(section(&md, "## Runs").contains("NVIDIA H200"));
    assert!(section(&md, "## Regressions").contains("None."));
    assert!(section(&md, "## Not run").starts_with("\nNone"));
    // No speedup rows and no GPU: every chart omitted, with the reason.
    assert!(md.contains("so the speedup chart is omitted"));
    assert!(md.contains("so the bandwidth chart is omitted"));
    assert!(md.contains("so the tokens/s chart is omitted"));
    assert!(!current.join("speedups.svg").exists());
}

#[test]
fn a_partial_run_is_incomplete_and_lists_what_did_not_run() {
    let tmp = tempfile::tempdir().unwrap();
    let baseline = copy_fixture("planted_baseline", tmp.path());
    // The baseline's own trials, all passing as before, but two missing.
    let current = tmp.path().join("partial");
    let rows: Vec<FalsificationRow> = rows_of(&baseline)
        .into_iter()
        .filter(|r| r.test_id != "F-SOFTMAX-001" && r.test_id != "F-RMS-GPU-001::mutant")
        .collect();
    write_rows_atomic(&current.join("falsification.csv"), &rows).unwrap();
    let outcome = write_report(&baseline, &current).unwrap();
    assert_eq!(outcome.verdict, Verdict::Incomplete);
    assert_eq!(outcome.verdict.exit_code(), EXIT_INCOMPLETE);
    assert!(outcome.regressions.is_empty());
    assert_eq!(
        outcome.not_run,
        [
            "rmsnorm-kernels-v1::F-RMS-GPU-001::mutant (absent from this run; passed in the baseline)",
            "softmax-properties-v1::F-SOFTMAX-001 (absent from this run; passed in the baseline)",
        ]
    );
    let md = std::fs::read_to_string(&outcome.path).unwrap();
    assert!(md.contains("**Verdict: INCOMPLETE**"), "{md}");
    assert!(!md.contains("Verdict: clean"));
    let not_run = section(&md, "## Not run");
    assert!(not_run.contains(
        "| softmax-properties-v1::F-SOFTMAX-001 | cpu | passed | absent from this run |"
    ));
    assert!(section(&md, "## Changes of status").contains("| **not run** |"));

    // The command line exits with the incomplete code and names them.
    let out = report_cli(&baseline, &current);
    assert_eq!(
        out.status.code(),
        Some(EXIT_INCOMPLETE.into()),
        "{}",
        stdout(&out)
    );
    assert!(stdout(&out).contains("NOT RUN softmax-properties-v1::F-SOFTMAX-001"));
    assert!(stdout(&out).contains("verdict: incomplete (exit 3)"));
}

#[test]
fn only_a_recorded_reason_excuses_a_skipped_trial() {
    let tmp = tempfile::tempdir().unwrap();
    let baseline = copy_fixture("planted_baseline", tmp.path());
    let current = tmp.path().join("skipping");
    let skip = |detail: &str| {
        let rows: Vec<FalsificationRow> = rows_of(&baseline)
            .into_iter()
            .map(|mut r| {
                if r.test_id == "F-TPUT-003" {
                    r.status = Status::Skipped;
                    r.detail = detail.into();
                }
                r
            })
            .collect();
        write_rows_atomic(&current.join("falsification.csv"), &rows).unwrap();
        write_report(&baseline, &current).unwrap()
    };
    let outcome = skip("no target for NVIDIA H200 (the target is stated for H100)");
    assert_eq!(outcome.verdict, Verdict::Clean, "{:?}", outcome.not_run);
    let md = std::fs::read_to_string(&outcome.path).unwrap();
    assert!(section(&md, "## Changes of status")
        .contains("skipped in this run for a recorded reason (no target for NVIDIA H200"));
    let outcome = skip("");
    assert_eq!(outcome.verdict, Verdict::Incomplete);
    assert!(outcome.not_run[0].contains("F-TPUT-003 (skipped, no reason recorded"));
}

#[test]
fn a_trial_that_errors_in_both_runs_is_listed_as_unjudged() {
    let tmp = tempfile::tempdir().unwrap();
    let baseline = tmp.path().join("baseline");
    let current = tmp.path().join("current");
    let planted = fixture("planted_baseline");
    // The same trial `error` in the baseline and now: no regression, but no
    // verdict on its claim either, and the report must say so.
    for dir in [&baseline, &current] {
        copy_dir(&planted, dir);
        let rows: Vec<FalsificationRow> = rows_of(dir)
            .into_iter()
            .map(|mut r| {
                if r.test_id == "F-TPUT-003" {
                    r.status = Status::Error;
                    r.detail = "the step stopped at step 1".into();
                }
                r
            })
            .collect();
        write_rows_atomic(&dir.join("falsification.csv"), &rows).unwrap();
    }
    let out = report_cli(&baseline, &current);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains("UNJUDGED train-throughput-v1::F-TPUT-003 (error in the baseline)"),
        "{text}"
    );
    let md = std::fs::read_to_string(current.join(REPORT_MD)).unwrap();
    assert!(md.contains("1 trial(s) could not be judged"), "{md}");
    assert!(section(&md, "## Unjudged").contains("the step stopped at step 1"));
}

#[test]
fn a_regression_outranks_an_incomplete_run() {
    let tmp = tempfile::tempdir().unwrap();
    let baseline = copy_fixture("planted_baseline", tmp.path());
    let current = copy_fixture("planted_current", tmp.path());
    let rows: Vec<FalsificationRow> = rows_of(&current)
        .into_iter()
        .filter(|r| r.test_id != "F-SOFTMAX-001")
        .collect();
    write_rows_atomic(&current.join("falsification.csv"), &rows).unwrap();
    let outcome = write_report(&baseline, &current).unwrap();
    assert_eq!(outcome.verdict, Verdict::Regressed);
    assert_eq!(outcome.not_run.len(), 1);
    let md = std::fs::read_to_string(&outcome.path).unwrap();
    assert!(md.contains("besides, 1 baseline trial(s) did not run"));
}

/// A folder of per-GPU baselines, `h200/` and `h100/`, made from the
/// planted baseline with the device renamed.
fn baselines_by_kind(into: &Path) -> PathBuf {
    let root = into.join("baseline");
    for (kind, device) in [("h200", "NVIDIA H200"), ("h100", "NVIDIA H100 80GB HBM3")] {
        let dir = copy_dir(&fixture("planted_baseline"), &root.join(kind));
        std::fs::remove_file(dir.join("run.json")).unwrap();
        let rows: Vec<FalsificationRow> = rows_of(&dir)
            .into_iter()
            .map(|mut r| {
                if r.backend == "cuda" {
                    r.device = device.into();
                }
                r.run_id = format!("{kind}-run");
                r
            })
            .collect();
        write_rows_atomic(&dir.join("falsification.csv"), &rows).unwrap();
    }
    root
}

/// The planted baseline's trials as run on `device`, all as in the baseline.
fn run_on(dir: &Path, device: &str) -> PathBuf {
    let rows: Vec<FalsificationRow> = rows_of(&fixture("planted_baseline"))
        .into_iter()
        .map(|mut r| {
            if r.backend == "cuda" {
                r.device = device.into();
            }
            r
        })
        .collect();
    write_rows_atomic(&dir.join("falsification.csv"), &rows).unwrap();
    dir.to_path_buf()
}

#[test]
fn a_gpu_run_is_compared_with_the_baseline_of_its_gpu_kind() {
    let tmp = tempfile::tempdir().unwrap();
    let root = baselines_by_kind(tmp.path());
    let current = run_on(&tmp.path().join("h100-run"), "NVIDIA H100 80GB HBM3");
    let outcome = write_report(&root, &current).unwrap();
    assert_eq!(outcome.verdict, Verdict::Clean, "{:?}", outcome.not_run);
    assert_eq!(
        outcome.baseline,
        format!(
            "Baseline `h100` (`{}`): the baseline of the GPU this run used, NVIDIA H100 80GB HBM3.",
            root.join("h100").display()
        )
    );
    let md = std::fs::read_to_string(&outcome.path).unwrap();
    assert!(section(&md, "## Runs").contains("h100-run"));
    assert!(!section(&md, "## Runs").contains("h200-run"));

    // A GPU kind without a baseline is no verdict at all, and says why.
    let current = run_on(&tmp.path().join("a100-run"), "NVIDIA A100-SXM4-80GB");
    let err = write_report(&root, &current).unwrap_err().to_string();
    assert!(
        err.contains("no baseline for `a100` here (baselines: h100, h200)"),
        "{err}"
    );
    let out = report_cli(&root, &current);
    assert_eq!(out.status.code(), Some(EXIT_NO_VERDICT.into()));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no baseline for `a100`"));
    assert!(!current.join(REPORT_MD).exists());
}

/// A run on a host of several GPUs is its own kind (`h200x2`): its
/// data-parallel trials run there and are skipped on one GPU, so only a
/// baseline of the same host can judge them. Records from before the count
/// was kept name the host by their folder.
#[test]
fn a_run_on_several_gpus_is_compared_with_the_baseline_of_that_host() {
    let tmp = tempfile::tempdir().unwrap();
    let root = baselines_by_kind(tmp.path());
    let current = run_on(&tmp.path().join("two-h200-run"), "NVIDIA H200");
    let mut meta = RunMeta::read_json(&fixture("planted_current"))
        .unwrap()
        .unwrap();
    meta.run_id = rows_of(&current)[0].run_id.clone();
    meta.selected.clear();
    // The fixture's record is of one H200; this run had two.
    let gpu = meta.gpu.as_mut().expect("planted_current records its GPU");
    gpu.device_count = Some(2);
    meta.write_json(&current).unwrap();

    // Only one-GPU baselines: no verdict, and the host kind named.
    let err = write_report(&root, &current).unwrap_err().to_string();
    assert!(
        err.contains("this run used 2x NVIDIA H200 (GPU kind `h200x2`), and there is no baseline for `h200x2` here (baselines: h100, h200)"),
        "{err}"
    );

    // The host's own baseline, a record from before the count was kept:
    // found by its folder, and named by it.
    let two = copy_dir(&root.join("h200"), &root.join("h200x2"));
    let outcome = write_report(&root, &current).unwrap();
    assert_eq!(
        outcome.baseline,
        format!(
            "Baseline `h200x2` (`{}`): the baseline of the GPU this run used, 2x NVIDIA H200.",
            two.display()
        )
    );
    let md = std::fs::read_to_string(&outcome.path).unwrap();
    assert!(
        section(&md, "## Runs")
            .contains("| GPU | none used (or not recorded) | 2x NVIDIA H200, 132 SMs, 139.8 GiB |"),
        "{}",
        section(&md, "## Runs")
    );
    let given = write_report(&two, &current).unwrap();
    assert!(
        given.baseline.starts_with("Baseline `h200x2`"),
        "{}",
        given.baseline
    );

    // A one-GPU baseline named directly says that it is another host.
    let one = write_report(&root.join("h200"), &current).unwrap();
    assert!(
        one.baseline.contains(
            "It ran on NVIDIA H200 (kind `h200`) and this run on 2x NVIDIA H200 (kind `h200x2`)"
        ),
        "{}",
        one.baseline
    );
}

#[test]
fn a_cpu_only_run_is_compared_with_the_cpu_rows_of_every_baseline() {
    let tmp = tempfile::tempdir().unwrap();
    let root = baselines_by_kind(tmp.path());
    // The h100 baseline had F-SOFTMAX-001 falsified; the h200 one passed it.
    let h100 = root.join("h100");
    let rows: Vec<FalsificationRow> = rows_of(&h100)
        .into_iter()
        .map(|mut r| {
            if r.test_id == "F-SOFTMAX-001" {
                r.status = Status::Falsified;
            }
            r
        })
        .collect();
    write_rows_atomic(&h100.join("falsification.csv"), &rows).unwrap();
    // This run: no GPU, and F-SOFTMAX-001 falsified.
    let current = tmp.path().join("cpu-run");
    let rows: Vec<FalsificationRow> = cpu_only(&rows_of(&fixture("planted_baseline")))
        .into_iter()
        .map(|mut r| {
            if r.test_id == "F-SOFTMAX-001" {
                r.status = Status::Falsified;
            }
            r
        })
        .collect();
    write_rows_atomic(&current.join("falsification.csv"), &rows).unwrap();
    let outcome = write_report(&root, &current).unwrap();
    assert_eq!(outcome.verdict, Verdict::Regressed);
    assert_eq!(
        outcome.regressions,
        ["softmax-properties-v1::F-SOFTMAX-001 (passed -> falsified) against h200"]
    );
    assert!(
        outcome
            .baseline
            .contains("against the `cpu` rows of every baseline: `h100`"),
        "{}",
        outcome.baseline
    );
    let md = std::fs::read_to_string(&outcome.path).unwrap();
    let runs = section(&md, "## Runs");
    assert!(
        runs.contains("| | baseline `h100` | baseline `h200` | current |"),
        "{runs}"
    );
    assert!(section(&md, "## Regressions").contains("### Against `h200`"));
    let verdicts = section(&md, "## Verdicts by contract");
    assert!(
        verdicts.contains("### Against `h100`") && verdicts.contains("#### softmax-properties-v1")
    );
    // Only cpu rows were compared: no GPU trial appears anywhere in the tables.
    assert!(!verdicts.contains("F-RMS-GPU-001"), "{verdicts}");
}

/// The report of `current` against the baselines under `root`: clean, and
/// judged against the baseline named `kind`.
fn judged_clean_against(root: &Path, current: &Path, kind: &str) -> ReportOutcome {
    let outcome = write_report(root, current).unwrap();
    assert_eq!(outcome.verdict, Verdict::Clean, "{:?}", outcome.regressions);
    let named = format!("Baseline `{kind}`");
    assert!(outcome.baseline.starts_with(&named), "{}", outcome.baseline);
    outcome
}

#[test]
fn the_committed_baselines_are_found_from_the_parent_folder() {
    let tmp = tempfile::tempdir().unwrap();
    let root = committed_baselines();
    let h200 = root.join("qlora/h200");
    // The committed H200 run against itself, as a copy: the baseline of its
    // own GPU kind is found from the folder of all baselines, and judges it clean.
    let current = copy_dir(&h200, &tmp.path().join("again"));
    let outcome = judged_clean_against(&root, &current, "h200");
    let md = std::fs::read_to_string(&outcome.path).unwrap();
    let runs = section(&md, "## Runs");
    // The baseline ran on the GPU machine from an archive; the report states
    // the build commit and what run.json recorded of the tree it ran in.
    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(h200.join("run.json")).unwrap()).unwrap();
    let sha = record["git_sha"].as_str().unwrap();
    let tree = match (record["git_source"].as_str(), record["git_dirty"].as_bool()) {
        (Some("checkout"), Some(true)) => "checkout with uncommitted changes",
        (Some("checkout"), Some(false)) => "clean checkout",
        _ => "not run from a checkout: tree state unknown",
    };
    assert!(runs.contains(&format!("{sha} ({tree})")), "{runs}");
    assert!(runs.contains("`gpu.forward_math=Tf32`") && !runs.contains("GpuOptions {"));
    assert!(!runs.contains("cpu: Intel"), "{runs}");
    // Bandwidth rows show their shape, never `0 x 0`.
    let speedups = section(&md, "## Speedups");
    assert!(speedups.contains("| K-EFF-BW-001 | rmsnorm fwd | {hidden=896, rows=1024} |"));
    assert!(!md.contains("0 x 0"));
    // The pass threshold is shown with each row.
    assert!(speedups.contains("| >= 0.7 |"), "{speedups}");
}

/// The folder of the committed baselines, by subject and GPU kind.
fn committed_baselines() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("reports/baseline")
}

/// A copy of the run folder `from` at `to`, its `run.json` changed by `edit`.
fn edited_copy(from: &Path, to: &Path, edit: impl FnOnce(&mut RunMeta)) -> PathBuf {
    let copy = copy_dir(from, to);
    let mut meta = RunMeta::read_json(&copy)
        .unwrap()
        .expect("the run records itself");
    edit(&mut meta);
    meta.write_json(&copy).unwrap();
    copy
}

/// The committed two-H200 baseline judges a two-H200 run: a copy of it,
/// its record given the count a run records today, is found from the
/// folder of all baselines and judged clean, its data-parallel rows against
/// passed rows, not the one-GPU baseline's skipped ones.
#[test]
fn the_committed_two_gpu_baseline_judges_a_two_gpu_run() {
    let tmp = tempfile::tempdir().unwrap();
    let root = committed_baselines();
    let current = edited_copy(
        &root.join("qlora/h200x2"),
        &tmp.path().join("again"),
        |meta| {
            meta.gpu.as_mut().expect("a GPU run").device_count = Some(2);
        },
    );
    let outcome = judged_clean_against(&root, &current, "h200x2");
    let md = std::fs::read_to_string(&outcome.path).unwrap();
    assert!(
        !md.contains("now passes"),
        "{}",
        section(&md, "## Verdicts by contract")
    );
}

/// Baselines are the subject's: a run records its subject, and the folder
/// of subjects is searched for that one's; a subject with no baseline is
/// told so, never judged against another subject's.
#[test]
fn a_run_is_judged_against_the_baselines_of_its_own_subject() {
    let tmp = tempfile::tempdir().unwrap();
    let root = committed_baselines();
    let current = edited_copy(
        &root.join("qlora/h200"),
        &tmp.path().join("toy-run"),
        |meta| {
            assert_eq!(
                meta.subject, "qlora",
                "a record from before subjects is qlora's"
            );
            meta.subject = "toy".into();
        },
    );
    let err = write_report(&root, &current).unwrap_err().to_string();
    assert!(
        err.contains("nor a toy/<gpu-kind>/falsification.csv for this run's subject `toy`"),
        "{err}"
    );
    // The subject's own folder, or one baseline, may still be named directly.
    judged_clean_against(&root.join("qlora"), &current, "h200");
}

#[test]
fn the_report_never_writes_into_the_baseline_folder() {
    let tmp = tempfile::tempdir().unwrap();
    let root = baselines_by_kind(tmp.path());
    let inside = root.join("h200");
    let before: Vec<_> = std::fs::read_dir(&inside)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    let err = write_report(&root, &inside).unwrap_err().to_string();
    assert!(err.contains("never writes there"), "{err}");
    let out = report_cli(&root, &inside);
    assert_eq!(out.status.code(), Some(EXIT_NO_VERDICT.into()));
    let after: Vec<_> = std::fs::read_dir(&inside)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(before, after, "nothing was written into the baseline");
    assert!(!inside.join(REPORT_MD).exists());
}

/// A speedup row of the planted baseline's run (a report judges a run's
/// speedups with its trials).
fn speedup(ratio: f64, low: f64, high: f64) -> SpeedupRow {
    SpeedupRow {
        run_id: "base-1".into(),
        contract: "fusion-v1".into(),
        test_id: "F-SPEED-001".into(),
        status: Some(Status::Passed),
        threshold: Some(1.0),
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
        peak_device_gib: None,
        baseline_peak_device_gib: None,
        clocks: String::new(),
    }
}

#[test]
fn only_a_speedup_interval_wholly_below_the_baseline_regresses() {
    let tmp = tempfile::tempdir().unwrap();
    let rows = rows_of(&fixture("planted_baseline"));
    let run = |name: &str, s: Vec<SpeedupRow>| {
        let dir = tmp.path().join(name);
        write_rows_atomic(&dir.join("falsification.csv"), &rows).unwrap();
        write_rows_atomic(&dir.join("speedups.csv"), &s).unwrap();
        dir
    };
    let mutant = |s: SpeedupRow| SpeedupRow {
        test_id: "F-SPEED-001::mutant".into(),
        ..s
    };
    let baseline = run(
        "baseline",
        vec![speedup(1.3, 1.2, 1.4), mutant(speedup(0.5, 0.45, 0.55))],
    );
    // Lower, but the intervals overlap: noise.
    let overlapping = run("overlap", vec![speedup(1.18, 1.1, 1.21)]);
    assert_eq!(
        write_report(&baseline, &overlapping).unwrap().verdict,
        Verdict::Clean
    );
    let below = run("below", vec![speedup(1.1, 1.05, 1.19)]);
    let outcome = write_report(&baseline, &below).unwrap();
    assert_eq!(outcome.verdict, Verdict::Regressed);
    assert_eq!(outcome.verdict.exit_code(), EXIT_REGRESSED);
    assert!(outcome.speedup_regressions[0].contains("1.1 [1.05, 1.19] now"));
    // A mutant's row times an injected fault: slower is never a regression.
    let slow_mutant = run(
        "slow-mutant",
        vec![speedup(1.3, 1.2, 1.4), mutant(speedup(0.2, 0.19, 0.21))],
    );
    assert_eq!(
        write_report(&baseline, &slow_mutant).unwrap().verdict,
        Verdict::Clean
    );
    // A row measured on a throttled GPU is `skipped`: unjudged, so never a
    // regression however low.
    let throttled = SpeedupRow {
        status: Some(Status::Skipped),
        ..speedup(1.1, 1.05, 1.19)
    };
    let hot = run("throttled", vec![throttled]);
    assert_eq!(
        write_report(&baseline, &hot).unwrap().verdict,
        Verdict::Clean
    );
    // The ratio fell because the baseline side got faster while the
    // candidate did not slow (an eager step on a faster host): marked, not a
    // regression.
    let faster_baseline_side = run(
        "faster-baseline-side",
        vec![SpeedupRow {
            baseline_median_ms: 1.1 / 1.3,
            candidate_median_ms: 1.0 / 1.3,
            ..speedup(1.1, 1.05, 1.19)
        }],
    );
    let outcome = write_report(&baseline, &faster_baseline_side).unwrap();
    assert_eq!(outcome.verdict, Verdict::Clean);
    let md = std::fs::read_to_string(&outcome.path).unwrap();
    assert!(md.contains("| -15.4% (baseline side faster) |"), "{md}");
    // The same low figure from another GPU is another measurement, not a regression.
    let elsewhere = run(
        "elsewhere",
        vec![SpeedupRow {
            device: "NVIDIA H100 80GB HBM3".into(),
            ..speedup(1.1, 1.05, 1.19)
        }],
    );
    let outcome = write_report(&baseline, &elsewhere).unwrap();
    assert_eq!(outcome.verdict, Verdict::Clean);
    assert!(outcome.speedup_regressions.is_empty());
}

#[test]
fn speedups_csv_has_the_design_columns_and_older_files_still_read() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("speedups.csv");
    write_rows_atomic(&path, &[speedup(1.3, 1.2, 1.4)]).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(
        text.lines().next().unwrap(),
        "run_id,contract,test_id,status,threshold,subject,model,batch,seq_len,baseline,candidate,\
         baseline_median_ms,candidate_median_ms,ratio,ratio_ci_low,ratio_ci_high,repeats,device,\
         peak_device_gib,baseline_peak_device_gib,clocks"
    );
    let back: Vec<SpeedupRow> = read_rows(&path).unwrap();
    assert_eq!(back, [speedup(1.3, 1.2, 1.4)]);
    // An older file (no contract, status, threshold, peak memory) reads, and
    // the report fills what the trial rows know.
    let old: Vec<SpeedupRow> =
        read_rows(&fixture("planted_baseline").join("speedups.csv")).unwrap();
    assert!(old
        .iter()
        .all(|s| s.status.is_none() && s.contract.is_empty()));
    let tmp_baseline = copy_fixture("planted_baseline", tmp.path());
    let data = falsify_core::report::compare::RunData::load(
        &tmp_baseline,
        falsify_core::report::evidence::Side::Baseline,
    )
    .unwrap();
    let bw = data
        .speedups
        .iter()
        .find(|s| s.test_id == "F-BW-RMSNORM-001")
        .unwrap();
    assert_eq!(
        (bw.contract.as_str(), bw.status, bw.threshold),
        ("kernel-efficiency-v1", Some(Status::Passed), Some(0.7))
    );
    // A rate over its target passes at 1.0.
    let target = data
        .speedups
        .iter()
        .find(|s| s.test_id == "F-TPUT-003")
        .unwrap();
    assert_eq!(target.threshold, Some(1.0));
}

#[test]
fn cells_that_would_run_as_formulas_are_neutralised_and_numbers_stay_numbers() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("falsification.csv");
    let mut row = rows_of(&fixture("planted_baseline")).remove(0);
    row.test_id = "=HYPERLINK(\"http://x\",\"click\")".into();
    row.detail = "-1+2, then @SUM(A1)".into();
    row.device = "+cmd|' /C calc'!A0".into();
    row.comparator = "==".into();
    row.observed = Some(-0.5);
    row.threshold = Some(-1e-7);
    write_rows_atomic(&path, std::slice::from_ref(&row)).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let record = text.lines().nth(1).unwrap();
    assert!(
        record.contains(r#""'=HYPERLINK(""http://x"",""click"")""#),
        "{record}"
    );
    assert!(record.contains("'-1+2, then @SUM(A1)"), "{record}");
    assert!(record.contains("'+cmd|"), "{record}");
    // A comparator is no formula: `==` reads as written.
    assert!(record.contains(",==,"), "{record}");
    // Numbers are not text: a negative number is written as a number.
    assert!(
        record.contains(",-0.5,") && record.contains(",-1e-7,"),
        "{record}"
    );
    // Reading undoes the neutralisation exactly.
    let back: Vec<FalsificationRow> = read_rows(&path).unwrap();
    assert_eq!(back, [row]);
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
fn the_runs_table_shows_plain_facts() {
    let tmp = tempfile::tempdir().unwrap();
    let baseline = copy_fixture("planted_baseline", tmp.path());
    let current = copy_fixture("planted_current", tmp.path());
    let outcome = write_report(&baseline, &current).unwrap();
    let md = std::fs::read_to_string(&outcome.path).unwrap();
    let runs = section(&md, "## Runs");
    assert!(runs.contains("base-1") && runs.contains("cur-2"));
    assert!(
        runs.contains("aaaa11112222 (not run from a checkout: tree state unknown)"),
        "{runs}"
    );
    assert!(
        runs.contains("bbbb33334444 (checkout with uncommitted changes)"),
        "{runs}"
    );
    assert!(
        runs.contains("| devices | Xeon; NVIDIA H200 |") || runs.contains("NVIDIA H200; Xeon"),
        "{runs}"
    );
    assert!(!runs.contains("cpu: Xeon"));
    assert!(runs.contains(
        "`seed=0`, `out_dir=reports/latest`, `gpu.ordinal=0`, `gpu.forward_math=Tf32`, `gpu.backward_math=Fp32`"
    ));
    let speedups = section(&md, "## Speedups");
    assert!(
        speedups.contains("| F-BW-RMSNORM-001 | rmsnorm fwd | {hidden=896, rows=1024} |"),
        "{speedups}"
    );
    assert!(speedups.contains("| qwen2.5-0.5b, batch 4 x seq 512 |"));
    assert!(!md.contains("0 x 0"));
}

#[test]
fn the_cli_exit_codes_tell_clean_regressed_and_no_verdict_apart() {
    let tmp = tempfile::tempdir().unwrap();
    let baseline = copy_fixture("planted_baseline", tmp.path());
    let current = copy_fixture("planted_current", tmp.path());
    let out = report_cli(&baseline, &current);
    assert_eq!(out.status.code(), Some(EXIT_REGRESSED.into()));
    let text = stdout(&out);
    assert!(
        text.contains("REGRESSION rmsnorm-kernels-v1::F-RMS-GPU-001"),
        "{text}"
    );
    assert!(text.contains("verdict: regressed (exit 1)"));
    assert!(text.contains("baseline: Baseline `h200`"));
    // The baseline against itself: clean, exit 0.
    let same = copy_fixture("planted_baseline", &tmp.path().join("again"));
    let out = report_cli(&baseline, &same);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    // A missing baseline is no verdict, not a clean report.
    let out = report_cli(&tmp.path().join("nowhere"), &current);
    assert_eq!(out.status.code(), Some(EXIT_NO_VERDICT.into()));
}

/// The release rehearsal end to end: a real trial run with its mutant injected
/// (`falsify run --inject`) is named as a regression against the committed
/// baselines, and `report` exits with the regression code although most
/// baseline trials did not run.
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
    // The summary reads as a failure: the relation that is true, then the verdict.
    let summary = stdout(&run);
    let line = summary
        .lines()
        .find(|l| l.contains("F-GRAD-GEMM-001") && l.contains("falsified"))
        .unwrap_or_else(|| panic!("{summary}"));
    assert!(
        line.contains(" > ") && line.trim_end().ends_with(": falsified"),
        "{line}"
    );
    // Rows name the build commit and the CPU model, nothing more.
    let rows = rows_of(&current);
    assert!(rows
        .iter()
        .all(|r| !r.git_sha.contains(' ') && !r.git_sha.ends_with("-dirty")));
    assert!(
        rows.iter().all(|r| !r.device.starts_with("cpu:")),
        "{:?}",
        rows[0].device
    );
    let record = std::fs::read_to_string(current.join("run.json")).unwrap();
    assert!(record.contains("\"git_source\""), "{record}");

    let out = Command::new(env!("CARGO_BIN_EXE_falsify"))
        .current_dir(manifest)
        .args(["report", "--baseline", "reports/baseline", "--current"])
        .arg(&current)
        .output()
        .unwrap();
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(EXIT_REGRESSED.into()), "{text}");
    assert!(
        text.contains("REGRESSION reference-gradients-v1::F-GRAD-GEMM-001"),
        "{text}"
    );
    // A run on a machine without a GPU: judged on the cpu rows of every baseline.
    assert!(
        text.contains("`cpu` rows of every baseline: `h100`"),
        "{text}"
    );
    assert!(text.contains("NOT RUN "), "{text}");
    let md = std::fs::read_to_string(current.join("REPORT.md")).unwrap();
    let regressions = section(&md, "## Regressions");
    assert!(regressions.contains("F-GRAD-GEMM-001"), "{regressions}");
    assert!(md.find("## Regressions") < md.find("## Changes of status"));
}

/// A drop within the run-to-run noise of one GPU kind is not a regression,
/// however narrow the intervals; nor is a drop in a row that is only one part
/// of a judged total (no threshold).
#[test]
fn a_speedup_drop_within_run_to_run_noise_or_in_a_part_row_is_not_a_regression() {
    let tmp = tempfile::tempdir().unwrap();
    let rows = rows_of(&fixture("planted_baseline"));
    let run = |name: &str, s: Vec<SpeedupRow>| {
        let dir = tmp.path().join(name);
        write_rows_atomic(&dir.join("falsification.csv"), &rows).unwrap();
        write_rows_atomic(&dir.join("speedups.csv"), &s).unwrap();
        dir
    };
    let baseline = run("baseline", vec![speedup(1.30, 1.299, 1.301)]);
    // 3% lower, intervals far apart: the spread between runs, not a regression.
    let small_drop = run("small", vec![speedup(1.26, 1.259, 1.261)]);
    assert_eq!(
        write_report(&baseline, &small_drop).unwrap().verdict,
        Verdict::Clean
    );
    // 10% lower: a regression.
    let big_drop = run("big", vec![speedup(1.17, 1.169, 1.171)]);
    assert_eq!(
        write_report(&baseline, &big_drop).unwrap().verdict,
        Verdict::Regressed
    );
    // The same 10% in a part row (no threshold of its own): context only.
    let part = |s: SpeedupRow| SpeedupRow {
        threshold: None,
        ..s
    };
    let part_base = run("part-base", vec![part(speedup(1.30, 1.299, 1.301))]);
    let part_drop = run("part-drop", vec![part(speedup(1.17, 1.169, 1.171))]);
    assert_eq!(
        write_report(&part_base, &part_drop).unwrap().verdict,
        Verdict::Clean
    );
}
