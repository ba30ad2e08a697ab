//! `REPORT.md`: the regression report of a run against its baseline(s).
//!
//! Layout, most urgent first: the verdict and which baseline was chosen, the
//! evidence (what each side's folder held, which runs were judged, what was
//! set aside), run metadata, regressions, the subject's known violations
//! (those fixed first), trials that did not run (selected
//! trials without a row, baseline trials absent), changes of status (with
//! the trials skipped here for a recorded reason), charts, failure
//! artifacts, a verdict table per contract, and the speedup table. Against
//! several baselines (a run without a GPU), each comparison section has one
//! subsection per baseline.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::artifacts::{ArtifactWriter, ARTIFACTS_DIR};
use super::baseline::{host_description, refuse_output_inside, select, subject_of};
use super::charts::{write_charts, Chart};
use super::claim::short;
use super::compare::{RunComparison, RunData, SpeedupDiff, TrialDiff, Verdict, RUN_TO_RUN_NOISE};
use super::evidence::Side;
use super::meta::{plain_device, plain_sha, GitSource};
use super::{format_number, FalsificationRow, SpeedupRow, Status};
use crate::error::{Error, Result};

/// Name of the report file written into the current run's directory.
pub const REPORT_MD: &str = "REPORT.md";

/// What `write_report` did.
#[derive(Debug, Clone)]
pub struct ReportOutcome {
    pub verdict: Verdict,
    /// Which baseline(s) the run was compared with, and why.
    pub baseline: String,
    /// Trials falsified now that are not known violations, and trials
    /// that passed in the baseline and are error now, as
    /// `contract::test_id (baseline -> current)`.
    pub regressions: Vec<String>,
    /// The subject the current run tested (its run record's; `qlora` for
    /// records from before subjects).
    pub subject: String,
    /// Trials falsified as their contracts expect on this subject, as
    /// `contract::test_id: reason`. Never regressions.
    pub known_violations: Vec<String>,
    /// Known violations that pass now, as `contract::test_id (reason)`:
    /// fixed, so their `known_violation` must be removed. Never regressions.
    pub fixed: Vec<String>,
    /// Speedups whose interval now lies wholly below the baseline's.
    pub speedup_regressions: Vec<String>,
    /// Baseline trials that did not run, as `contract::test_id (why)`.
    pub not_run: Vec<String>,
    /// Trials that are error now and did not pass in the baseline, as
    /// `contract::test_id (status in the baseline)`: not regressions, and
    /// no evidence either way.
    pub unjudged: Vec<String>,
    /// Trials the current run selected and has no row of, as
    /// `contract::test_id`: they did not finish, whatever older rows say.
    pub missing: Vec<String>,
    /// Why the current run's evidence is short of what it selected (see
    /// [`RunData::gaps`]); any makes the verdict at best `incomplete`.
    pub gaps: Vec<String>,
    /// For each side, what was read and judged: `baseline `h200`: read ...`,
    /// then `current: read ...`.
    pub evidence: Vec<String>,
    /// The report file.
    pub path: PathBuf,
    pub charts: Vec<Chart>,
}

/// One baseline and the comparison of the current run with it.
struct Compared<'a> {
    /// The baseline as compared (a run without a GPU: its `cpu` rows).
    baseline: &'a RunData,
    /// The baseline run whole, for the runs table.
    whole: &'a RunData,
    cmp: RunComparison,
}

/// Everything the report says.
struct Report<'a> {
    /// The current run as compared, and whole.
    current: &'a RunData,
    current_whole: &'a RunData,
    compared: Vec<Compared<'a>>,
    why: &'a str,
}

