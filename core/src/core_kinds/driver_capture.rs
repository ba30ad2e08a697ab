//! `driver_capture`: the subject's CUDA-graphed step, as the driver
//! observer saw it: every capture begins, ends and instantiates without an
//! error; no host synchronisation and no device-to-host copy inside a
//! capture; the graph replayed at least `steps - 1` times; at most
//! `max_syncs_per_step` host synchronisations per step outside captures.
//! Where the subject counts its own syncs, its counts must agree.

use falsify_observer::Recording;
use serde::Deserialize;

use super::drive::observe;
use super::evidence::listed;
use super::train::{self, Training};
use super::{CoreCheck, CoreTrial};
use crate::check::params::Count;
use crate::check::{Backend, Comparator, Measurement, ParamDefault, ParamDoc, Piece, Validate};
use crate::subject::{OwnCounts, Subject};
use crate::Result;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    pub model: String,
    pub steps: Count,
    #[serde(default = "train::one")]
    pub batch: Count,
    #[serde(default)]
    pub seq_len: Option<Count>,
    /// Must be `true`: the check is about the graphed step.
    pub graph: bool,
    /// Host synchronisations allowed per step, outside captures.
    pub max_syncs_per_step: usize,
}

/// The parameters of `driver_capture`, for the generated reference.
pub const PARAMS: &[ParamDoc] = &[
    train::MODEL_DOC,
    train::STEPS_DOC,
    train::BATCH_DOC,
    train::SEQ_LEN_DOC,
    ParamDoc {
        name: "graph",
        default: ParamDefault::Required,
        bound: &[Piece::Text("true")],
        meaning: "CUDA-graph the step (the workload decides how)",
    },
    ParamDoc {
        name: "max_syncs_per_step",
        default: ParamDefault::Required,
        bound: &[Piece::Text(">= 0")],
        meaning: "host synchronisations allowed per step, outside captures",
    },
];

/// A minimal `driver_capture` check.
pub const EXAMPLE: &[(&str, &str)] = &[
    ("model", "tiny"),
    ("steps", "3"),
    ("graph", "true"),
    ("max_syncs_per_step", "1"),
];

impl Params {
    fn training(&self) -> Training<'_> {
        Training {
            model: &self.model,
            steps: self.steps,
            batch: self.batch,
            seq_len: self.seq_len,
            graph: self.graph,
        }
    }
}

impl Validate for Params {
    fn validate(&self) -> std::result::Result<(), String> {
        if !self.graph {
            return Err("graph: must be true (driver_capture judges the graphed step)".into());
        }
        self.training().validate()
    }
}

impl CoreCheck for Params {
    fn execute<S: Subject>(
        &self,
        _backend: Backend,
        trial: CoreTrial<'_, '_, S>,
    ) -> Result<Measurement> {
        let o = observe(trial, &self.training(), None)?;
        o.conclude(judge(
            &o.recording,
            o.own.as_ref(),
            self.steps.0,
            self.max_syncs_per_step,
        ))
    }

    fn driven_training(&self) -> Option<Training<'_>> {
        Some(self.training())
    }
}

/// `syncs_inside_capture` (must be 0) headlines; failed captures, D2H
/// copies inside a capture, too few replays, too many syncs in a step and
/// own counters that disagree with the driver are violations.
pub fn judge(
    recording: &Recording,
    own: Option<&OwnCounts>,
    steps: usize,
    max_syncs_per_step: usize,
) -> Measurement {
    let inside = recording.syncs_inside_capture();
    let mut m = Measurement::new(
        "syncs_inside_capture",
        inside.len() as f64,
        Comparator::Le,
        0.0,
        "syncs",
    );
    let captures = recording.captures();
    let replays: usize = captures.iter().map(|c| c.launches).sum();
    let per_step: Vec<_> = recording
        .host_syncs_per_step()
        .into_iter()
        .filter(|s| s.label.starts_with("step "))
        .collect();
    m.detail = format!(
        "{} captures, {replays} replays; host syncs per step outside captures: {}",
        captures.len(),
        listed(
            per_step
                .iter()
                .map(|s| format!("{} {}", s.label, s.host_syncs))
        )
    );
    if captures.is_empty() {
        m.violate("no stream capture in the region: the step was not graphed");
    }
    for c in captures.iter().filter(|c| !c.succeeded()) {
        m.violate(format!(
            "capture at event {} failed (begin {:?}, end {:?}, instantiations {:?})",
            c.begin_seq,
            c.begin_result,
            c.end_result,
            c.instantiations
                .iter()
                .map(|i| i.result)
                .collect::<Vec<_>>()
        ));
    }
    if !inside.is_empty() {
        let listed_inside = listed(inside.iter().map(|e| format!("event {} {}", e.seq, e.api)));
        m.violate(format!("host syncs inside a capture: {listed_inside}"));
    }
    let dtoh = recording.dtoh_inside_capture();
    if !dtoh.is_empty() {
        m.violate(format!(
            "{} device-to-host copies inside a capture",
            dtoh.len()
        ));
    }
    if replays + 1 < steps {
        m.violate(format!(
            "{replays} graph replays in {steps} steps: at least {} expected",
            steps - 1
        ));
    }
    for s in per_step
        .iter()
        .filter(|s| s.host_syncs > max_syncs_per_step)
    {
        m.violate(format!(
            "{}: {} host syncs outside captures, above {max_syncs_per_step}",
            s.label, s.host_syncs
        ));
    }
    witnesses(&mut m, own, inside.len(), &per_step);
    m
}

