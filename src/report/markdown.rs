//! `REPORT.md`: the regression report of a run against a baseline.
//!
//! Layout, most urgent first: run metadata, regressions, changes of status
//! (with the trials this run could not execute, e.g. GPU trials without a
//! driver), charts, failure artifacts, a verdict table per contract, and the
//! speedup table.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::artifacts::{ArtifactWriter, ARTIFACTS_DIR};
use super::charts::{write_charts, Chart};
use super::compare::{RunComparison, RunData, SpeedupDiff, TrialDiff, Verdict};
use super::{FalsificationRow, SpeedupRow, Status};
use crate::error::Result;
use crate::report::format_number;

/// Name of the report file written into the current run's directory.
pub const REPORT_MD: &str = "REPORT.md";

/// What `write_report` did.
#[derive(Debug, Clone)]
pub struct ReportOutcome {
    pub verdict: Verdict,
    /// Trials that passed in the baseline and are falsified or error now,
    /// as `contract::test_id (baseline -> current)`.
    pub regressions: Vec<String>,
    /// Speedups whose interval now lies wholly below the baseline's.
    pub speedup_regressions: Vec<String>,
    /// The report file.
    pub path: PathBuf,
    pub charts: Vec<Chart>,
}

/// Compares `current` with `baseline`, draws the charts and writes
/// `<current>/REPORT.md` (atomically). The verdict is `Regressed` when any
/// trial or speedup regressed; the caller maps it to an exit code.
pub fn write_report(baseline_dir: &Path, current_dir: &Path) -> Result<ReportOutcome> {
    let baseline = RunData::load(baseline_dir)?;
    let current = RunData::load(current_dir)?;
    let cmp = RunComparison::new(&baseline, &current);
    let charts = write_charts(current_dir, &cmp)?;
    let artifacts: Vec<String> = ArtifactWriter::list(&current_dir.join(ARTIFACTS_DIR))
        .iter()
        .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .collect();
    let text = render(&baseline, &current, &cmp, &charts, &artifacts);
    let path = current_dir.join(REPORT_MD);
    super::write_bytes_atomic(&path, text.as_bytes())?;
    Ok(ReportOutcome {
        verdict: cmp.verdict(),
        regressions: cmp
            .regressions()
            .iter()
            .map(|t| regression_line(t))
            .collect(),
        speedup_regressions: cmp
            .speedup_regressions()
            .iter()
            .map(|s| speedup_line(s))
            .collect(),
        path,
        charts,
    })
}

/// The whole report as Markdown.
pub fn render(
    baseline: &RunData,
    current: &RunData,
    cmp: &RunComparison,
    charts: &[Chart],
    artifacts: &[String],
) -> String {
    let mut md = String::new();
    let regressions = cmp.regressions();
    let slow = cmp.speedup_regressions();
    let _ = writeln!(md, "# Regression report\n");
    let verdict = match cmp.verdict() {
        Verdict::Regressed => format!(
            "**Verdict: REGRESSED** — {} trial regression(s), {} speedup regression(s).",
            regressions.len(),
            slow.len()
        ),
        Verdict::Clean => {
            "**Verdict: clean** — nothing that passed in the baseline fails now, and no speedup dropped below its baseline interval.".to_string()
        }
    };
    let _ = writeln!(md, "{verdict}\n");
    runs_section(&mut md, baseline, current);

    let _ = writeln!(md, "## Regressions\n");
    if regressions.is_empty() && slow.is_empty() {
        let _ = writeln!(md, "None.\n");
    }
    for t in &regressions {
        let detail = t.current.as_ref().map(|r| r.detail.as_str()).unwrap_or("");
        let _ = writeln!(
            md,
            "- **{}** — {}  \n  {}",
            cell(&format!("{}::{}", t.contract, t.test_id)),
            cell(&format!(
                "{} in the baseline, {} now: {}",
                status_text(t.baseline_status()),
                status_text(t.current_status()),
                t.current.as_ref().map(measured).unwrap_or_default()
            )),
            cell(detail)
        );
    }
    for s in &slow {
        let _ = writeln!(md, "- **speedup dropped** — {}", cell(&speedup_line(s)));
    }
    if !(regressions.is_empty() && slow.is_empty()) {
        md.push('\n');
    }

    changes_section(&mut md, cmp);
    charts_section(&mut md, charts);
    artifacts_section(&mut md, artifacts);
    verdicts_section(&mut md, cmp);
    speedups_section(&mut md, cmp);
    md
}

/// One line of the runs table: how to read a fact from a run's reports.
type Fact = fn(&RunData) -> String;