impl Report<'_> {
    /// The worst verdict over the baselines; at best `incomplete` when the
    /// current run did not finish what it selected.
    fn verdict(&self) -> Verdict {
        let compared = self
            .compared
            .iter()
            .map(|c| c.cmp.verdict())
            .max()
            .unwrap_or(Verdict::Clean);
        if self.current_whole.gaps().is_empty() {
            compared
        } else {
            compared.max(Verdict::Incomplete)
        }
    }

    /// For each side, what was read and judged.
    fn evidence(&self) -> Vec<String> {
        let mut lines: Vec<String> = self
            .compared
            .iter()
            .map(|c| {
                format!(
                    "baseline `{}`: {}",
                    c.baseline.name,
                    c.whole.account.summary()
                )
            })
            .collect();
        lines.push(format!("current: {}", self.current_whole.account.summary()));
        lines
    }

    /// Several baselines get one subsection each.
    fn several(&self) -> bool {
        self.compared.len() > 1
    }

    /// ` against h200` when there are several baselines.
    fn against(&self, c: &Compared) -> String {
        if self.several() {
            format!(" against {}", c.baseline.name)
        } else {
            String::new()
        }
    }

    /// Writes `### Against `<name>`` before a baseline's part of a section.
    fn subheading(&self, md: &mut String, c: &Compared) {
        if self.several() {
            let _ = writeln!(md, "### Against `{}`\n", c.baseline.name);
        }
    }

    fn count(&self, f: impl Fn(&RunComparison) -> usize) -> usize {
        self.compared.iter().map(|c| f(&c.cmp)).sum()
    }

    /// The current run's known violations still falsified: what the rows
    /// say, the same against every baseline, so read from the first.
    fn known_violations(&self) -> Vec<&TrialDiff> {
        self.compared
            .first()
            .map(|c| c.cmp.known_violations())
            .unwrap_or_default()
    }

    /// The current run's known violations that pass now.
    fn fixed(&self) -> Vec<&TrialDiff> {
        self.compared
            .first()
            .map(|c| c.cmp.fixed())
            .unwrap_or_default()
    }
}

/// Compares the run in `current_dir` with its baseline(s) under
/// `baseline_root` (see [`super::baseline`]), draws the charts and writes
/// `<current>/REPORT.md` (atomically). Refuses to write anything when
/// `current_dir` lies inside `baseline_root`. The caller maps the verdict to
/// an exit code ([`Verdict::exit_code`]).
pub fn write_report(baseline_root: &Path, current_dir: &Path) -> Result<ReportOutcome> {
    let current = RunData::load(current_dir, Side::Current)?;
    refuse_output_inside(baseline_root, current_dir)?;
    let selection = select(baseline_root, &current)?;
    let report = Report {
        current: &selection.current,
        current_whole: &current,
        compared: selection
            .baselines
            .iter()
            .zip(&selection.whole_baselines)
            .map(|(baseline, whole)| Compared {
                baseline,
                whole,
                cmp: RunComparison::new(baseline, &selection.current),
            })
            .collect(),
        why: &selection.why,
    };
    let first = report
        .compared
        .first()
        .ok_or_else(|| Error::InvalidArgument {
            op: "report",
            message: format!("no baseline to compare {} with", current_dir.display()),
        })?;
    let charts = write_charts(current_dir, &first.cmp, &first.baseline.name)?;
    let artifacts: Vec<String> = ArtifactWriter::list(&current_dir.join(ARTIFACTS_DIR))
        .iter()
        .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .collect();
    let text = render(&report, &charts, &artifacts);
    let path = current_dir.join(REPORT_MD);
    super::write_bytes_atomic(&path, text.as_bytes())?;
    Ok(outcome(&report, path, charts))
}

fn outcome(report: &Report, path: PathBuf, charts: Vec<Chart>) -> ReportOutcome {
    let mut out = ReportOutcome {
        verdict: report.verdict(),
        baseline: report.why.to_string(),
        regressions: Vec::new(),
        subject: subject_of(report.current_whole).to_string(),
        known_violations: report.known_violations().iter().map(known_line).collect(),
        fixed: report.fixed().iter().map(fixed_line).collect(),
        speedup_regressions: Vec::new(),
        not_run: Vec::new(),
        unjudged: Vec::new(),
        missing: report.current_whole.account.missing.clone(),
        gaps: report.current_whole.gaps(),
        evidence: report.evidence(),
        path,
        charts,
    };
    for c in &report.compared {
        let against = report.against(c);
        for t in c.cmp.regressions() {
            out.regressions
                .push(format!("{}{against}", regression_line(t)));
        }
        for s in c.cmp.speedup_regressions() {
            out.speedup_regressions
                .push(format!("{}{against}", speedup_line(s)));
        }
        for t in c.cmp.unjudged() {
            out.unjudged.push(format!(
                "{}::{} ({} in the baseline{against})",
                t.contract,
                t.test_id,
                status_text(t.baseline_status())
            ));
        }
        for t in c.cmp.not_run() {
            out.not_run.push(format!(
                "{}::{} ({}; {} in the baseline{against})",
                t.contract,
                t.test_id,
                not_run_reason(t),
                status_text(t.baseline_status())
            ));
        }
    }
    out
}

