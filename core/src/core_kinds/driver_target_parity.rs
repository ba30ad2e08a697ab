//! `driver_target_parity`: every module image the CUDA driver loads while
//! the subject prepares and trains targets the device's `sm_XY` (PTX
//! `.target`, cubin arch, a fat binary holding the device's entry), as the
//! driver observer saw it, not as the subject reports it.

use falsify_observer::{Recording, Sm};
use serde::Deserialize;

use super::drive::observe;
use super::evidence::listed;
use super::train::{self, Training, TrainingParams};
use super::{CoreCheck, CoreTrial};
use crate::check::{Backend, Comparator, Measurement, ParamDoc, Validate};
use crate::subject::Subject;

/// `driver_target_parity`'s parameters: the training it drives, nothing more.
#[derive(Debug, Clone, Deserialize)]
#[serde(transparent)]
pub struct Params(pub TrainingParams);

/// The parameters of `driver_target_parity`, for the generated reference.
pub const PARAMS: &[ParamDoc] = train::TRAINING_PARAMS;

/// A minimal `driver_target_parity` check.
pub const EXAMPLE: &[(&str, &str)] = &[("model", "tiny"), ("steps", "2")];

impl Validate for Params {
    fn validate(&self) -> Result<(), String> {
        self.0.training().validate()
    }
}

impl CoreCheck for Params {
    fn execute<S: Subject>(
        &self,
        _backend: Backend,
        trial: CoreTrial<'_, '_, S>,
    ) -> crate::Result<Measurement> {
        let observed = observe(trial, &self.0.training(), None)?;
        observed.conclude(judge(&observed.recording, observed.device))
    }

    fn driven_training(&self) -> Option<Training<'_>> {
        Some(self.0.training())
    }
}

/// `target_mismatches` = the module loads the driver did not refuse whose
/// image holds no code for `device`; must be 0. The detail lists every
/// image loaded.
pub fn judge(recording: &Recording, device: Sm) -> Measurement {
    let mismatches = recording.target_mismatches(device);
    let loaded = recording.loaded_targets();
    let images = listed(
        loaded
            .iter()
            .map(|l| format!("event {} {}: {}", l.seq, l.api, l.image)),
    );
    let mut m = Measurement::new(
        "target_mismatches",
        mismatches.len() as f64,
        Comparator::Le,
        0.0,
        "modules",
    );
    let wrong = listed(mismatches.iter().map(ToString::to_string));
    m.detail = format!(
        "device {device}; {} module loads: {images}{}",
        loaded.len(),
        if wrong.is_empty() {
            String::new()
        } else {
            format!("; not for the device: {wrong}")
        }
    );
    m
}

#[cfg(test)]
mod tests {
    use falsify_observer::image::parse_image;
    use falsify_observer::{CuResult, EventKind, RecordingBuilder};

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

    #[test]
    fn modules_for_the_device_pass_and_each_other_is_named() {
        let mut b = RecordingBuilder::new();
        b.call("cuModuleLoadData", ptx("sm_90"));
        b.mark("prepared");
        let m = judge(&b.build(), H100);
        assert!(m.passed(), "{m:?}");
        assert!(m.detail.contains("1 module loads"), "{}", m.detail);

        let mut b = RecordingBuilder::new();
        b.call("cuModuleLoadData", ptx("sm_90"));
        b.call("cuModuleLoadData", ptx("sm_70"));
        // A load the driver refused loaded nothing.
        b.call_with("cuModuleLoadData", ptx("sm_80"), CuResult::INVALID_PTX);
        let m = judge(&b.build(), H100);
        assert!(!m.passed());
        assert_eq!(m.observed, 1.0);
        assert!(
            m.detail.contains("not for the device: event 1"),
            "{}",
            m.detail
        );
    }
}
