//! `driver_span_traffic`: inside each step, from the first launch of one
//! kernel to the last launch of another, the host does not wait for the
//! device, as the driver observer saw it: at most `max` device-to-host
//! copies and host synchronisations in the span.
//!
//! The span is found per step (between the `step i` markers the drive puts
//! down) from the kernel names CUPTI reports: it starts at the step's first
//! launch of a kernel whose name starts with `from_kernel` and ends at its
//! last launch of one whose name starts with `to_kernel`, both included. A
//! step without that span is an error, never a pass: the names are wrong (or
//! the step replayed a graph, whose kernels the driver does not launch one by
//! one). The subject's own device-to-host counter is not a witness here: it
//! counts the whole step, not the span.

use falsify_observer::{EventKind, Recording, StepSpan};
use serde::Deserialize;

use super::drive::observe;
use super::evidence::listed;
use super::train::{self, Training};
use super::{CoreCheck, CoreTrial};
use crate::check::params::Count;
use crate::check::{Backend, Comparator, Measurement, ParamDefault, ParamDoc, Piece, Validate};
use crate::subject::Subject;
use crate::{Error, Result};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    pub model: String,
    pub steps: Count,
    #[serde(default = "train::one")]
    pub batch: Count,
    #[serde(default)]
    pub seq_len: Option<Count>,
    #[serde(default)]
    pub graph: bool,
    /// The span starts at the step's first launch of a kernel whose name
    /// starts with this.
    pub from_kernel: String,
    /// The span ends at the step's last launch of a kernel whose name starts
    /// with this (at or after the start).
    pub to_kernel: String,
    /// Device-to-host copies and host synchronisations allowed in a step's
    /// span.
    #[serde(default)]
    pub max: usize,
}

/// The parameters of `driver_span_traffic`, for the generated reference.
pub const PARAMS: &[ParamDoc] = &[
    train::MODEL_DOC,
    train::STEPS_DOC,
    train::BATCH_DOC,
    train::SEQ_LEN_DOC,
    ParamDoc {
        name: "graph",
        default: ParamDefault::Yaml("false"),
        bound: &[Piece::Text("true or false")],
        meaning: "CUDA-graph the step (the workload decides how); a replayed step launches no \
                  kernel the driver sees, so it has no span (an error)",
    },
    ParamDoc {
        name: "from_kernel",
        default: ParamDefault::Required,
        bound: &[Piece::Text("a non-empty kernel name prefix")],
        meaning: "the span starts at the step's first launch of a kernel named so",
    },
    ParamDoc {
        name: "to_kernel",
        default: ParamDefault::Required,
        bound: &[Piece::Text("a non-empty kernel name prefix")],
        meaning: "the span ends at the step's last launch of a kernel named so (inclusive)",
    },
    ParamDoc {
        name: "max",
        default: ParamDefault::Yaml("0"),
        bound: &[Piece::Text(">= 0")],
        meaning: "device-to-host copies and host synchronisations allowed in a step's span",
    },
];

/// A minimal `driver_span_traffic` check.
pub const EXAMPLE: &[(&str, &str)] = &[
    ("model", "tiny"),
    ("steps", "3"),
    ("from_kernel", "squared_sum"),
    ("to_kernel", "clip_scale"),
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
        for (key, prefix) in [
            ("from_kernel", &self.from_kernel),
            ("to_kernel", &self.to_kernel),
        ] {
            if prefix.trim().is_empty() {
                return Err(format!(
                    "{key}: must name a kernel (a non-empty prefix of its name)"
                ));
            }
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
        let o = observe(trial, &self.training(), Some(&self.from_kernel))?;
        o.conclude(judge(
            &o.recording,
            &self.from_kernel,
            &self.to_kernel,
            self.max,
        )?)
    }

    fn driven_training(&self) -> Option<Training<'_>> {
        Some(self.training())
    }
}

