//! The driver observer on a real GPU, in one run: every kind of event and every
//! injection, each expectation checked.
//!
//! A program of its own (cudarc's driver API and NVRTC, nothing of the stack)
//! loads modules (PTX for the device, PTX for an older target, a cubin for the
//! device), allocates, uploads, launches, captures two launches into a graph,
//! replays it three times and reads back; then, in a second region, the three
//! driver-level mutants are armed and a capture is broken by the injected sync.
//!
//! Prints the CUPTI library it loaded, every event, one `ok`/`FAIL` line per
//! expectation and a last line of JSON; exits 0 when every expectation holds,
//! 1 when one fails, 2 when the run itself could not go on.

use std::error::Error;
use std::ffi::CString;
use std::process::ExitCode;
use std::sync::Arc;

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::{self, CompileOptions, Ptx};
use falsify_observer::{
    Action, CuResult, Direction, DriverObserver, Event, EventKind, Injection, Recording, Sm,
};
use serde_json::json;

type Fallible<T> = Result<T, Box<dyn Error>>;

const KERNEL: &str = r#"
extern "C" __global__ void scale(float *x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= a;
}"#;

/// Elements of the "model": its bytes are the upload.
const N: usize = 1 << 16;
const MODEL_BYTES: u64 = (N * std::mem::size_of::<f32>()) as u64;
const CAPTURE_MODE: CUstreamCaptureMode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;

#[derive(Default)]
struct Checks {
    results: Vec<(String, bool)>,
}

impl Checks {
    fn check(&mut self, name: &str, ok: bool, detail: impl std::fmt::Display) {
        println!("{} {name}: {detail}", if ok { "ok  " } else { "FAIL" });
        self.results.push((name.to_string(), ok));
    }

    fn all_ok(&self) -> bool {
        self.results.iter().all(|(_, ok)| *ok)
    }
}

/// The code the program loads.
struct Code {
    device_ptx: Ptx,
    older_ptx: Ptx,
    older: Sm,
    cubin: Vec<u8>,
}

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            println!("SMOKE FAILED");
            ExitCode::from(1)
        }
        Err(e) => {
            println!("SMOKE ERROR: {e}");
            ExitCode::from(2)
        }
    }
}

fn run() -> Fallible<bool> {
    let observer = DriverObserver::attach()?;
    let library = observer.library();
    println!(
        "cupti: {} (opened as {})",
        library.path.display(),
        library.opened_as
    );
    println!("unobserved callback ids: {:?}", observer.unobserved_calls());
    let module_loading = std::env::var("CUDA_MODULE_LOADING").unwrap_or_default();
    println!("CUDA_MODULE_LOADING={module_loading:?}");
    let ctx = CudaContext::new(0)?;
    // SAFETY: called before any stream is made; the program synchronises
    // explicitly (stream capture fails with event tracking on).
    unsafe { ctx.disable_event_tracking() };
    let (major, minor) = ctx.compute_capability()?;
    let device = Sm::new(major.try_into()?, minor.try_into()?);
    println!("device: {} ({device})", ctx.name()?);
    let stream = ctx.new_stream()?;
    let code = compile(device)?;
    let mut checks = Checks::default();
    let main = main_region(&observer, &ctx, &stream, &code, device, &mut checks)?;
    let mutants = mutant_region(&observer, &ctx, &stream, &code, device, &mut checks)?;
    let summary = json!({
        "smoke": "falsify-observer",
        "ok": checks.all_ok(),
        "cupti": library.path.display().to_string(),
        "device": device.to_string(),
        "failed": checks.results.iter().filter(|(_, ok)| !ok).map(|(n, _)| n).collect::<Vec<_>>(),
        "checks": checks.results.len(),
        "events": [main.events.len(), mutants.events.len()],
        "injections": mutants.injections.iter().map(|r| json!({
            "injection": r.injection,
            "trigger_seq": r.trigger_seq,
            "call": r.call,
        })).collect::<Vec<_>>(),
    });
    println!("{summary}");
    Ok(checks.all_ok())
}

