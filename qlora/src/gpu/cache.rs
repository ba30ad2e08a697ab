//! The kernel cache: NVRTC compilation for the device's own architecture, the
//! PTX `.target` check on every load, the JIT counter pre-warm is judged by,
//! and the set of modules the code actually used.
//!
//! The driver loads PTX for an *older* architecture silently (it JIT-compiles it
//! up), so the cache itself refuses any PTX whose `.target` is not exactly the
//! device's `sm_XY` — older and newer alike.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileError, CompileOptions, Ptx};

use super::context::{nvrtc_present, DeviceFacts};
use crate::error::{Error, Result};
use crate::kernels::{self, ModuleSource};

/// The virtual architecture [`crate::Faults::ptx_older_target`] compiles for (Turing):
/// older than every device this crate targets, and still accepted by NVRTC 13.
pub const OLDER_ARCH: &str = "compute_75";

/// Compiles `source` with NVRTC for the virtual architecture `arch`
/// (e.g. `compute_90`) and returns the PTX text. Errors (never panics) when
/// NVRTC cannot be loaded; a compile error keeps the NVRTC log.
pub fn compile_module(source: &ModuleSource, arch: &str) -> Result<String> {
    if !nvrtc_present() {
        return Err(Error::CudaUnavailable("NVRTC library not found".into()));
    }
    let opts = CompileOptions {
        options: vec![format!("--gpu-architecture={arch}"), "--std=c++17".into()],
        name: Some(format!("{}.cu", source.name)),
        ..Default::default()
    };
    match compile_ptx_with_opts(source.source, opts) {
        Ok(ptx) => Ok(ptx.to_src()),
        Err(CompileError::CompileError { log, .. }) => Err(Error::Compile {
            module: source.name.to_string(),
            log: log.to_string_lossy().into_owned(),
        }),
        Err(e) => Err(Error::Nvrtc(e)),
    }
}

/// The architecture on the `.target` line of a PTX text (`sm_90` for
/// `.target sm_90` or `.target sm_90, debug`), if there is one.
pub fn ptx_target(ptx: &str) -> Option<&str> {
    ptx.lines().find_map(|line| {
        let rest = line.trim_start().strip_prefix(".target")?;
        let first = rest.split_whitespace().next()?;
        Some(first.trim_end_matches(','))
    })
}

/// Ok when the PTX targets exactly `device_sm`, else [`Error::TargetMismatch`]
/// naming both.
pub fn check_target(ptx: &str, device_sm: &str) -> Result<()> {
    match ptx_target(ptx) {
        Some(t) if t == device_sm => Ok(()),
        other => Err(Error::TargetMismatch {
            ptx: other.unwrap_or("(no .target line)").to_string(),
            device: device_sm.to_string(),
        }),
    }
}

/// Checks the `.target` of `ptx` against the device and only then loads it:
/// the one load path of the cache, also used to plant mismatched PTX.
pub fn load_checked(
    ctx: &Arc<CudaContext>,
    facts: &DeviceFacts,
    ptx: &str,
) -> Result<Arc<CudaModule>> {
    check_target(ptx, &facts.sm_arch())?;
    if ptx.contains('\0') {
        // cudarc turns the text into a C string; an interior NUL would panic there.
        return Err(Error::InvalidArgument {
            op: "kernel cache",
            message: "PTX text contains a NUL byte".into(),
        });
    }
    Ok(ctx.load_module(Ptx::from_src(ptx))?)
}

/// One compilation the cache made.
#[derive(Debug, Clone, PartialEq)]
pub struct CompileRecord {
    pub module: &'static str,
    /// The virtual architecture asked of NVRTC, e.g. `compute_90`.
    pub arch: String,
    /// The PTX `.target` NVRTC produced, e.g. `sm_90`.
    pub ptx_target: String,
    /// Whether the load path accepted it (the target matched the device).
    pub accepted: bool,
    pub compile_ms: f64,
    /// Compiled after [`KernelCache::mark_prewarmed`].
    pub after_prewarm: bool,
}

