//! The `falsify` command line: `run` the contracts with a progress bar and a
//! summary table, `list` the trials they define, `report` how the latest
//! run compares with a baseline, or print the reference of the check `kinds`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{anyhow, bail, Context};
use clap::{Args, Parser, Subcommand};
use falsify_core::contract::load_dir;
use falsify_core::harness::answer;
use falsify_core::report::compare::{Verdict, EXIT_NO_VERDICT};
use falsify_core::report::markdown::{write_report, ReportOutcome};
use falsify_core::report::terminal::escape_controls;
use falsify_core::report::{ReportDir, Status};
use falsify_core::run::{
    check_budgets, helper_reply, plan, ChildCommand, Isolation, RunOptions, TrialOutcome,
};
use falsify_qlora::Qlora;
use indicatif::{ProgressBar, ProgressStyle};
use qlora::gpu::GpuOptions;

/// The subject `run`, `list` and `kinds` work on.
type Subject = Qlora;
type Engine = falsify_core::run::Engine<Subject>;
type TrialSpec = falsify_core::run::TrialSpec<Subject>;

#[derive(Parser)]
#[command(
    name = "falsify",
    version,
    about = "Executable contracts for a GPU training stack"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// The options of `falsify run`.
#[derive(Args)]
struct RunArgs {
    /// Directory of contract files.
    #[arg(long, default_value = "contracts")]
    contracts: PathBuf,
    /// Run only trials whose name contains this text.
    #[arg(long)]
    filter: Option<String>,
    /// Where the CSV reports are written.
    #[arg(long, default_value = "reports/latest")]
    out: PathBuf,
    /// Mixed into every trial's seed; change it to draw different inputs.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Skip the mutant self-tests.
    #[arg(long)]
    no_mutants: bool,
    /// Run this test with its mutant injected, to rehearse a regression
    /// (repeatable; the row says so in its detail). The test's own trial
    /// must be selected and runnable here.
    #[arg(long, value_name = "TEST_ID")]
    inject: Vec<String>,
    /// Where compiled kernel modules are kept between trial processes
    /// (git-ignored under target/; `cargo clean` empties it).
    #[arg(long, default_value = falsify_core::run::DEFAULT_KERNEL_CACHE)]
    kernel_cache: PathBuf,
}

#[derive(Subcommand)]
enum Command {
    /// Run the contracts' falsification tests and their mutant self-tests.
    Run(RunArgs),
    /// List the trials the contracts define.
    List {
        #[arg(long, default_value = "contracts")]
        contracts: PathBuf,
    },
    /// Compare a run with its baseline: writes REPORT.md and SVG charts into
    /// the current run's directory. Exits 0 clean, 1 regressed, 3 incomplete
    /// (baseline trials that did not run), 2 when no verdict was reached.
    Report {
        /// The folder of baselines (`<subject>/<kind>/`, e.g. `qlora/h200/`),
        /// one subject's folder of per-GPU baselines, or one baseline's
        /// report directory. A GPU run is compared with its subject's and
        /// GPU kind's baseline; a run without a GPU with the cpu rows of
        /// every baseline of its subject.
        #[arg(long, default_value = "reports/baseline")]
        baseline: PathBuf,
        /// The run to judge (never inside the baseline folder).
        #[arg(long, default_value = "reports/latest")]
        current: PathBuf,
        /// First merge these run directories (the shards of a partitioned
        /// run, each with its run.json) into `--current`, then judge it on
        /// the shards' rows (rows already there of trials no shard ran stay,
        /// as rows of their own runs).
        #[arg(long, num_args = 1.., value_name = "RUN_DIR")]
        merge: Vec<PathBuf>,
    },
    /// Print the reference of the check kinds (Markdown): what each
    /// measures, where it runs, and its parameters with their defaults and
    /// bounds. docs/src/reference/kinds.md holds a copy of it.
    Kinds,
}

fn main() -> ExitCode {
    let process_start = std::time::Instant::now();
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let argv: Vec<String> = std::env::args().collect();
    // A trial process or a data-parallel rank: run it, answer on stdout.
    if let Some(reply) = helper_reply::<Subject>(&argv, &mut std::io::stdin().lock(), process_start)
    {
        return answer(reply);
    }
    match real_main() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", escape_controls(&error_text(&e)));
            ExitCode::FAILURE
        }
    }
}

