//! The driver observer around one aprender-train session, as the core's
//! observer kinds will run it (a region around `prepare`, a marker
//! "prepared", a marker "step i" before each step), with what this subject
//! predicts printed beside what the driver did:
//!
//! - the upload point: host-to-device bytes before the first layer's first
//!   copy (predicted 0), the copy at which they reach `upload_bytes`
//!   (predicted: the last layer's replicated V bias, 4·S·kv bytes) and the
//!   copy after it;
//! - every module load after the upload point, with the step it fell in;
//! - per step: host-to-device, device-to-host bytes (predicted 4·S per
//!   train_step), host syncs outside and inside captures, allocations,
//!   graph launches; every capture.
//!
//! ```text
//! HOME=$(mktemp -d) CUDA_GRAPH=1 observe qwen2-tiny-4l 12 --json $OUT/rec.json 2> $OUT/stderr.txt
//! ```
//!
//! Exit status: 0 ran, 2 the subject left the GPU or CUPTI is missing, 1 otherwise.

use std::error::Error;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use falsify_aprender_train::{upload_bytes, Error as SubjectError, Session, Setup};
use falsify_observer::{Direction, DriverObserver, Event, EventKind, Recording, Sm};

type Fallible<T> = Result<T, Box<dyn Error>>;

#[derive(Parser)]
#[command(about = "Observe one aprender-train session at the driver level")]
struct Args {
    model: String,
    steps: usize,
    #[arg(long, default_value_t = 1)]
    batch: usize,
    #[arg(long)]
    seq_len: Option<usize>,
    #[arg(long)]
    lr: Option<f64>,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// The device's architecture, for the target check.
    #[arg(long, default_value = "sm_90")]
    sm: String,
    /// Write the whole recording here as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            println!("error={error}");
            let left_gpu = matches!(
                error.downcast_ref::<SubjectError>(),
                Some(SubjectError::CpuFallback | SubjectError::NoNvidiaSmi)
            );
            let no_cupti = error
                .downcast_ref::<falsify_observer::ObserverError>()
                .is_some();
            ExitCode::from(if left_gpu || no_cupti { 2 } else { 1 })
        }
    }
}

fn run(args: &Args) -> Fallible<()> {
    let setup = Setup {
        model: args.model.clone(),
        batch: args.batch,
        seq_len: args.seq_len,
        graph: std::env::var("CUDA_GRAPH").as_deref() == Ok("1"),
        steps: args.steps,
        seed: args.seed,
        learning_rate: args.lr,
    };
    let run = setup.resolve()?;
    let device = Sm::parse(&args.sm).ok_or("--sm: expected sm_XY")?;
    let observer = DriverObserver::attach()?;
    println!("cupti={}", observer.library().path.display());
    observer.start(Vec::new())?;
    let recording = record(&observer, &setup);
    let recording = match recording {
        Ok(()) => observer.stop()?,
        Err(error) => {
            observer.stop()?;
            return Err(error);
        }
    };
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec(&recording)?)?;
    }
    let shape = run.shape;
    let first_copy = 4 * shape.hidden as u64;
    let last_copy = 4 * (run.seq_len * shape.kv_dim()) as u64;
    print_upload(&recording, upload_bytes(&setup)?, first_copy, last_copy);
    print_loads_and_targets(&recording, upload_bytes(&setup)?, device);
    print_steps(&recording);
    Ok(())
}

fn record(observer: &DriverObserver, setup: &Setup) -> Fallible<()> {
    let prepared = Session::prepare(setup);
    observer.mark("prepared")?;
    let mut session = prepared?;
    for step in 1..=setup.steps {
        observer.mark(format!("step {step}"))?;
        let loss = session.step()?;
        println!("step={step} loss={loss:.6}");
    }
    Ok(())
}

fn h2d_copies(recording: &Recording) -> Vec<(&Event, u64)> {
    recording
        .events()
        .iter()
        .filter(|e| !e.failed())
        .filter_map(|e| match e.kind {
            EventKind::Copy {
                direction: Direction::HostToDevice,
                bytes,
                ..
            } => Some((e, bytes)),
            _ => None,
        })
        .collect()
}

