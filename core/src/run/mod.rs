//! The engine shared by the `cargo test` harness and the CLI, for any
//! [`Subject`]: it plans trials from contracts, decides what can run here,
//! executes one trial at a time on the subject's device, times every trial,
//! and collects the report rows.

mod isolate;
mod observe;

use std::collections::{BTreeSet, HashSet};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use isolate::ChildReply;
pub use isolate::{helper_reply, run_child, ChildCommand, ChildRequest, CHILD_FLAG};

pub use crate::report::meta::{
    nvidia_smi_query, read_clocks, GpuMeta, RecordedOptions, RunMeta, RUN_JSON,
};

use crate::check::clocks::ClockWindow;
use crate::check::{GpuHere, Here, Measurement};
use crate::contract::{Backend, ContractOf, TestOf};
use crate::core_kinds::{Check, CoreTrial, MutantName};
use crate::error::{Error, Result};
use crate::report::artifacts::{self, artifact_stem, ArtifactWriter, ARTIFACTS_DIR};
use crate::report::claim::Headline;
use crate::report::{trial_key, FalsificationRow, ReportDir, SpeedupRow, Status, Written};
use crate::subject::{DeviceFacts, DeviceOptions, KindSet, Subject, TrialContext};

/// Where the front ends keep compiled kernel modules, relative to the
/// workspace root: under the git-ignored `target/`, shared by every trial
/// process of a run and by later runs. Trials that measure a cold start use
/// a fresh directory of their own instead.
pub const DEFAULT_KERNEL_CACHE: &str = "target/falsify-kernel-cache";

pub use crate::check::driver_present;

/// Options of a run of the subject `S`. Front ends fill this in; nothing is
/// read from the environment.
pub struct RunOptions<S: Subject> {
    /// Where the reports go (`reports/latest`).
    pub out_dir: PathBuf,
    /// Mixed into every trial's seed; change it to draw different inputs.
    pub seed: u64,
    /// The subject's device options (ordinal, kernel cache, ...).
    pub device: S::Options,
    /// Test ids whose own trial runs with the test's mutant injected: a
    /// rehearsal of a regression (the report must then flag it).
    /// [`Engine::select`] refuses one that could not take effect.
    pub inject: Vec<String>,
    /// Where trials run: in this process, or each in a child process of its
    /// own (what the CLI and the test runner use).
    pub isolation: Isolation,
    /// The run's id, when a front end is one of several processes of one
    /// run (cargo-nextest's run id); `None`: this process's own.
    pub run_id: Option<String>,
    /// When this process started: the first trial it runs counts its setup
    /// (`setup_ms`) from here. `None`: from the trial's own start.
    pub process_start: Option<Instant>,
}

/// Where a trial runs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Isolation {
    /// In the calling process: no timeout can be enforced and a crash ends
    /// the process. For library callers and tests of single trials.
    #[default]
    InProcess,
    /// Each trial in a child process started with this command: a crash or
    /// a hang past the trial's timeout costs that trial one `error` row.
    Child(ChildCommand),
}

impl<S: Subject> Default for RunOptions<S> {
    fn default() -> Self {
        RunOptions {
            out_dir: PathBuf::from("reports/latest"),
            seed: 0,
            device: S::Options::default(),
            inject: Vec::new(),
            isolation: Isolation::InProcess,
            run_id: None,
            process_start: None,
        }
    }
}

impl<S: Subject> Clone for RunOptions<S> {
    fn clone(&self) -> Self {
        RunOptions {
            out_dir: self.out_dir.clone(),
            seed: self.seed,
            device: self.device.clone(),
            inject: self.inject.clone(),
            isolation: self.isolation.clone(),
            run_id: self.run_id.clone(),
            process_start: self.process_start,
        }
    }
}

impl<S: Subject> std::fmt::Debug for RunOptions<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunOptions")
            .field("out_dir", &self.out_dir)
            .field("seed", &self.seed)
            .field("device", &self.device)
            .field("inject", &self.inject)
            .field("isolation", &self.isolation)
            .field("run_id", &self.run_id)
            .field("process_start", &self.process_start)
            .finish()
    }
}

/// One trial: a falsification test, or the mutant self-test of one.
pub struct TrialSpec<S: Subject> {
    /// `{contract}::{test_id}`, with `::mutant` appended for the self-test.
    pub name: String,
    pub contract: Arc<ContractOf<S>>,
    /// [`contract_hash`] of the contract's text as the run read it.
    pub contract_hash: String,
    test_index: usize,
    pub backend: Backend,
    /// Run with the test's mutant injected; passes only if the check falsifies.
    pub selftest: bool,
}

impl<S: Subject> Clone for TrialSpec<S> {
    fn clone(&self) -> Self {
        TrialSpec {
            name: self.name.clone(),
            contract: Arc::clone(&self.contract),
            contract_hash: self.contract_hash.clone(),
            test_index: self.test_index,
            backend: self.backend,
            selftest: self.selftest,
        }
    }
}

impl<S: Subject> std::fmt::Debug for TrialSpec<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrialSpec")
            .field("name", &self.name)
            .field("contract", &self.contract.path)
            .field("contract_hash", &self.contract_hash)
            .field("backend", &self.backend)
            .field("selftest", &self.selftest)
            .finish()
    }
}

impl<S: Subject> TrialSpec<S> {
    pub fn test(&self) -> &TestOf<S> {
        &self.contract.falsification_tests[self.test_index]
    }

    /// How long the trial may run: its test's `timeout_s`, or its check
    /// kind's default.
    pub fn timeout(&self) -> Duration {
        timeout_of(self.test().timeout_s())
    }

    /// The `test_id` column: the test id, with `::mutant` for the self-test.
    pub fn test_id(&self) -> String {
        if self.selftest {
            format!("{}::mutant", self.test().id)
        } else {
            self.test().id.clone()
        }
    }
}

/// The first 16 hex digits of the SHA-256 of `text`: the `contract_hash`
/// of a row whose contract had this text.
pub fn contract_hash(text: &str) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(text.as_bytes())
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Every trial the contracts define, in file order: each test, then its
/// mutant self-test. The run is a snapshot of these contracts: their text is
/// hashed here, and a trial process gets the same text, never the file.
pub fn plan<S: Subject>(contracts: Vec<ContractOf<S>>) -> Vec<TrialSpec<S>> {
    let mut trials = Vec::new();
    for contract in contracts {
        let hash = contract_hash(&contract.source);
        let contract = Arc::new(contract);
        for (i, test) in contract.falsification_tests.iter().enumerate() {
            let backend = contract.backend_of(test);
            for selftest in [false, true] {
                let mut name = format!("{}::{}", contract.metadata.id, test.id);
                if selftest {
                    name.push_str("::mutant");
                }
                trials.push(TrialSpec {
                    name,
                    contract: Arc::clone(&contract),
                    contract_hash: hash.clone(),
                    test_index: i,
                    backend,
                    selftest,
                });
            }
        }
    }
    trials
}