/// The subject's own sync counters against the driver's.
fn witnesses(
    m: &mut Measurement,
    own: Option<&OwnCounts>,
    inside: usize,
    per_step: &[falsify_observer::StepSyncs],
) {
    let Some(own) = own else { return };
    if let Some(said) = own.syncs_inside_capture {
        if said != inside as u64 {
            m.violate(format!(
                "witnesses disagree: subject says {said} syncs inside capture, driver saw {inside}"
            ));
        }
    }
    if let (Some(said), false) = (own.syncs_per_step, per_step.is_empty()) {
        let total: usize = per_step.iter().map(|s| s.host_syncs).sum();
        let seen = total as f64 / per_step.len() as f64;
        if (said - seen).abs() > 1e-9 {
            m.violate(format!(
                "witnesses disagree: subject says {said} syncs per step, driver saw {seen}"
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use falsify_observer::{CuResult, EventKind, RecordingBuilder, SyncOn};

    use super::*;

    const STREAM: u64 = 0x5000;

    /// A step captured then replayed `steps - 1` times, one sync per step;
    /// `sync_inside`: a stream sync inside the capture, which breaks it.
    fn recording(steps: usize, sync_inside: bool) -> Recording {
        let mut b = RecordingBuilder::new();
        b.mark("prepared");
        b.mark("step 1");
        b.call(
            "cuStreamBeginCapture_v2",
            EventKind::CaptureBegin {
                stream: STREAM,
                mode: Some(0),
            },
        );
        let capture_end = if sync_inside {
            let sync = EventKind::Sync {
                on: SyncOn::Stream,
                handle: STREAM,
            };
            b.call_with(
                "cuStreamSynchronize",
                sync,
                CuResult::STREAM_CAPTURE_UNSUPPORTED,
            );
            CuResult::STREAM_CAPTURE_INVALIDATED
        } else {
            CuResult::SUCCESS
        };
        let end = EventKind::CaptureEnd {
            stream: STREAM,
            graph: Some(7),
        };
        b.call_with("cuStreamEndCapture", end, capture_end);
        b.call(
            "cuGraphInstantiateWithFlags",
            EventKind::GraphInstantiate {
                graph: 7,
                exec: Some(8),
            },
        );
        for step in 1..=steps {
            if step > 1 {
                b.mark(&format!("step {step}"));
            }
            b.call(
                "cuGraphLaunch",
                EventKind::GraphLaunch {
                    exec: 8,
                    stream: STREAM,
                },
            );
            b.call(
                "cuStreamSynchronize",
                EventKind::Sync {
                    on: SyncOn::Stream,
                    handle: STREAM,
                },
            );
        }
        b.build()
    }

    fn own(inside: u64, per_step: f64) -> OwnCounts {
        OwnCounts {
            syncs_inside_capture: Some(inside),
            syncs_per_step: Some(per_step),
            ..OwnCounts::default()
        }
    }

    #[test]
    fn a_clean_graphed_step_passes() {
        let m = judge(&recording(3, false), Some(&own(0, 1.0)), 3, 1);
        assert!(m.passed(), "{m:?}");
        assert!(m.detail.contains("1 captures, 3 replays"), "{}", m.detail);
    }

    #[test]
    fn a_sync_inside_the_capture_falsifies() {
        let m = judge(&recording(3, true), None, 3, 1);
        assert!(!m.passed());
        assert_eq!(m.observed, 1.0);
        assert!(
            m.violations.iter().any(|v| v.contains("capture at event")),
            "{:?}",
            m.violations
        );
    }

    #[test]
    fn too_many_syncs_too_few_replays_and_disagreeing_witnesses_falsify() {
        let m = judge(&recording(3, false), None, 3, 0);
        assert!(
            m.violations.iter().any(|v| v.contains("above 0")),
            "{:?}",
            m.violations
        );
        let m = judge(&recording(3, false), None, 6, 1);
        assert!(
            m.violations
                .iter()
                .any(|v| v.contains("3 graph replays in 6 steps")),
            "{:?}",
            m.violations
        );
        let m = judge(&recording(3, false), Some(&own(1, 2.0)), 3, 1);
        let disagree = m
            .violations
            .iter()
            .filter(|v| v.starts_with("witnesses disagree"))
            .count();
        assert_eq!(disagree, 2, "{:?}", m.violations);
        let m = judge(&RecordingBuilder::new().build(), None, 1, 1);
        assert!(
            m.violations.iter().any(|v| v.contains("no stream capture")),
            "{:?}",
            m.violations
        );
    }
}
