//! The `falsify` command line: `run` the contracts with a progress bar and a
//! summary table, `list` the trials they define, or `report` how the latest
//! run compares with a baseline.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use falsify::contract::{load_dir, Backend};
use falsify::report::markdown::write_report;
use falsify::report::{compare::Verdict, Status};
use falsify::run::{plan, Engine, RunOptions, TrialOutcome, TrialSpec};
use indicatif::{ProgressBar, ProgressStyle};

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

#[derive(Subcommand)]
enum Command {
    /// Run the contracts' falsification tests and their mutant self-tests.
    Run {
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
        /// (repeatable; the row says so in its detail).
        #[arg(long, value_name = "TEST_ID")]
        inject: Vec<String>,
    },
    /// List the trials the contracts define.
    List {
        #[arg(long, default_value = "contracts")]
        contracts: PathBuf,
    },
    /// Compare a run with a baseline: writes REPORT.md and SVG charts into the
    /// current run's directory; exits non-zero on any regression.
    Report {
        /// The baseline run's report directory.
        #[arg(long, default_value = "reports/baseline")]
        baseline: PathBuf,
        /// The run to judge.
        #[arg(long, default_value = "reports/latest")]
        current: PathBuf,
    },
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    match real_main() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn load(contracts: &Path) -> anyhow::Result<Vec<TrialSpec>> {
    match load_dir(contracts) {
        Ok(c) => Ok(plan(c)),
        Err(errors) => {
            for e in &errors {
                eprintln!("error: {e}");
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
                println!("{}: {}", t.name, t.backend);
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Report { baseline, current } => {
            let outcome = write_report(&baseline, &current).with_context(|| {
                format!(
                    "comparing {} with the baseline {}",
                    current.display(),
                    baseline.display()
                )
            })?;
            for c in &outcome.charts {
                if let Some(file) = &c.file {
                    println!("chart: {}", current.join(file).display());
                }
            }
            println!("report: {}", outcome.path.display());
            for r in &outcome.regressions {
                println!("REGRESSION {r}");
            }
            for r in &outcome.speedup_regressions {
                println!("SPEEDUP REGRESSION {r}");
            }
            println!("verdict: {}", outcome.verdict.as_str());
            Ok(match outcome.verdict {
                Verdict::Clean => ExitCode::SUCCESS,
                Verdict::Regressed => ExitCode::FAILURE,
            })
        }
        Command::Run {
            contracts,
            filter,
            out,
            seed,
            no_mutants,
            inject,
        } => {
            let all = load(&contracts)?;
            let selected: Vec<&TrialSpec> = all
                .iter()
                .filter(|t| filter.as_deref().is_none_or(|f| t.name.contains(f)))
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
            if let Some(unknown) = inject
                .iter()
                .find(|id| !all.iter().any(|t| t.test().id == **id))
            {
                bail!("--inject {unknown}: no test has that id");
            }
            let engine = Engine::new(RunOptions {
                out_dir: out,
                seed,
                inject,
                ..RunOptions::default()
            });
            let outcomes = run_all(&engine, &selected);
            let path = engine.write_reports(&all).context("writing the report")?;
            print_summary(&selected, &outcomes);
            println!("report: {}", path.display());
            let bad = outcomes
                .iter()
                .filter(|o| matches!(o.status, Status::Falsified | Status::Error))
                .count();
            Ok(if bad == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
    }
}

fn run_all(engine: &Engine, trials: &[&TrialSpec]) -> Vec<TrialOutcome> {
    let skip_reason = if trials.iter().any(|t| t.backend == Backend::Cuda) {
        engine.cuda_skip_reason()
    } else {
        None
    };
    let bar = ProgressBar::new(trials.len() as u64);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} [{elapsed}] {wide_msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut outcomes = Vec::with_capacity(trials.len());
    for t in trials {
        bar.set_message(t.name.clone());
        let outcome = match (&skip_reason, t.backend) {
            (Some(reason), Backend::Cuda) => engine.skip(t, reason),
            _ => engine.run(t),
        };
        if matches!(outcome.status, Status::Falsified | Status::Error) {
            bar.println(format!(
                "{} {}: {}",
                outcome.status.as_str().to_uppercase(),
                t.name,
                outcome.detail
            ));
        }
        outcomes.push(outcome);
        bar.inc(1);
    }
    bar.finish_and_clear();
    outcomes
}

fn print_summary(trials: &[&TrialSpec], outcomes: &[TrialOutcome]) {
    let width = trials
        .iter()
        .map(|t| t.name.len())
        .max()
        .unwrap_or(5)
        .min(70);
    println!(
        "{:<width$}  {:<4}  {:<9}  measured",
        "trial", "on", "status"
    );
    for (t, o) in trials.iter().zip(outcomes) {
        let mut summary = o.summary.clone();
        if summary.chars().count() > 130 {
            summary = summary.chars().take(127).collect::<String>() + "...";
        }
        println!(
            "{:<width$}  {:<4}  {:<9}  {}",
            t.name,
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
