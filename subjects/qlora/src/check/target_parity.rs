//! `target_parity`: every module the kernel cache holds targets the device's
//! own `sm_XY`, planted PTX for an older or a newer target is refused, and
//! so is a planted disk entry built for another architecture or compiler,
//! or corrupted: it is compiled again and rewritten, never loaded.

use std::collections::BTreeSet;

use super::prewarm::on_cold_cache;
use crate::check::params::BaseWeights;
use crate::check::MutantFaults;
use crate::check::{require_gpu, Comparator};
use crate::error::{Error, Result};
use qlora::gpu::cache::{compile_cubin, compile_module, load_checked, ptx_target, OLDER_ARCH};
use qlora::gpu::disk::{self, EntryHeader, Format};
use qlora::gpu::{GpuContext, Origin};
use qlora::kernels;

/// The small module whose PTX is planted with a wrong target.
const PLANT_MODULE: &str = "elementwise";

use serde::Deserialize;

use super::doc::{ParamDefault::*, ParamDoc, Piece::*, ANY_PRESET};

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
    /// A disk entry at this module's key whose header and code are PTX for
    /// an older architecture (the driver would JIT it silently).
    StaleArch,
    /// A disk entry at this module's key holding this device's cubin, built
    /// (its header says) by another NVRTC major version.
    StaleNvrtc,
    /// A disk entry at this module's key with a correct header and one
    /// payload byte flipped.
    Corrupted,
}