fn runs_section(md: &mut String, baseline: &RunData, current: &RunData) {
    let _ = writeln!(md, "## Runs\n");
    let _ = writeln!(md, "| | baseline | current |\n| --- | --- | --- |");
    let facts: [(&str, Fact); 11] = [
        ("report directory", |r| format!("`{}`", r.dir.display())),
        ("run id(s)", |r| {
            let mut ids = r.distinct(|x| &x.run_id);
            if let Some(m) = &r.meta {
                if !ids.contains(&m.run_id) {
                    ids.push(m.run_id.clone());
                }
            }
            ids.join(", ")
        }),
        ("started / finished", |r| match (&r.meta, r.time_span()) {
            (Some(m), _) => format!("{} / {}", m.started, m.finished),
            (None, Some((a, b))) => format!("{a} / {b} (first and last row)"),
            (None, None) => "unknown".into(),
        }),
        ("git sha", |r| r.distinct(|x| &x.git_sha).join(", ")),
        ("devices", |r| r.distinct(|x| &x.device).join("; ")),
        ("compute capability", |r| {
            or_none(r.distinct(|x| &x.compute_capability).join(", "))
        }),
        ("CUDA driver (driver API)", |r| {
            or_none(r.distinct(|x| &x.driver_version).join(", "))
        }),
        ("NVIDIA driver", |r| {
            match r.meta.as_ref().and_then(|m| m.gpu.as_ref()) {
                Some(g) => g.nvidia_driver.clone(),
                None => "not recorded".into(),
            }
        }),
        ("GPU", |r| {
            match r.meta.as_ref().and_then(|m| m.gpu.as_ref()) {
                Some(g) => format!(
                    "{}, {} SMs, {:.1} GiB",
                    g.name,
                    g.sm_count,
                    g.total_memory_bytes as f64 / (1u64 << 30) as f64
                ),
                None => "none used (or not recorded)".into(),
            }
        }),
        ("clocks (SM, memory, power)", |r| match &r.meta {
            Some(m) => m.clocks.clone(),
            None => "not recorded".into(),
        }),
        ("options", |r| match &r.meta {
            Some(m) => format!(
                "seed {}, out `{}`, {}",
                m.options.seed, m.options.out_dir, m.options.gpu
            ),
            None => "not recorded (no run.json)".into(),
        }),
    ];
    for (name, fact) in facts {
        let _ = writeln!(
            md,
            "| {name} | {} | {} |",
            cell(&fact(baseline)),
            cell(&fact(current))
        );
    }
    let count = |r: &RunData| {
        let n = |s: Status| r.rows.iter().filter(|x| x.status == s).count();
        format!(
            "{} passed, {} falsified, {} error, {} skipped",
            n(Status::Passed),
            n(Status::Falsified),
            n(Status::Error),
            n(Status::Skipped)
        )
    };
    let _ = writeln!(
        md,
        "| trials | {} | {} |\n",
        count(baseline),
        count(current)
    );
}

fn changes_section(md: &mut String, cmp: &RunComparison) {
    let _ = writeln!(md, "## Changes of status\n");
    for (reason, trials) in cmp.not_run_here() {
        let gpu = trials.iter().all(|t| t.backend() == "cuda");
        let _ = writeln!(
            md,
            "{} {} were not run in this run (skipped: {}) — their baseline verdicts are shown for reference.\n",
            trials.len(),
            if gpu { "GPU trials" } else { "trials" },
            cell(&reason)
        );
    }
    let changes = cmp.status_changes();
    if changes.is_empty() {
        let _ = writeln!(md, "No trial changed status.\n");
        return;
    }
    let _ = writeln!(
        md,
        "| trial | on | baseline | current | change |\n| --- | --- | --- | --- | --- |"
    );
    for t in changes {
        let kind = if t.is_regression() {
            "**regression**"
        } else if t.not_run_here() {
            "not run here"
        } else if t.baseline.is_none() {
            "new trial"
        } else if t.current.is_none() {
            "not in the current report"
        } else if t.current_status() == Some(Status::Passed) {
            "now passes"
        } else {
            "changed"
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {kind} |",
            cell(&format!("{}::{}", t.contract, t.test_id)),
            t.backend(),
            status_text(t.baseline_status()),
            status_text(t.current_status())
        );
    }
    md.push('\n');
}

fn charts_section(md: &mut String, charts: &[Chart]) {
    let _ = writeln!(md, "## Charts\n");
    for c in charts {
        match &c.file {
            Some(file) => {
                let _ = writeln!(
                    md,
                    "### {}\n\n{} [{file}]({file})\n\n![{}]({file})\n",
                    c.title, c.note, c.title
                );
            }
            None => {
                let _ = writeln!(md, "- {}", c.note);
            }
        }
    }
    md.push('\n');
}