/// The whole report as Markdown.
fn render(report: &Report, charts: &[Chart], artifacts: &[String]) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# Regression report\n");
    let _ = writeln!(md, "{}\n", verdict_sentence(report));
    let _ = writeln!(md, "{}\n", report.why);
    evidence_section(&mut md, report);
    runs_section(&mut md, report);
    regressions_section(&mut md, report);
    known_violations_section(&mut md, report);
    not_run_section(&mut md, report);
    unjudged_section(&mut md, report);
    changes_section(&mut md, report);
    charts_section(&mut md, charts);
    artifacts_section(&mut md, artifacts);
    verdicts_section(&mut md, report);
    speedups_section(&mut md, report);
    md
}

fn verdict_sentence(report: &Report) -> String {
    let verdict = report.verdict();
    let regressions = report.count(|c| c.regressions().len());
    let slow = report.count(|c| c.speedup_regressions().len());
    let not_run = report.count(|c| c.not_run().len());
    let mut gaps = Vec::new();
    if not_run > 0 {
        gaps.push(format!("{not_run} baseline trial(s) did not run"));
    }
    gaps.extend(report.current_whole.gaps());
    let mut sentence = verdict_words(verdict, regressions, slow, &gaps);
    let unjudged = report.count(|c| c.unjudged().len());
    if unjudged > 0 {
        sentence.push_str(&format!(
            " {unjudged} trial(s) could not be judged (`error`, and not passed in the baseline): \
             listed under *Unjudged*."
        ));
    }
    match report.fixed().len() {
        0 => sentence,
        fixed => format!(
            "{sentence} **{fixed} known violation(s) of `{}` now hold: remove their \
             `known_violation`** (listed under *Known violations*).",
            subject_of(report.current_whole)
        ),
    }
}

/// The verdict in words, with what decided it.
fn verdict_words(verdict: Verdict, regressions: usize, slow: usize, gaps: &[String]) -> String {
    let code = verdict.exit_code();
    match verdict {
        Verdict::Regressed => format!(
            "**Verdict: REGRESSED** — {regressions} trial regression(s), {slow} speedup regression(s){}. `falsify report` exits {code}.",
            if gaps.is_empty() {
                String::new()
            } else {
                format!("; besides, {}", gaps.join("; "))
            }
        ),
        Verdict::Incomplete => format!(
            "**Verdict: INCOMPLETE** — {} (listed under *Not run*), so this run cannot be called clean; nothing that did run regressed. `falsify report` exits {code}.",
            gaps.join("; ")
        ),
        Verdict::Clean => format!(
            "**Verdict: clean** — every trial this run selected finished, every baseline trial ran or was skipped for a recorded reason, no trial is falsified but the known violations its contract states, nothing that passed in the baseline errors now, and no speedup dropped below its baseline interval. `falsify report` exits {code}."
        ),
    }
}

/// What each side's folder held and which of it was judged.
fn evidence_section(md: &mut String, report: &Report) {
    let _ = writeln!(md, "## Evidence\n");
    for line in report.evidence() {
        let _ = writeln!(md, "- {}", cell(&line));
    }
    md.push('\n');
}

/// One line of the runs table: how to read a fact from a run's reports.
type Fact = fn(&RunData) -> String;