/// NVRTC: PTX for the device, PTX for an older target, and a cubin for the
/// device (whose ELF header is printed: it settles the e_flags layout).
fn compile(device: Sm) -> Fallible<Code> {
    let ptx = |arch: Sm| {
        let arch: &'static str = format!("compute_{}", arch.number()).leak();
        let options = CompileOptions {
            arch: Some(arch),
            ..Default::default()
        };
        nvrtc::compile_ptx_with_opts(KERNEL, options)
    };
    // NVRTC 13 compiles nothing older than compute_75.
    let older = if device > Sm::new(7, 5) {
        Sm::new(7, 5)
    } else {
        device.older()
    };
    let code = Code {
        device_ptx: ptx(device)?,
        older_ptx: ptx(older)?,
        older,
        cubin: cubin(device)?,
    };
    let header = &code.cubin[..64.min(code.cubin.len())];
    let flags = u32::from_le_bytes(header[48..52].try_into()?);
    println!(
        "cubin: {} bytes, EI_OSABI {:#x}, EI_ABIVERSION {}, e_flags {flags:#010x}, read as {:?}",
        code.cubin.len(),
        header[7],
        header[8],
        falsify_observer::image::cubin_sm(header)
    );
    Ok(code)
}

fn cubin(device: Sm) -> Fallible<Vec<u8>> {
    let source = CString::new(KERNEL)?;
    let program = nvrtc::result::create_program(&source, None)?;
    let arch = format!("--gpu-architecture=sm_{}", device.number());
    // SAFETY: `program` was just created and is destroyed once, below.
    let compiled = unsafe { nvrtc::result::compile_program(program, &[arch.as_str()]) };
    let mut size = 0usize;
    // SAFETY: as above; `size` is a valid out-pointer.
    let sized = unsafe { nvrtc::sys::nvrtcGetCUBINSize(program, &mut size) };
    let mut bytes = vec![0u8; size];
    // SAFETY: as above; `bytes` has the size NVRTC gave.
    let got = unsafe { nvrtc::sys::nvrtcGetCUBIN(program, bytes.as_mut_ptr().cast()) };
    // SAFETY: as above.
    unsafe { nvrtc::result::destroy_program(program) }?;
    compiled?;
    sized.result()?;
    got.result()?;
    Ok(bytes)
}

fn launch(
    stream: &Arc<CudaStream>,
    f: &CudaFunction,
    x: &mut CudaSlice<f32>,
    a: f32,
) -> Fallible<()> {
    let n = N as i32;
    let mut builder = stream.launch_builder(f);
    builder.arg(x).arg(&a).arg(&n);
    // SAFETY: `scale(float*, float, int)` gets a buffer of `n` floats.
    unsafe { builder.launch(LaunchConfig::for_num_elems(N as u32)) }?;
    Ok(())
}

fn print_events(name: &str, recording: &Recording) {
    println!("--- {name}: {} events", recording.events.len());
    for e in &recording.events {
        let result = e.result.map_or("-".to_string(), |r| r.to_string());
        let kind = serde_json::to_string(&e.kind).unwrap_or_default();
        println!(
            "{:>4} {:<30} {:<40} capture={}/{} {:?} {kind}",
            e.seq, e.api, result, e.capture.open, e.capture.on_capturing_stream, e.origin
        );
    }
}

fn main_region(
    observer: &DriverObserver,
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    code: &Code,
    device: Sm,
    checks: &mut Checks,
) -> Fallible<Recording> {
    let host: Vec<f32> = (0..N).map(|i| (i % 7) as f32 + 1.0).collect();
    observer.start(Vec::new())?;
    observer.mark("load")?;
    let module = ctx.load_module(code.device_ptx.clone())?;
    let _older = ctx.load_module(code.older_ptx.clone())?;
    let _cubin = ctx.load_module(Ptx::from_binary(code.cubin.clone()))?;
    let f = module.load_function("scale")?;
    observer.mark("upload")?;
    let mut x = stream.clone_htod(&host)?;
    stream.synchronize()?;
    observer.mark("step")?;
    launch(stream, &f, &mut x, 2.0)?;
    stream.synchronize()?;
    observer.mark("capture")?;
    stream.begin_capture(CAPTURE_MODE)?;
    launch(stream, &f, &mut x, 2.0)?;
    launch(stream, &f, &mut x, 2.0)?;
    let graph = stream
        .end_capture(CUgraphInstantiate_flags(0))?
        .ok_or("the capture made no graph")?;
    observer.mark("replay")?;
    for _ in 0..3 {
        graph.launch()?;
    }
    stream.synchronize()?;
    observer.mark("readback")?;
    let back = stream.clone_dtoh(&x)?;
    stream.synchronize()?;
    let recording = observer.stop()?;
    print_events("main region", &recording);
    let right = back.iter().zip(&host).all(|(b, h)| *b == h * 128.0);
    checks.check("kernel_results", right, "x * 2 * (2 * 2)^3 read back");
    check_loads(&recording, device, code.older, checks);
    check_upload(&recording, checks);
    check_capture(&recording, checks);
    Ok(recording)
}