/// Every trial whose check would need more than `here` has, or more than its
/// kind's bounds allow, as a located contract error (file and line of the
/// test): a contract that validates can also run. Cuda trials are checked
/// only where a GPU was found; elsewhere they are skipped anyway.
pub fn check_budgets<'a, S: Subject>(
    trials: impl IntoIterator<Item = &'a TrialSpec<S>>,
    engine: &Engine<S>,
) -> Vec<Error> {
    let mut errors = Vec::new();
    for trial in trials.into_iter().filter(|t| !t.selftest) {
        let here = engine.here_for(trial.backend);
        if trial.backend == Backend::Cuda && here.gpu.is_none() {
            continue;
        }
        let test = trial.test();
        if let Err(message) = test.check.check_budget(trial.backend, &here) {
            errors.push(Error::Contract {
                line: crate::contract::locate(&trial.contract.source, "id", &test.id),
                column: 0,
                message: format!("test {} on {}: {message}", test.id, trial.backend),
                path: trial.contract.path.clone(),
            });
        }
    }
    errors
}

/// What a finished trial says, for the front end.
#[derive(Debug, Clone)]
pub struct TrialOutcome {
    pub status: Status,
    /// One line: the metric against its threshold, or the reason.
    pub summary: String,
    /// The detail column: seed, shapes, violations, the contract's `if_fails`.
    pub detail: String,
}

enum GpuSlot<S: Subject> {
    Unprobed,
    /// No usable device: cuda trials are skipped with this reason.
    Unavailable(String),
    Ready(Box<S::Device>),
    /// The context faulted: the remaining cuda trials are errors with this reason.
    Lost(String),
}

/// Runs trials of the subject `S` and collects their rows. Shared by
/// reference across the harness's worker threads; GPU trials serialise on
/// the one device.
pub struct Engine<S: Subject> {
    options: RunOptions<S>,
    meta: RunMeta,
    gpu: Mutex<GpuSlot<S>>,
    rows: Mutex<Vec<FalsificationRow>>,
    /// `{contract}::{test_id}` of the trials among `rows` skipped without
    /// being run ([`Engine::skip`]): forecasts, which a row of the same run
    /// whose trial ran (in another process) overrules.
    forecasts: Mutex<HashSet<String>>,
    speedups: Mutex<Vec<SpeedupRow>>,
    /// The host's available memory, read once when trials are planned.
    host_memory: OnceLock<u64>,
    /// The GPU's facts and free memory, or why there is no usable GPU; read
    /// once, and only when a cuda trial is planned.
    gpu_probe: OnceLock<std::result::Result<(DeviceFacts, GpuHere), String>>,
    /// With child processes, cuda trials take turns: one GPU, one trial.
    gpu_turn: Mutex<()>,
    /// Set when the run is being stopped: no trial starts, a running child
    /// is killed, and the reports hold only the trials that finished.
    interrupted: AtomicBool,
    /// The process's start, until the first trial run here takes it.
    process_start: Mutex<Option<Instant>>,
    /// The names of the trials this run selected (see [`Engine::select`]).
    selected: Mutex<BTreeSet<String>>,
    /// The driver observer, for the core's driver-observed kinds only.
    driver: observe::DriverAccess,
}

/// What planning found out about this machine.
#[derive(Debug, Clone)]
struct Planned {
    here: Here,
    /// The GPU's facts, or why cuda trials cannot run here.
    gpu: std::result::Result<DeviceFacts, String>,
}

/// The one line a person reads for a trial: the bound that decided it, read
/// as a verdict (`grad_rel_error 2.31 > 1e-6: falsified`), or its detail
/// when no verdict line applies; a self-test's names its mutant.
fn summary_line<S: Subject>(
    trial: &TrialSpec<S>,
    status: Status,
    m: &Measurement,
    detail: &str,
) -> String {
    let line = crate::report::claim::verdict_line(&headline(m), status, trial.selftest)
        .unwrap_or_else(|| detail.to_string());
    if trial.selftest {
        format!("with mutant `{}`: {line}", trial.test().mutant)
    } else {
        line
    }
}