/// `e` and its causes on one line, each said once: an error that already
/// quotes its cause (a file error quotes the OS error) is not followed by
/// it again.
fn error_text(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let part = cause.to_string();
        if text.ends_with(&part) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&part);
    }
    text
}

/// Prints `error: {e}` on stderr, contract text escaped.
fn print_error(e: &dyn std::fmt::Display) {
    eprintln!("error: {}", escape_controls(&e.to_string()));
}

fn load(contracts: &Path) -> anyhow::Result<Vec<TrialSpec>> {
    match load_dir::<Subject>(contracts) {
        Ok(c) => Ok(plan::<Subject>(c)),
        Err(errors) => {
            for e in &errors {
                print_error(e);
            }
            bail!(
                "{} problem(s) in the contracts under {}",
                errors.len(),
                contracts.display()
            )
        }
    }
}

fn real_main() -> anyhow::Result<ExitCode> {
    match Cli::parse().command {
        Command::List { contracts } => {
            for t in load(&contracts)? {
                println!("{}: {}", escape_controls(&t.name), t.backend);
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Report {
            baseline,
            current,
            merge,
        } => {
            if !merge.is_empty() {
                if let Err(e) = merge_shards(&baseline, &merge, &current) {
                    eprintln!("error: {e:#}");
                    return Ok(ExitCode::from(EXIT_NO_VERDICT));
                }
            }
            Ok(report(&baseline, &current))
        }
        Command::Kinds => {
            print!("{}", falsify_qlora::check::reference_markdown());
            Ok(ExitCode::SUCCESS)
        }
        Command::Run(args) => run(args),
    }
}

/// The trials `falsify run` selects: those whose name contains `filter`,
/// without the self-tests with `no_mutants`. None is an error.
fn select<'a>(
    all: &'a [TrialSpec],
    filter: Option<&str>,
    no_mutants: bool,
) -> anyhow::Result<Vec<&'a TrialSpec>> {
    let selected: Vec<&TrialSpec> = all
        .iter()
        .filter(|t| filter.is_none_or(|f| t.name.contains(f)))
        .filter(|t| !(no_mutants && t.selftest))
        .collect();
    if selected.is_empty() {
        bail!(
            "no trials selected{}",
            filter
                .map(|f| format!(" (filter `{f}` matched none of {} trials)", all.len()))
                .unwrap_or_default()
        );
    }
    Ok(selected)
}

/// `falsify run`: everything that can be refused is refused before the
/// first trial runs (contracts, budgets, an `--inject` that cannot take
/// effect, an `--out` that cannot be written); then the trials run, the
/// rows are written (or kept in a fallback folder the error names), and the
/// summary is printed whatever the write did.
fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let all = load(&args.contracts)?;
    let selected = select(&all, args.filter.as_deref(), args.no_mutants)?;
    if let Some(unknown) = args
        .inject
        .iter()
        .find(|id| !all.iter().any(|t| t.test().id == **id))
    {
        bail!("--inject {unknown}: no test has that id");
    }
    let engine = Arc::new(Engine::new(RunOptions {
        out_dir: args.out.clone(),
        seed: args.seed,
        inject: args.inject,
        isolation: Isolation::Child(ChildCommand::current_exe()?),
        device: falsify_qlora::Options(GpuOptions {
            kernel_cache_dir: Some(args.kernel_cache),
            ..GpuOptions::default()
        }),
        ..RunOptions::default()
    }));
    let over = check_budgets(selected.iter().copied(), &engine);
    if !over.is_empty() {
        for e in &over {
            print_error(e);
        }
        bail!(
            "{} trial(s) would need more than this machine has",
            over.len()
        );
    }
    engine
        .select(&selected)
        .map_err(|e| anyhow!("{e}; no trial was run"))?;
    ReportDir::new(&args.out)
        .check_writable()
        .map_err(|e| anyhow!("--out {e}; no trial was run"))?;
    let stop = Arc::clone(&engine);
    ctrlc::set_handler(move || stop.interrupt())
        .context("installing the SIGINT/SIGTERM handler")?;
    let outcomes = run_all(&engine, &selected);
    Ok(finish(&engine, &all, &selected, &outcomes))
}

