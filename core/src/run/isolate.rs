//! One trial, one process: a trial that aborts, segfaults, hangs past its
//! timeout or poisons its CUDA context costs that trial one `error` row, and
//! every other trial still runs.
//!
//! The parent (the CLI or the `cargo test` runner) starts its own executable
//! with [`CHILD_FLAG`] and writes a [`ChildRequest`] as JSON to its stdin: the
//! trial's name and the text of its contract as the run read it when it was
//! planned (the child never reads the contract file, so editing it during a
//! run changes nothing for that run; and a pipe, unlike a command line,
//! bounds neither the text nor an id). The child runs the one trial
//! in-process and answers with a [`ChildReply`] on stdout after
//! [`REPLY_MARKER`]. The parent waits at most the trial's timeout, kills the
//! child past it, and turns a death or a missing reply into an error row
//! naming the cause. Each child opens its own CUDA context and compiles the
//! kernels it needs: a trial's claims about pre-warm are measured inside it.

use std::ffi::OsString;
use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, ExitStatus};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::{plan, Engine, Isolation, RunOptions, TrialOutcome, TrialSpec};
use crate::child::{marked_reply, tail, Piped, POLL};
use crate::contract::parse;
use crate::error::{Error, Result};
use crate::report::meta::RunMeta;
use crate::report::{FalsificationRow, SpeedupRow, Status};
use crate::subject::{helper_by_flag, Subject};
use crate::workload::arms::{arm_reply, ARM_FLAG};

/// The first argument that makes a front end run one trial as a child.
pub const CHILD_FLAG: &str = "__falsify-trial";
/// Starts the line of the child's stdout that holds its reply.
pub const REPLY_MARKER: &str = "FALSIFY-TRIAL-REPLY ";

/// How a front end starts a child: its own executable and the arguments
/// before [`CHILD_FLAG`] (none for the CLI and the test runner).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildCommand {
    pub program: PathBuf,
    pub args: Vec<OsString>,
}

impl ChildCommand {
    /// This process's own executable, as a child command.
    pub fn current_exe() -> Result<Self> {
        let program = std::env::current_exe().map_err(|e| Error::io("current executable", e))?;
        Ok(ChildCommand {
            program,
            args: Vec::new(),
        })
    }
}

/// What a child is asked to run: one trial of the contract
/// `contract_text`, with the parent's options for the subject `S`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(bound = "")]
pub struct ChildRequest<S: Subject> {
    /// Where the contract was read from: its errors name this file, which
    /// the child does not read.
    pub contract_file: PathBuf,
    /// The contract's text as the parent read it when it planned the run.
    pub contract_text: String,
    /// The trial's name, `{contract}::{test_id}` (`::mutant` for a self-test).
    pub trial: String,
    /// The parent's run record: the child's rows carry its run id, commit
    /// and CPU, read once by the parent rather than again per trial.
    pub meta: RunMeta,
    pub seed: u64,
    pub out_dir: PathBuf,
    pub inject: Vec<String>,
    /// The parent's device options (its kernel cache directory, which
    /// every trial process shares, among them).
    pub device: S::Options,
}

/// What a child answers: the rows its trial produced and its outcome.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ChildReply {
    pub row: FalsificationRow,
    pub speedups: Vec<SpeedupRow>,
    pub summary: String,
    pub detail: String,
}

impl<S: Subject> ChildRequest<S> {
    /// The request for `trial`, with the contract text the run planned it from.
    pub fn new(options: &RunOptions<S>, trial: &TrialSpec<S>, meta: &RunMeta) -> Self {
        ChildRequest {
            contract_file: trial.contract.path.clone(),
            contract_text: trial.contract.source.clone(),
            trial: trial.name.clone(),
            meta: meta.clone(),
            seed: options.seed,
            out_dir: options.out_dir.clone(),
            inject: options.inject.clone(),
            device: options.device.clone(),
        }
    }

    /// The run options of the child: the parent's, run in-process, with
    /// setup counted from the child's start.
    fn options(&self, process_start: Instant) -> RunOptions<S> {
        RunOptions {
            out_dir: self.out_dir.clone(),
            seed: self.seed,
            device: self.device.clone(),
            inject: self.inject.clone(),
            isolation: Isolation::InProcess,
            run_id: None,
            process_start: Some(process_start),
        }
    }
}