fn runs_section(md: &mut String, report: &Report) {
    let _ = writeln!(md, "## Runs\n");
    // Each run's facts come from the run whole; the trial counts from what
    // was compared.
    let mut runs: Vec<(String, &RunData, &RunData)> = report
        .compared
        .iter()
        .map(|c| {
            let title = if report.several() {
                format!("baseline `{}`", c.baseline.name)
            } else {
                "baseline".to_string()
            };
            (title, c.whole, c.baseline)
        })
        .collect();
    runs.push(("current".into(), report.current_whole, report.current));
    let titles: Vec<&str> = runs.iter().map(|(t, _, _)| t.as_str()).collect();
    let _ = writeln!(
        md,
        "| | {} |\n| --- |{}",
        titles.join(" | "),
        " --- |".repeat(runs.len())
    );
    for (name, fact) in facts() {
        let values: Vec<String> = runs.iter().map(|(_, r, _)| cell(&fact(r))).collect();
        let _ = writeln!(md, "| {name} | {} |", values.join(" | "));
    }
    let counts: Vec<String> = runs.iter().map(|(_, _, r)| trial_counts(r)).collect();
    let _ = writeln!(md, "| trials compared | {} |\n", counts.join(" | "));
}

fn trial_counts(r: &RunData) -> String {
    let n = |s: Status| r.rows.iter().filter(|x| x.status == s).count();
    format!(
        "{} passed, {} falsified, {} error, {} skipped",
        n(Status::Passed),
        n(Status::Falsified),
        n(Status::Error),
        n(Status::Skipped)
    )
}

fn facts() -> [(&'static str, Fact); 12] {
    [
        ("report directory", |r| format!("`{}`", r.dir.display())),
        ("run id(s)", run_ids),
        ("started / finished", |r| match (&r.meta, r.time_span()) {
            (Some(m), _) => format!("{} / {}", m.started, m.finished),
            (None, Some((a, b))) => format!("{a} / {b} (first and last row)"),
            (None, None) => "unknown".into(),
        }),
        ("every selected trial finished", finished_fact),
        ("git sha (build commit)", git_fact),
        ("devices", |r| {
            let devices = r.distinct(|x| &x.device);
            // `none`: the device of a `cuda` trial skipped without a GPU.
            let plain: Vec<&str> = devices
                .iter()
                .map(|d| plain_device(d))
                .filter(|d| *d != "none")
                .collect();
            plain.join("; ")
        }),
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
                    host_description(&g.name, g.device_count),
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
            Some(m) => m
                .options
                .key_values()
                .iter()
                .map(|kv| format!("`{kv}`"))
                .collect::<Vec<_>>()
                .join(", "),
            None => "not recorded (no run.json)".into(),
        }),
    ]
}

/// Whether the run finished what it selected: its record's word, and every
/// selected trial has a row of it.
fn finished_fact(r: &RunData) -> String {
    let gaps = r.gaps();
    match &r.meta {
        _ if !gaps.is_empty() => format!("no: {}", gaps.join("; ")),
        Some(_) => "yes".into(),
        None => "not recorded".into(),
    }
}

fn run_ids(r: &RunData) -> String {
    let mut ids = r.distinct(|x| &x.run_id);
    if let Some(m) = &r.meta {
        if !ids.contains(&m.run_id) {
            ids.push(m.run_id.clone());
        }
    }
    ids.join(", ")
}

/// The build commit(s) of a run's rows, and what is known of the tree: from
/// the run record, or from the suffix older rows kept in the same cell.
fn git_fact(r: &RunData) -> String {
    let cells = r.distinct(|x| &x.git_sha);
    let mut shas: Vec<&str> = Vec::new();
    let mut legacy = None;
    for c in &cells {
        let (sha, state) = plain_sha(c);
        if !shas.contains(&sha) {
            shas.push(sha);
        }
        legacy = legacy.or(state);
    }
    let state = r
        .meta
        .as_ref()
        .map(|m| (m.git_source, m.git_dirty))
        .or(legacy);
    let tree = match state {
        Some((GitSource::Checkout, Some(true))) => "checkout with uncommitted changes",
        Some((GitSource::Checkout, Some(false))) => "clean checkout",
        Some((GitSource::Checkout, None)) => "checkout, changes not read",
        Some((GitSource::BuildOnly, _)) => "not run from a checkout: tree state unknown",
        None => "tree state not recorded",
    };
    format!("{} ({tree})", shas.join(", "))
}