fn check_loads(recording: &Recording, device: Sm, older: Sm, checks: &mut Checks) {
    let loads = recording.loaded_targets();
    let images: Vec<&str> = loads.iter().map(|l| l.image.as_str()).collect();
    let expected = [
        format!("PTX {device}"),
        format!("PTX {older}"),
        format!("cubin {device}"),
    ];
    let all_ok = loads.iter().all(|l| l.result == Some(CuResult::SUCCESS));
    checks.check(
        "module_images",
        images == expected && all_ok,
        format!("{images:?}"),
    );
    let mismatches = recording.target_mismatches(device);
    let found: Vec<String> = mismatches.iter().map(ToString::to_string).collect();
    let only_older = mismatches.len() == 1 && mismatches[0].found == format!("PTX {older}");
    checks.check(
        "target_mismatch_is_the_older_ptx",
        only_older,
        format!("{found:?}"),
    );
    let jit: Vec<u64> = recording.jit_loads(device).iter().map(|e| e.seq).collect();
    let jit_ok = jit.len() == 2
        && jit
            .iter()
            .all(|&s| loads.iter().take(2).any(|l| l.seq == s));
    checks.check("jit_loads_are_the_two_ptx", jit_ok, format!("{jit:?}"));
    let loaded: Vec<String> = recording
        .events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ModuleLoaded {
                cubin, module_id, ..
            } => Some(format!("{module_id}:{cubin:?}")),
            _ => None,
        })
        .collect();
    checks.check(
        "module_loaded_notifications",
        !loaded.is_empty(),
        format!("{loaded:?}"),
    );
}

fn check_upload(recording: &Recording, checks: &mut Checks) {
    let upload = recording.upload_point(MODEL_BYTES);
    let is_copy = upload.is_some_and(|e| e.api.starts_with("cuMemcpyHtoD"));
    let seq = upload.map(|e| e.seq);
    checks.check(
        "upload_point",
        is_copy,
        format!("{:?}", upload.map(|e| (&e.api, e.seq))),
    );
    let after: Vec<&Event> = seq.map(|s| recording.loads_after(s)).unwrap_or_default();
    let api_loads = after
        .iter()
        .filter(|e| matches!(e.kind, EventKind::ModuleLoad { .. }))
        .count();
    let notes = after.len() - api_loads;
    checks.check(
        "no_load_after_upload",
        seq.is_some() && api_loads == 0,
        format!("{api_loads} load calls, {notes} module-loaded notifications after it"),
    );
    let allocated = recording.bytes_allocated();
    checks.check(
        "allocated",
        allocated >= MODEL_BYTES,
        format!("{allocated} bytes"),
    );
    let h2d = recording.bytes_copied(Direction::HostToDevice);
    checks.check("h2d_bytes", h2d == MODEL_BYTES, format!("{h2d} bytes"));
    let d2h = recording.bytes_copied(Direction::DeviceToHost);
    checks.check("d2h_bytes", d2h == MODEL_BYTES, format!("{d2h} bytes"));
    let unanswered = recording
        .events
        .iter()
        .filter(|e| {
            !matches!(
                e.kind,
                EventKind::Marker { .. } | EventKind::ModuleLoaded { .. }
            )
        })
        .filter(|e| e.result.is_none())
        .count();
    checks.check(
        "every_call_has_its_result",
        unanswered == 0,
        format!("{unanswered} without"),
    );
    let faults = recording.callback_faults;
    checks.check("no_callback_faults", faults == 0, faults);
}

fn check_capture(recording: &Recording, checks: &mut Checks) {
    let captures = recording.captures();
    let one = captures.len() == 1 && captures[0].succeeded();
    let replays = captures
        .first()
        .map(|c| (c.launches, c.failed_launches, c.syncs_inside));
    checks.check(
        "capture_succeeded",
        one,
        format!("{} captures", captures.len()),
    );
    checks.check(
        "replays_counted",
        replays == Some((3, 0, 0)),
        format!("{replays:?}"),
    );
    let graph_launches = recording.graph_launches().len();
    checks.check("graph_launches", graph_launches == 3, graph_launches);
    let launches = recording.kernel_launches();
    let named = launches.iter().all(
        |e| matches!(&e.kind, EventKind::KernelLaunch { name: Some(n), .. } if n.contains("scale")),
    );
    let captured = launches
        .iter()
        .filter(|e| e.capture.on_capturing_stream)
        .count();
    let detail = format!("{} launches, {captured} inside the capture", launches.len());
    checks.check(
        "kernel_launches",
        launches.len() == 3 && named && captured == 2,
        detail,
    );
    let inside = recording.syncs_inside_capture().len() + recording.dtoh_inside_capture().len();
    checks.check("nothing_syncs_inside_the_capture", inside == 0, inside);
    let steps = recording.host_syncs_per_step();
    let per_step: Vec<String> = steps
        .iter()
        .map(|s| {
            format!(
                "{}={}+{}",
                s.label, s.host_syncs, s.host_syncs_inside_capture
            )
        })
        .collect();
    let synced = |label: &str| steps.iter().any(|s| s.label == label && s.host_syncs >= 1);
    let ok = synced("replay")
        && synced("readback")
        && steps.iter().all(|s| s.host_syncs_inside_capture == 0);
    checks.check("host_syncs_per_step", ok, per_step.join(" "));
}