/// What this process answers when the harness started it as a helper: as a
/// trial process ([`CHILD_FLAG`]) it runs the trial its request on `input`
/// (its stdin) names; as one of the subject's helpers
/// ([`Subject::helpers`], e.g. a data-parallel rank) or as a workload arm
/// ([`ARM_FLAG`], see [`crate::workload::arms`]) whatever its job on
/// `input` describes. `None`, with `input` untouched, for any other command
/// line. The front ends print the reply on stdout, or the error.
pub fn helper_reply<S: Subject>(
    argv: &[String],
    input: &mut dyn Read,
    process_start: Instant,
) -> Option<Result<String>> {
    let flag = argv.get(1).map(String::as_str)?;
    let helper = helper_by_flag(S::helpers(), flag);
    if flag != CHILD_FLAG && flag != ARM_FLAG && helper.is_none() {
        return None;
    }
    let mut payload = String::new();
    if let Err(e) = input.read_to_string(&mut payload) {
        return Some(Err(Error::io("standard input", e)));
    }
    Some(match helper {
        Some(role) => (role.run)(&payload).map_err(Error::Subject),
        None if flag == ARM_FLAG => arm_reply::<S>(&payload),
        None => run_child::<S>(&payload, process_start),
    })
}

/// The child's side: runs the trial `request_json` names and returns the line
/// the front end prints on stdout (`REPLY_MARKER` and the reply as JSON).
/// `process_start` is when the child process started (its trial's setup
/// time counts from there).
pub fn run_child<S: Subject>(request_json: &str, process_start: Instant) -> Result<String> {
    let request: ChildRequest<S> =
        serde_json::from_str(request_json).map_err(|e| bad(e.to_string()))?;
    let trials = plan(vec![parse::<S>(
        &request.contract_file,
        &request.contract_text,
    )?]);
    let trial = trials
        .iter()
        .find(|t| t.name == request.trial)
        .ok_or_else(|| bad(format!("no trial `{}`", request.trial)))?;
    let engine = Engine::with_meta(request.options(process_start), request.meta.clone());
    let outcome = engine.run(trial);
    let row = engine
        .rows()
        .pop()
        .ok_or_else(|| bad("the trial recorded no row".into()))?;
    let reply = ChildReply {
        row,
        speedups: engine.speedup_rows(),
        summary: outcome.summary,
        detail: outcome.detail,
    };
    let json = serde_json::to_string(&reply).map_err(|e| bad(e.to_string()))?;
    // On a line of its own, whatever the trial left unterminated on stdout.
    Ok(format!("\n{REPLY_MARKER}{json}"))
}

fn bad(message: String) -> Error {
    Error::InvalidArgument {
        op: "trial process",
        message,
    }
}

/// How a child ended, seen from the parent.
pub enum ChildEnd {
    /// It answered.
    Replied(Box<ChildReply>),
    /// The run was interrupted while it ran; it was stopped, and its trial
    /// did not finish.
    Interrupted,
    /// It could not answer: the cause, for the trial's error row.
    Failed(String),
}

/// The trial process to start: the command, and the environment it adds
/// (a workload's [`process_env`](crate::subject::Workload::process_env)).
pub struct Child<'a> {
    pub command: &'a ChildCommand,
    pub env: &'a [(String, String)],
}

/// Starts a child for `request`, waits at most `timeout`, and says how it
/// ended. `interrupted` is the run's stop flag: once set, the child is killed.
pub fn run_in_child<S: Subject>(
    Child { command, env }: Child<'_>,
    request: &ChildRequest<S>,
    timeout: Duration,
    interrupted: &AtomicBool,
) -> ChildEnd {
    let json = match serde_json::to_string(request) {
        Ok(j) => j,
        Err(e) => return ChildEnd::Failed(format!("could not encode the trial request: {e}")),
    };
    let mut cmd = Command::new(&command.program);
    cmd.args(&command.args).arg(CHILD_FLAG);
    cmd.envs(env.iter().map(|(k, v)| (k, v)));
    let mut child = match Piped::start(&mut cmd, json.into_bytes()) {
        Ok(c) => c,
        Err(e) => {
            return ChildEnd::Failed(format!(
                "could not start the trial process {}: {e}",
                command.program.display()
            ))
        }
    };
    let waited = wait(&mut child, timeout, interrupted);
    let (out, err) = child.output();
    match waited {
        Waited::Interrupted => ChildEnd::Interrupted,
        Waited::TimedOut => ChildEnd::Failed(format!(
            "timed out: still running after {:.0} s, stopped{}",
            timeout.as_secs_f64(),
            tail(&err)
        )),
        Waited::Exited(status) => ended(status, &out, &err),
        Waited::Lost(e) => ChildEnd::Failed(format!("lost the trial process: {e}")),
    }
}

enum Waited {
    Exited(ExitStatus),
    TimedOut,
    Interrupted,
    Lost(std::io::Error),
}

/// Polls `child` until it exits, the timeout passes or the run is
/// interrupted; stops it in the last two cases.
fn wait(child: &mut Piped, timeout: Duration, interrupted: &AtomicBool) -> Waited {
    let started = Instant::now();
    loop {
        match child.child.try_wait() {
            Ok(Some(status)) => return Waited::Exited(status),
            Ok(None) => {}
            Err(e) => return Waited::Lost(e),
        }
        let stop = if interrupted.load(Ordering::SeqCst) {
            Waited::Interrupted
        } else if started.elapsed() > timeout {
            Waited::TimedOut
        } else {
            std::thread::sleep(POLL);
            continue;
        };
        child.stop();
        return stop;
    }
}