/// `host_traffic_in_span` = the most device-to-host copies plus host
/// synchronisations (whatever the driver answered, injected ones included)
/// in one step's span from the first `from_kernel` launch to the last
/// `to_kernel` launch; must be at most `max`. A step without the span (or a
/// recording without steps) is an error: nothing can be judged.
pub fn judge(recording: &Recording, from: &str, to: &str, max: usize) -> Result<Measurement> {
    let spans = recording.host_traffic_in_spans(from, to);
    if spans.is_empty() {
        return Err(Error::Unjudgeable(
            "the recording has no `step` markers: no step to find the span in".into(),
        ));
    }
    let missing: Vec<&str> = spans
        .iter()
        .filter(|s| s.span.is_none())
        .map(|s| s.label.as_str())
        .collect();
    if !missing.is_empty() {
        return Err(Error::Unjudgeable(format!(
            "no span from a `{from}*` launch to a later `{to}*` launch in {}: the kernel names \
             are wrong (or the step replayed a graph); kernels launched in the region: {}",
            missing.join(", "),
            launched_names(recording)
        )));
    }
    let (largest, at) = spans
        .iter()
        .map(|s| (s.traffic.len(), s.label.as_str()))
        .max_by_key(|&(n, _)| n)
        .unwrap_or((0, ""));
    let mut m = Measurement::new(
        "host_traffic_in_span",
        largest as f64,
        Comparator::Le,
        max as f64,
        "calls",
    );
    let over: Vec<&StepSpan<'_>> = spans.iter().filter(|s| s.traffic.len() > max).collect();
    m.detail = format!(
        "span `{from}*` .. `{to}*` found in all {} steps; most host traffic in a span: {largest} \
         ({at}); {} steps above {max}",
        spans.len(),
        over.len()
    );
    if !over.is_empty() {
        let calls = listed(
            over.iter()
                .flat_map(|s| s.traffic.iter().map(|e| describe(s, e))),
        );
        m.detail.push_str(&format!(": {calls}"));
    }
    Ok(m)
}

/// One call in a span, as the detail lists it.
fn describe(step: &StepSpan<'_>, e: &falsify_observer::Event) -> String {
    let bytes = match e.kind {
        EventKind::Copy { bytes, .. } => format!(" {bytes} B"),
        _ => String::new(),
    };
    let result = match e.result {
        Some(r) if !r.is_success() => format!(" -> {r}"),
        _ => String::new(),
    };
    let injected = if e.is_injected() { ", injected" } else { "" };
    format!(
        "{} event {} {}{bytes}{result}{injected}",
        step.label, e.seq, e.api
    )
}

/// The distinct kernel names launched in the region, in first-launch order.
fn launched_names(recording: &Recording) -> String {
    let mut names: Vec<&str> = Vec::new();
    for e in recording.kernel_launches() {
        if let EventKind::KernelLaunch {
            name: Some(name), ..
        } = &e.kind
        {
            if !names.contains(&name.as_str()) {
                names.push(name);
            }
        }
    }
    if names.is_empty() {
        return "none".into();
    }
    listed(names.into_iter().map(str::to_string))
}

#[cfg(test)]
mod tests {
    use falsify_observer::{Direction, RecordingBuilder, SyncOn};

    use super::*;

    const STREAM: u64 = 0x5000;

    fn launch(name: &str) -> EventKind {
        EventKind::KernelLaunch {
            name: Some(name.into()),
            stream: STREAM,
            grid: [1, 1, 1],
            block: [32, 1, 1],
        }
    }

    fn dtoh(bytes: u64) -> EventKind {
        EventKind::Copy {
            direction: Direction::DeviceToHost,
            bytes,
            asynchronous: false,
            stream: None,
        }
    }

    fn sync() -> EventKind {
        EventKind::Sync {
            on: SyncOn::Stream,
            handle: STREAM,
        }
    }

    /// What a step puts inside its span, between the clip's launches.
    #[derive(Clone, Copy, PartialEq)]
    enum Inside {
        Nothing,
        Copy,
        Sync,
    }