/// The bound of `m` that decided its trial (see [`Headline::of`]).
fn headline(m: &Measurement) -> Headline {
    Headline::of(
        &m.metric,
        m.observed,
        m.comparator.symbol(),
        m.threshold,
        &m.unit,
        &m.violations,
    )
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicking trial is caught and recorded; its lock is still usable.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<S: Subject> Engine<S> {
    pub fn new(options: RunOptions<S>) -> Self {
        Self::with_meta(options, RunMeta::detect())
    }

    /// An engine recording into the run `meta` describes (a trial process
    /// reports for its parent's run), for the subject `S`.
    pub fn with_meta(options: RunOptions<S>, mut meta: RunMeta) -> Self {
        meta.subject = S::NAME.to_string();
        meta.options = RecordedOptions {
            seed: options.seed,
            out_dir: options.out_dir.display().to_string(),
            gpu: format!("{:?}", options.device),
        };
        if let Some(id) = &options.run_id {
            meta.run_id = id.clone();
        }
        Engine {
            process_start: Mutex::new(options.process_start),
            options,
            meta,
            gpu: Mutex::new(GpuSlot::Unprobed),
            rows: Mutex::new(Vec::new()),
            forecasts: Mutex::new(HashSet::new()),
            speedups: Mutex::new(Vec::new()),
            host_memory: OnceLock::new(),
            gpu_probe: OnceLock::new(),
            gpu_turn: Mutex::new(()),
            interrupted: AtomicBool::new(false),
            selected: Mutex::new(BTreeSet::new()),
            driver: observe::DriverAccess::default(),
        }
    }

    /// Records `trials` as selected by this run (run.json lists them, and a
    /// report counts any of them without a row of this run as not
    /// finished), and checks that every injected mutant can take effect: an
    /// [`RunOptions::inject`] id must name a test whose own trial (not its
    /// self-test) is among `trials` and can be judged here. A rehearsal whose
    /// mutant would silently not be injected is refused, before anything runs.
    pub fn select(&self, trials: &[&TrialSpec<S>]) -> Result<()> {
        lock(&self.selected).extend(trials.iter().map(|t| t.name.clone()));
        let problems: Vec<String> = self
            .options
            .inject
            .iter()
            .filter_map(|id| self.inject_problem(id, trials))
            .collect();
        if problems.is_empty() {
            Ok(())
        } else {
            Err(Error::Inject(problems.join("; ")))
        }
    }

    /// Why injecting the mutant of test `id` would not take effect in a run
    /// of `trials`, if it would not.
    fn inject_problem(&self, id: &str, trials: &[&TrialSpec<S>]) -> Option<String> {
        let Some(trial) = trials.iter().find(|t| !t.selftest && t.test().id == id) else {
            return Some(format!(
                "--inject {id}: the trial of test {id} is not selected by this run (a filter, \
                 or a --skip, leaves it out), so its mutant would not be injected"
            ));
        };
        let why = self.unjudged(trial)?;
        Some(format!(
            "--inject {id}: {} cannot be judged here ({why}), so its mutant would not be injected",
            trial.name
        ))
    }

    /// Stops the run: no further trial starts and a running trial process
    /// is killed. Safe to call from a signal handler's thread.
    pub fn interrupt(&self) {
        self.interrupted.store(true, Ordering::SeqCst);
    }

    /// Whether the run was stopped before every trial ran.
    pub fn was_interrupted(&self) -> bool {
        self.interrupted.load(Ordering::SeqCst)
    }

    /// What a trial on `backend` may use here: the host's memory and, for a
    /// cuda trial, the GPU's name and memory when one is usable. Each is
    /// read once; the GPU only when a cuda trial asks.
    pub fn here_for(&self, backend: Backend) -> Here {
        Here {
            host_memory_bytes: *self.host_memory.get_or_init(host_memory_bytes),
            gpu: match backend {
                Backend::Cuda => self.gpu_probe().as_ref().ok().map(|(_, g)| g.clone()),
                Backend::Cpu => None,
            },
        }
    }

    fn planned(&self, backend: Backend) -> Planned {
        Planned {
            here: self.here_for(backend),
            gpu: match backend {
                Backend::Cuda => self.gpu_probe().clone().map(|(facts, _)| facts),
                Backend::Cpu => Err("a cpu trial uses no GPU".into()),
            },
        }
    }

    /// Reads the GPU's facts. In-process, the context opened here is the
    /// one the trials use; with child processes it is closed again, so the
    /// children have the device to themselves.
    fn gpu_probe(&self) -> &std::result::Result<(DeviceFacts, GpuHere), String> {
        self.gpu_probe
            .get_or_init(|| match &self.options.isolation {
                Isolation::InProcess => {
                    let mut slot = lock(&self.gpu);
                    Self::ensure_gpu(&mut slot, &self.options.device);
                    match &*slot {
                        GpuSlot::Ready(device) => Ok(gpu_here::<S>(device)),
                        GpuSlot::Unavailable(why) | GpuSlot::Lost(why) => Err(why.clone()),
                        GpuSlot::Unprobed => Err("CUDA was not probed".to_string()),
                    }
                }
                Isolation::Child(_) => probe_gpu::<S>(&self.options.device),
            })
    }

    /// Why `trial` cannot be judged here, decided before it runs: no usable
    /// GPU for a cuda trial, no target for this GPU kind, a configuration
    /// that does not fit. Such a trial is ignored and recorded `skipped`.
    pub fn unjudged(&self, trial: &TrialSpec<S>) -> Option<String> {
        unjudged_on(trial, &self.planned(trial.backend))
            .or_else(|| self.driver.unjudged(&trial.test().check))
    }

    /// Whether a cuda trial ran (was not skipped) in this run.
    fn ran_cuda(&self) -> bool {
        lock(&self.rows)
            .iter()
            .any(|r| r.backend == Backend::Cuda.as_str() && r.status != Status::Skipped)
    }

    /// The number of trials recorded so far.
    pub fn row_count(&self) -> usize {
        lock(&self.rows).len()
    }

    /// The speedup rows recorded so far.
    pub fn speedup_rows(&self) -> Vec<SpeedupRow> {
        lock(&self.speedups).clone()
    }

    pub fn meta(&self) -> &RunMeta {
        &self.meta
    }

    pub fn options(&self) -> &RunOptions<S> {
        &self.options
    }

    /// Why `cuda` trials cannot run here, or `None` when a device is usable.
    /// Opens the device on first call.
    pub fn cuda_skip_reason(&self) -> Option<String> {
        self.gpu_probe().as_ref().err().cloned()
    }

    fn ensure_gpu(slot: &mut GpuSlot<S>, options: &S::Options) {
        if let GpuSlot::Unprobed = slot {
            *slot = if !driver_present() {
                GpuSlot::Unavailable("no CUDA driver".into())
            } else {
                match S::open_device(options) {
                    Ok(device) => GpuSlot::Ready(Box::new(device)),
                    Err(e) => GpuSlot::Unavailable(format!("no usable CUDA device: {e}")),
                }
            };
        }
    }

    /// After a failed cuda trial: if the subject says its device is no
    /// longer healthy ([`Subject::check_health`]), the fault was sticky
    /// (e.g. an illegal address). CUDA then refuses all further work in
    /// this process, so the remaining cuda trials are recorded as errors
    /// ("context lost") and the run goes on with everything else.
    fn recover_if_faulted(slot: &mut GpuSlot<S>) {
        let health = match slot {
            GpuSlot::Ready(device) => S::check_health(device),
            _ => return,
        };
        if let Err(e) = health {
            log::warn!("the CUDA context faulted: {e}");
            *slot = GpuSlot::Lost(format!(
                "context lost: an earlier trial faulted the CUDA context ({e})"
            ));
        }
    }

    /// Records `trial` as an error without running it.
    fn record_error(&self, trial: &TrialSpec<S>, reason: &str) -> TrialOutcome {
        let row = self.row(trial, Status::Error, None, 0.0, None, reason.to_string());
        lock(&self.rows).push(row);
        TrialOutcome {
            status: Status::Error,
            summary: reason.to_string(),
            detail: reason.to_string(),
        }
    }

    /// Records `trial` as skipped without running it.
    pub fn skip(&self, trial: &TrialSpec<S>, reason: &str) -> TrialOutcome {
        let row = self.row(trial, Status::Skipped, None, 0.0, None, reason.to_string());
        lock(&self.forecasts).insert(trial_key(&row.contract, &row.test_id));
        lock(&self.rows).push(row);
        TrialOutcome {
            status: Status::Skipped,
            summary: reason.to_string(),
            detail: reason.to_string(),
        }
    }

    /// Runs one trial to completion and records its row, in this process or
    /// in a child of its own (see [`Isolation`]). Never panics: a panicking
    /// check, a check error, a crashed or timed-out trial process all become
    /// `error` rows. Once the run is interrupted, trials no longer start and
    /// record nothing.
    pub fn run(&self, trial: &TrialSpec<S>) -> TrialOutcome {
        if self.was_interrupted() {
            return isolate::failed_outcome("not run: the run was interrupted");
        }
        match &self.options.isolation {
            Isolation::InProcess => self.run_here(trial),
            Isolation::Child(command) => self.run_in_child(trial, command),
        }
    }

    /// [`Engine::run`] in a child process: waits at most the test's timeout,
    /// records the child's rows, or one `error` row naming why it gave none.
    fn run_in_child(&self, trial: &TrialSpec<S>, command: &ChildCommand) -> TrialOutcome {
        if trial.backend == Backend::Cuda {
            if let Some(why) = self.cuda_skip_reason() {
                return self.skip(trial, &why);
            }
        }
        // One GPU: cuda trials take turns; cpu trials run side by side.
        let _turn = (trial.backend == Backend::Cuda).then(|| lock(&self.gpu_turn));
        let request = ChildRequest::new(&self.options, trial, &self.meta);
        let timeout = trial.timeout();
        let started = Instant::now();
        let seed = trial_seed(
            self.options.seed,
            &trial.contract.metadata.id,
            &trial.test().id,
        );
        // The scratch folder lives until the trial's process has ended.
        let (env, _scratch) = match observe::process_env::<S>(&trial.test().check, seed) {
            Ok(made) => made,
            Err(e) => return self.record_failure(trial, started, &e.to_string()),
        };
        let child = isolate::Child { command, env: &env };
        match isolate::run_in_child(child, &request, timeout, &self.interrupted) {
            isolate::ChildEnd::Replied(reply) => self.record_reply(*reply),
            isolate::ChildEnd::Interrupted => {
                isolate::failed_outcome("not finished: the run was interrupted")
            }
            isolate::ChildEnd::Failed(cause) => self.record_failure(trial, started, &cause),
        }
    }

    /// Records an `error` row for a trial whose process gave no answer.
    fn record_failure(&self, trial: &TrialSpec<S>, started: Instant, cause: &str) -> TrialOutcome {
        let duration_ms = started.elapsed().as_secs_f64() * 1e3;
        let row = self.row(
            trial,
            Status::Error,
            None,
            duration_ms,
            None,
            cause.to_string(),
        );
        lock(&self.rows).push(row);
        isolate::failed_outcome(cause)
    }

    /// Records the rows a trial process sent back.
    fn record_reply(&self, reply: ChildReply) -> TrialOutcome {
        let outcome = TrialOutcome {
            status: reply.row.status,
            summary: reply.summary,
            detail: reply.detail,
        };
        lock(&self.rows).push(reply.row);
        lock(&self.speedups).extend(reply.speedups);
        outcome
    }

    /// Runs one trial in this process and records its row.
    fn run_here(&self, trial: &TrialSpec<S>) -> TrialOutcome {
        let origin = lock(&self.process_start)
            .take()
            .unwrap_or_else(Instant::now);
        let test = trial.test();
        let seed = trial_seed(self.options.seed, &trial.contract.metadata.id, &test.id);
        let injected = !trial.selftest && self.options.inject.contains(&test.id);
        let mutant = (trial.selftest || injected).then(|| test.mutant.clone());
        let started = Instant::now();

        let mut gpu_guard = match self.claim_gpu(trial) {
            Ok(guard) => guard,
            Err(outcome) => return outcome,
        };
        let device = gpu_guard.as_mut().and_then(|slot| match &mut **slot {
            GpuSlot::Ready(device) => Some(&mut **device),
            _ => None,
        });
        let mut cx = TrialContext {
            seed,
            mutant: mutant.as_ref().and_then(|m| m.subject().cloned()),
            device,
        };
        let setup_ms = origin.elapsed().as_secs_f64() * 1e3;
        let result = catch_unwind(AssertUnwindSafe(|| match &test.check {
            Check::Subject(kind) => kind
                .execute(trial.backend, &mut cx)
                .map_err(Failure::Subject),
            Check::Core(kind) => {
                let observer = self.driver.for_check(&test.check).map_err(Failure::Core)?;
                let core = CoreTrial {
                    cx: &mut cx,
                    mutant: mutant.as_ref().and_then(MutantName::core),
                    observer,
                };
                kind.execute(trial.backend, core).map_err(Failure::Core)
            }
        }))
        .unwrap_or_else(|panic| Err(Failure::Panicked(panic_message(panic))));
        // A sticky fault (e.g. an illegal address) leaves the context unusable
        // for every later call; the remaining cuda trials are then recorded
        // as errors and the rest of the run goes on.
        if let (Some(slot), Err(_)) = (gpu_guard.as_mut(), &result) {
            Self::recover_if_faulted(slot);
        }
        drop(gpu_guard);
        let timing = (started.elapsed().as_secs_f64() * 1e3, setup_ms);
        self.record(trial, seed, injected, result, timing)
    }

    /// Judges a trial's result, writes its failure artifact, and records
    /// its row and speedups; `timing` is its duration and setup, in ms.
    fn record(
        &self,
        trial: &TrialSpec<S>,
        seed: u64,
        injected: bool,
        result: std::result::Result<Measurement, Failure<S::Error>>,
        (duration_ms, setup_ms): (f64, f64),
    ) -> TrialOutcome {
        let test = trial.test();
        let (status, measurement, mut detail) = judge::<S>(trial, seed, result);
        if injected {
            detail = format!(
                "mutant `{}` injected on purpose (--inject); {detail}",
                test.mutant
            );
        }
        if trial.backend == Backend::Cuda {
            // Which GPU of the host ran it: with several (nextest's `gpu`
            // group slots), a row says which device its figures are from.
            detail.push_str(&format!("; CUDA device {}", self.options.device.ordinal()));
        }
        if !trial.selftest {
            if let Some(note) = self.write_artifact(trial, status, measurement.as_ref(), seed) {
                detail.push_str("; ");
                detail.push_str(&note);
            }
        }
        let summary = match &measurement {
            Some(m) => summary_line(trial, status, m, &detail),
            None => detail.clone(),
        };
        if let Some(m) = &measurement {
            self.record_speedups(trial, status, m);
        }
        let row = self.row(
            trial,
            status,
            measurement.as_ref(),
            duration_ms,
            Some(setup_ms),
            detail.clone(),
        );
        lock(&self.rows).push(row);
        TrialOutcome {
            status,
            summary,
            detail,
        }
    }

    /// The GPU slot a cuda trial runs with, held for the whole trial (`None`
    /// for a cpu trial), or the trial's outcome when it cannot run: `skipped`
    /// with no usable GPU, `error` once the context is lost.
    fn claim_gpu(
        &self,
        trial: &TrialSpec<S>,
    ) -> Result<Option<MutexGuard<'_, GpuSlot<S>>>, TrialOutcome> {
        if trial.backend != Backend::Cuda {
            return Ok(None);
        }
        let mut slot = lock(&self.gpu);
        Self::ensure_gpu(&mut slot, &self.options.device);
        match &mut *slot {
            GpuSlot::Unavailable(why) => {
                let why = why.clone();
                drop(slot);
                Err(self.skip(trial, &why))
            }
            GpuSlot::Lost(why) => {
                let why = why.clone();
                drop(slot);
                Err(self.record_error(trial, &why))
            }
            GpuSlot::Ready(_) | GpuSlot::Unprobed => Ok(Some(slot)),
        }
    }

    /// Adds the speedup rows of `m` to the run's `speedups.csv`.
    fn record_speedups(&self, trial: &TrialSpec<S>, status: Status, m: &Measurement) {
        let device = self.device_name(trial.backend);
        let mut speedups = lock(&self.speedups);
        for s in &m.speedups {
            speedups.push(SpeedupRow {
                run_id: self.meta.run_id.clone(),
                contract: trial.contract.metadata.id.clone(),
                test_id: trial.test_id(),
                status: Some(status),
                threshold: crate::report::claim::ratio_threshold(
                    s.ratio,
                    m.observed,
                    m.comparator.symbol(),
                    m.threshold,
                ),
                subject: s.subject.clone(),
                model: s.model.clone(),
                batch: s.batch,
                seq_len: s.seq_len,
                baseline: s.baseline.clone(),
                candidate: s.candidate.clone(),
                baseline_median_ms: s.baseline_median_ms,
                candidate_median_ms: s.candidate_median_ms,
                ratio: s.ratio,
                ratio_ci_low: s.ratio_ci_low,
                ratio_ci_high: s.ratio_ci_high,
                repeats: s.repeats,
                device: device.clone(),
                peak_device_gib: s.peak_device_gib,
                baseline_peak_device_gib: s.baseline_peak_device_gib,
                clocks: m.clocks.as_ref().map(|w| w.describe()).unwrap_or_default(),
            });
        }
    }

    /// Replaces the trial's failure artifact: removes the one an earlier run
    /// left, and writes the measurement's tensors when the trial is falsified.
    /// Returns a note for the detail column when something was written or failed.
    fn write_artifact(
        &self,
        trial: &TrialSpec<S>,
        status: Status,
        m: Option<&Measurement>,
        seed: u64,
    ) -> Option<String> {
        let dir = self.options.out_dir.join(ARTIFACTS_DIR);
        let stem = artifact_stem(&trial.contract.metadata.id, &trial.test_id());
        let stale = dir.join(format!("{stem}.{}", artifacts::EXTENSION));
        // Best effort: an old artifact that cannot be removed still names its
        // own run in its header.
        let _ = std::fs::remove_file(&stale);
        let dump = m.and_then(|m| m.failure.as_ref())?;
        if status != Status::Falsified {
            return None;
        }
        let mut metadata = vec![
            ("contract".to_string(), trial.contract.metadata.id.clone()),
            ("test_id".to_string(), trial.test_id()),
            ("seed".to_string(), seed.to_string()),
            ("run_id".to_string(), self.meta.run_id.clone()),
            ("git_sha".to_string(), self.meta.git_sha.clone()),
        ];
        metadata.extend(dump.metadata.iter().cloned());
        Some(
            match ArtifactWriter::write(&dir, &stem, &dump.tensors, &metadata) {
                Ok(path) => format!("artifact: {}", path.display()),
                Err(e) => format!("artifact not written: {e}"),
            },
        )
    }

    fn device_name(&self, backend: Backend) -> String {
        match backend {
            Backend::Cpu => self.meta.cpu.clone(),
            Backend::Cuda => match &*lock(&self.gpu) {
                GpuSlot::Ready(device) => S::device_facts(device).name,
                _ => "none".into(),
            },
        }
    }

    fn row(
        &self,
        trial: &TrialSpec<S>,
        status: Status,
        m: Option<&Measurement>,
        duration_ms: f64,
        setup_ms: Option<f64>,
        detail: String,
    ) -> FalsificationRow {
        let (device, cc, driver) = match trial.backend {
            Backend::Cpu => (self.meta.cpu.clone(), String::new(), String::new()),
            Backend::Cuda => match &*lock(&self.gpu) {
                GpuSlot::Ready(device) => {
                    let f = S::device_facts(device);
                    (
                        f.name.clone(),
                        format!("{}.{}", f.compute_capability.0, f.compute_capability.1),
                        f.driver_version.clone(),
                    )
                }
                _ => ("none".into(), String::new(), String::new()),
            },
        };
        let test = trial.test();
        // The headline is the bound that decided the trial: when the metric
        // held and a violation did not, the violation leads the row and the
        // metric that held moves to the detail.
        let headline = m.map(headline).unwrap_or_default();
        let detail = match &headline.held {
            Some(held) => format!("{detail}; headline metric: {held}"),
            None => detail,
        };
        FalsificationRow {
            run_id: self.meta.run_id.clone(),
            timestamp: RunMeta::now_rfc3339(),
            git_sha: self.meta.git_sha.clone(),
            contract: trial.contract.metadata.id.clone(),
            contract_version: trial.contract.metadata.version.clone(),
            contract_hash: trial.contract_hash.clone(),
            test_id: trial.test_id(),
            check_kind: test.check.kind_name().to_string(),
            backend: trial.backend.to_string(),
            device,
            compute_capability: cc,
            driver_version: driver,
            status,
            metric: headline.metric,
            observed: headline.observed,
            comparator: headline.comparator,
            threshold: headline.threshold,
            unit: headline.unit,
            duration_ms,
            setup_ms,
            detail,
            // The test's own trial only: a self-test judges the mutant.
            known_violation: match &test.known_violation {
                Some(known) if !trial.selftest => known.reason.clone(),
                _ => String::new(),
            },
        }
    }

    /// Rows recorded so far.
    pub fn rows(&self) -> Vec<FalsificationRow> {
        lock(&self.rows).clone()
    }

    /// Writes this run's rows and its record into the report directory,
    /// merged with the rows already there (see [`ReportDir::record_run`];
    /// `all_trials` is every trial the contracts define). Should that fail,
    /// the rows are written to a fallback folder in the system's temp
    /// directory instead, and the error names it: the results of a run are
    /// never lost to a folder that could not be written.
    pub fn write_reports(&self, all_trials: &[TrialSpec<S>]) -> Result<Written> {
        let known = known_trials(all_trials);
        let (rows, speedups, record) = (self.rows(), self.speedup_rows(), self.run_record());
        let forecasts = lock(&self.forecasts).clone();
        let out = ReportDir::new(&self.options.out_dir);
        out.record_run(
            (rows.clone(), &forecasts),
            speedups.clone(),
            &known,
            &record,
        )
        .map_err(|failed| {
            let fallback = ReportDir::new(std::env::temp_dir().join(format!(
                "falsify-unwritten-{}",
                file_safe(&self.meta.run_id)
            )));
            let (message, kept) =
                match fallback.record_run((rows, &forecasts), speedups, &known, &record) {
                    Ok(w) => (
                        format!(
                            "{failed}; this run's rows were written to {} instead",
                            w.path.display()
                        ),
                        Some(w.path),
                    ),
                    Err(e) => (
                        format!(
                            "{failed}; nor could they be written to {}: {e}",
                            fallback.dir.display()
                        ),
                        None,
                    ),
                };
            Error::NotWritten {
                out: self.options.out_dir.clone(),
                message,
                fallback: kept,
            }
        })
    }

    /// Writes an `error` row for `trial` into the reports now, without
    /// recording it here, and this process's selection into run.json: what
    /// the reports say if this process dies before the trial finishes (under
    /// cargo-nextest, whose process per test is the trial's own). The
    /// trial's real row replaces it.
    pub fn write_provisional(
        &self,
        trial: &TrialSpec<S>,
        reason: &str,
        all_trials: &[TrialSpec<S>],
    ) -> Result<Written> {
        let row = self.row(trial, Status::Error, None, 0.0, None, reason.to_string());
        ReportDir::new(&self.options.out_dir).record_run(
            (vec![row], &HashSet::new()),
            Vec::new(),
            &known_trials(all_trials),
            &self.run_record(),
        )
    }

    /// The run record as of now: the device facts and clock state when this
    /// run opened a GPU.
    pub fn run_record(&self) -> RunMeta {
        let mut meta = self.meta.clone();
        meta.finished = RunMeta::now_rfc3339();
        let facts = match &*lock(&self.gpu) {
            GpuSlot::Ready(device) => Some(S::device_facts(device)),
            // With child processes: the probed GPU, when a cuda trial ran on it.
            _ if self.ran_cuda() => self
                .gpu_probe
                .get()
                .and_then(|p| p.as_ref().ok().map(|(facts, _)| facts.clone())),
            _ => None,
        };
        if let Some(facts) = facts {
            meta.gpu = Some(GpuMeta::from_facts(&facts, device_count()));
            meta.clocks = read_clocks();
        } else {
            meta.clocks = "not read (no GPU was used)".into();
        }
        meta.selected = lock(&self.selected).iter().cloned().collect();
        if self.was_interrupted() {
            meta.incomplete = Some(
                "interrupted: the CSVs hold the trials that finished before the run was stopped"
                    .into(),
            );
        }
        meta
    }
}