/// Counters of the cache since its last reset.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CacheStats {
    /// NVRTC compilations (accepted or refused).
    pub compilations: usize,
    /// Total NVRTC time.
    pub compile_ms: f64,
    /// Total `load_module` time (driver JIT of the PTX to SASS).
    pub load_ms: f64,
    /// Compilations after pre-warm finished: zero in a well pre-warmed run.
    pub compiled_after_prewarm: usize,
    /// Modules whose PTX the target check refused.
    pub refused: usize,
}

struct Loaded {
    module: Arc<CudaModule>,
    functions: BTreeMap<&'static str, CudaFunction>,
}

/// Compiled modules by name, with their counters. One per [`super::GpuContext`].
#[derive(Default)]
pub struct KernelCache {
    loaded: BTreeMap<&'static str, Loaded>,
    stats: CacheStats,
    records: Vec<CompileRecord>,
    used: BTreeSet<&'static str>,
    prewarmed: Option<BTreeSet<&'static str>>,
}

impl KernelCache {
    /// Drops every module, counter, record and the used / pre-warmed sets.
    pub fn reset(&mut self) {
        *self = KernelCache::default();
    }

    pub fn stats(&self) -> &CacheStats {
        &self.stats
    }

    pub fn records(&self) -> &[CompileRecord] {
        &self.records
    }

