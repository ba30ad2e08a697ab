//! The kernel cache: NVRTC compilation for the device's own architecture
//! (a cubin for its `sm_XY`, so the driver does not JIT either), the target
//! check on every load, the on-disk cache of compiled modules, the counters
//! pre-warm is judged by, and the set of modules the code actually used.
//!
//! The driver loads PTX for an *older* architecture silently (it JIT-compiles it
//! up), so the cache itself refuses any code whose target is not exactly the
//! device's `sm_XY` — older and newer alike: the `.target` of PTX, the ELF
//! flags of a cubin. An entry on disk is loaded only when its header names
//! this module's source hash, this NVRTC and this architecture, its payload
//! has the length and hash the header states, and the payload's own target is
//! the device's; anything else is refused and compiled again.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::CString;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use cudarc::driver::{CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::{compile_ptx_with_opts, result as nvrtc, sys as nvrtc_sys};
use cudarc::nvrtc::{CompileError, CompileOptions, Ptx};

use super::context::{nvrtc_present, DeviceFacts};
use super::disk::{self, cubin_sm, DiskCache, EntryHeader, Format, Refusal};
use crate::error::{Error, Result};
use crate::kernels::{self, Compile, ModuleSource};

/// The virtual architecture [`crate::Faults::ptx_older_target`] compiles for (Turing):
/// older than every device this crate targets, and still accepted by NVRTC 13.
pub const OLDER_ARCH: &str = "compute_75";

/// The NVRTC options of `source` compiled for `arch`. They are part of the
/// disk cache's key, so a changed option never loads an old entry.
///
/// `-minimal` leaves out what no kernel here uses (texture and surface
/// types, the device runtime's `cuda*` functions, launches from device
/// code), so NVRTC's front end parses less: about 4 % of a cold pre-warm's
/// compile work, with every module's cubin byte for byte the same.
///
/// `--no-cache` keeps NVRTC (12.9 and later) away from the CUDA driver's
/// compute cache (`~/.nv/ComputeCache`), which it otherwise reads and
/// writes for every cubin. The kernel cache here is the one cache: its key
/// is checked entry by entry (F-PTX-001), NVRTC's is not. And NVRTC's costs
/// a cold compilation its write (measured slower through it; the book's
/// pre-warm history has the figures), and it made a cold pre-warm warm
/// unless the runner set `CUDA_CACHE_DISABLE=1`.
pub fn compile_options(source: &ModuleSource, arch: &str) -> Vec<String> {
    let mut options = vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".into(),
        "-minimal".into(),
        "--no-cache".into(),
    ];
    if source.compile == Compile::FastMin {
        options.push("--Ofast-compile=min".into());
    }
    options
}