fn regressions_section(md: &mut String, report: &Report) {
    let _ = writeln!(md, "## Regressions\n");
    let any = report.count(|c| c.regressions().len() + c.speedup_regressions().len());
    if any == 0 {
        let _ = writeln!(md, "None.\n");
        return;
    }
    for c in &report.compared {
        let (regressions, slow) = (c.cmp.regressions(), c.cmp.speedup_regressions());
        if regressions.is_empty() && slow.is_empty() {
            continue;
        }
        report.subheading(md, c);
        for t in regressions {
            let detail = t.current.as_ref().map(|r| r.detail.as_str()).unwrap_or("");
            let _ = writeln!(
                md,
                "- **{}** — {}  \n  {}",
                cell(&format!("{}::{}", t.contract, t.test_id)),
                cell(&format!(
                    "{} in the baseline, {} now: {}",
                    status_text(t.baseline_status()),
                    status_text(t.current_status()),
                    t.current.as_ref().map(result).unwrap_or_default()
                )),
                cell(detail)
            );
        }
        for s in slow {
            let _ = writeln!(md, "- **speedup dropped** — {}", cell(&speedup_line(s)));
        }
        md.push('\n');
    }
}

/// The subject's known violations: those that hold now first (their
/// `known_violation` must go), then those still falsified, with the reason
/// their contracts give.
fn known_violations_section(md: &mut String, report: &Report) {
    let subject = subject_of(report.current_whole);
    let _ = writeln!(md, "## Known violations\n");
    let (fixed, known) = (report.fixed(), report.known_violations());
    if fixed.is_empty() && known.is_empty() {
        let _ = writeln!(
            md,
            "None: no trial of `{}` is falsified as its contract expects.\n",
            cell(subject)
        );
        return;
    }
    if !fixed.is_empty() {
        let _ = writeln!(
            md,
            "**Fixed: {} known violation(s) of `{}` now hold. Remove the `known_violation` of each test from its contract**, so that a new failure of it is a regression again.\n",
            fixed.len(),
            cell(subject)
        );
        for t in &fixed {
            let _ = writeln!(md, "- **{}** — {}", cell(&key(t)), cell(&fixed_text(t)));
        }
        md.push('\n');
    }
    if known.is_empty() {
        return;
    }
    let _ = writeln!(
        md,
        "Claims `{}` is known not to keep, still falsified as its contracts state: findings, not regressions.\n\n| trial | on | current result | reason |\n| --- | --- | --- | --- |",
        cell(subject)
    );
    for t in known {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} |",
            cell(&key(t)),
            t.backend(),
            cell(&t.current.as_ref().map(result).unwrap_or_default()),
            cell(t.known_reason().unwrap_or_default())
        );
    }
    md.push('\n');
}

/// `contract::test_id` of a trial.
fn key(t: &TrialDiff) -> String {
    format!("{}::{}", t.contract, t.test_id)
}

/// A known violation still falsified, as `falsify report` lists it.
fn known_line(t: &&TrialDiff) -> String {
    format!("{}: {}", key(t), t.known_reason().unwrap_or_default())
}

/// A fixed known violation, as `falsify report` lists it.
fn fixed_line(t: &&TrialDiff) -> String {
    format!("{} ({})", key(t), fixed_text(t))
}

fn fixed_text(t: &TrialDiff) -> String {
    format!(
        "passes now: {}; its contract says: {}",
        t.current.as_ref().map(result).unwrap_or_default(),
        t.known_reason().unwrap_or_default()
    )
}

/// Trials that are `error` now without having passed in the baseline: the
/// gate does not call them regressions, and this section says that no
/// verdict on them was reached.
fn unjudged_section(md: &mut String, report: &Report) {
    if report.count(|c| c.unjudged().len()) == 0 {
        return;
    }
    let _ = writeln!(md, "## Unjudged\n");
    let _ = writeln!(
        md,
        "Trials whose check could not measure (`error`) here and did not pass in the baseline either: not regressions, and no evidence for or against their claims.\n"
    );
    trial_tables(md, report, RunComparison::unjudged, "current detail", |t| {
        cell(t.current.as_ref().map_or("", |r| r.detail.as_str()))
    });
}