fn print_upload(recording: &Recording, model_bytes: u64, first_copy: u64, last_copy: u64) {
    let copies = h2d_copies(recording);
    let before: u64 = copies
        .iter()
        .take_while(|(_, bytes)| *bytes != first_copy)
        .map(|(_, bytes)| bytes)
        .sum();
    println!("upload h2d_bytes_before_first_layer_copy={before} predicted=0");
    let Some(point) = recording.upload_point(model_bytes) else {
        println!("upload point=none model_bytes={model_bytes}");
        return;
    };
    let at = copies.iter().position(|(e, _)| e.seq == point.seq);
    let cumulative: u64 = copies[..=at.unwrap_or(0)].iter().map(|(_, b)| b).sum();
    let size = |i: usize| copies.get(i).map_or(0, |(_, bytes)| *bytes);
    println!(
        "upload point_seq={} cumulative={cumulative} model_bytes={model_bytes} \
         point_copy_bytes={} predicted={last_copy} next_copy_bytes={}",
        point.seq,
        at.map_or(0, size),
        at.map_or(0, |i| size(i + 1))
    );
}

fn step_of(recording: &Recording, seq: u64) -> String {
    recording
        .markers()
        .iter()
        .rev()
        .find(|m| m.seq < seq)
        .and_then(|m| match &m.kind {
            EventKind::Marker { label } => Some(label.clone()),
            _ => None,
        })
        .unwrap_or_else(|| "before prepared".into())
}

fn print_loads_and_targets(recording: &Recording, model_bytes: u64, device: Sm) {
    let point = recording
        .upload_point(model_bytes)
        .map_or(u64::MAX, |e| e.seq);
    let loads = recording.loads_after(point);
    println!("loads_after_upload count={}", loads.len());
    for load in loads {
        let image = match &load.kind {
            EventKind::ModuleLoad { image, .. } | EventKind::LinkInput { image, .. } => {
                image.describe()
            }
            EventKind::ModuleLoaded { cubin, .. } => format!("loaded cubin {cubin:?}"),
            _ => String::new(),
        };
        let step = step_of(recording, load.seq);
        println!(
            "load_after_upload seq={} api={} in=\"{step}\" {image}",
            load.seq, load.api
        );
    }
    let total = recording.loaded_targets().len();
    let mismatches = recording.target_mismatches(device);
    println!("targets loads={total} mismatches={}", mismatches.len());
    for mismatch in mismatches {
        println!("target_mismatch {mismatch}");
    }
}

fn print_steps(recording: &Recording) {
    let markers = recording.markers();
    let first = markers.first().map_or(u64::MAX, |m| m.seq);
    print_region(recording, "prepare", None, first);
    for (i, marker) in markers.iter().enumerate() {
        let end = markers.get(i + 1).map_or(u64::MAX, |m| m.seq);
        print_region(recording, step_label(marker), Some(marker.seq), end);
    }
    for capture in recording.captures() {
        println!(
            "capture begin_seq={} in=\"{}\" succeeded={} launches={} syncs_inside={} end={:?}",
            capture.begin_seq,
            step_of(recording, capture.begin_seq),
            capture.succeeded(),
            capture.launches,
            capture.syncs_inside,
            capture.end_result.map(|r| r.to_string())
        );
    }
}

/// The events after `after` (from the start when `None`) and before `end`.
fn print_region(recording: &Recording, label: &str, after: Option<u64>, end: u64) {
    let inside = |e: &&Event| after.is_none_or(|a| e.seq > a) && e.seq < end;
    let events: Vec<&Event> = recording.events().iter().filter(inside).collect();
    let bytes = |d: Direction| -> u64 {
        events
            .iter()
            .filter(|e| !e.failed())
            .filter_map(|e| match e.kind {
                EventKind::Copy {
                    direction, bytes, ..
                } if direction == d => Some(bytes),
                _ => None,
            })
            .sum()
    };
    let count = |keep: &dyn Fn(&Event) -> bool| events.iter().filter(|e| keep(e)).count();
    println!(
        "region label=\"{label}\" h2d_bytes={} d2h_bytes={} host_syncs={} syncs_in_capture={} \
         allocs={} launches={} graph_launches={}",
        bytes(Direction::HostToDevice),
        bytes(Direction::DeviceToHost),
        count(&|e| e.is_host_sync() && !e.capture.inside()),
        count(&|e| e.is_host_sync() && e.capture.inside()),
        count(&|e| matches!(e.kind, EventKind::Alloc { .. })),
        count(&|e| matches!(e.kind, EventKind::KernelLaunch { .. })),
        count(&|e| matches!(e.kind, EventKind::GraphLaunch { .. })),
    );
}

fn step_label(marker: &Event) -> &str {
    match &marker.kind {
        EventKind::Marker { label } => label,
        _ => "",
    }
}
