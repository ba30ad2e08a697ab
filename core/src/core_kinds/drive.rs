//! Drives a subject's workload under the driver observer: the region every
//! driver-observed kind judges.
//!
//! Per trial: [`Workload::upload_bytes`](crate::subject::Workload::upload_bytes),
//! then, inside one observed region with the core mutant's injection armed,
//! `prepare` (a marker `prepared` after it) and `steps` steps (a marker
//! `step i` before each); the region always ends, whatever failed.

use crate::check::Measurement;
use falsify_observer::{DriverObserver, Injection, Recording, Sm};

use super::train::Training;
use super::{CoreMutant, CoreTrial};
use crate::subject::{OwnCounts, Subject, TrainSetup};
use crate::{Error, Result};

/// What an observed run of the workload left to judge.
#[derive(Debug, Clone)]
pub struct Observed {
    pub recording: Recording,
    /// Why the workload stopped before its last step, if it did: what the
    /// driver saw until then is still judged (an injected sync inside a
    /// capture makes the capture, and so the step, fail).
    pub failure: Option<String>,
    /// The subject's own counters after the last step, where it keeps them.
    pub own: Option<OwnCounts>,
    /// The workload's upload byte count for this setup.
    pub upload_bytes: u64,
    /// The device's architecture.
    pub device: Sm,
    /// The loss of each step.
    pub losses: Vec<f32>,
}

/// The injection that makes `mutant` happen, on a `device` whose workload
/// uploads `upload_bytes`, in a check whose kernel span starts at
/// `span_from` (a kernel name prefix, for the span mutant); `None` for a
/// mutant the observer does not inject (the two-arm kinds apply theirs to
/// an arm) or a span mutant without a span to start.
pub fn injection(
    mutant: CoreMutant,
    upload_bytes: u64,
    device: Sm,
    span_from: Option<&str>,
) -> Option<Injection> {
    match mutant {
        CoreMutant::DriverOlderTargetModule => Some(Injection::older_target(device)),
        CoreMutant::DriverModuleAfterUpload => {
            Some(Injection::module_after_upload(upload_bytes, device))
        }
        CoreMutant::DriverSyncInsideCapture => Some(Injection::sync_inside_capture()),
        CoreMutant::DriverCopyToHostInSpan => span_from.map(Injection::copy_to_host_after_kernel),
        CoreMutant::WorkloadGraphArmLearningRateDoubled | CoreMutant::WorkloadGraphArmSlowed => {
            None
        }
    }
}

/// The setup, trained under the observer (`span_from`: see [`injection`]);
/// a workload's error is the subject's, an observer's is
/// [`Error::Observer`]. A core mutant this check cannot inject is an error,
/// never an un-mutated run.
pub fn observe<S: Subject>(
    trial: CoreTrial<'_, '_, S>,
    training: &Training<'_>,
    span_from: Option<&str>,
) -> Result<Observed> {
    let workload = S::workload().ok_or_else(|| {
        Error::Unjudgeable(format!("subject `{}` has no training workload", S::NAME))
    })?;
    let observer = trial.observer.ok_or_else(|| {
        Error::Unjudgeable("no driver observer is attached in this trial's process".into())
    })?;
    let cx = trial.cx;
    let setup = training.setup(cx.seed);
    let upload_bytes = workload.upload_bytes(&setup).map_err(Error::Subject)?;
    let device = cx
        .device
        .as_deref_mut()
        .ok_or_else(|| Error::CudaUnavailable("a driver-observed trial needs the device".into()))?;
    let (major, minor) = S::device_facts(device).compute_capability;
    let sm = Sm::new(major, minor);
    let injections: Vec<Injection> = match trial.mutant {
        Some(m) => {
            let injected = injection(m, upload_bytes, sm, span_from);
            vec![injected.ok_or_else(|| {
                Error::Unjudgeable(format!(
                    "mutant `{m}` is not one the driver observer injects here"
                ))
            })?]
        }
        None => Vec::new(),
    };
    let subject_mutant = cx.mutant.as_ref();
    let (trained, recording) = observer.record(injections, |observer| {
        train::<S>(observer, workload, device, &setup, subject_mutant)
    })?;
    let (losses, own, failure) = match trained {
        Ok((losses, own)) => (losses, own, None),
        Err(e @ Error::Observer(_)) => return Err(e),
        Err(e) => (Vec::new(), None, Some(e.to_string())),
    };
    Ok(Observed {
        recording,
        failure,
        own,
        upload_bytes,
        device: sm,
        losses,
    })
}

