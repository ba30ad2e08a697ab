//! The `cargo test` runner: one libtest-mimic trial per falsification test
//! (`{contract}::{test_id}`) and one per mutant self-test
//! (`{contract}::{test_id}::mutant`), with kind `cpu` or `cuda`.
//!
//! Each trial runs in a child process of this executable (a crash, a hang
//! past the trial's timeout or a poisoned CUDA context costs that trial one
//! `error` row). A trial that cannot be judged here — no CUDA driver, no
//! target stated for this GPU kind, a configuration that does not fit — is
//! reported ignored and recorded as `skipped` with the reason, decided before
//! anything runs. SIGINT or SIGTERM stop the run and keep the rows of the
//! trials that finished. Results go to `reports/latest/*.csv`; compiled
//! kernel modules are kept in `target/falsify-kernel-cache/`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use falsify::contract::load_dir;
use falsify::report::Status;
use falsify::run::{
    check_budgets, plan, run_child, ChildCommand, Engine, Isolation, RunOptions, TrialSpec,
    CHILD_FLAG, DEFAULT_KERNEL_CACHE,
};
use libtest_mimic::{Arguments, Failed, Trial};
use qlora::gpu::GpuOptions;

/// `contracts/` of the working directory (cargo runs tests from the package
/// root; a staged executable runs from a copy of it), else of this crate.
fn contracts_dir() -> PathBuf {
    let here = PathBuf::from("contracts");
    if here.is_dir() {
        here
    } else {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("contracts")
    }
}

/// The directory `contracts/` is in: the workspace root (or its copy).
fn workspace_root(contracts: &std::path::Path) -> PathBuf {
    contracts
        .parent()
        .unwrap_or(std::path::Path::new("."))
        .to_path_buf()
}

fn reports_dir(contracts: &std::path::Path) -> PathBuf {
    workspace_root(contracts).join("reports").join("latest")
}

/// The same selection rule libtest-mimic applies, so that skipped `cuda` rows
/// are written only for trials the filters selected.
fn selected(args: &Arguments, name: &str) -> bool {
    let matches = |pattern: &str| {
        if args.exact {
            name == pattern
        } else {
            name.contains(pattern)
        }
    };
    let filter_ok = args.filter.as_deref().is_none_or(matches);
    filter_ok && !args.skip.iter().any(|s| matches(s))
}

/// As a trial process: runs the one trial `request` names and prints its
/// reply on stdout for the parent.
fn child_main(request: &str) -> ExitCode {
    match run_child(request) {
        Ok(reply) => {
            println!("{reply}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some(CHILD_FLAG) {
        return child_main(argv.get(2).map_or("", String::as_str));
    }
    let args = Arguments::from_args();
    let dir = contracts_dir();
    let contracts = match load_dir(&dir) {
        Ok(c) => c,
        Err(errors) => {
            for e in &errors {
                eprintln!("error: {e}");
            }
            eprintln!(
                "{} invalid contract file(s) in {}",
                errors.len(),
                dir.display()
            );
            return ExitCode::FAILURE;
        }
    };
    let specs = plan(contracts);
    let isolation = match ChildCommand::current_exe() {
        Ok(command) => Isolation::Child(command),
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let engine = Arc::new(Engine::new(RunOptions {
        out_dir: reports_dir(&dir),
        isolation,
        gpu: GpuOptions {
            kernel_cache_dir: Some(workspace_root(&dir).join(DEFAULT_KERNEL_CACHE)),
            ..GpuOptions::default()
        },
        ..RunOptions::default()
    }));
    if !args.list {
        let chosen = specs.iter().filter(|s| selected(&args, &s.name));
        let over = check_budgets(chosen, &engine);
        if !over.is_empty() {
            for e in &over {
                eprintln!("error: {e}");
            }
            eprintln!(
                "{} trial(s) would need more than this machine has",
                over.len()
            );
            return ExitCode::FAILURE;
        }
        let stop = Arc::clone(&engine);
        if let Err(e) = ctrlc::set_handler(move || stop.interrupt()) {
            eprintln!("warning: SIGINT/SIGTERM will not keep finished rows: {e}");
        }
    }
    let unjudged: Vec<Option<String>> = specs.iter().map(|s| engine.unjudged(s)).collect();
    let trials: Vec<Trial> = specs
        .iter()
        .zip(&unjudged)
        .map(|(spec, why)| make_trial(spec, &engine, why.is_some()))
        .collect();
    if trials.is_empty() {
        eprintln!("no trials: the contracts define no falsification tests");
        return ExitCode::FAILURE;
    }
    let listing = args.list;
    let conclusion = libtest_mimic::run(&args, trials);
    if listing {
        return conclusion.exit_code();
    }

    // Ignored trials never ran; record them as skipped, with the reason.
    if !args.ignored && !args.include_ignored {
        let mut reasons: std::collections::BTreeMap<&str, usize> = Default::default();
        for (spec, why) in specs.iter().zip(&unjudged) {
            if let Some(reason) = why.as_deref().filter(|_| selected(&args, &spec.name)) {
                engine.skip(spec, reason);
                *reasons.entry(reason).or_default() += 1;
            }
        }
        for (reason, n) in reasons {
            eprintln!("{n} trial(s) ignored: {reason}");
        }
    }
    let ran = conclusion.num_passed + conclusion.num_failed;
    if ran == 0 && conclusion.num_ignored == 0 {
        eprintln!("no trial matched the filter: nothing was run");
        return ExitCode::FAILURE;
    }
    match engine.write_reports(&specs) {
        Ok(path) => eprintln!("report: {}", path.display()),
        Err(e) => {
            eprintln!("error: could not write the report: {e}");
            return ExitCode::FAILURE;
        }
    }
    if engine.was_interrupted() {
        eprintln!("interrupted: the report holds the trials that finished");
        return ExitCode::from(130);
    }
    conclusion.exit_code()
}

fn make_trial(spec: &TrialSpec, engine: &Arc<Engine>, ignored: bool) -> Trial {
    let kind = spec.backend.as_str();
    let engine = Arc::clone(engine);
    let owned = spec.clone();
    Trial::test(spec.name.clone(), move || {
        let outcome = engine.run(&owned);
        match outcome.status {
            Status::Passed => Ok(()),
            Status::Skipped => Err(Failed::from(format!("skipped: {}", outcome.summary))),
            Status::Falsified => Err(Failed::from(format!(
                "falsified: {}\n{}",
                outcome.summary, outcome.detail
            ))),
            Status::Error => Err(Failed::from(format!("error: {}", outcome.detail))),
        }
    })
    .with_kind(kind)
    .with_ignored_flag(ignored)
}