/// Compiles `source` with NVRTC for the virtual architecture `arch`
/// (e.g. `compute_90`) and returns the PTX text. Errors (never panics) when
/// NVRTC cannot be loaded; a compile error keeps the NVRTC log.
pub fn compile_module(source: &ModuleSource, arch: &str) -> Result<String> {
    if !nvrtc_present() {
        return Err(Error::CudaUnavailable("NVRTC library not found".into()));
    }
    let opts = CompileOptions {
        options: compile_options(source, arch),
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
/// the PTX load path, also used to plant mismatched PTX.
pub fn load_checked(
    ctx: &Arc<CudaContext>,
    facts: &DeviceFacts,
    ptx: &str,
) -> Result<Arc<CudaModule>> {
    check_target(ptx, &facts.sm_arch())?;
    load_unchecked(ctx, &Payload::Ptx(ptx.to_string()))
}

/// Destroys an NVRTC program when dropped, also on an early return.
struct Program(nvrtc_sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: the program came from `create_program` and is destroyed
        // only here, once. A failure to free it leaves nothing to do.
        let _ = unsafe { nvrtc::destroy_program(self.0) };
    }
}

/// The text of `prog`'s compile log.
fn program_log(prog: &Program) -> Result<String> {
    // SAFETY: `prog` holds a live program (see `Program`).
    let raw = unsafe { nvrtc::get_program_log(prog.0) }?;
    let bytes: Vec<u8> = raw
        .iter()
        .map(|&c| c as u8)
        .take_while(|&b| b != 0)
        .collect();
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// Compiles `source` with NVRTC for the real architecture `arch` (e.g.
/// `sm_90`) and returns the cubin: SASS the driver loads without a JIT.
pub fn compile_cubin(source: &ModuleSource, arch: &str) -> Result<Vec<u8>> {
    compiled(source, &compile_options(source, arch), |prog, _| {
        let mut size = 0usize;
        // SAFETY: `prog` compiled successfully; NVRTC writes one usize.
        unsafe { nvrtc_sys::nvrtcGetCUBINSize(prog.0, &mut size) }.result()?;
        let mut cubin = vec![0u8; size];
        // SAFETY: `cubin` holds exactly the `size` bytes NVRTC said it writes.
        unsafe { nvrtc_sys::nvrtcGetCUBIN(prog.0, cubin.as_mut_ptr().cast()) }.result()?;
        Ok(cubin)
    })
}

/// What ptxas says of each kernel of `source` compiled for the real
/// architecture `arch` with [`compile_options`] (`--ptxas-options=-v`):
/// per entry function its registers, stack frame and spill bytes, as text.
pub fn ptxas_report(source: &ModuleSource, arch: &str) -> Result<String> {
    let mut options = compile_options(source, arch);
    options.push("--ptxas-options=-v".into());
    compiled(source, &options, |_, log| Ok(log))
}

/// `read` of `source` compiled with `options` and of NVRTC's log, while the
/// program lives; a compile error keeps the log.
fn compiled<T>(
    source: &ModuleSource,
    options: &[String],
    read: impl FnOnce(&Program, String) -> Result<T>,
) -> Result<T> {
    if !nvrtc_present() {
        return Err(Error::CudaUnavailable("NVRTC library not found".into()));
    }
    let text = |what: String| {
        CString::new(what).map_err(|_| Error::InvalidArgument {
            op: "kernel cache",
            message: format!("module `{}` contains a NUL byte", source.name),
        })
    };
    let src = text(source.source.to_string())?;
    let name = text(format!("{}.cu", source.name))?;
    let prog = Program(nvrtc::create_program(&src, Some(&name))?);
    // SAFETY: `prog` is live until dropped at the end of this function, and
    // `src` and `name`, which it may point into, outlive it (declared first).
    let failed = unsafe { nvrtc::compile_program(prog.0, options) }.is_err();
    let log = program_log(&prog)?;
    if failed {
        return Err(Error::Compile {
            module: source.name.to_string(),
            log,
        });
    }
    read(&prog, log)
}

/// Starts NVRTC on a thread of its own: one compilation of an empty kernel
/// for `sm_75`. A process's first NVRTC compilation pays a one-time start-up
/// (loading the compiler and its built-in headers: about 0.2 s on the GPU
/// runners' CPUs, where a cold pre-warm has 1 s), and a parallel pre-warm
/// pays it on every thread at once. [`super::GpuContext::new`] starts it
/// while the driver creates the context, so the two overlap. The result is
/// not needed: the real compilations report any error themselves.
pub fn start_nvrtc() -> NvrtcStart {
    if !nvrtc_present() {
        return NvrtcStart::default();
    }
    let warm_up = || {
        let empty = ModuleSource {
            name: "nvrtc_start",
            source: "extern \"C\" __global__ void nvrtc_start() {}",
            symbols: &["nvrtc_start"],
            compile: Compile::Optimised,
        };
        let _ = compile_cubin(&empty, "sm_75");
    };
    NvrtcStart(
        std::thread::Builder::new()
            .name("nvrtc-start".into())
            .spawn(warm_up)
            .ok(),
    )
}

/// The thread [`start_nvrtc`] started. Waited for before the first
/// compilation, and at the latest when dropped: the process must not exit
/// while NVRTC is still starting on it.
#[derive(Default)]
pub struct NvrtcStart(Option<JoinHandle<()>>);

impl NvrtcStart {
    /// Waits for the start-up to end, once; a panicked start-up only means
    /// the compilations start NVRTC themselves.
    fn wait(&mut self) {
        if let Some(thread) = self.0.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for NvrtcStart {
    fn drop(&mut self) {
        self.wait();
    }
}

/// NVRTC's (major, minor) version.
pub fn nvrtc_version() -> Result<(i32, i32)> {
    if !nvrtc_present() {
        return Err(Error::CudaUnavailable("NVRTC library not found".into()));
    }
    let (mut major, mut minor) = (0i32, 0i32);
    // SAFETY: nvrtcVersion writes one int through each valid pointer.
    unsafe { nvrtc_sys::nvrtcVersion(&mut major, &mut minor) }.result()?;
    Ok((major, minor))
}

/// Compiled code of one module.
#[derive(Debug, Clone, PartialEq)]
pub enum Payload {
    Ptx(String),
    Cubin(Vec<u8>),
}

impl Payload {
    /// Compiles `source` for `arch`: a cubin for `sm_XY`, PTX for `compute_XY`.
    pub fn compile(source: &ModuleSource, arch: &str) -> Result<Payload> {
        match Format::for_arch(arch) {
            Format::Ptx => compile_module(source, arch).map(Payload::Ptx),
            Format::Cubin => compile_cubin(source, arch).map(Payload::Cubin),
        }
    }

    /// The payload of an entry file of `format`; PTX must be UTF-8 text.
    pub fn from_bytes(format: Format, bytes: &[u8]) -> std::result::Result<Payload, Refusal> {
        match format {
            Format::Cubin => Ok(Payload::Cubin(bytes.to_vec())),
            Format::Ptx => String::from_utf8(bytes.to_vec())
                .map(Payload::Ptx)
                .map_err(|_| Refusal::NotAnEntry),
        }
    }

    pub fn bytes(&self) -> &[u8] {
        match self {
            Payload::Ptx(text) => text.as_bytes(),
            Payload::Cubin(bytes) => bytes,
        }
    }

    /// The architecture the code itself says it is for: the PTX `.target`,
    /// or `sm_N` from the cubin's ELF flags.
    pub fn target(&self) -> String {
        match self {
            Payload::Ptx(text) => ptx_target(text).unwrap_or("(no .target line)").to_string(),
            Payload::Cubin(bytes) => match cubin_sm(bytes) {
                Some(sm) => format!("sm_{sm}"),
                None => "(not a CUDA ELF file)".to_string(),
            },
        }
    }

    /// Ok when the code targets exactly `device_sm`, else
    /// [`Error::TargetMismatch`] naming both.
    pub fn check_target(&self, device_sm: &str) -> Result<()> {
        let target = self.target();
        if target == device_sm {
            Ok(())
        } else {
            Err(Error::TargetMismatch {
                ptx: target,
                device: device_sm.to_string(),
            })
        }
    }
}

/// Loads `payload` as it is: no target check (the callers make it).
fn load_unchecked(ctx: &Arc<CudaContext>, payload: &Payload) -> Result<Arc<CudaModule>> {
    match payload {
        Payload::Ptx(text) => {
            if text.contains('\0') {
                // cudarc turns the text into a C string; an interior NUL would panic there.
                return Err(Error::InvalidArgument {
                    op: "kernel cache",
                    message: "PTX text contains a NUL byte".into(),
                });
            }
            Ok(ctx.load_module(Ptx::from_src(text.as_str()))?)
        }
        Payload::Cubin(bytes) => Ok(ctx.load_module(Ptx::from_binary(bytes.clone()))?),
    }
}

/// Where a loaded module's code came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// NVRTC compiled it in this process.
    Compiled,
    /// Read from the on-disk cache.
    Disk,
}

/// One module the cache compiled or read from disk, and whether it loaded.
#[derive(Debug, Clone, PartialEq)]
pub struct CompileRecord {
    pub module: &'static str,
    /// The architecture asked of NVRTC, e.g. `sm_90` (or `compute_75`).
    pub arch: String,
    /// The target the code states: PTX `.target` or the cubin's ELF flags.
    pub target: String,
    pub origin: Origin,
    /// An entry on disk refused before this one was compiled, and why.
    pub refused_entry: Option<String>,
    /// Whether the load path accepted it (the target matched the device).
    pub accepted: bool,
    /// NVRTC time (zero for a disk entry).
    pub compile_ms: f64,
    /// Installed after [`KernelCache::mark_prewarmed`].
    pub after_prewarm: bool,
}

/// Counters of the cache since its last reset.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CacheStats {
    /// NVRTC compilations (accepted or refused).
    pub compilations: usize,
    /// Total NVRTC time.
    pub compile_ms: f64,
    /// Total `load_module` time (no JIT for a cubin; PTX is JIT-compiled).
    pub load_ms: f64,
    /// Compilations after pre-warm finished: zero in a well pre-warmed run.
    pub compiled_after_prewarm: usize,
    /// Modules loaded (compiled or read from disk) after pre-warm finished.
    pub loaded_after_prewarm: usize,
    /// Modules whose code the target check refused.
    pub refused: usize,
    /// Modules loaded from the on-disk cache.
    pub disk_hits: usize,
    /// Entries on disk refused (stale, torn, corrupted, wrong target).
    pub disk_refused: usize,
    /// Entries that could not be written (the module still loaded).
    pub disk_write_failures: usize,
}

struct Loaded {
    module: Arc<CudaModule>,
    functions: BTreeMap<&'static str, CudaFunction>,
}

/// What a module's code is loaded for: the device, the architecture asked
/// of NVRTC, and whether disk entries are checked.
pub struct Target<'a> {
    pub ctx: &'a Arc<CudaContext>,
    pub facts: &'a DeviceFacts,
    pub arch: &'a str,
    /// Load disk entries without checking header, length, hash or target
    /// (only under [`crate::Faults::disk_entries_trusted`]).
    pub trust_disk: bool,
}

/// A module's code, from disk or NVRTC, before it is loaded.
struct Fetched {
    payload: Payload,
    origin: Origin,
    refused_entry: Option<Refusal>,
    compile_ms: f64,
    write_failed: bool,
}

/// Compiled modules by name, with their counters. One per [`super::GpuContext`].
#[derive(Default)]
pub struct KernelCache {
    loaded: BTreeMap<&'static str, Loaded>,
    stats: CacheStats,
    records: Vec<CompileRecord>,
    used: BTreeSet<&'static str>,
    prewarmed: Option<BTreeSet<&'static str>>,
    disk: Option<DiskCache>,
    /// NVRTC's version, read on first need: part of every entry's key.
    nvrtc: Option<(i32, i32)>,
    /// The thread [`start_nvrtc`] started, waited for before the first
    /// compilation.
    nvrtc_start: NvrtcStart,
}

impl KernelCache {
    /// A cache that keeps compiled modules in `dir` (none: in memory only).
    pub fn new(dir: Option<PathBuf>) -> Self {
        KernelCache {
            disk: dir.map(DiskCache::new),
            ..KernelCache::default()
        }
    }

    /// This cache, with NVRTC being started by `started` (see [`start_nvrtc`]).
    pub fn with_nvrtc_start(mut self, started: NvrtcStart) -> Self {
        self.nvrtc_start = started;
        self
    }

    /// Drops every module, counter, record and the used / pre-warmed sets;
    /// the directory on disk stays, and so does what it holds.
    pub fn reset(&mut self) {
        let dir = self.disk.take();
        *self = KernelCache {
            disk: dir,
            nvrtc: self.nvrtc,
            nvrtc_start: std::mem::take(&mut self.nvrtc_start),
            ..KernelCache::default()
        };
    }

    /// The on-disk cache's directory, if there is one.
    pub fn dir(&self) -> Option<&std::path::Path> {
        self.disk.as_ref().map(DiskCache::dir)
    }

    /// Keeps compiled modules in `dir` from now on; returns the previous one.
    pub fn set_dir(&mut self, dir: Option<PathBuf>) -> Option<PathBuf> {
        let old = self.disk.take().map(|d| d.dir().to_path_buf());
        self.disk = dir.map(DiskCache::new);
        old
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

    /// Unloads `module` from memory (its disk entry stays).
    pub fn evict(&mut self, module: &str) -> bool {
        self.loaded.remove(module).is_some()
    }

    /// The modules pre-warm compiled, once it ran.
    pub fn prewarmed(&self) -> Option<&BTreeSet<&'static str>> {
        self.prewarmed.as_ref()
    }

    /// Records that pre-warm finished with `modules`; later compilations and
    /// loads count as `compiled_after_prewarm` / `loaded_after_prewarm`.
    pub fn mark_prewarmed(&mut self, modules: BTreeSet<&'static str>) {
        self.prewarmed = Some(modules);
        self.stats.compiled_after_prewarm = 0;
        self.stats.loaded_after_prewarm = 0;
    }

    /// The key (and header) of `module`'s entry compiled for `arch` by this NVRTC.
    pub fn entry_header(&mut self, module: &str, arch: &str) -> Result<EntryHeader> {
        let source = module_source(module)?;
        Ok(EntryHeader {
            format: Format::for_arch(arch),
            arch: arch.to_string(),
            nvrtc: self.nvrtc()?,
            source_hash: disk::source_hash(source.source, &compile_options(source, arch)),
        })
    }

    fn nvrtc(&mut self) -> Result<(i32, i32)> {
        if let Some(v) = self.nvrtc {
            return Ok(v);
        }
        let v = nvrtc_version()?;
        self.nvrtc = Some(v);
        Ok(v)
    }

    /// Loads `name` (from disk or NVRTC) unless it is loaded already.
    pub fn ensure(&mut self, target: &Target<'_>, name: &str) -> Result<&'static str> {
        self.ensure_all(target, &[name])?;
        Ok(module_source(name)?.name)
    }

    /// [`KernelCache::ensure`] for several modules: those not loaded yet are
    /// read from disk or compiled by NVRTC concurrently (`fetch_all`;
    /// NVRTC programs are independent), then loaded one after another on
    /// this thread. The first error, in `names` order, is returned after
    /// every thread ended.
    pub fn ensure_all(&mut self, target: &Target<'_>, names: &[&str]) -> Result<()> {
        let missing = self.missing(names)?;
        if missing.is_empty() {
            return Ok(());
        }
        let mut wanted = Vec::with_capacity(missing.len());
        for source in &missing {
            wanted.push(self.entry_header(source.name, target.arch)?);
        }
        let disk_holds_all = self.disk.as_ref().is_some_and(|disk| {
            missing
                .iter()
                .zip(&wanted)
                .all(|(source, header)| disk.holds(source.name, header))
        });
        if !disk_holds_all {
            // Waiting here keeps the start-up inside whatever times this
            // call when it has not finished yet. Where the disk holds every
            // module, nothing here needs NVRTC: no reason to wait.
            self.nvrtc_start.wait();
        }
        let device = target.facts.sm_arch();
        let fetched = fetch_all(
            &missing,
            &wanted,
            self.disk.as_ref(),
            target.trust_disk,
            &device,
        );
        for (source, fetched) in missing.into_iter().zip(fetched) {
            self.install(target, source, fetched?)?;
        }
        Ok(())
    }

    /// The sources of `names` not loaded yet, each once.
    fn missing(&self, names: &[&str]) -> Result<Vec<&'static ModuleSource>> {
        let mut missing: Vec<&'static ModuleSource> = Vec::new();
        for &name in names {
            let source = module_source(name)?;
            if !self.loaded.contains_key(source.name)
                && !missing.iter().any(|m| m.name == source.name)
            {
                missing.push(source);
            }
        }
        Ok(missing)
    }

    /// Counts and records one module, checks its target (unless it is a
    /// trusted disk entry) and loads it.
    fn install(
        &mut self,
        target: &Target<'_>,
        source: &'static ModuleSource,
        fetched: Fetched,
    ) -> Result<&'static str> {
        let after_prewarm = self.prewarmed.is_some();
        self.count(&fetched, after_prewarm);
        let mut record = CompileRecord {
            module: source.name,
            arch: target.arch.to_string(),
            target: fetched.payload.target(),
            origin: fetched.origin,
            refused_entry: fetched.refused_entry.as_ref().map(Refusal::to_string),
            accepted: false,
            compile_ms: fetched.compile_ms,
            after_prewarm,
        };
        let trusted = target.trust_disk && fetched.origin == Origin::Disk;
        let started = Instant::now();
        let loaded = if trusted {
            load_unchecked(target.ctx, &fetched.payload)
        } else {
            fetched
                .payload
                .check_target(&target.facts.sm_arch())
                .and_then(|()| load_unchecked(target.ctx, &fetched.payload))
        };
        self.stats.load_ms += started.elapsed().as_secs_f64() * 1e3;
        record.accepted = loaded.is_ok();
        self.records.push(record);
        match loaded {
            Ok(module) => {
                let functions = BTreeMap::new();
                self.loaded
                    .insert(source.name, Loaded { module, functions });
                Ok(source.name)
            }
            Err(e) => {
                if matches!(e, Error::TargetMismatch { .. }) {
                    self.stats.refused += 1;
                }
                Err(e)
            }
        }
    }

    fn count(&mut self, fetched: &Fetched, after_prewarm: bool) {
        let s = &mut self.stats;
        match fetched.origin {
            Origin::Compiled => {
                s.compilations += 1;
                s.compile_ms += fetched.compile_ms;
                s.compiled_after_prewarm += usize::from(after_prewarm);
            }
            Origin::Disk => s.disk_hits += 1,
        }
        s.loaded_after_prewarm += usize::from(after_prewarm);
        s.disk_refused += usize::from(fetched.refused_entry.is_some());
        s.disk_write_failures += usize::from(fetched.write_failed);
    }

    /// The kernel `symbol` of module `module`, loading the module on first
    /// use. The symbol must be one the module declares in [`kernels::MODULES`].
    pub fn function(
        &mut self,
        target: &Target<'_>,
        module: &str,
        symbol: &str,
    ) -> Result<CudaFunction> {
        let name = self.ensure(target, module)?;
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

fn module_source(name: &str) -> Result<&'static ModuleSource> {
    kernels::module(name).ok_or_else(|| Error::InvalidArgument {
        op: "kernel cache",
        message: format!("no kernel module `{name}`"),
    })
}

/// The payload of an entry file, if the entry is exactly `want` and its
/// code targets `device`; a trusting cache takes whatever the file holds.
pub fn accept_entry(
    bytes: &[u8],
    want: &EntryHeader,
    trust: bool,
    device: &str,
) -> std::result::Result<Payload, Refusal> {
    if trust {
        let (header, payload) = disk::decode_unchecked(bytes)?;
        return Payload::from_bytes(header.format, payload);
    }
    let payload = Payload::from_bytes(want.format, disk::decode(bytes, want)?)?;
    let found = payload.target();
    if found != device {
        return Err(Refusal::WrongTarget {
            found,
            device: device.to_string(),
        });
    }
    Ok(payload)
}

/// Reads or compiles each of `missing` (`wanted` holds their headers, in the
/// same order) on [`compile_threads`] threads, the longest compilation
/// first ([`kernels::COMPILE_COST_MS`]), and returns the results in
/// `missing`'s order.
///
/// Why a pool, and why that order: concurrent NVRTC compilations slow each
/// other down, so a bounded pool finishes the set sooner than a thread per
/// module (measured in the book's pre-warm history); and a pool's wall is
/// at least the start of its last long compilation plus its length, so the
/// long ones start first and the short ones fill the gaps.
fn fetch_all(
    missing: &[&'static ModuleSource],
    wanted: &[EntryHeader],
    disk: Option<&DiskCache>,
    trust: bool,
    device: &str,
) -> Vec<Result<Fetched>> {
    let mut order: Vec<usize> = (0..missing.len()).collect();
    // Stable: equal costs keep the caller's order.
    order.sort_by_key(|&i| std::cmp::Reverse(kernels::compile_cost_ms(missing[i].name)));
    let next = AtomicUsize::new(0);
    let mut results: Vec<Option<Result<Fetched>>> = missing.iter().map(|_| None).collect();
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..compile_threads(missing.len()))
            .map(|_| {
                scope.spawn(|| {
                    let mut done = Vec::new();
                    while let Some(&i) = order.get(next.fetch_add(1, Ordering::Relaxed)) {
                        done.push((i, fetch(missing[i], &wanted[i], disk, trust, device)));
                    }
                    done
                })
            })
            .collect();
        for worker in workers {
            // A panicked worker's modules stay `None`: reported below.
            for (i, result) in worker.join().unwrap_or_default() {
                results[i] = Some(result);
            }
        }
    });
    results
        .into_iter()
        .map(|r| {
            r.unwrap_or_else(|| {
                Err(Error::InvalidArgument {
                    op: "kernel cache",
                    message: "a kernel compilation thread panicked".into(),
                })
            })
        })
        .collect()
}