/// The end of a child that exited: its reply, or why there is none.
fn ended(status: ExitStatus, out: &str, err: &str) -> ChildEnd {
    if let Some(signal) = signal_of(status) {
        return ChildEnd::Failed(format!(
            "the trial's process died of signal {signal} ({}){}",
            signal_name(signal),
            tail(err)
        ));
    }
    match marked_reply::<ChildReply>(out, REPLY_MARKER) {
        Some(Ok(r)) => ChildEnd::Replied(Box::new(r)),
        Some(Err(e)) => ChildEnd::Failed(format!("the trial's reply does not parse: {e}")),
        None => ChildEnd::Failed(format!(
            "the trial's process exited with {status} without a result{}",
            tail(err)
        )),
    }
}

#[cfg(unix)]
fn signal_of(status: ExitStatus) -> Option<i32> {
    use std::os::unix::process::ExitStatusExt;
    status.signal()
}

#[cfg(not(unix))]
fn signal_of(_status: ExitStatus) -> Option<i32> {
    None
}

fn signal_name(signal: i32) -> &'static str {
    match signal {
        4 => "SIGILL: illegal instruction",
        6 => "SIGABRT: aborted, e.g. a failed allocation",
        7 => "SIGBUS: bus error",
        8 => "SIGFPE: arithmetic fault",
        9 => "SIGKILL: killed, e.g. by the out-of-memory killer",
        11 => "SIGSEGV: invalid memory access",
        _ => "terminated by a signal",
    }
}

/// The outcome a parent records for a child that could not answer.
pub fn failed_outcome(cause: &str) -> TrialOutcome {
    TrialOutcome {
        status: Status::Error,
        summary: cause.to_string(),
        detail: cause.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{contract, test, Toy};

    #[test]
    fn only_the_trial_flag_reaches_the_trial_side() {
        let argv = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let now = Instant::now();
        let mut untouched: &[u8] = b"left alone";
        assert!(helper_reply::<Toy>(&argv(&["falsify", "run"]), &mut untouched, now).is_none());
        assert!(helper_reply::<Toy>(&argv(&["falsify"]), &mut untouched, now).is_none());
        // The toy has no helpers: another flag is not one.
        assert!(
            helper_reply::<Toy>(&argv(&["x", "__falsify-rank"]), &mut untouched, now).is_none()
        );
        assert_eq!(untouched, b"left alone");
        // An unreadable request on stdin is answered by the trial side.
        match helper_reply::<Toy>(&argv(&["falsify", CHILD_FLAG]), &mut &b"{"[..], now) {
            Some(Err(Error::InvalidArgument { op, .. })) => assert_eq!(op, "trial process"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn requests_round_trip_and_keep_the_options_and_the_text() {
        let mut options = RunOptions::<Toy> {
            seed: 7,
            inject: vec!["F-1".into()],
            ..RunOptions::default()
        };
        options.device.ordinal = 3;
        let contract = contract("toy-v1", false, &test("T-1", 1.0, 2.0, &[]));
        let text = contract.source.clone();
        let trials = plan(vec![contract]);
        let r = ChildRequest::new(&options, &trials[1], &RunMeta::detect());
        assert_eq!(r.contract_text, text);
        assert_eq!(r.trial, "toy-v1::T-1::mutant");
        let json = serde_json::to_string(&r).unwrap();
        let back: ChildRequest<Toy> = serde_json::from_str(&json).unwrap();
        assert_eq!(serde_json::to_string(&back).unwrap(), json);
        let o = back.options(Instant::now());
        assert_eq!((o.seed, o.inject.clone()), (7, vec!["F-1".to_string()]));
        assert_eq!(o.device, options.device);
        assert_eq!(o.isolation, Isolation::InProcess);
    }

    /// A trial process of a subject without a device answers for its trial.
    #[test]
    fn a_child_runs_the_trial_its_request_names() {
        let dir = tempfile::tempdir().unwrap();
        let options = RunOptions::<Toy> {
            out_dir: dir.path().to_path_buf(),
            ..RunOptions::default()
        };
        let trials = plan::<Toy>(vec![contract("toy-v1", false, &test("T-1", 3.0, 2.0, &[]))]);
        let request = ChildRequest::new(&options, &trials[1], &RunMeta::detect());
        let line =
            run_child::<Toy>(&serde_json::to_string(&request).unwrap(), Instant::now()).unwrap();
        let reply: ChildReply = marked_reply(&line, REPLY_MARKER).unwrap().unwrap();
        assert_eq!(reply.row.status, Status::Passed, "{}", reply.detail);
        assert_eq!(reply.row.test_id, "T-1::mutant");
    }
}