    /// `steps` steps, each: a readback and a sync before the span, the span
    /// (`sum`, `scale`, `sum`, `scale`) with `inside` in step 2 between the
    /// first two launches, then a loss readback and a sync after it.
    fn recording(steps: usize, inside: Inside) -> Recording {
        let mut b = RecordingBuilder::new();
        b.mark("prepared");
        b.call("cuLaunchKernel", launch("squared_sum_reduce"));
        b.call("cuMemcpyDtoH_v2", dtoh(4));
        for step in 1..=steps {
            b.mark(&format!("step {step}"));
            b.call("cuMemcpyDtoH_v2", dtoh(8));
            b.call("cuStreamSynchronize", sync());
            b.call("cuLaunchKernel", launch("forward"));
            b.call("cuLaunchKernel", launch("squared_sum_reduce"));
            match (step == 2, inside) {
                (true, Inside::Copy) => {
                    b.call("cuMemcpyDtoH_v2", dtoh(4));
                }
                (true, Inside::Sync) => {
                    b.call("cuStreamSynchronize", sync());
                }
                _ => {}
            }
            b.call("cuLaunchKernel", launch("gradient_clip_gpu_scale"));
            b.call("cuLaunchKernel", launch("squared_sum_reduce"));
            b.call("cuLaunchKernel", launch("gradient_clip_gpu_scale"));
            b.call("cuMemcpyDtoH_v2", dtoh(4));
            b.call("cuCtxSynchronize", sync());
        }
        b.build()
    }

    const FROM: &str = "squared_sum";
    const TO: &str = "gradient_clip";

    #[test]
    fn a_span_without_host_traffic_passes_whatever_lies_outside_it() {
        let m = judge(&recording(3, Inside::Nothing), FROM, TO, 0).unwrap();
        assert!(m.passed(), "{m:?}");
        assert_eq!(m.observed, 0.0);
        assert!(
            m.detail.contains("found in all 3 steps") && m.detail.contains("0 steps above 0"),
            "{}",
            m.detail
        );
    }

    #[test]
    fn a_copy_in_the_span_falsifies_and_is_named() {
        let m = judge(&recording(3, Inside::Copy), FROM, TO, 0).unwrap();
        assert!(!m.passed());
        assert_eq!(m.observed, 1.0);
        assert!(
            m.detail.contains("1 steps above 0: step 2 event")
                && m.detail.contains("cuMemcpyDtoH_v2 4 B"),
            "{}",
            m.detail
        );
        // Within `max`, it passes.
        assert!(judge(&recording(3, Inside::Copy), FROM, TO, 1)
            .unwrap()
            .passed());
    }

    #[test]
    fn a_sync_in_the_span_falsifies() {
        let m = judge(&recording(2, Inside::Sync), FROM, TO, 0).unwrap();
        assert!(!m.passed());
        assert_eq!(m.observed, 1.0);
        assert!(
            m.detail.contains("step 2 event") && m.detail.contains("cuStreamSynchronize"),
            "{}",
            m.detail
        );
    }

    #[test]
    fn a_span_never_found_is_an_error_not_a_pass() {
        let e = judge(&recording(2, Inside::Nothing), "squared_sum", "adamw", 0).unwrap_err();
        let message = e.to_string();
        assert!(
            message.contains(
                "no span from a `squared_sum*` launch to a later `adamw*` launch in step 1, step 2"
            ),
            "{message}"
        );
        assert!(
            message.contains(
                "kernels launched in the region: squared_sum_reduce; forward; gradient_clip_gpu_scale"
            ),
            "{message}"
        );
        // Ends named before the start do not make a span.
        assert!(judge(&recording(2, Inside::Nothing), TO, "forward", 0).is_err());
        // No steps at all.
        assert!(judge(&RecordingBuilder::new().build(), FROM, TO, 0).is_err());
    }
}