impl Planted {
    /// A disk entry rather than PTX handed to the load path.
    fn is_entry(self) -> bool {
        !matches!(self, Planted::Older | Planted::Newer)
    }
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
/// Most planted modules (each an NVRTC compilation): about each kind twice.
pub const MAX_PLANTED: usize = 8;

fn default_planted() -> Vec<Planted> {
    vec![Planted::Older, Planted::Newer]
}

/// The parameters of `target_parity`, for the generated reference.
pub const PARAMS: &[ParamDoc] = &[
    ParamDoc {
        name: "models",
        default: Required,
        bound: &[
            Text("1 to "),
            Int(MAX_MODELS),
            Text(" presets: "),
            ANY_PRESET,
        ],
        meaning: "pre-warm the cache for each before inspecting it",
    },
    ParamDoc {
        name: "planted",
        default: Yaml("[older, newer]"),
        bound: &[
            Text("at most "),
            Int(MAX_PLANTED),
            Text(" of "),
            OneOf(&["older", "newer", "stale_arch", "stale_nvrtc", "corrupted"]),
        ],
        meaning: "mismatched PTX or disk entries to plant; each must be refused",
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
    let compiled = records.len();
    let mismatched: Vec<String> = records
        .iter()
        .filter(|r| r.target != device)
        .map(|r| format!("{} ({} -> {})", r.module, r.arch, r.target))
        .collect();
    let targets: BTreeSet<String> = records.iter().map(|r| r.target.clone()).collect();
    let loaded = gpu.cache().loaded();

    let source = kernels::module(PLANT_MODULE).ok_or_else(|| Error::InvalidArgument {
        op: "target_parity",
        message: format!("no kernel module `{PLANT_MODULE}` to plant"),
    })?;
    let mut planted_accepted = 0usize;
    let mut planted_detail = Vec::new();
    for &planted in &p.planted {
        let verdict = if planted.is_entry() {
            plant_entry(gpu, planted, source)?
        } else {
            plant_ptx(gpu, planted, source)?
        };
        match verdict {
            Ok(refused) => planted_detail.push(refused),
            Err(violation) => {
                planted_accepted += 1;
                violations.push(violation);
            }
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
        compiled,
        targets,
        loaded.join(", "),
        planted_detail.join("; ")
    ));
    for v in violations {
        m.violate(v);
    }
    Ok(m)
}

/// Hands PTX for an older or a newer target to the cache's PTX load path.
/// Ok (the refusal) when it was refused with a target mismatch; Err (the
/// violation) otherwise.
fn plant_ptx(
    gpu: &mut GpuContext,
    planted: Planted,
    source: &kernels::ModuleSource,
) -> Result<std::result::Result<String, String>> {
    let device = gpu.facts().sm_arch();
    let ptx = if planted == Planted::Newer {
        let own = compile_module(source, &gpu.facts().compute_arch())?;
        retarget(
            &own,
            &format!("sm_{}0", gpu.facts().compute_capability.0 + 1),
        )
    } else {
        compile_module(source, OLDER_ARCH)?
    };
    let target = ptx_target(&ptx).unwrap_or("(none)").to_string();
    Ok(match load_checked(gpu.context(), gpu.facts(), &ptx) {
        Ok(_) => Err(format!(
            "planted {planted:?} PTX ({target}) was loaded on {device}"
        )),
        Err(e @ qlora::Error::TargetMismatch { .. }) => {
            Ok(format!("{planted:?} ({target}) refused: {e}"))
        }
        Err(e) => Err(format!(
            "planted {planted:?} PTX ({target}) failed without a target mismatch: {e}"
        )),
    })
}

/// Writes the `planted` entry at the path of `source`'s own key in the
/// cache's directory, then loads the module from a cold memory cache. Ok
/// (what the cache said) when the entry was refused, compiled again and
/// rewritten; Err (the violation) otherwise.
fn plant_entry(
    gpu: &mut GpuContext,
    planted: Planted,
    source: &kernels::ModuleSource,
) -> Result<std::result::Result<String, String>> {
    let dir = gpu
        .kernel_cache_dir()
        .ok_or_else(|| Error::InvalidArgument {
            op: "target_parity",
            message: "the kernel cache has no directory to plant an entry in".into(),
        })?
        .to_path_buf();
    let want = gpu.kernel_entry_header(source.name)?;
    let path = dir.join(want.file_name(source.name));
    disk::write_atomic(&path, &planted_bytes(planted, &want, source)?)?;
    gpu.reset_cache();
    let loaded = gpu.ensure_modules(&[source.name]);
    let record = gpu
        .compile_records()
        .iter()
        .rev()
        .find(|r| r.module == source.name)
        .cloned();
    let tag = format!("planted {planted:?} entry");
    let verdict = match (loaded, record) {
        (Err(e), _) => Err(format!("{tag}: loading the module failed: {e}")),
        (Ok(()), None) => Err(format!("{tag}: the module was loaded without a record")),
        (Ok(()), Some(r)) if r.origin == Origin::Disk => Err(format!(
            "{tag} was loaded from disk (its code targets {})",
            r.target
        )),
        (Ok(()), Some(r)) => match r.refused_entry {
            None => Err(format!("{tag} was never read")),
            Some(why) => rewritten(&path, &want)
                .map(|()| {
                    format!("{planted:?} entry refused ({why}), compiled again and rewritten")
                })
                .map_err(|e| format!("{tag} was refused but not rewritten: {e}")),
        },
    };
    Ok(verdict)
}

/// The bytes of a `planted` entry for the key `want`.
fn planted_bytes(
    planted: Planted,
    want: &EntryHeader,
    source: &kernels::ModuleSource,
) -> Result<Vec<u8>> {
    let bytes = match planted {
        Planted::StaleArch => {
            let header = EntryHeader {
                format: Format::Ptx,
                arch: OLDER_ARCH.to_string(),
                ..want.clone()
            };
            disk::encode(&header, compile_module(source, OLDER_ARCH)?.as_bytes())?
        }
        Planted::StaleNvrtc => {
            let header = EntryHeader {
                nvrtc: (want.nvrtc.0 - 1, want.nvrtc.1),
                ..want.clone()
            };
            disk::encode(&header, &compile_cubin(source, &want.arch)?)?
        }
        Planted::Corrupted | Planted::Older | Planted::Newer => {
            let mut bytes = disk::encode(want, &compile_cubin(source, &want.arch)?)?;
            // The last byte: within the cubin's string data, so even a
            // cache that loads it unchecked reads no further than its end.
            if let Some(last) = bytes.last_mut() {
                *last ^= 0x5a;
            }
            bytes
        }
    };
    Ok(bytes)
}

/// Ok when the entry at `path` is now a valid one for `want`.
fn rewritten(path: &std::path::Path, want: &EntryHeader) -> std::result::Result<(), String> {
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    disk::decode(&bytes, want)
        .map(|_| ())
        .map_err(|r| r.to_string())
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

impl Kind<crate::Qlora> for Params {
    fn execute(&self, _backend: Backend, cx: &mut TrialContext<'_>) -> Result<Measurement> {
        target_parity(self, cx)
    }

    /// Many times this kind's longest trial (its `duration_ms` in the
    /// committed baselines; the parameter bounds keep a trial within it):
    /// a stuck trial is stopped, a slow machine is not.
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
            p("models: [tiny]\nplanted: [stale_arch, stale_nvrtc, corrupted]"),
            Ok(())
        );
        let nine = ["older"; 9].join(", ");
        assert_eq!(
            p(&format!("models: [tiny]\nplanted: [{nine}]")).unwrap_err(),
            "planted: 9 is above its bound of 8"
        );
        assert!(Planted::StaleArch.is_entry() && !Planted::Older.is_entry());
        let nine = ["tiny"; 9].join(", ");
        assert_eq!(
            p(&format!("models: [{nine}]")).unwrap_err(),
            "models: 9 is above its bound of 8"
        );
    }
}
