//! The `cargo test` runner of a subject's contracts, which
//! [`harness!`](macro@crate::harness) makes a test target's `main`: one
//! libtest-mimic trial per falsification test (`{contract}::{test_id}`)
//! and one per mutant self-test (`{contract}::{test_id}::mutant`), with
//! kind `cpu` or `cuda`.
//!
//! Under `cargo test` each trial runs in a child process of this executable
//! (a crash, a hang past the trial's timeout or a poisoned CUDA context costs
//! that trial one `error` row). Under cargo-nextest, which already starts
//! this executable once per trial, the trial runs in that process: a second
//! process would only open a second CUDA context. Its `error` row is written
//! before it starts and replaced when it finishes, so a crash still costs
//! exactly that row; a watchdog stops it at its timeout. The environment is
//! read here only (nextest's run id, the test group and its slot, which
//! picks the CUDA device); the engine gets them as options. Before it
//! opens a GPU, a trial of a GPU test group takes the locks of the GPUs it
//! works on ([`gpu_locks`]): exclusively where it times them, shared where
//! it does not, so that nothing runs on a GPU while a trial times it.
//!
//! A trial that cannot be judged here — no CUDA driver, no target stated for
//! this GPU kind, a configuration that does not fit — is reported ignored and
//! recorded as `skipped` with the reason, decided before anything runs.
//! SIGINT or SIGTERM stop the run and keep the rows of the trials that
//! finished. Results go to `reports/latest/*.csv` (checked writable before
//! any trial runs), and `run.json` lists the trials this process ran or
//! recorded; compiled kernel modules are kept in
//! `target/falsify-kernel-cache/`. Under nextest the contracts are read by
//! each process: their rows' `contract_hash` tells whether all read the same
//! text.
//!
//! This module is a front end kept in the library so that a subject's test
//! target is one macro call: like libtest, it prints its messages on
//! stderr, and its watchdog ends the process of a trial past its timeout.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use libtest_mimic::{Arguments, Failed, Trial};

use crate::contract::{load_dir, Backend};
use crate::report::terminal::escape_controls;
use crate::report::{ReportDir, Status, Written};
use crate::run::{
    check_budgets, driver_present, helper_reply, plan, ChildCommand, Engine, Isolation, RunOptions,
    TrialSpec, DEFAULT_KERNEL_CACHE,
};
use crate::subject::{DeviceOptions, Subject};

pub mod gpu_locks;

use gpu_locks::{Access, Held};

/// Makes a test target (`harness = false`) the contract suite of a subject:
///
/// ```ignore
/// falsify_core::harness! {
///     contracts: "contracts",
///     subject: my_subject::MySubject,
/// }
/// ```
///
/// expands to a `main` that runs [`main`](crate::harness::main) on the
/// contracts folder: `contracts` relative to the working directory when it
/// is there (cargo runs a test from its package root; a staged executable
/// runs from a copy of it), else relative to the package that uses the
/// macro. Reports go to `reports/latest/` beside the contracts folder.
#[macro_export]
macro_rules! harness {
    (contracts: $dir:expr, subject: $subject:ty $(,)?) => {
        fn main() -> ::std::process::ExitCode {
            $crate::harness::main::<$subject>($crate::harness::contracts_dir(
                $dir,
                env!("CARGO_MANIFEST_DIR"),
            ))
        }
    };
}

/// The contracts folder `relative`: of the working directory when it is
/// there, else of `manifest_dir` (the package the test target belongs to).
pub fn contracts_dir(relative: &str, manifest_dir: &str) -> PathBuf {
    let here = PathBuf::from(relative);
    if here.is_dir() {
        here
    } else {
        Path::new(manifest_dir).join(relative)
    }
}