impl Observed {
    /// The trial's result from `judged`, the judgement of the recording: a
    /// workload that failed part way falsifies only where what the driver
    /// saw until then already does (the failure is then one more
    /// violation); otherwise the evidence is incomplete and the trial is an
    /// error, never a pass.
    pub fn conclude(&self, mut judged: Measurement) -> Result<Measurement> {
        match &self.failure {
            None => Ok(judged),
            Some(failure) if !judged.passed() => {
                judged.violate(format!("the workload stopped: {failure}"));
                Ok(judged)
            }
            Some(failure) => Err(Error::Unjudgeable(format!(
                "the workload stopped before its last step, with nothing falsified until then: {failure}"
            ))),
        }
    }
}

/// The observed region: prepare, then the steps, each behind its marker.
fn train<S: Subject>(
    observer: &DriverObserver,
    workload: &dyn crate::subject::Workload<S>,
    device: &mut S::Device,
    setup: &TrainSetup,
    mutant: Option<&S::Mutant>,
) -> Result<(Vec<f32>, Option<OwnCounts>)> {
    let mut session = workload
        .prepare(device, setup, mutant)
        .map_err(Error::Subject)?;
    observer.mark("prepared")?;
    let mut losses = Vec::with_capacity(setup.steps);
    for step in 1..=setup.steps {
        observer.mark(format!("step {step}"))?;
        losses.push(session.step().map_err(Error::Subject)?);
    }
    Ok((losses, session.own_counts()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stopped(failure: Option<&str>) -> Observed {
        Observed {
            recording: falsify_observer::RecordingBuilder::new().build(),
            failure: failure.map(str::to_string),
            own: None,
            upload_bytes: 0,
            device: Sm::new(9, 0),
            losses: Vec::new(),
        }
    }

    fn syncs_inside(n: f64) -> Measurement {
        use crate::check::Comparator;
        Measurement::new("syncs_inside_capture", n, Comparator::Le, 0.0, "")
    }

    #[test]
    fn a_workload_that_stops_falsifies_only_on_what_the_driver_saw() {
        // The injected sync invalidates the capture, so the step fails: the
        // sync the recording holds still falsifies, the failure beside it.
        let caught = stopped(Some("capture invalidated"))
            .conclude(syncs_inside(1.0))
            .unwrap();
        assert!(!caught.passed());
        assert!(caught
            .violations
            .iter()
            .any(|v| v.contains("capture invalidated")));
        // Nothing falsified before it stopped: incomplete evidence, an error.
        let stopped_clean = stopped(Some("out of memory")).conclude(syncs_inside(0.0));
        assert!(matches!(stopped_clean, Err(Error::Unjudgeable(_))));
        assert!(stopped(None).conclude(syncs_inside(0.0)).unwrap().passed());
    }

    #[test]
    fn the_span_mutant_copies_after_the_span_start_it_is_given() {
        let device = Sm::new(9, 0);
        let span = CoreMutant::DriverCopyToHostInSpan;
        assert_eq!(
            injection(span, 0, device, Some("squared_sum")),
            Some(Injection::copy_to_host_after_kernel("squared_sum"))
        );
        assert_eq!(injection(span, 0, device, None), None);
        assert_eq!(
            injection(CoreMutant::DriverSyncInsideCapture, 0, device, Some("x")),
            Some(Injection::sync_inside_capture())
        );
    }
}