/// Per compared baseline (under its subheading), a table of the trials
/// `pick` chooses: the trial, its backend, its baseline status and `last`.
fn trial_tables(
    md: &mut String,
    report: &Report,
    pick: impl Fn(&RunComparison) -> Vec<&TrialDiff>,
    last_heading: &str,
    last: impl Fn(&TrialDiff) -> String,
) {
    for c in &report.compared {
        let trials = pick(&c.cmp);
        if trials.is_empty() {
            continue;
        }
        report.subheading(md, c);
        let _ = writeln!(
            md,
            "| trial | on | baseline | {last_heading} |\n| --- | --- | --- | --- |"
        );
        for t in trials {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} |",
                cell(&format!("{}::{}", t.contract, t.test_id)),
                t.backend(),
                status_text(t.baseline_status()),
                last(t)
            );
        }
        md.push('\n');
    }
}

fn not_run_section(md: &mut String, report: &Report) {
    let _ = writeln!(md, "## Not run\n");
    let missing = &report.current_whole.account.missing;
    if report.count(|c| c.not_run().len()) == 0 && missing.is_empty() {
        let _ = writeln!(
            md,
            "None: every trial this run selected finished, and every baseline trial ran here or was skipped for a recorded reason.\n"
        );
        return;
    }
    if !missing.is_empty() {
        let _ = writeln!(
            md,
            "Trials this run selected that have no row of it: they did not finish (rows an earlier run left for them are not evidence).\n"
        );
        for key in missing {
            let _ = writeln!(md, "- {}", cell(key));
        }
        md.push('\n');
    }
    if report.count(|c| c.not_run().len()) == 0 {
        return;
    }
    let _ = writeln!(
        md,
        "Baseline trials this run did not execute, with nothing recording why. Run them (a trial removed from the contracts needs a refreshed baseline instead).\n"
    );
    trial_tables(md, report, RunComparison::not_run, "current", |t| {
        not_run_reason(t).to_string()
    });
}

/// Why a trial counts as not run: absent, or skipped without a reason.
fn not_run_reason(t: &TrialDiff) -> &'static str {
    if t.current.is_none() {
        "absent from this run"
    } else {
        "skipped, no reason recorded"
    }
}

fn changes_section(md: &mut String, report: &Report) {
    let _ = writeln!(md, "## Changes of status\n");
    for c in &report.compared {
        report.subheading(md, c);
        changes_of(md, &c.cmp);
    }
}

fn changes_of(md: &mut String, cmp: &RunComparison) {
    for (reason, trials) in cmp.not_run_here() {
        let gpu = trials.iter().all(|t| t.backend() == "cuda");
        let _ = writeln!(
            md,
            "{} {} were skipped in this run for a recorded reason ({}) — not a regression; their baseline verdicts are shown for reference.\n",
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
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} |",
            cell(&format!("{}::{}", t.contract, t.test_id)),
            t.backend(),
            status_text(t.baseline_status()),
            status_text(t.current_status()),
            change_kind(t)
        );
    }
    md.push('\n');
}

fn change_kind(t: &TrialDiff) -> &'static str {
    if t.is_regression() {
        "**regression**"
    } else if t.is_fixed() {
        "**fixed: remove the known_violation**"
    } else if t.is_known_violation() {
        "known violation"
    } else if t.not_run() {
        "**not run**"
    } else if t.not_run_here() {
        "skipped here (reason recorded)"
    } else if t.baseline.is_none() {
        "new trial"
    } else if t.current_status() == Some(Status::Passed) {
        "now passes"
    } else {
        "changed"
    }
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

fn verdicts_section(md: &mut String, report: &Report) {
    let _ = writeln!(md, "## Verdicts by contract\n");
    for c in &report.compared {
        report.subheading(md, c);
        let level = if report.several() { "####" } else { "###" };
        for contract in c.cmp.contracts() {
            let _ = writeln!(
                md,
                "{level} {contract}\n\n| test | on | baseline | current | current result | baseline observed |\n| --- | --- | --- | --- | --- | --- |"
            );
            for t in c.cmp.trials.iter().filter(|t| t.contract == contract) {
                verdict_row(md, t);
            }
            md.push('\n');
        }
    }
}

