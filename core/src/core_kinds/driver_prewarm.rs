//! `driver_prewarm`: no module is loaded and nothing is JIT-compiled after
//! the subject's weights are uploaded, as the driver observer saw it. The
//! upload point is where the host-to-device bytes first reach the
//! workload's `upload_bytes`; where the subject counts its own compilations
//! after pre-warm, that count must agree with the driver's.

use falsify_observer::{Event, Recording, Sm};
use serde::Deserialize;

use super::drive::observe;
use super::evidence::{listed, marker_before};
use super::train::{self, Training, TrainingParams};
use super::{CoreCheck, CoreTrial};
use crate::check::{Backend, Comparator, Measurement, ParamDoc, Validate};
use crate::subject::{OwnCounts, Subject};
use crate::{Error, Result};

/// `driver_prewarm`'s parameters: the training it drives, nothing more.
#[derive(Debug, Clone, Deserialize)]
#[serde(transparent)]
pub struct Params(pub TrainingParams);

/// The parameters of `driver_prewarm`, for the generated reference.
pub const PARAMS: &[ParamDoc] = train::TRAINING_PARAMS;

/// A minimal `driver_prewarm` check.
pub const EXAMPLE: &[(&str, &str)] = &[("model", "tiny"), ("steps", "3")];

impl Validate for Params {
    fn validate(&self) -> std::result::Result<(), String> {
        self.0.training().validate()
    }
}

impl CoreCheck for Params {
    fn execute<S: Subject>(
        &self,
        _backend: Backend,
        trial: CoreTrial<'_, '_, S>,
    ) -> Result<Measurement> {
        let o = observe(trial, &self.0.training(), None)?;
        o.conclude(judge(
            &o.recording,
            o.own.as_ref(),
            o.upload_bytes,
            o.device,
        )?)
    }

    fn driven_training(&self) -> Option<Training<'_>> {
        Some(self.0.training())
    }
}

/// `modules_loaded_after_upload` = the module loads (calls the driver did
/// not refuse, JIT-linker inputs, and CUPTI's module-loaded notifications)
/// after the upload point; must be 0. Where the subject counts its own
/// compilations after pre-warm, a count other than the driver's JIT loads
/// after the upload is a violation. An upload point never reached is an
/// error: the workload's byte count is wrong, and nothing can be judged.
pub fn judge(
    recording: &Recording,
    own: Option<&OwnCounts>,
    upload_bytes: u64,
    device: Sm,
) -> Result<Measurement> {
    let Some(upload) = recording.upload_point(upload_bytes) else {
        return Err(Error::Unjudgeable(format!(
            "the upload point was never reached: the driver saw {} bytes copied host to device, \
             the workload says its weights are {upload_bytes} bytes",
            recording.bytes_copied(falsify_observer::Direction::HostToDevice)
        )));
    };
    let after = recording.loads_after(upload.seq);
    let jit_after = recording
        .jit_loads(device)
        .into_iter()
        .filter(|e| e.seq > upload.seq)
        .count() as u64;
    let mut m = Measurement::new(
        "modules_loaded_after_upload",
        after.len() as f64,
        Comparator::Le,
        0.0,
        "modules",
    );
    let loads = listed(after.iter().map(|e| describe(recording.events(), e)));
    m.detail = format!(
        "upload point: event {} ({} bytes); {} loads after it{}",
        upload.seq,
        upload_bytes,
        after.len(),
        if loads.is_empty() {
            String::new()
        } else {
            format!(": {loads}")
        }
    );
    if let Some(said) = own.and_then(|o| o.compilations_after_prewarm) {
        if said != jit_after {
            m.violate(format!(
                "witnesses disagree: subject says {said} compilations after pre-warm, driver saw \
                 {jit_after} JIT loads after the upload"
            ));
        }
    }
    Ok(m)
}

/// One load after the upload, as the detail lists it.
fn describe(events: &[Event], e: &Event) -> String {
    let what = match &e.kind {
        falsify_observer::EventKind::ModuleLoad { image, .. }
        | falsify_observer::EventKind::LinkInput { image, .. } => image.describe(),
        falsify_observer::EventKind::ModuleLoaded { cubin, .. } => {
            format!(
                "module loaded ({})",
                cubin.map_or("?".into(), |c| c.to_string())
            )
        }
        _ => String::new(),
    };
    let injected = if e.is_injected() { ", injected" } else { "" };
    format!(
        "event {} {} {what} in `{}`{injected}",
        e.seq,
        e.api,
        marker_before(events, e.seq)
    )
}

#[cfg(test)]
mod tests {
    use falsify_observer::image::parse_image;
    use falsify_observer::{Direction, EventKind, RecordingBuilder};

    use super::*;

    const H100: Sm = Sm::new(9, 0);

    fn ptx(target: &str) -> EventKind {
        let text = format!(".version 8.0\n.target {target}\n");
        EventKind::ModuleLoad {
            image: parse_image(text.as_bytes()),
            file: None,
            handle: Some(1),
        }
    }

    fn upload(bytes: u64) -> EventKind {
        EventKind::Copy {
            direction: Direction::HostToDevice,
            bytes,
            asynchronous: false,
            stream: None,
        }
    }

    /// Pre-warm, upload 300 bytes in two copies, then `late` loads in step 1.
    fn recording(late: usize) -> Recording {
        let mut b = RecordingBuilder::new();
        b.call("cuModuleLoadData", ptx("sm_90"));
        b.call("cuMemcpyHtoD_v2", upload(100));
        b.call("cuMemcpyHtoD_v2", upload(200));
        b.mark("prepared");
        b.mark("step 1");
        for _ in 0..late {
            b.call("cuModuleLoadData", ptx("sm_90"));
        }
        b.build()
    }

    fn own(compilations: u64) -> OwnCounts {
        OwnCounts {
            compilations_after_prewarm: Some(compilations),
            ..OwnCounts::default()
        }
    }

    #[test]
    fn loads_before_the_upload_pass_and_one_after_it_falsifies() {
        let m = judge(&recording(0), Some(&own(0)), 300, H100).unwrap();
        assert!(m.passed(), "{m:?}");
        assert!(m.detail.contains("upload point: event 2"), "{}", m.detail);
        let m = judge(&recording(1), Some(&own(1)), 300, H100).unwrap();
        assert!(!m.passed());
        assert_eq!(m.observed, 1.0);
        assert!(m.detail.contains("in `step 1`"), "{}", m.detail);
        // The upload ends with the copy that reaches the bytes, not before.
        let m = judge(&recording(0), None, 301, H100);
        assert!(m.is_err());
    }

    #[test]
    fn witnesses_that_disagree_falsify() {
        let m = judge(&recording(0), Some(&own(2)), 300, H100).unwrap();
        assert!(!m.passed());
        assert!(
            m.violations[0].contains("subject says 2 compilations after pre-warm, driver saw 0"),
            "{:?}",
            m.violations
        );
        // A JIT the subject did not count: the metric and the witness say so.
        let m = judge(&recording(1), Some(&own(0)), 300, H100).unwrap();
        assert_eq!(m.violations.len(), 1, "{:?}", m.violations);
    }

    #[test]
    fn an_upload_point_never_reached_is_an_error_not_a_pass() {
        let e = judge(&recording(1), None, 1 << 30, H100).unwrap_err();
        assert!(
            e.to_string()
                .contains("the upload point was never reached: the driver saw 300 bytes"),
            "{e}"
        );
    }
}
