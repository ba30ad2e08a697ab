//! `target_parity`: every PTX module the kernel cache holds targets the
//! device's own `sm_XY`, and planted PTX for an older or a newer target is refused.

use std::collections::BTreeSet;

use super::prewarm::on_cold_cache;
use crate::check::params::BaseWeights;
use crate::check::{require_gpu, Comparator};
use crate::error::{Error, Result};
use qlora::gpu::cache::{compile_module, load_checked, ptx_target, OLDER_ARCH};
use qlora::gpu::GpuContext;
use qlora::kernels;

/// The small module whose PTX is planted with a wrong target.
const PLANT_MODULE: &str = "elementwise";

use serde::Deserialize;

use super::doc::{ParamDefault::*, ParamDoc, Piece::*};

use super::params::{at_most, ModelName};
use super::{Backend, Kind, Measurement, TrialContext, Validate};

/// A mismatched target the cache must refuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Planted {
    /// An architecture older than the device's (the driver would load it silently).
    Older,
    /// An architecture newer than the device's (the driver refuses it too).
    Newer,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    /// Pre-warm the cache for each of these presets before inspecting it:
    /// at most [`MAX_MODELS`].
    pub models: Vec<ModelName>,
    /// Mismatched PTX to plant; each must be refused: at most
    /// [`MAX_PLANTED`].
    #[serde(default = "default_planted")]
    pub planted: Vec<Planted>,
}

/// Most presets pre-warmed (no trainer is built; each is NVRTC
/// compilations): twice the number of presets.
pub const MAX_MODELS: usize = 8;
/// Most planted modules (each an NVRTC compilation): each kind twice.
pub const MAX_PLANTED: usize = 4;

fn default_planted() -> Vec<Planted> {
    vec![Planted::Older, Planted::Newer]
}

/// The parameters of `target_parity`, for the generated reference.
pub const PARAMS: &[ParamDoc] = &[
    ParamDoc {
        name: "models",
        default: Required,
        bound: &[Text("1 to "), Int(MAX_MODELS), Text(" presets: "), Presets],
        meaning: "pre-warm the cache for each before inspecting it",
    },
    ParamDoc {
        name: "planted",
        default: Yaml("[older, newer]"),
        bound: &[Text("at most "), Int(MAX_PLANTED), Text(" of "), OneOf(&["older", "newer"])],
        meaning: "mismatched PTX to plant; each must be refused",
    },
];

/// A minimal `target_parity` check.
pub const EXAMPLE: &[(&str, &str)] = &[("models", "[tiny]")];

impl Validate for Params {
    fn validate(&self) -> std::result::Result<(), String> {
        if self.models.is_empty() {
            return Err("`models` must list at least one preset".into());
        }
        at_most("models", self.models.len(), MAX_MODELS)?;
        at_most("planted", self.planted.len(), MAX_PLANTED)
    }
}

/// `target_parity`: pre-warm every listed model, then compile every other
/// kernel module too; every compiled module's PTX `.target` must equal the
/// device's `sm_XY`; planted older and newer PTX must be refused by the
/// cache's load path with a target mismatch.
fn target_parity(p: &Params, cx: &mut TrialContext<'_>) -> Result<Measurement> {
    let faults = cx.faults();
    let gpu = require_gpu(cx)?;
    on_cold_cache(gpu, faults, |gpu| target_parity_body(p, gpu))
}