fn verdict_row(md: &mut String, t: &TrialDiff) {
    let mark = if t.is_regression() {
        " **(regression)**"
    } else if t.is_fixed() {
        " **(fixed: remove the known_violation)**"
    } else if t.is_known_violation() {
        " (known violation)"
    } else if t.not_run() {
        " **(not run)**"
    } else {
        ""
    };
    let current = match &t.current {
        Some(r) => result(r),
        None => "not run".into(),
    };
    let _ = writeln!(
        md,
        "| {}{mark} | {} | {} | {} | {} | {} |",
        cell(&t.test_id),
        t.backend(),
        status_text(t.baseline_status()),
        status_text(t.current_status()),
        cell(&current),
        cell(
            &t.baseline
                .as_ref()
                .and_then(|r| r.observed)
                .map(short)
                .unwrap_or_default()
        ),
    );
}

fn speedups_section(md: &mut String, report: &Report) {
    let _ = writeln!(md, "## Speedups\n");
    if report.count(|c| c.speedups.len()) == 0 {
        let _ = writeln!(md, "Neither report has speedup rows.\n");
        return;
    }
    let _ = writeln!(
        md,
        "`ratio` is baseline time / candidate time (for a `d2d copy` baseline: the kernel's fraction of copy bandwidth; for a target: the measured rate over the target; for a bound on a time: the bound over the measured time). *pass at* is the ratio the trial needs; rows without one are context (parts of a judged total). Mutant rows time an injected fault and never count as regressions; nor does a ratio that fell because its baseline side got faster while the candidate did not slow (*baseline side faster*).\n"
    );
    for c in &report.compared {
        if c.cmp.speedups.is_empty() {
            continue;
        }
        report.subheading(md, c);
        let _ = writeln!(
            md,
            "| test | subject | workload | baseline / candidate | pass at | current ratio [CI] | baseline ratio [CI] | change |\n| --- | --- | --- | --- | --- | --- | --- | --- |"
        );
        for s in &c.cmp.speedups {
            speedup_row(md, s);
        }
        md.push('\n');
    }
}

fn speedup_row(md: &mut String, s: &SpeedupDiff) {
    let Some(r) = s.row() else { return };
    let change = match s.change() {
        Some(c) => format!("{:+.1}%", c * 100.0),
        None => String::new(),
    };
    let mutant = s.current.as_ref().is_some_and(SpeedupRow::is_mutant);
    let dropped = !mutant && s.change().is_some_and(|c| c < -RUN_TO_RUN_NOISE);
    let mark = if s.is_regression() {
        " **(regression)**"
    } else if dropped && s.baseline_side_faster() {
        " (baseline side faster)"
    } else {
        ""
    };
    let _ = writeln!(
        md,
        "| {} | {} | {} | {} / {} | {} | {} | {} | {change}{mark} |",
        cell(&r.test_id),
        cell(&r.subject),
        cell(&workload(r)),
        cell(&r.baseline),
        cell(&r.candidate),
        r.threshold
            .map(|t| format!(">= {}", short(t)))
            .unwrap_or_default(),
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

/// What a speedup row measured on: a model at a batch and sequence length,
/// or, for rows without them (kernel bandwidth), the shape in `model`.
pub fn workload(r: &SpeedupRow) -> String {
    if r.batch == 0 && r.seq_len == 0 {
        r.model.clone()
    } else {
        format!("{}, batch {} x seq {}", r.model, r.batch, r.seq_len)
    }
}

/// The ratio and its interval to four decimals: intervals are often
/// narrower than three significant digits can show.
fn ratio_ci(r: &SpeedupRow) -> String {
    format!(
        "{} [{}, {}]",
        format_number(r.ratio),
        format_number(r.ratio_ci_low),
        format_number(r.ratio_ci_high)
    )
}

/// The row's result as one phrase that reads as its verdict, or why there
/// is none.
fn result(r: &FalsificationRow) -> String {
    r.verdict_line()
        .unwrap_or_else(|| format!("not measured ({})", r.status.as_str()))
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
        "{} {} ({}; {} / {}): {} now, {} in the baseline",
        c.test_id,
        c.subject,
        workload(c),
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