/// Threads for compiling `modules` modules at once: five eighths of the CPUs
/// this process may use (10 of the GPU runners' 16), rounded up, and no more
/// than there are modules.
fn compile_threads(modules: usize) -> usize {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cpus * 5).div_ceil(8).clamp(1, modules.max(1))
}

/// `source`'s code: its disk entry when one is there and acceptable, else
/// NVRTC's, written to disk when its target is the device's.
fn fetch(
    source: &ModuleSource,
    want: &EntryHeader,
    disk: Option<&DiskCache>,
    trust: bool,
    device: &str,
) -> Result<Fetched> {
    let mut refused_entry = None;
    if let Some(bytes) = disk
        .map(|d| d.read(source.name, want))
        .transpose()?
        .flatten()
    {
        match accept_entry(&bytes, want, trust, device) {
            Ok(payload) => {
                return Ok(Fetched {
                    payload,
                    origin: Origin::Disk,
                    refused_entry: None,
                    compile_ms: 0.0,
                    write_failed: false,
                })
            }
            Err(refusal) => refused_entry = Some(refusal),
        }
    }
    let started = Instant::now();
    let payload = Payload::compile(source, &want.arch)?;
    let compile_ms = started.elapsed().as_secs_f64() * 1e3;
    let mut write_failed = false;
    if let Some(disk) = disk.filter(|_| payload.target() == device) {
        if let Err(e) = disk.write(source.name, want, payload.bytes()) {
            log::warn!("kernel cache: {e}");
            write_failed = true;
        }
    }
    Ok(Fetched {
        payload,
        origin: Origin::Compiled,
        refused_entry,
        compile_ms,
        write_failed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compile_threads_stay_between_one_and_the_module_count() {
        assert_eq!(compile_threads(0), 1);
        assert_eq!(compile_threads(1), 1);
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert!((1..=cpus).contains(&compile_threads(1000)));
    }

    #[test]
    fn nvrtc_never_uses_the_drivers_compute_cache() {
        // A cold pre-warm must compile, whatever the runner's environment.
        for source in kernels::MODULES {
            for arch in ["sm_90", "compute_90"] {
                let options = compile_options(source, arch);
                assert!(
                    options.iter().any(|o| o == "--no-cache"),
                    "{}: {options:?}",
                    source.name
                );
            }
        }
    }

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

    fn cubin_header() -> EntryHeader {
        EntryHeader {
            format: Format::Cubin,
            arch: "sm_90".into(),
            nvrtc: (13, 0),
            source_hash: 42,
        }
    }

    /// An ELF64 header of a CUDA cubin for `sm_90`.
    fn sm90_cubin() -> Vec<u8> {
        let mut b = vec![0u8; 64];
        b[..4].copy_from_slice(b"\x7fELF");
        b[4] = 2;
        b[5] = 1;
        b[18..20].copy_from_slice(&190u16.to_le_bytes());
        b[48..52].copy_from_slice(&0x005a_055au32.to_le_bytes());
        b
    }

    #[test]
    fn only_an_entry_of_this_key_and_target_is_accepted() {
        let want = cubin_header();
        let good = disk::encode(&want, &sm90_cubin()).unwrap();
        let payload = accept_entry(&good, &want, false, "sm_90").unwrap();
        assert_eq!(payload, Payload::Cubin(sm90_cubin()));
        assert_eq!(payload.target(), "sm_90");
        assert!(payload.check_target("sm_90").is_ok());
        assert!(matches!(
            payload.check_target("sm_100"),
            Err(Error::TargetMismatch { ptx, device }) if ptx == "sm_90" && device == "sm_100"
        ));

        // Right key, wrong code: the header lies about what the payload is for.
        let ptx75 = ".version 8.0\n.target sm_75\n.address_size 64\n";
        let lying = disk::encode(&want, ptx75.as_bytes()).unwrap();
        assert_eq!(
            accept_entry(&lying, &want, false, "sm_90"),
            Err(Refusal::WrongTarget {
                found: "(not a CUDA ELF file)".into(),
                device: "sm_90".into()
            })
        );

        // Another architecture's PTX (a stale entry planted at this key's path).
        let stale_header = EntryHeader {
            format: Format::Ptx,
            arch: OLDER_ARCH.into(),
            ..cubin_header()
        };
        let stale = disk::encode(&stale_header, ptx75.as_bytes()).unwrap();
        assert!(matches!(
            accept_entry(&stale, &want, false, "sm_90"),
            Err(Refusal::Stale {
                field: "format",
                ..
            })
        ));
        // A trusting cache takes it as the PTX it says it is.
        assert_eq!(
            accept_entry(&stale, &want, true, "sm_90"),
            Ok(Payload::Ptx(ptx75.into()))
        );

        let older_nvrtc = EntryHeader {
            nvrtc: (12, 8),
            ..cubin_header()
        };
        let stale = disk::encode(&older_nvrtc, &sm90_cubin()).unwrap();
        assert!(matches!(
            accept_entry(&stale, &want, false, "sm_90"),
            Err(Refusal::Stale { field: "nvrtc", .. })
        ));
    }

    #[test]
    fn reset_keeps_the_directory() {
        let mut cache = KernelCache::new(Some(PathBuf::from("/tmp/kernels")));
        cache.stats.compilations = 3;
        cache.reset();
        assert_eq!(cache.stats().compilations, 0);
        assert_eq!(cache.dir(), Some(std::path::Path::new("/tmp/kernels")));
        assert_eq!(cache.set_dir(None), Some(PathBuf::from("/tmp/kernels")));
        assert_eq!(cache.dir(), None);
    }
}