/// Every trial's report key, `{contract}::{test_id}`.
fn known_trials<S: Subject>(all_trials: &[TrialSpec<S>]) -> HashSet<String> {
    all_trials
        .iter()
        .map(|t| trial_key(&t.contract.metadata.id, &t.test_id()))
        .collect()
}

/// `text` with every character but ASCII letters, digits, `-`, `_` and `.`
/// replaced by `_`: a run id as part of a file name.
fn file_safe(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// A trial's timeout as a `Duration`; a limit too large for one (a contract
/// may write `timeout_s: 1e300`) means no limit rather than a panic.
fn timeout_of(seconds: f64) -> Duration {
    Duration::try_from_secs_f64(seconds).unwrap_or(Duration::MAX)
}

/// [`Engine::unjudged`] on the machine `planned` describes.
fn unjudged_on<S: Subject>(trial: &TrialSpec<S>, planned: &Planned) -> Option<String> {
    if trial.backend == Backend::Cuda {
        if let Err(why) = &planned.gpu {
            return Some(why.clone());
        }
    }
    trial.test().check.unjudged_on(trial.backend, &planned.here)
}

/// The host's available memory in bytes (`MemAvailable` of /proc/meminfo),
/// or `u64::MAX` where it cannot be read (budgets are then not enforced).
fn host_memory_bytes() -> u64 {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(u64::MAX, |kb| kb.saturating_mul(1024))
}

/// The facts of an open device, with its free memory now.
fn gpu_here<S: Subject>(device: &S::Device) -> (DeviceFacts, GpuHere) {
    let facts = S::device_facts(device);
    let (free, total) = S::free_memory(device).unwrap_or((0, facts.total_memory_bytes as u64));
    let here = GpuHere {
        name: facts.name.clone(),
        total_memory_bytes: total,
        free_memory_bytes: free,
        device_count: device_count(),
    };
    (facts, here)
}

/// CUDA devices the driver reports; 1 (the open one) if it cannot say or
/// there is no driver to ask.
pub(crate) fn device_count() -> usize {
    if !driver_present() {
        return 1;
    }
    cudarc::driver::CudaContext::device_count()
        .ok()
        .and_then(|n| usize::try_from(n).ok())
        .unwrap_or(1)
}

/// Opens the device just long enough to read its facts and free memory.
fn probe_gpu<S: Subject>(
    options: &S::Options,
) -> std::result::Result<(DeviceFacts, GpuHere), String> {
    if !driver_present() {
        return Err("no CUDA driver".into());
    }
    S::open_device(options)
        .map(|device| gpu_here::<S>(&device))
        .map_err(|e| format!("no usable CUDA device: {e}"))
}

/// Why a check gave no measurement.
enum Failure<E> {
    /// The subject's error, as the check returned it.
    Subject(E),
    /// A core kind's error.
    Core(crate::Error),
    /// The check panicked, with this message.
    Panicked(String),
}

impl<E: std::fmt::Display> std::fmt::Display for Failure<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Subject(e) => e.fmt(f),
            Failure::Core(e) => e.fmt(f),
            Failure::Panicked(message) => write!(f, "check: panicked: {message}"),
        }
    }
}