/// Prints a helper process's reply (a trial process, or a subject's helper
/// such as a data-parallel rank) on stdout, or its error on stderr, and
/// gives its exit code. The one printer of a reply, for every front end.
pub fn answer(reply: crate::Result<String>) -> ExitCode {
    match reply {
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

/// What cargo-nextest tells a test process about its run.
struct Nextest {
    /// Shared by every process of one `cargo nextest run`.
    run_id: String,
    /// The CUDA device ordinal this test's test-group slot names (slots run
    /// 0 to the group's max-threads - 1, unique among the group's running
    /// tests): in the `gpu` group (one slot per GPU) the slot itself; in
    /// the `gpu-shared` group (a dozen slots, whatever the GPUs) and the `gpu-ranks`
    /// group (trials whose ranks run on every GPU, timing nothing; the
    /// device is that of the one-GPU run they compare their ranks with) the
    /// slot modulo the GPUs, so that they spread over the host. On one GPU
    /// all are device 0. The GPU locks keep every other trial off a GPU
    /// while a trial of the `gpu` group times it. `None` outside the groups.
    device_ordinal: Option<usize>,
    /// This test's GPU test group; `None` outside them (a cpu trial).
    group: Option<GpuGroup>,
}

/// The test groups of `.config/nextest.toml` that hold cuda trials.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GpuGroup {
    /// `gpu`: a GPU to itself, one slot per GPU.
    Alone,
    /// `gpu-shared`: shares its GPU with others of the group.
    Shared,
    /// `gpu-ranks`: a process on every GPU, beside others of the group and
    /// of `gpu-shared`, never beside a test of `gpu`.
    Ranks,
}

/// The group whose tests have a GPU to themselves, one slot per GPU.
const GPU_GROUP: &str = "gpu";

impl GpuGroup {
    fn named(name: &str) -> Option<GpuGroup> {
        match name {
            GPU_GROUP => Some(GpuGroup::Alone),
            "gpu-shared" => Some(GpuGroup::Shared),
            "gpu-ranks" => Some(GpuGroup::Ranks),
            _ => None,
        }
    }

    /// The GPUs (ordinals) a trial of this group on `device` works on, of
    /// `gpus` in all, and how: a timed trial locks its GPU exclusively, or
    /// every GPU where it spans the whole host (`whole_host`: data-parallel
    /// ranks on every GPU, or work on every core); an untimed one locks its
    /// GPU shared, or every GPU for the ranks of an untimed data-parallel
    /// trial.
    fn gpus_used(self, device: usize, gpus: usize, whole_host: bool) -> (Vec<usize>, Access) {
        let every = (0..gpus.max(1)).collect();
        match self {
            GpuGroup::Alone if whole_host => (every, Access::Exclusive),
            GpuGroup::Alone => (vec![device], Access::Exclusive),
            GpuGroup::Shared => (vec![device], Access::Shared),
            GpuGroup::Ranks => (every, Access::Shared),
        }
    }
}

/// Whether this process was started by cargo-nextest, and with what.
fn nextest() -> Option<Nextest> {
    let run_id = std::env::var("NEXTEST_RUN_ID").ok()?;
    let group = GpuGroup::named(&std::env::var("NEXTEST_TEST_GROUP").unwrap_or_default());
    let slot: Option<usize> = std::env::var("NEXTEST_TEST_GROUP_SLOT")
        .ok()
        .and_then(|s| s.parse().ok());
    let device_ordinal = match group {
        Some(GpuGroup::Alone) => slot,
        Some(GpuGroup::Shared) => {
            use_one_hardware_queue();
            slot.map(|s| s % crate::run::device_count().max(1))
        }
        Some(GpuGroup::Ranks) => {
            use_one_hardware_queue();
            slot.map(|s| s % crate::run::device_count().max(1))
        }
        None => None,
    };
    Some(Nextest {
        run_id,
        device_ordinal,
        group,
    })
}

/// Whether every trial `args` selects (under cargo-nextest: the one this
/// process runs) does its GPU work on one stream ([`Kind::runs_on_one_stream`](crate::subject::Kind::runs_on_one_stream)).
fn all_on_one_stream<S: Subject>(args: &Arguments, specs: &[TrialSpec<S>]) -> bool {
    let mut chosen = specs.iter().filter(|s| selected(args, s)).peekable();
    chosen.peek().is_some() && chosen.all(|s| s.test().check.runs_on_one_stream())
}

/// CUDA's own setting of how many hardware work queues a context opens
/// (its default is 8).
const HARDWARE_QUEUES: &str = "CUDA_DEVICE_MAX_CONNECTIONS";

/// Makes this process's CUDA context open one hardware work queue, unless
/// the caller chose a number. Called before anything touches CUDA, for a
/// trial of the `gpu-shared` or `gpu-ranks` group (whose rank processes
/// inherit it) and for one of the `gpu` group whose work runs on one
/// stream. The driver creates and destroys a context's queues one process
/// at a time, and with a dozen trial processes starting and ending together
/// that wait is most of their setup; one queue makes a context about half
/// as costly. A shared trial and an untimed data-parallel one time nothing,
/// so the overlap of streams they give up (the ranks' collectives then
/// queue behind their compute, in the order each rank launched them)
/// changes none of their verdicts; a timed one that runs one stream has no
/// overlap to give up. The timed trials that run streams side by side (the
/// data-parallel scaling trials among them) keep CUDA's default, what a
/// user's process runs with (docs/src/performance/suite-time.md).
fn use_one_hardware_queue() {
    if std::env::var_os(HARDWARE_QUEUES).is_none() {
        // The harness calls this before the process starts a thread or loads
        // CUDA, so no other thread reads the environment while it changes.
        std::env::set_var(HARDWARE_QUEUES, "1");
    }
}

/// The same selection rule libtest-mimic applies (a filter matches the name
/// or, as cargo-nextest passes it, `[kind] name`), so that skipped rows are
/// written only for trials the filters selected.
fn selected<S: Subject>(args: &Arguments, spec: &TrialSpec<S>) -> bool {
    let name = spec.name.as_str();
    let with_kind = format!("[{}] {name}", spec.backend);
    let matches = |pattern: &str| {
        if args.exact {
            name == pattern || with_kind == pattern
        } else {
            with_kind.contains(pattern)
        }
    };
    let filter_ok = args.filter.as_deref().is_none_or(matches);
    filter_ok && !args.skip.iter().any(|s| matches(s))
}

/// Whether libtest runs `spec` in this process: the filters select it, and
/// it is not ignored (`why`: why it cannot be judged here), or `--ignored`
/// asks for exactly the ignored ones, or `--include-ignored` for all.
fn runs<S: Subject>(args: &Arguments, spec: &TrialSpec<S>, why: Option<&str>) -> bool {
    selected(args, spec) && (args.include_ignored || why.is_some() == args.ignored)
}

/// Whether this process records `spec` as `skipped` without running it: it
/// cannot be judged here and libtest does not run it. cargo-nextest never
/// starts a process for an ignored trial, so under it every process records
/// all it judged (the same rows each time): a nextest run's report then
/// holds every trial, as a `cargo test` run's does.
fn records_skipped<S: Subject>(
    args: &Arguments,
    spec: &TrialSpec<S>,
    why: Option<&str>,
    under_nextest: bool,
) -> bool {
    why.is_some()
        && !args.ignored
        && !args.include_ignored
        && (under_nextest || selected(args, spec))
}

/// Prints `error: {e}` on stderr, contract text escaped.
fn print_error(e: &dyn std::fmt::Display) {
    eprintln!("error: {}", escape_controls(&e.to_string()));
}

/// Prints what writing the reports did besides writing the rows.
fn print_messages(written: &Written) {
    for m in written.messages() {
        eprintln!("{}", escape_controls(&m));
    }
}

/// The contract suite of the subject `S` in the folder `dir`, as a test
/// target's `main` (see [`harness!`](macro@crate::harness)): a trial process or
/// a helper of the subject when started as one, else the libtest run of
/// every trial the contracts define, with the reports written at the end.
pub fn main<S: Subject>(dir: PathBuf) -> ExitCode {
    let process_start = Instant::now();
    let argv: Vec<String> = std::env::args().collect();
    // A trial process or a subject's helper: run it, answer on stdout.
    if let Some(reply) = helper_reply::<S>(&argv, &mut std::io::stdin().lock(), process_start) {
        return answer(reply);
    }
    let nextest = nextest();
    let under_nextest = nextest.is_some();
    let args = Arguments::from_args();
    // Held until the process ends: the GPUs stay locked while the trial
    // runs and its rows are written.
    let Some((specs, engine, _gpu_locks)) =
        start::<S>(&dir, &args, nextest.as_ref(), process_start)
    else {
        return ExitCode::FAILURE;
    };
    let unjudged = unjudged_trials(&args, &specs, &engine, under_nextest);
    let trials: Vec<Trial> = specs
        .iter()
        .zip(&unjudged)
        .map(|(spec, why)| make_trial(spec, &engine, why.is_some()))
        .collect();
    if trials.is_empty() {
        eprintln!("no trials: the contracts define no falsification tests");
        return ExitCode::FAILURE;
    }
    if !args.list {
        if let Err(e) = prepare(&args, &specs, &unjudged, &engine, under_nextest) {
            print_error(&format!("{e}; no trial was run"));
            return ExitCode::FAILURE;
        }
    }
    let conclusion = libtest_mimic::run(&args, trials);
    if args.list {
        return conclusion.exit_code();
    }
    record_skipped(&args, &specs, &unjudged, &engine, under_nextest);
    finish(&specs, &engine, &conclusion)
}

/// Every trial the contracts define, the engine that runs them, and the
/// GPU locks this process holds (under cargo-nextest, in a GPU test group).
type Planned<S> = (Vec<TrialSpec<S>>, Arc<Engine<S>>, Option<Held>);

/// Loads and plans the contracts in `dir`, takes the GPU locks and makes
/// the engine; unless listing, also refuses trials that need more than this
/// machine has and lets SIGINT/SIGTERM stop the run. `None` when refused
/// (said on stderr).
fn start<S: Subject>(
    dir: &Path,
    args: &Arguments,
    nextest: Option<&Nextest>,
    process_start: Instant,
) -> Option<Planned<S>> {
    let contracts = match load_dir::<S>(dir) {
        Ok(c) => c,
        Err(errors) => {
            for e in &errors {
                print_error(e);
            }
            eprintln!(
                "{} invalid contract file(s) in {}",
                errors.len(),
                dir.display()
            );
            return None;
        }
    };
    let specs = plan::<S>(contracts);
    let group = nextest.and_then(|n| n.group);
    if group == Some(GpuGroup::Alone) && all_on_one_stream(args, &specs) {
        use_one_hardware_queue();
    }
    let (locks, process_start) = match nextest.filter(|_| !args.list) {
        Some(n) => lock_gpus(n, spans_the_host(args, &specs), process_start)
            .map_err(|e| print_error(&format!("{e}; no trial was run")))
            .ok()?,
        None => (None, process_start),
    };
    let options = run_options::<S>(dir, nextest, process_start)
        .map_err(|e| print_error(&e))
        .ok()?;
    let engine = Arc::new(Engine::new(options));
    if !args.list {
        let chosen = specs.iter().filter(|s| selected(args, s));
        let over = check_budgets(chosen, &engine);
        if !over.is_empty() {
            for e in &over {
                print_error(e);
            }
            eprintln!(
                "{} trial(s) would need more than this machine has",
                over.len()
            );
            return None;
        }
        let stop = Arc::clone(&engine);
        if let Err(e) = ctrlc::set_handler(move || stop.interrupt()) {
            eprintln!("warning: SIGINT/SIGTERM will not keep finished rows: {e}");
        }
    }
    Some((specs, engine, locks))
}

/// Whether a trial `args` selects spans the whole host
/// ([`Kind::needs_the_whole_host`](crate::subject::Kind::needs_the_whole_host)).
fn spans_the_host<S: Subject>(args: &Arguments, specs: &[TrialSpec<S>]) -> bool {
    specs
        .iter()
        .any(|s| selected(args, s) && s.test().check.needs_the_whole_host())
}

/// A wait for other trials' GPU locks short enough not to mention.
const UNREMARKABLE_WAIT: Duration = Duration::from_millis(100);

/// Takes the locks of the GPUs this process's trial works on, as its test
/// group says ([`GpuGroup::gpus_used`]), before anything opens a GPU; says
/// so when it waited. Returns the locks (none outside the GPU groups) and
/// `process_start` moved on by the wait, so that a trial's setup time does
/// not count the time it waited for others. A lock that cannot be taken is
/// an error: a timed trial could not vouch for what it measured.
fn lock_gpus(
    n: &Nextest,
    whole_host: bool,
    process_start: Instant,
) -> crate::Result<(Option<Held>, Instant)> {
    let (Some(group), Some(device)) = (n.group, n.device_ordinal) else {
        return Ok((None, process_start));
    };
    let gpus = crate::run::device_count();
    let (ordinals, access) = group.gpus_used(device, gpus, whole_host);
    let names: Vec<String> = ordinals.iter().map(|&o| gpu_locks::gpu_name(o)).collect();
    let (held, waited) = gpu_locks::acquire(&gpu_locks::lock_dir(), &names, access)?;
    if waited >= UNREMARKABLE_WAIT {
        let until = match access {
            Access::Exclusive => "no other trial worked on",
            Access::Shared => "no trial timed",
        };
        eprintln!(
            "waited {:.1} s until {until} GPU(s) {ordinals:?}",
            waited.as_secs_f64()
        );
    }
    Ok((Some(held), process_start + waited))
}

/// Records the trials libtest ignored (they never ran) as skipped, with
/// the reason, and says how many per reason.
fn record_skipped<S: Subject>(
    args: &Arguments,
    specs: &[TrialSpec<S>],
    unjudged: &[Option<String>],
    engine: &Engine<S>,
    under_nextest: bool,
) {
    let mut reasons: std::collections::BTreeMap<&str, usize> = Default::default();
    for (spec, why) in specs.iter().zip(unjudged) {
        if let Some(reason) = why
            .as_deref()
            .filter(|w| records_skipped(args, spec, Some(w), under_nextest))
        {
            engine.skip(spec, reason);
            *reasons.entry(reason).or_default() += 1;
        }
    }
    for (reason, n) in reasons {
        eprintln!("{n} trial(s) ignored: {}", escape_controls(reason));
    }
}

/// After the trials: refuses a run that matched nothing, writes the
/// reports, and gives the exit code (130 when interrupted, libtest's
/// otherwise).
fn finish<S: Subject>(
    specs: &[TrialSpec<S>],
    engine: &Engine<S>,
    conclusion: &libtest_mimic::Conclusion,
) -> ExitCode {
    let ran = conclusion.num_passed + conclusion.num_failed;
    if ran == 0 && conclusion.num_ignored == 0 {
        eprintln!("no trial matched the filter: nothing was run");
        return ExitCode::FAILURE;
    }
    match engine.write_reports(specs) {
        Ok(written) => {
            print_messages(&written);
            eprintln!("report: {}", written.path.display());
        }
        Err(e) => {
            print_error(&e);
            return ExitCode::FAILURE;
        }
    }
    if engine.was_interrupted() {
        eprintln!("interrupted: the report holds the trials that finished");
        return ExitCode::from(130);
    }
    conclusion.exit_code()
}

/// Why each trial cannot be judged here (`None`: it can run). A cuda trial
/// is judged by opening the GPU; under nextest a cpu trial's process leaves
/// that to the cuda trials' processes (on a GPU runner it would open a
/// context on a device a cuda trial may be timing), except where no CUDA
/// driver makes the answer free.
fn unjudged_trials<S: Subject>(
    args: &Arguments,
    specs: &[TrialSpec<S>],
    engine: &Engine<S>,
    under_nextest: bool,
) -> Vec<Option<String>> {
    let judge_cuda = !under_nextest
        || args.list
        || !driver_present()
        || specs
            .iter()
            .any(|s| s.backend == Backend::Cuda && selected(args, s));
    specs
        .iter()
        .map(|s| {
            let leave = s.backend == Backend::Cuda && !judge_cuda;
            (!leave).then(|| engine.unjudged(s)).flatten()
        })
        .collect()
}

/// The engine's options. Under cargo-nextest: trials run in this process
/// (nextest started it for one trial), rows carry nextest's run id, and a
/// trial in the `gpu` group runs on the device its slot names.
fn run_options<S: Subject>(
    dir: &std::path::Path,
    nextest: Option<&Nextest>,
    process_start: Instant,
) -> crate::Result<RunOptions<S>> {
    let mut options: RunOptions<S> = RunOptions {
        out_dir: reports_dir(dir),
        process_start: Some(process_start),
        ..RunOptions::default()
    };
    options
        .device
        .set_kernel_cache_dir(workspace_root(dir).join(DEFAULT_KERNEL_CACHE));
    match nextest {
        Some(n) => {
            options.run_id = Some(n.run_id.clone());
            options.device.set_ordinal(n.device_ordinal.unwrap_or(0));
        }
        None => options.isolation = Isolation::Child(ChildCommand::current_exe()?),
    }
    Ok(options)
}

/// Before any trial runs: records which trials this process runs or
/// records (run.json lists them), makes sure the reports can be written,
/// and under cargo-nextest guards the one trial this process runs.
fn prepare<S: Subject>(
    args: &Arguments,
    specs: &[TrialSpec<S>],
    unjudged: &[Option<String>],
    engine: &Arc<Engine<S>>,
    under_nextest: bool,
) -> crate::Result<()> {
    let chosen: Vec<&TrialSpec<S>> = specs
        .iter()
        .zip(unjudged)
        .filter(|(s, why)| {
            let why = why.as_deref();
            runs(args, s, why) || records_skipped(args, s, why, under_nextest)
        })
        .map(|(s, _)| s)
        .collect();
    engine.select(&chosen)?;
    ReportDir::new(&engine.options().out_dir).check_writable()?;
    if under_nextest {
        guard_nextest_trial(args, specs, unjudged, engine)?;
    }
    Ok(())
}

/// Under cargo-nextest, for the one trial this process runs: records its
/// `error` row before it starts (the real row replaces it; should the
/// process die, the row says so), and starts a watchdog that records a
/// timeout and ends the process once the trial's time is up.
fn guard_nextest_trial<S: Subject>(
    args: &Arguments,
    specs: &[TrialSpec<S>],
    unjudged: &[Option<String>],
    engine: &Arc<Engine<S>>,
) -> crate::Result<()> {
    let mut running = specs
        .iter()
        .zip(unjudged)
        .filter(|(s, why)| runs(args, s, why.as_deref()));
    let (Some((spec, _)), None) = (running.next(), running.next()) else {
        // Not one trial: an ordinary libtest run under nextest's environment.
        return Ok(());
    };
    let timeout = spec.timeout();
    let written = engine.write_provisional(
        spec,
        "the trial's process ended before it recorded a result (a crash, or stopped \
         by the test runner); the runner's output for this test names the cause",
        specs,
    )?;
    print_messages(&written);
    let (engine, spec, all) = (Arc::clone(engine), spec.clone(), specs.to_vec());
    std::thread::spawn(move || {
        std::thread::sleep(timeout);
        let why = format!(
            "timed out: still running after {:.0} s, stopped",
            timeout.as_secs_f64()
        );
        print_error(&format!("{}: {why}", spec.name));
        if let Err(e) = engine.write_provisional(&spec, &why, &all) {
            print_error(&e);
        }
        std::process::exit(124);
    });
    Ok(())
}

fn make_trial<S: Subject>(spec: &TrialSpec<S>, engine: &Arc<Engine<S>>, ignored: bool) -> Trial {
    let kind = spec.backend.as_str();
    let engine = Arc::clone(engine);
    let owned = spec.clone();
    Trial::test(spec.name.clone(), move || {
        let outcome = engine.run(&owned);
        // Contract text in a message is escaped: it reaches the terminal.
        let (summary, detail) = (
            escape_controls(&outcome.summary),
            escape_controls(&outcome.detail),
        );
        match outcome.status {
            Status::Passed => Ok(()),
            Status::Skipped => Err(Failed::from(format!("skipped: {summary}"))),
            Status::Falsified => Err(Failed::from(format!("falsified: {summary}\n{detail}"))),
            Status::Error => Err(Failed::from(format!("error: {detail}"))),
        }
    })
    .with_kind(kind)
    .with_ignored_flag(ignored)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timed_trial_locks_its_gpu_alone_and_a_whole_host_one_every_gpu() {
        let alone = GpuGroup::Alone;
        assert_eq!(alone.gpus_used(2, 4, false), (vec![2], Access::Exclusive));
        assert_eq!(
            alone.gpus_used(0, 4, true),
            (vec![0, 1, 2, 3], Access::Exclusive)
        );
    }

    #[test]
    fn an_untimed_trial_shares_its_gpu_and_untimed_ranks_share_every_gpu() {
        assert_eq!(
            GpuGroup::Shared.gpus_used(3, 4, false),
            (vec![3], Access::Shared)
        );
        assert_eq!(
            GpuGroup::Ranks.gpus_used(1, 2, false),
            (vec![0, 1], Access::Shared)
        );
        // No driver: one GPU, device 0.
        assert_eq!(
            GpuGroup::Ranks.gpus_used(0, 0, false),
            (vec![0], Access::Shared)
        );
    }
}