fn artifacts_section(md: &mut String, artifacts: &[String]) {
    let _ = writeln!(md, "## Failure artifacts\n");
    if artifacts.is_empty() {
        let _ = writeln!(
            md,
            "None: no parity trial of this run was falsified with tensors to dump.\n"
        );
        return;
    }
    let _ = writeln!(
        md,
        "Inputs, outputs and references of falsified parity trials, under `{ARTIFACTS_DIR}/` (metadata: seed, op, shape). Requires `pip install safetensors numpy` (and `torch` for PyTorch).\n"
    );
    for a in artifacts {
        let path = format!("{ARTIFACTS_DIR}/{a}");
        let _ = writeln!(
            md,
            "### [{a}]({path})\n\n```python\nfrom safetensors.numpy import load_file\ntensors = load_file(\"{path}\")  # dict: name -> numpy array\n\nimport safetensors.torch\ntensors = safetensors.torch.load_file(\"{path}\")  # dict: name -> torch.Tensor\n```\n"
        );
    }
}

fn verdicts_section(md: &mut String, cmp: &RunComparison) {
    let _ = writeln!(md, "## Verdicts by contract\n");
    for contract in cmp.contracts() {
        let _ = writeln!(
            md,
            "### {contract}\n\n| test | on | baseline | current | current: observed vs threshold | baseline: observed |\n| --- | --- | --- | --- | --- | --- |"
        );
        for t in cmp.trials.iter().filter(|t| t.contract == contract) {
            let mark = if t.is_regression() {
                " **(regression)**"
            } else {
                ""
            };
            let _ = writeln!(
                md,
                "| {}{mark} | {} | {} | {} | {} | {} |",
                cell(&t.test_id),
                t.backend(),
                status_text(t.baseline_status()),
                status_text(t.current_status()),
                cell(&t.current.as_ref().map(measured).unwrap_or_default()),
                cell(
                    &t.baseline
                        .as_ref()
                        .and_then(|r| r.observed)
                        .map(format_number)
                        .unwrap_or_default()
                ),
            );
        }
        md.push('\n');
    }
}

fn speedups_section(md: &mut String, cmp: &RunComparison) {
    let _ = writeln!(md, "## Speedups\n");
    if cmp.speedups.is_empty() {
        let _ = writeln!(md, "Neither report has speedup rows.\n");
        return;
    }
    let _ = writeln!(
        md,
        "| test | subject | model | batch x seq | baseline / candidate | current ratio [CI] | baseline ratio [CI] | change |\n| --- | --- | --- | --- | --- | --- | --- | --- |"
    );
    for s in &cmp.speedups {
        let Some(r) = s.row() else { continue };
        let change = match s.change() {
            Some(c) => format!("{:+.1}%", c * 100.0),
            None => String::new(),
        };
        let mark = if s.is_regression() {
            " **(regression)**"
        } else {
            ""
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} x {} | {} / {} | {} | {} | {change}{mark} |",
            cell(&r.test_id),
            cell(&r.subject),
            cell(&r.model),
            r.batch,
            r.seq_len,
            cell(&r.baseline),
            cell(&r.candidate),
            s.current
                .as_ref()
                .map(ratio_ci)
                .unwrap_or_else(|| "not run".into()),
            s.baseline
                .as_ref()
                .map(ratio_ci)
                .unwrap_or_else(|| "absent".into()),
        );
    }
    md.push('\n');
}

fn ratio_ci(r: &SpeedupRow) -> String {
    format!(
        "{} [{}, {}]",
        format_number(r.ratio),
        format_number(r.ratio_ci_low),
        format_number(r.ratio_ci_high)
    )
}

/// `metric = observed <= threshold unit`, or the status when nothing was measured.
fn measured(r: &FalsificationRow) -> String {
    match (r.observed, r.threshold) {
        (Some(o), Some(t)) => format!(
            "{} = {} {} {}{}",
            r.metric,
            format_number(o),
            r.comparator,
            format_number(t),
            if r.unit.is_empty() {
                String::new()
            } else {
                format!(" {}", r.unit)
            }
        ),
        _ => format!("not measured ({})", r.status.as_str()),
    }
}

fn regression_line(t: &TrialDiff) -> String {
    format!(
        "{}::{} ({} -> {})",
        t.contract,
        t.test_id,
        status_text(t.baseline_status()),
        status_text(t.current_status())
    )
}

fn speedup_line(s: &SpeedupDiff) -> String {
    let (Some(b), Some(c)) = (&s.baseline, &s.current) else {
        return String::new();
    };
    format!(
        "{} {} {} b{} s{} ({} / {}): {} now, {} in the baseline",
        c.test_id,
        c.subject,
        c.model,
        c.batch,
        c.seq_len,
        c.baseline,
        c.candidate,
        ratio_ci(c),
        ratio_ci(b)
    )
}

fn status_text(s: Option<Status>) -> &'static str {
    s.map(Status::as_str).unwrap_or("absent")
}

fn or_none(s: String) -> String {
    if s.is_empty() {
        "none".into()
    } else {
        s
    }
}

/// Text safe inside a Markdown table cell: pipes escaped, newlines flattened.
fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace(['\n', '\r'], " ")
}
