//! GPU-side execution of `target_parity` and `prewarm`.
//!
//! Both start from a cold kernel cache with the trial's fault knobs on, and on
//! the way out turn them off (the guard does, a panic included) and drop
//! every module compiled under them, whatever the outcome.

use std::collections::BTreeSet;

use crate::check::params::{BaseWeights, StepMode};
use crate::check::{prewarm, require_gpu, target_parity, Comparator, Measurement, TrialContext};
use crate::error::{Error, Result};
use qlora::gpu::cache::{compile_module, load_checked, ptx_target, OLDER_ARCH};
use qlora::gpu::{GpuContext, PrewarmReport};
use qlora::kernels;
use qlora::train::GpuTrainer;
use qlora::Faults;

/// The small module whose PTX is planted with a wrong target.
const PLANT_MODULE: &str = "elementwise";

/// Runs `body` on a cold cache with `faults` on, then drops the modules
/// compiled under them, also when `body` fails.
fn on_cold_cache<T>(
    gpu: &mut GpuContext,
    faults: Faults,
    body: impl FnOnce(&mut GpuContext) -> Result<T>,
) -> Result<T> {
    gpu.reset_cache();
    let out = body(&mut gpu.with_faults(faults));
    gpu.reset_cache();
    out
}

/// `target_parity`: pre-warm every listed model, then compile every other
/// kernel module too; every compiled module's PTX `.target` must equal the
/// device's `sm_XY`; planted older and newer PTX must be refused by the
/// cache's load path with a target mismatch.
pub fn target_parity(p: &target_parity::Params, cx: &mut TrialContext<'_>) -> Result<Measurement> {
    let faults = cx.faults();
    let gpu = require_gpu(cx)?;
    on_cold_cache(gpu, faults, |gpu| target_parity_body(p, gpu))
}

fn target_parity_body(p: &target_parity::Params, gpu: &mut GpuContext) -> Result<Measurement> {
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
            target_parity::Planted::Older => compile_module(source, OLDER_ARCH)?,
            target_parity::Planted::Newer => {
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

/// `prewarm`: for each model and base, a cold cache, pre-warm, then `steps`
/// real training steps of a `GpuTrainer` (eager, captured and replayed). Counts compilations after pre-warm; a module used but
/// not pre-warmed is a violation; pre-warmed but unused modules are reported.
pub fn prewarm(p: &prewarm::Params, cx: &mut TrialContext<'_>) -> Result<Measurement> {
    let faults = cx.faults();
    let seed = cx.seed;
    let gpu = require_gpu(cx)?;
    let mut total_after = 0usize;
    let mut violations = Vec::new();
    let mut detail = Vec::new();
    for model in &p.models {
        let config = model.0;
        for &base in p.bases.iter().map(|b| &b.0) {
            let (report, after, used) = on_cold_cache(gpu, faults, |gpu| {
                let report = gpu.prewarm(&config, &[base])?;
                gpu.cache_mut().clear_used();
                // Real training steps, graphed as in production: step 1 runs
                // eagerly, step 2 captures, later steps replay.
                let mode = StepMode {
                    graph: true,
                    base,
                    ..StepMode::default()
                };
                let options = mode.speed_options();
                let mut trainer = GpuTrainer::new(gpu, &config, options, seed)?;
                for _ in 0..p.steps.0 {
                    trainer.step(gpu)?;
                }
                drop(trainer);
                gpu.synchronize()?;
                let after = gpu.cache_stats().compiled_after_prewarm;
                let used = gpu.cache().used().clone();
                Ok((report, after, used))
            })?;
            total_after += after;
            let prewarmed: BTreeSet<&str> = report.modules.iter().copied().collect();
            let missing: Vec<&str> = used.difference(&prewarmed).copied().collect();
            let unused: Vec<&str> = prewarmed.difference(&used).copied().collect();
            let tag = format!("{}/{}", config.name, base_name(base));
            if !missing.is_empty() {
                violations.push(format!(
                    "{tag}: used but not pre-warmed: {}",
                    missing.join(", ")
                ));
            }
            if let Some(bound) = p.max_prewarm_ms {
                if report.wall_ms > bound.0 {
                    violations.push(format!(
                        "{tag}: pre-warm took {:.0} ms, over the bound of {:.0} ms",
                        report.wall_ms, bound.0
                    ));
                }
            }
            detail.push(summary(&tag, &report, after, &unused));
        }
    }
    let mut m = Measurement::new(
        "compilations_after_prewarm",
        total_after as f64,
        Comparator::Le,
        p.max_compilations as f64,
        "compilations",
    )
    .with_detail(detail.join("; "));
    for v in violations {
        m.violate(v);
    }
    Ok(m)
}

fn base_name(base: BaseWeights) -> &'static str {
    match base {
        BaseWeights::Fp32 => "fp32",
        BaseWeights::Nf4 => "nf4",
    }
}

fn summary(tag: &str, r: &PrewarmReport, after: usize, unused: &[&str]) -> String {
    format!(
        "{tag}: pre-warmed {} modules ({} compilations, {:.0} ms JIT, {:.0} ms wall), {after} after{}{}",
        r.modules.len(),
        r.compilations,
        r.compile_ms,
        r.wall_ms,
        if r.skipped.is_empty() {
            String::new()
        } else {
            format!(", skipped [{}]", r.skipped.join(", "))
        },
        if unused.is_empty() {
            String::new()
        } else {
            format!(", unused [{}]", unused.join(", "))
        }
    )
}