/// Turns a check's result into a status and the detail column.
fn judge<S: Subject>(
    trial: &TrialSpec<S>,
    seed: u64,
    result: std::result::Result<Measurement, Failure<S::Error>>,
) -> (Status, Option<Measurement>, String) {
    let test = trial.test();
    match result {
        // A configuration that does not fit is reported before allocating:
        // not run, and said so, rather than a crash or an error of the code.
        Err(Failure::Subject(e)) if S::does_not_fit(&e) => (Status::Skipped, None, e.to_string()),
        Err(e) => (Status::Error, None, format!("seed {seed}: {e}")),
        Ok(m) => {
            if let Some(why) = m.clocks.as_ref().and_then(ClockWindow::throttled) {
                // A throttled GPU times the cooling, not the code: unjudged,
                // whatever the ratio says (the kind has already retried once).
                let detail = format!("seed {seed}; {why} (measured twice); {}", m.detail);
                return (Status::Skipped, Some(m), detail);
            }
            let mut detail = format!("seed {seed}");
            if !m.detail.is_empty() {
                detail.push_str("; ");
                detail.push_str(&m.detail);
            }
            if !m.violations.is_empty() {
                detail.push_str("; violations: ");
                detail.push_str(&m.violations.join("; "));
            }
            let held = m.passed();
            let status = if trial.selftest {
                // The self-test passes when the injected fault is caught.
                if held {
                    detail = format!(
                        "mutant `{}` survived: the check did not falsify it ({detail})",
                        test.mutant
                    );
                    Status::Falsified
                } else {
                    detail = format!("mutant `{}` caught ({detail})", test.mutant);
                    Status::Passed
                }
            } else if held {
                Status::Passed
            } else {
                detail = format!("{detail}; if it fails: {}", test.if_fails);
                Status::Falsified
            };
            (status, Some(m), detail)
        }
    }
}