fn mutant_region(
    observer: &DriverObserver,
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    code: &Code,
    device: Sm,
    checks: &mut Checks,
) -> Fallible<Recording> {
    let host: Vec<f32> = vec![1.0; N];
    let armed = vec![
        Injection::older_target(device),
        Injection::module_after_upload(MODEL_BYTES, device),
        Injection::sync_inside_capture(),
    ];
    observer.start(armed)?;
    let module = ctx.load_module(code.device_ptx.clone())?;
    let f = module.load_function("scale")?;
    let mut x = stream.clone_htod(&host)?;
    stream.synchronize()?;
    stream.begin_capture(CAPTURE_MODE)?;
    let launched = launch(stream, &f, &mut x, 2.0);
    let ended = stream.end_capture(CUgraphInstantiate_flags(0));
    observer.inject_now(Action::LoadModule {
        target: device.older(),
    })?;
    let recording = observer.stop()?;
    print_events("mutant region", &recording);
    println!(
        "launch inside the broken capture: {:?}",
        launched.err().map(|e| e.to_string())
    );
    checks.check(
        "broken_capture_fails_to_end",
        ended.is_err(),
        format!("{:?}", ended.err()),
    );
    check_mutants(&recording, device, checks);
    Ok(recording)
}

fn check_mutants(recording: &Recording, device: Sm, checks: &mut Checks) {
    check_fired(recording, checks);
    check_caught(recording, device, checks);
}

/// Every armed injection fired and made its call; how CUPTI reported it.
fn check_fired(recording: &Recording, checks: &mut Checks) {
    let reports = &recording.injections;
    for (i, name) in [
        "older_target",
        "module_after_upload",
        "sync_inside_capture",
        "inject_now",
    ]
    .iter()
    .enumerate()
    {
        let call = reports.get(i).and_then(|r| r.call.as_ref());
        let detail = call.map_or("never fired".to_string(), |c| {
            format!(
                "{} -> {}, reported by CUPTI: {}",
                c.api, c.result, c.reported_by_cupti
            )
        });
        checks.check(&format!("mutant_{name}_fired"), call.is_some(), detail);
    }
}

/// The analyses catch every mutant.
fn check_caught(recording: &Recording, device: Sm, checks: &mut Checks) {
    let reports = &recording.injections;
    let injected_older = recording
        .target_mismatches(device)
        .iter()
        .filter(|m| m.found == format!("PTX {}", device.older()))
        .count();
    checks.check(
        "older_target_is_a_mismatch",
        injected_older >= 2,
        format!("{injected_older} found"),
    );
    let upload = recording.upload_point(MODEL_BYTES).map(|e| e.seq);
    let fired_at = reports.get(1).and_then(|r| r.trigger_seq);
    let after = upload.map(|s| recording.loads_after(s)).unwrap_or_default();
    let loads_after = after
        .iter()
        .filter(|e| matches!(e.kind, EventKind::ModuleLoad { .. }))
        .count();
    let detail = format!("upload at {upload:?}, fired at {fired_at:?}, {loads_after} loads after");
    checks.check(
        "load_after_upload_is_seen",
        upload == fired_at && loads_after >= 1,
        detail,
    );
    let syncs = recording.syncs_inside_capture();
    let refused = syncs.iter().any(|e| e.is_injected() && e.failed());
    checks.check(
        "sync_inside_capture_is_seen",
        refused,
        format!("{} syncs inside", syncs.len()),
    );
    let captures = recording.captures();
    let broken = captures
        .first()
        .map(|c| (c.succeeded(), c.end_result, c.syncs_inside));
    let ok = matches!(broken, Some((false, Some(r), 1..)) if !r.is_success());
    checks.check("capture_broken_by_the_sync", ok, format!("{broken:?}"));
    let direct = reports
        .get(3)
        .and_then(|r| r.call.as_ref())
        .is_some_and(|c| c.reported_by_cupti);
    checks.check(
        "direct_injection_reported_by_cupti",
        direct,
        "inject_now outside callbacks",
    );
    let faults = recording.callback_faults;
    checks.check("no_callback_faults_with_mutants", faults == 0, faults);
}
