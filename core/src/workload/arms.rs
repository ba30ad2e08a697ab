//! One arm of a two-arm comparison of a subject's training workload, run in
//! a process of its own.
//!
//! A stack may read a switch once per process (aprender-train reads
//! `CUDA_GRAPH` into a `OnceLock`), so a graphed and an un-graphed run
//! cannot share one: the trial process starts its own executable with
//! [`ARM_FLAG`], the job ([`ArmJob`]) on stdin and the workload's
//! [`Workload::process_env`](crate::subject::Workload::process_env) for the arm's setup (with a scratch folder made
//! for that one process), and reads the [`ArmReply`] from the line of its
//! stdout that starts with [`ARM_REPLY_MARKER`]. The arm opens the device,
//! prepares the workload, runs `setup.steps` steps, and reports each step's
//! loss and wall time, or where it failed.

use std::process::Command;
use std::thread::sleep;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::child::{marked_reply, tail, Piped, POLL};
use crate::error::{Error, Result};
use crate::subject::{OwnCounts, Subject, TrainSetup};

/// The first argument that makes a front end run one workload arm.
pub const ARM_FLAG: &str = "__falsify-arm";
/// Starts the line of an arm's stdout that holds its reply.
pub const ARM_REPLY_MARKER: &str = "FALSIFY-ARM-REPLY ";

/// What an arm runs.
#[derive(Debug, Serialize, Deserialize)]
#[serde(bound = "")]
pub struct ArmJob<S: Subject> {
    /// The arm's setup (its `graph` is what differs between two arms).
    pub setup: TrainSetup,
    /// The device options the arm opens its device with.
    pub device: S::Options,
    /// A subject mutant for the workload's `prepare`, by name.
    pub mutant: Option<String>,
    /// A host delay added to steps (a core mutant of the speedup kind).
    pub slowdown: Option<Slowdown>,
}

/// A fixed host delay added to each step from `from_step` (0-based) on,
/// inside the step's measured time.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Slowdown {
    pub from_step: usize,
    pub delay_ms: f64,
}

/// What an arm measured.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ArmReply {
    /// The loss of each step that completed, in order.
    pub losses: Vec<f32>,
    /// The wall time of each completed step, in milliseconds.
    pub step_ms: Vec<f64>,
    /// Where the arm stopped early, if it did.
    pub failure: Option<ArmFailure>,
    /// The subject's own counters after the last step.
    pub own_counts: Option<OwnCounts>,
}

/// An arm that stopped early: in `prepare` (`step: None`) or at a step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArmFailure {
    /// 0-based step; `None`: opening the device or `prepare` failed.
    pub step: Option<usize>,
    pub error: String,
}

impl ArmFailure {
    /// `prepare` or `step N` (1-based), for messages.
    pub fn place(&self) -> String {
        match self.step {
            None => "prepare".into(),
            Some(step) => format!("step {}", step + 1),
        }
    }
}

/// The arm's side: runs the job `job_json` describes and returns the line
/// the front end prints on stdout ([`ARM_REPLY_MARKER`] and the reply).
pub fn arm_reply<S: Subject>(job_json: &str) -> Result<String> {
    let job: ArmJob<S> =
        serde_json::from_str(job_json).map_err(|e| Error::Arm(format!("bad job: {e}")))?;
    let reply = run_job::<S>(&job)?;
    let json = serde_json::to_string(&reply).map_err(|e| Error::Arm(e.to_string()))?;
    Ok(format!("\n{ARM_REPLY_MARKER}{json}"))
}

/// Opens the device, prepares and steps; a failure of the subject is
/// recorded in the reply (evidence for the kind), not returned.
fn run_job<S: Subject>(job: &ArmJob<S>) -> Result<ArmReply> {
    let workload = S::workload()
        .ok_or_else(|| Error::Arm(format!("subject `{}` has no training workload", S::NAME)))?;
    let mutant = job
        .mutant
        .as_ref()
        .map(|name| serde_json::from_value::<S::Mutant>(serde_json::Value::String(name.clone())))
        .transpose()
        .map_err(|e| Error::Arm(format!("mutant: {e}")))?;
    let mut reply = ArmReply::default();
    let failed = |step: Option<usize>, error: String| Some(ArmFailure { step, error });
    let mut device = match S::open_device(&job.device) {
        Ok(device) => device,
        Err(e) => {
            reply.failure = failed(None, format!("opening the device: {e}"));
            return Ok(reply);
        }
    };
    let mut session = match workload.prepare(&mut device, &job.setup, mutant.as_ref()) {
        Ok(session) => session,
        Err(e) => {
            reply.failure = failed(None, e.to_string());
            return Ok(reply);
        }
    };
    for step in 0..job.setup.steps {
        let started = Instant::now();
        let loss = session.step();
        if let Some(slow) = job.slowdown.filter(|s| step >= s.from_step) {
            sleep(Duration::from_secs_f64(slow.delay_ms.max(0.0) / 1e3));
        }
        let elapsed_ms = started.elapsed().as_secs_f64() * 1e3;
        match loss {
            Ok(loss) => {
                reply.losses.push(loss);
                reply.step_ms.push(elapsed_ms);
            }
            Err(e) => {
                reply.failure = failed(Some(step), e.to_string());
                break;
            }
        }
    }
    reply.own_counts = session.own_counts();
    Ok(reply)
}