/// The message a panic carried.
fn panic_message(panic: Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

/// Deterministic per-test seed: FNV-1a of the trial's identity, mixed with the
/// run's seed option. The self-test uses the same inputs as its test.
fn trial_seed(run_seed: u64, contract: &str, test: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in contract.bytes().chain([0u8]).chain(test.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h ^ run_seed.wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::Comparator;
    use crate::report::artifacts::{ArtifactTensor, FailureDump};
    use crate::testing::{contract, test, Toy};

    /// Whether a trial can be judged is decided from the planning machine's
    /// facts, before it runs: a target for other GPU kinds makes the trial
    /// (and its self-test) ignored with the reason; no GPU, the probe's.
    #[test]
    fn a_trial_with_no_target_for_this_gpu_is_not_run() {
        let targets = ["NVIDIA H200", "NVIDIA H100 80GB HBM3"];
        let trials = plan::<Toy>(vec![contract(
            "targets-v1",
            true,
            &test("T-1", 1.0, 2.0, &targets),
        )]);
        assert_eq!(trials.len(), 2, "the test and its mutant self-test");
        let on = |name: &str| Planned {
            here: Here {
                host_memory_bytes: 24 << 30,
                gpu: Some(GpuHere {
                    name: name.into(),
                    total_memory_bytes: 80 << 30,
                    free_memory_bytes: 79 << 30,
                    device_count: 1,
                }),
            },
            gpu: Ok(DeviceFacts {
                name: name.into(),
                compute_capability: (9, 0),
                sm_count: 132,
                total_memory_bytes: 80 << 30,
                driver_version: "13.0".into(),
            }),
        };
        for trial in &trials {
            let why = unjudged_on(trial, &on("NVIDIA A100-SXM4-80GB")).unwrap();
            assert!(why.starts_with("no target for NVIDIA A100"), "{why}");
            assert_eq!(unjudged_on(trial, &on("NVIDIA H200")), None);
            assert_eq!(unjudged_on(trial, &on("NVIDIA H100 80GB HBM3")), None);
        }
        let no_gpu = Planned {
            here: Here::default(),
            gpu: Err("no CUDA driver".into()),
        };
        assert_eq!(
            unjudged_on(&trials[0], &no_gpu).as_deref(),
            Some("no CUDA driver")
        );
    }

    /// A trial of a subject without a device runs in-process: the test
    /// holds, its mutant is caught, and the rows say so under the
    /// subject's name.
    #[test]
    fn a_subject_without_a_device_runs_its_cpu_trials() {
        let dir = tempfile::tempdir().unwrap();
        let tests = test("T-1", 1.0, 2.0, &[]) + &test("T-2", 3.0, 2.0, &[]);
        let trials = plan::<Toy>(vec![contract("toy-v1", false, &tests)]);
        let engine = Engine::<Toy>::new(RunOptions {
            out_dir: dir.path().to_path_buf(),
            ..RunOptions::default()
        });
        let statuses: Vec<Status> = trials.iter().map(|t| engine.run(t).status).collect();
        use Status::{Falsified, Passed};
        assert_eq!(statuses, [Passed, Passed, Falsified, Passed]);
        assert_eq!(engine.run_record().subject, "toy");
        let rows = engine.rows();
        assert_eq!(rows[2].detail.split("; if it fails: ").nth(1), Some("f"));
        assert!(
            rows[3].detail.starts_with("mutant `inflated` caught"),
            "{}",
            rows[3].detail
        );
    }

    /// A test known to be falsified says so in its own row (which still
    /// records `falsified`), never in its self-test's.
    #[test]
    fn a_known_violation_is_recorded_on_the_tests_own_row() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = contract("toy-v1", false, &test("T-1", 3.0, 2.0, &[]));
        // Set after loading: the toy, like qlora, refuses the key itself.
        c.falsification_tests[0].known_violation = Some(crate::contract::KnownViolation {
            subject: "toy".into(),
            reason: "r".into(),
            evidence: "e".into(),
            source: "s.rs:1".into(),
        });
        let trials = plan::<Toy>(vec![c]);
        let engine = Engine::<Toy>::new(RunOptions {
            out_dir: dir.path().to_path_buf(),
            ..RunOptions::default()
        });
        let statuses: Vec<Status> = trials.iter().map(|t| engine.run(t).status).collect();
        assert_eq!(statuses, [Status::Falsified, Status::Passed]);
        let rows: Vec<(Status, String)> = engine
            .rows()
            .into_iter()
            .map(|r| (r.status, r.known_violation))
            .collect();
        assert_eq!(
            rows,
            [
                (Status::Falsified, "r".into()),
                (Status::Passed, String::new())
            ]
        );
    }

    #[test]
    fn any_positive_timeout_becomes_a_duration() {
        assert_eq!(timeout_of(2.5), Duration::from_millis(2500));
        assert_eq!(timeout_of(1e300), Duration::MAX);
        assert_eq!(timeout_of(f64::INFINITY), Duration::MAX);
    }

    #[test]
    fn a_falsified_trial_with_tensors_leaves_an_artifact_and_a_pass_removes_it() {
        let dir = tempfile::tempdir().unwrap();
        let trials = plan::<Toy>(vec![contract("toy-v1", false, &test("T-1", 1.0, 2.0, &[]))]);
        let trial = &trials[0];
        let engine = Engine::<Toy>::new(RunOptions {
            out_dir: dir.path().to_path_buf(),
            ..RunOptions::default()
        });
        let m = Measurement::new("e", 2.0, Comparator::Le, 1.0, "").with_failure(FailureDump {
            tensors: vec![ArtifactTensor::f32("output", vec![1.0, 2.0], vec![2])],
            metadata: vec![("shape".into(), "{n=2}".into())],
        });
        let note = engine
            .write_artifact(trial, Status::Falsified, Some(&m), 7)
            .unwrap();
        let file = dir
            .path()
            .join(ARTIFACTS_DIR)
            .join(format!("toy-v1__{}.safetensors", trial.test_id()));
        assert_eq!(note, format!("artifact: {}", file.display()));
        let (tensors, meta) = ArtifactWriter::read(&file).unwrap();
        assert_eq!(tensors.len(), 1);
        assert_eq!(meta.get("seed").map(String::as_str), Some("7"));
        assert_eq!(meta.get("shape").map(String::as_str), Some("{n=2}"));
        // The same trial passing later removes the stale artifact.
        assert_eq!(
            engine.write_artifact(trial, Status::Passed, Some(&m), 7),
            None
        );
        assert!(!file.exists());
    }

    /// A measurement whose GPU throttled is recorded `skipped` with the
    /// reason, its speedup rows too, whatever its ratio; calm or unknown
    /// clocks are recorded in the row and judged.
    #[test]
    fn a_throttled_measurement_is_skipped_and_its_clocks_recorded() {
        use crate::check::clocks::{ClockReading, ClockWindow, HW_THERMAL, SW_POWER_CAP};
        use crate::check::Speedup;
        let dir = tempfile::tempdir().unwrap();
        let trials = plan::<Toy>(vec![contract("toy-v1", false, &test("T-1", 1.0, 2.0, &[]))]);
        let engine = Engine::<Toy>::new(RunOptions {
            out_dir: dir.path().to_path_buf(),
            ..RunOptions::default()
        });
        let at = |reasons| {
            Ok(ClockReading {
                sm_mhz: 1755,
                mem_mhz: 2619,
                reasons,
            })
        };
        let timed = |window: ClockWindow| {
            let mut m = Measurement::new("ratio", 2.0, Comparator::Ge, 1.0, "x");
            m.speedups.push(Speedup {
                subject: "s".into(),
                model: "m".into(),
                batch: 1,
                seq_len: 1,
                baseline: "b".into(),
                candidate: "c".into(),
                baseline_median_ms: 2.0,
                candidate_median_ms: 1.0,
                ratio: 2.0,
                ratio_ci_low: 1.9,
                ratio_ci_high: 2.1,
                repeats: 10,
                peak_device_gib: None,
                baseline_peak_device_gib: None,
            });
            m.clocks = Some(window);
            m
        };
        let hot = timed(ClockWindow {
            before: at(0),
            after: at(HW_THERMAL),
        });
        let out = engine.record(&trials[0], 7, false, Ok(hot), (1.0, 0.0));
        assert_eq!(out.status, Status::Skipped);
        assert!(
            out.detail.contains("GPU throttled: HW thermal slowdown"),
            "{}",
            out.detail
        );
        let capped = timed(ClockWindow {
            before: at(SW_POWER_CAP),
            after: at(SW_POWER_CAP),
        });
        assert_eq!(
            engine
                .record(&trials[0], 7, false, Ok(capped), (1.0, 0.0))
                .status,
            Status::Passed
        );
        let unknown = timed(ClockWindow {
            before: Err("no nvidia-smi".into()),
            after: at(0),
        });
        assert_eq!(
            engine
                .record(&trials[0], 7, false, Ok(unknown), (1.0, 0.0))
                .status,
            Status::Passed
        );
        let rows = engine.speedup_rows();
        let got: Vec<(Option<Status>, &str)> =
            rows.iter().map(|r| (r.status, r.clocks.as_str())).collect();
        assert_eq!(
            got,
            [
                (
                    Some(Status::Skipped),
                    "sm 1755->1755 MHz, mem 2619->2619 MHz, reasons none -> HW thermal slowdown"
                ),
                (
                    Some(Status::Passed),
                    "sm 1755->1755 MHz, mem 2619->2619 MHz, reasons SW power cap -> SW power cap"
                ),
                (Some(Status::Passed), "unknown (no nvidia-smi)"),
            ]
        );
    }

    #[test]
    fn seeds_differ_per_test_and_follow_the_run_seed() {
        assert_ne!(trial_seed(0, "c", "A"), trial_seed(0, "c", "B"));
        assert_ne!(trial_seed(0, "c", "A"), trial_seed(1, "c", "A"));
        assert_eq!(trial_seed(7, "c", "A"), trial_seed(7, "c", "A"));
    }
}