fn target_parity_body(p: &Params, gpu: &mut GpuContext) -> Result<Measurement> {
    let device = gpu.facts().sm_arch();
    let mut violations = Vec::new();
    for model in &p.models {
        let config = model.0;
        match gpu.prewarm(&config, &[BaseWeights::Fp32, BaseWeights::Nf4]) {
            Ok(_) => {}
            Err(e @ qlora::Error::TargetMismatch { .. }) => {
                violations.push(format!("pre-warm of {} refused a module: {e}", config.name));
            }
            Err(e) => return Err(e.into()),
        }
    }
    let all: Vec<&str> = kernels::MODULES.iter().map(|m| m.name).collect();
    match gpu.ensure_modules(&all) {
        Ok(()) => {}
        Err(e @ qlora::Error::TargetMismatch { .. }) => {
            violations.push(format!("a kernel module was refused: {e}"));
        }
        Err(e) => return Err(e.into()),
    }
    let records = gpu.compile_records();
    let mismatched: Vec<String> = records
        .iter()
        .filter(|r| r.ptx_target != device)
        .map(|r| format!("{} ({} -> {})", r.module, r.arch, r.ptx_target))
        .collect();
    let targets: BTreeSet<String> = records.iter().map(|r| r.ptx_target.clone()).collect();
    let loaded = gpu.cache().loaded();

    let source = kernels::module(PLANT_MODULE).ok_or_else(|| Error::InvalidArgument {
        op: "target_parity",
        message: format!("no kernel module `{PLANT_MODULE}` to plant"),
    })?;
    let mut planted_accepted = 0usize;
    let mut planted_detail = Vec::new();
    for planted in &p.planted {
        let ptx = match planted {
            Planted::Older => compile_module(source, OLDER_ARCH)?,
            Planted::Newer => {
                let own = compile_module(source, &gpu.facts().compute_arch())?;
                let newer = format!("sm_{}0", gpu.facts().compute_capability.0 + 1);
                retarget(&own, &newer)
            }
        };
        let target = ptx_target(&ptx).unwrap_or("(none)").to_string();
        match load_checked(gpu.context(), gpu.facts(), &ptx) {
            Ok(_) => {
                planted_accepted += 1;
                violations.push(format!(
                    "planted {planted:?} PTX ({target}) was loaded on {device}"
                ));
            }
            Err(e @ qlora::Error::TargetMismatch { .. }) => {
                planted_detail.push(format!("{planted:?} ({target}) refused: {e}"));
            }
            Err(e) => violations.push(format!(
                "planted {planted:?} PTX ({target}) failed without a target mismatch: {e}"
            )),
        }
    }
    for m in &mismatched {
        violations.push(format!("module {m} does not target {device}"));
    }
    let observed = (mismatched.len() + planted_accepted) as f64;
    let mut m = Measurement::new(
        "mismatched_modules",
        observed,
        Comparator::Le,
        0.0,
        "modules",
    )
    .with_detail(format!(
        "device {device}; {} compilations, targets {:?}; loaded [{}]; {}",
        records.len(),
        targets,
        loaded.join(", "),
        planted_detail.join("; ")
    ));
    for v in violations {
        m.violate(v);
    }
    Ok(m)
}

/// `ptx` with its `.target` line naming `target` instead.
fn retarget(ptx: &str, target: &str) -> String {
    ptx.lines()
        .map(|line| {
            if line.trim_start().starts_with(".target") {
                format!(".target {target}")
            } else {
                line.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

impl Kind for Params {
    fn execute(&self, _backend: Backend, cx: &mut TrialContext<'_>) -> Result<Measurement> {
        target_parity(self, cx)
    }

    /// Observed: at most 1.3 s on an H200 (every module compiled cold).
    /// Kernel modules hold kilobytes: there is no memory to budget.
    fn default_timeout_s(&self) -> f64 {
        120.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_are_bounded() {
        let p = |yaml: &str| {
            serde_yaml::from_str::<Params>(yaml)
                .map_err(|e| e.to_string())
                .and_then(|p| p.validate())
        };
        assert_eq!(p("models: [small-4l]"), Ok(()));
        assert_eq!(
            p("models: [tiny]\nplanted: [older, newer, older, newer, older]").unwrap_err(),
            "planted: 5 is above its bound of 4"
        );
        let nine = ["tiny"; 9].join(", ");
        assert_eq!(
            p(&format!("models: [{nine}]")).unwrap_err(),
            "models: 9 is above its bound of 8"
        );
    }
}