/// The parent's side: starts this executable as an arm for `job`, with the
/// workload's process environment for its setup and a scratch folder made
/// for it (removed after), waits at most `timeout`, and returns its reply.
pub fn run_arm<S: Subject>(job: &ArmJob<S>, timeout: Duration) -> Result<ArmReply> {
    let workload = S::workload()
        .ok_or_else(|| Error::Arm(format!("subject `{}` has no training workload", S::NAME)))?;
    let scratch = tempfile::Builder::new()
        .prefix("falsify-arm-")
        .tempdir()
        .map_err(|e| Error::io(std::env::temp_dir(), e))?;
    let program = std::env::current_exe().map_err(|e| Error::io("current executable", e))?;
    let mut cmd = Command::new(&program);
    cmd.arg(ARM_FLAG)
        .envs(workload.process_env(&job.setup, scratch.path()));
    let json = serde_json::to_vec(job).map_err(|e| Error::Arm(e.to_string()))?;
    let mut child = Piped::start(&mut cmd, json)
        .map_err(|e| Error::Arm(format!("starting {}: {e}", program.display())))?;
    let started = Instant::now();
    let status = loop {
        match child.child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() < timeout => sleep(POLL),
            Ok(None) => {
                child.stop();
                let (_, err) = child.output();
                return Err(Error::Arm(format!(
                    "timed out after {:.0} s{}",
                    timeout.as_secs_f64(),
                    tail(&err)
                )));
            }
            Err(e) => return Err(Error::Arm(format!("lost the arm process: {e}"))),
        }
    };
    let (out, err) = child.output();
    match marked_reply::<ArmReply>(&out, ARM_REPLY_MARKER) {
        Some(Ok(reply)) => Ok(reply),
        Some(Err(e)) => Err(Error::Arm(format!("the reply does not parse: {e}"))),
        None => Err(Error::Arm(format!(
            "the arm exited with {status} without a reply{}",
            tail(&err)
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::Toy;

    #[test]
    fn a_reply_round_trips_through_its_marked_line() {
        let reply = ArmReply {
            losses: vec![6.9, 6.5],
            step_ms: vec![20.0, 19.5],
            failure: Some(ArmFailure {
                step: Some(2),
                error: "CPU fallback".into(),
            }),
            own_counts: None,
        };
        let line = format!(
            "noise\n{ARM_REPLY_MARKER}{}",
            serde_json::to_string(&reply).unwrap()
        );
        let back = marked_reply::<ArmReply>(&line, ARM_REPLY_MARKER).unwrap();
        assert_eq!(back.unwrap(), reply);
        assert_eq!(reply.failure.unwrap().place(), "step 3");
    }

    /// The toy subject has a workload but no device: the arm answers with
    /// where it stopped, which the kinds judge; a bad job is an error.
    #[test]
    fn an_arm_that_cannot_open_its_device_says_so_in_its_reply() {
        let job = ArmJob::<Toy> {
            setup: TrainSetup {
                model: "toy-model".into(),
                batch: 1,
                seq_len: None,
                graph: true,
                steps: 2,
                seed: 0,
                learning_rate: None,
            },
            device: Default::default(),
            mutant: None,
            slowdown: None,
        };
        let line = arm_reply::<Toy>(&serde_json::to_string(&job).unwrap()).unwrap();
        let reply = marked_reply::<ArmReply>(&line, ARM_REPLY_MARKER)
            .unwrap()
            .unwrap();
        let failure = reply.failure.unwrap();
        assert_eq!(failure.place(), "prepare");
        assert!(failure.error.contains("opening the device"), "{failure:?}");
        assert!(reply.losses.is_empty());
        assert!(matches!(arm_reply::<Toy>("{"), Err(Error::Arm(_))));
    }
}