/// After the trials: writes the reports (or says where the rows went
/// instead), prints the summary whatever the write did, and gives the exit
/// code: 130 interrupted, 1 when a trial was falsified or errored or the
/// reports could not be written where asked, else 0.
fn finish(
    engine: &Engine,
    all: &[TrialSpec],
    selected: &[&TrialSpec],
    outcomes: &[TrialOutcome],
) -> ExitCode {
    let written = engine.write_reports(all);
    print_summary(selected, outcomes);
    let unwritten = match written {
        Ok(w) => {
            for m in w.messages() {
                eprintln!("{}", escape_controls(&m));
            }
            println!("report: {}", w.path.display());
            false
        }
        Err(e) => {
            print_error(&e);
            true
        }
    };
    if engine.was_interrupted() {
        println!(
            "interrupted: {} of {} trials finished; the report holds those",
            outcomes.len(),
            selected.len()
        );
        return ExitCode::from(130);
    }
    let bad = outcomes
        .iter()
        .any(|o| matches!(o.status, Status::Falsified | Status::Error));
    if bad || unwritten {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// Runs `trials` one after another, each in a process of its own; a trial
/// that cannot be judged here is recorded skipped without running. Stops at
/// an interrupt, returning the outcomes of the trials that finished.
fn run_all(engine: &Engine, trials: &[&TrialSpec]) -> Vec<TrialOutcome> {
    let bar = ProgressBar::new(trials.len() as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} [{elapsed}] {wide_msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut outcomes = Vec::with_capacity(trials.len());
    for t in trials {
        bar.set_message(escape_controls(&t.name).into_owned());
        let before = engine.row_count();
        let outcome = match engine.unjudged(t) {
            Some(reason) => engine.skip(t, &reason),
            None => engine.run(t),
        };
        // A trial stopped by an interrupt records no row and is left out.
        if engine.row_count() == before {
            break;
        }
        if matches!(outcome.status, Status::Falsified | Status::Error) {
            // On stdout above the bar, and without a terminal too (where
            // the bar is hidden): a log keeps why a trial failed.
            bar.suspend(|| {
                println!(
                    "{} {}: {}",
                    outcome.status.as_str().to_uppercase(),
                    escape_controls(&t.name),
                    escape_controls(&outcome.detail)
                );
            });
        }
        outcomes.push(outcome);
        bar.inc(1);
    }
    bar.finish_and_clear();
    outcomes
}

/// The table of every trial that finished, contract text escaped, and the
/// counts.
fn print_summary(trials: &[&TrialSpec], outcomes: &[TrialOutcome]) {
    let names: Vec<String> = trials
        .iter()
        .map(|t| escape_controls(&t.name).into_owned())
        .collect();
    let width = names.iter().map(String::len).max().unwrap_or(5).min(70);
    println!(
        "{:<width$}  {:<4}  {:<9}  measured",
        "trial", "on", "status"
    );
    for ((t, name), o) in trials.iter().zip(&names).zip(outcomes) {
        let mut summary = escape_controls(&o.summary).into_owned();
        if summary.chars().count() > 130 {
            summary = summary.chars().take(127).collect::<String>() + "...";
        }
        println!(
            "{:<width$}  {:<4}  {:<9}  {}",
            name,
            t.backend,
            o.status.as_str(),
            summary
        );
    }
    let count = |s: Status| outcomes.iter().filter(|o| o.status == s).count();
    println!(
        "\n{} passed, {} falsified, {} error, {} skipped ({} trials)",
        count(Status::Passed),
        count(Status::Falsified),
        count(Status::Error),
        count(Status::Skipped),
        outcomes.len()
    );
}

/// Merges the shard directories into `into` (never inside the baseline
/// folder, checked before anything is written).
fn merge_shards(baseline: &Path, shards: &[PathBuf], into: &Path) -> anyhow::Result<()> {
    // `into` may not exist yet: its nearest existing folder decides.
    let existing = into
        .ancestors()
        .find(|p| p.exists())
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    falsify_core::report::baseline::refuse_output_inside(baseline, existing)?;
    let merged = falsify_core::report::merge::merge_runs(shards, into)
        .with_context(|| format!("merging {} run(s) into {}", shards.len(), into.display()))?;
    for shard in &merged.shards {
        println!("shard {shard}");
    }
    println!(
        "merged {} run(s) into {}: {} trials, {} speedup rows",
        shards.len(),
        into.display(),
        merged.trials,
        merged.speedups
    );
    if merged.kept > 0 {
        println!(
            "kept {} row(s) {} already held of trials no shard ran (rows of earlier runs: not judged)",
            merged.kept,
            into.display()
        );
    }
    Ok(())
}

/// How many not-run (or missing) trials the terminal lists; REPORT.md lists
/// them all.
const NOT_RUN_SHOWN: usize = 20;

/// Prints the first [`NOT_RUN_SHOWN`] of `items` as `LABEL item note`.
fn print_capped(label: &str, note: &str, items: &[String]) {
    for item in items.iter().take(NOT_RUN_SHOWN) {
        println!("{label} {}{note}", escape_controls(item));
    }
    if items.len() > NOT_RUN_SHOWN {
        println!(
            "... and {} more {} (REPORT.md lists them all)",
            items.len() - NOT_RUN_SHOWN,
            label.to_lowercase()
        );
    }
}

/// The subject's known violations, just above the verdict: those still
/// falsified (findings, not regressions), then those that hold now, whose
/// `known_violation` must be removed.
fn print_known_violations(outcome: &ReportOutcome) {
    let subject = escape_controls(&outcome.subject);
    if !outcome.known_violations.is_empty() {
        println!(
            "known violations of {subject}: {} still falsified, as their contracts state \
             (not regressions)",
            outcome.known_violations.len()
        );
    }
    for k in &outcome.known_violations {
        println!("KNOWN VIOLATION {subject} {}", escape_controls(k));
    }
    for f in &outcome.fixed {
        println!(
            "FIXED {subject} {}: remove its known_violation from the contract",
            escape_controls(f)
        );
    }
}

/// `falsify report`: the verdict as the exit code (0 clean, 1 regressed,
/// 3 incomplete), and 2 when no verdict could be reached, so a script can
/// tell a failed comparison from a regression.
fn report(baseline: &Path, current: &Path) -> ExitCode {
    let outcome = match write_report(baseline, current) {
        Ok(outcome) => outcome,
        Err(e) => {
            eprintln!(
                "error: comparing {} with the baseline {}: {}",
                current.display(),
                baseline.display(),
                escape_controls(&e.to_string())
            );
            return ExitCode::from(EXIT_NO_VERDICT);
        }
    };
    println!("baseline: {}", outcome.baseline);
    for line in &outcome.evidence {
        println!("{}", escape_controls(line));
    }
    for c in &outcome.charts {
        if let Some(file) = &c.file {
            println!("chart: {}", current.join(file).display());
        }
    }
    println!("report: {}", outcome.path.display());
    for r in &outcome.regressions {
        println!("REGRESSION {}", escape_controls(&r.to_string()));
    }
    for r in &outcome.speedup_regressions {
        println!("SPEEDUP REGRESSION {}", escape_controls(&r.to_string()));
    }
    print_capped(
        "MISSING",
        " (selected by this run, no row of it)",
        &outcome.missing,
    );
    print_capped("NOT RUN", "", &outcome.not_run);
    print_capped(
        "UNJUDGED",
        ": error, not a regression, no evidence either way",
        &outcome.unjudged,
    );
    for gap in &outcome.gaps {
        println!("{}: the run is incomplete, not clean", escape_controls(gap));
    }
    if outcome.verdict == Verdict::Incomplete && !outcome.not_run.is_empty() {
        println!(
            "{} baseline trial(s) did not run: the run is incomplete, not clean",
            outcome.not_run.len()
        );
    }
    print_known_violations(&outcome);
    let code = outcome.verdict.exit_code();
    println!("verdict: {} (exit {code})", outcome.verdict.as_str());
    ExitCode::from(code)
}