    /// Modules a kernel was fetched from since the last [`KernelCache::clear_used`].
    pub fn used(&self) -> &BTreeSet<&'static str> {
        &self.used
    }

    pub fn clear_used(&mut self) {
        self.used.clear();
    }

    /// Names of the modules currently loaded.
    pub fn loaded(&self) -> Vec<&'static str> {
        self.loaded.keys().copied().collect()
    }

    /// The modules pre-warm compiled, once it ran.
    pub fn prewarmed(&self) -> Option<&BTreeSet<&'static str>> {
        self.prewarmed.as_ref()
    }

    /// Records that pre-warm finished with `modules`; later compilations count
    /// as `compiled_after_prewarm`.
    pub fn mark_prewarmed(&mut self, modules: BTreeSet<&'static str>) {
        self.prewarmed = Some(modules);
        self.stats.compiled_after_prewarm = 0;
    }

    /// Compiles and loads `name` unless it is loaded already.
    pub fn ensure(
        &mut self,
        ctx: &Arc<CudaContext>,
        facts: &DeviceFacts,
        arch: &str,
        name: &str,
    ) -> Result<&'static str> {
        let source = kernels::module(name).ok_or_else(|| Error::InvalidArgument {
            op: "kernel cache",
            message: format!("no kernel module `{name}`"),
        })?;
        if self.loaded.contains_key(source.name) {
            return Ok(source.name);
        }
        let started = Instant::now();
        let ptx = compile_module(source, arch)?;
        let compile_ms = started.elapsed().as_secs_f64() * 1e3;
        self.install(ctx, facts, source, arch.to_string(), &ptx, compile_ms)
    }

    /// [`KernelCache::ensure`] for several modules: those not loaded yet are
    /// compiled by NVRTC concurrently (one thread each; NVRTC programs are
    /// independent), then loaded one after another on this thread. The first
    /// error, in `names` order, is returned after every compilation ended.
    pub fn ensure_all(
        &mut self,
        ctx: &Arc<CudaContext>,
        facts: &DeviceFacts,
        arch: &str,
        names: &[&str],
    ) -> Result<()> {
        let mut missing = Vec::new();
        for &name in names {
            let source = kernels::module(name).ok_or_else(|| Error::InvalidArgument {
                op: "kernel cache",
                message: format!("no kernel module `{name}`"),
            })?;
            if !self.loaded.contains_key(source.name)
                && !missing
                    .iter()
                    .any(|m: &&ModuleSource| m.name == source.name)
            {
                missing.push(source);
            }
        }
        let compiled: Vec<(Result<String>, f64)> = std::thread::scope(|scope| {
            let handles: Vec<_> = missing
                .iter()
                .map(|&source| {
                    scope.spawn(move || {
                        let started = Instant::now();
                        let ptx = compile_module(source, arch);
                        (ptx, started.elapsed().as_secs_f64() * 1e3)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        (
                            Err(Error::InvalidArgument {
                                op: "kernel cache",
                                message: "an NVRTC compilation thread panicked".into(),
                            }),
                            0.0,
                        )
                    })
                })
                .collect()
        });
        for (source, (ptx, compile_ms)) in missing.into_iter().zip(compiled) {
            self.install(ctx, facts, source, arch.to_string(), &ptx?, compile_ms)?;
        }
        Ok(())
    }

    /// Counts one compilation of `source`, checks the PTX's target and loads it.
    fn install(
        &mut self,
        ctx: &Arc<CudaContext>,
        facts: &DeviceFacts,
        source: &'static ModuleSource,
        arch: String,
        ptx: &str,
        compile_ms: f64,
    ) -> Result<&'static str> {
        let after_prewarm = self.prewarmed.is_some();
        self.stats.compilations += 1;
        self.stats.compile_ms += compile_ms;
        if after_prewarm {
            self.stats.compiled_after_prewarm += 1;
        }
        let mut record = CompileRecord {
            module: source.name,
            arch,
            ptx_target: ptx_target(ptx).unwrap_or("(none)").to_string(),
            accepted: false,
            compile_ms,
            after_prewarm,
        };
        let started = Instant::now();
        let loaded = load_checked(ctx, facts, ptx);
        self.stats.load_ms += started.elapsed().as_secs_f64() * 1e3;
        match loaded {
            Ok(module) => {
                record.accepted = true;
                self.records.push(record);
                self.loaded.insert(
                    source.name,
                    Loaded {
                        module,
                        functions: BTreeMap::new(),
                    },
                );
                Ok(source.name)
            }
            Err(e) => {
                if matches!(e, Error::TargetMismatch { .. }) {
                    self.stats.refused += 1;
                }
                self.records.push(record);
                Err(e)
            }
        }
    }

    /// The kernel `symbol` of module `module`, compiling the module on first
    /// use. The symbol must be one the module declares in [`kernels::MODULES`].
    pub fn function(
        &mut self,
        ctx: &Arc<CudaContext>,
        facts: &DeviceFacts,
        arch: &str,
        module: &str,
        symbol: &str,
    ) -> Result<CudaFunction> {
        let name = self.ensure(ctx, facts, arch, module)?;
        self.used.insert(name);
        let declared = kernels::module(name)
            .and_then(|m| m.symbols.iter().copied().find(|s| *s == symbol))
            .ok_or_else(|| Error::InvalidArgument {
                op: "kernel cache",
                message: format!("module `{name}` declares no kernel `{symbol}`"),
            })?;
        let loaded = self
            .loaded
            .get_mut(name)
            .ok_or_else(|| Error::InvalidArgument {
                op: "kernel cache",
                message: format!("module `{name}` is not loaded"),
            })?;
        if let Some(f) = loaded.functions.get(declared) {
            return Ok(f.clone());
        }
        let f = loaded.module.load_function(declared)?;
        loaded.functions.insert(declared, f.clone());
        Ok(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_line_is_parsed() {
        let ptx = "//\n.version 9.0\n.target sm_90\n.address_size 64\n";
        assert_eq!(ptx_target(ptx), Some("sm_90"));
        assert_eq!(ptx_target(".target sm_75, debug\n"), Some("sm_75"));
        assert_eq!(ptx_target(".version 9.0\n"), None);
        assert!(check_target(ptx, "sm_90").is_ok());
        let older = check_target(".target sm_75\n", "sm_90");
        assert!(
            matches!(&older, Err(Error::TargetMismatch { ptx, device }) if ptx == "sm_75" && device == "sm_90"),
            "{older:?}"
        );
        assert!(check_target(".target sm_100\n", "sm_90").is_err());
        assert!(check_target(".target sm_90a\n", "sm_90").is_err());
        assert!(check_target("", "sm_90").is_err());
    }
}
