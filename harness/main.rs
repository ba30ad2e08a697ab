//! The `cargo test` runner: one libtest-mimic trial per falsification test
//! (`{contract}::{test_id}`) and one per mutant self-test
//! (`{contract}::{test_id}::mutant`), with kind `cpu` or `cuda`.
//!
//! Without a CUDA driver every `cuda` trial is reported ignored and recorded as
//! `skipped` with the reason. Results go to `reports/latest/*.csv`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use falsify::contract::{load_dir, Backend};
use falsify::report::Status;
use falsify::run::{plan, Engine, RunOptions, TrialSpec};
use libtest_mimic::{Arguments, Failed, Trial};

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

fn reports_dir(contracts: &std::path::Path) -> PathBuf {
    contracts
        .parent()
        .unwrap_or(std::path::Path::new("."))
        .join("reports")
        .join("latest")
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

fn main() -> ExitCode {
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
    let engine = Arc::new(Engine::new(RunOptions {
        out_dir: reports_dir(&dir),
        ..RunOptions::default()
    }));
    let skip_reason = if specs.iter().any(|s| s.backend == Backend::Cuda) {
        engine.cuda_skip_reason()
    } else {
        None
    };

    let trials: Vec<Trial> = specs
        .iter()
        .map(|spec| make_trial(spec, &engine, skip_reason.is_some()))
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

    // Ignored cuda trials never ran; record them as skipped, with the reason.
    if let Some(reason) = &skip_reason {
        if !args.ignored && !args.include_ignored {
            for spec in specs.iter().filter(|s| s.backend == Backend::Cuda) {
                if selected(&args, &spec.name) {
                    engine.skip(spec, reason);
                }
            }
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
    conclusion.exit_code()
}

fn make_trial(spec: &TrialSpec, engine: &Arc<Engine>, cuda_missing: bool) -> Trial {
    let kind = spec.backend.as_str();
    let ignored = spec.backend == Backend::Cuda && cuda_missing;
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
