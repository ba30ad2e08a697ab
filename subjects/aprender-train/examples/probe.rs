//! Runs aprender-train's QLoRA CUDA path for a few steps and prints each
//! step's loss and time: a probe for the GPU machine.
//!
//! The graph switch is the process environment, as it is for aprender-train
//! itself (`CUDA_GRAPH=1`, read once per process): the probe reads it, says
//! which environment the subject wants, and runs. For a cold module cache
//! give it a fresh `HOME`:
//!
//! ```text
//! HOME=$(mktemp -d) CUDA_GRAPH=1 probe qwen2-tiny-4l 100 2> stderr.txt
//! ```
//!
//! stdout: `key=value` lines; aprender-train's own lines go to stderr
//! (read them with the `witness` example). Exit status: 0 ran, 2 the
//! subject left the GPU (CPU fallback, no nvidia-smi), 1 any other error.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use falsify_aprender_train::{
    loss_readback_bytes, process_env, upload_bytes, Error, GpuCounters, Session, Setup,
};

#[derive(Parser)]
#[command(about = "Train aprender-train's QLoRA CUDA path for a few steps")]
struct Args {
    /// A model: qwen2-tiny-4l, qwen2-0.5b-shape, qwen2-1.5b-shape.
    model: String,
    /// Steps to run.
    steps: usize,
    /// Samples per step (each a train_step call).
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Tokens per sample (default 256).
    #[arg(long)]
    seq_len: Option<usize>,
    /// Learning rate (default 1e-3).
    #[arg(long)]
    lr: Option<f64>,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Median step time over the last this many steps.
    #[arg(long, default_value_t = 10)]
    last: usize,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            println!("error={error}");
            eprintln!("probe: {error}");
            let left_gpu = matches!(error, Error::CpuFallback | Error::NoNvidiaSmi);
            ExitCode::from(if left_gpu { 2 } else { 1 })
        }
    }
}

fn run(args: &Args) -> Result<(), Error> {
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
    println!(
        "setup model={} steps={} batch={} seq_len={} lr={} seed={} graph={}",
        run.shape.name,
        args.steps,
        run.batch,
        run.seq_len,
        run.learning_rate,
        run.seed,
        setup.graph
    );
    print_env(&setup);
    println!(
        "expect upload_bytes={} loss_readback_bytes_per_train_step={}",
        upload_bytes(&setup)?,
        loss_readback_bytes(&setup)?
    );
    let started = Instant::now();
    let mut session = Session::prepare(&setup)?;
    let prepare = session.own_counts().prepare;
    println!(
        "prepared ms={:.1} gpu={:?} d2h_bytes={} allocs={}",
        started.elapsed().as_secs_f64() * 1e3,
        session.gpu_name().unwrap_or_default(),
        prepare.device_to_host_bytes,
        prepare.device_allocs
    );
    let mut times = Vec::with_capacity(args.steps);
    let mut losses = Vec::with_capacity(args.steps);
    for step in 1..=args.steps {
        let started = Instant::now();
        let loss = session.step()?;
        let ms = started.elapsed().as_secs_f64() * 1e3;
        let counts = last_step_counts(&session, run.batch);
        println!(
            "step={step} loss={loss:.6} ms={ms:.3} d2h_bytes={} allocs={}",
            counts.device_to_host_bytes, counts.device_allocs
        );
        times.push(ms);
        losses.push(loss);
    }
    print_summary(&times, &losses, args.last);
    for bad in session.non_finite_losses() {
        println!(
            "non_finite_loss step={} sample={}",
            bad.step + 1,
            bad.sample
        );
    }
    Ok(())
}

/// The environment the subject wants for this setup beside what it has.
fn print_env(setup: &Setup) {
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let wanted = process_env(setup, home.as_deref().unwrap_or(Path::new("<unset>")));
    for (name, value) in wanted {
        let actual = std::env::var(&name).unwrap_or_else(|_| "<unset>".into());
        let note = if actual == value { "" } else { " (differs)" };
        println!("env {name}={actual} wanted={value}{note}");
    }
    let cache = home.map(|home| home.join(".cache/trueno/ptx"));
    let cubins = cache
        .and_then(|dir| std::fs::read_dir(dir).ok())
        .map_or(0, |entries| entries.count());
    println!("module_cache cubins_before={cubins}");
}

/// aprender-gpu's counters summed over the last step's train_step calls.
fn last_step_counts(session: &Session, batch: usize) -> GpuCounters {
    let all = &session.own_counts().per_train_step;
    let last = &all[all.len().saturating_sub(batch)..];
    last.iter()
        .fold(GpuCounters::default(), |sum, c| GpuCounters {
            device_to_host_bytes: sum.device_to_host_bytes + c.device_to_host_bytes,
            device_allocs: sum.device_allocs + c.device_allocs,
        })
}

fn print_summary(times: &[f64], losses: &[f32], last: usize) {
    let tail = &times[times.len().saturating_sub(last)..];
    let mut sorted = tail.to_vec();
    sorted.sort_by(f64::total_cmp);
    let median = match sorted.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    };
    println!("summary median_ms_last_{}={median:.3}", tail.len());
    for checkpoint in [1, 10, 50, 100] {
        if let Some(loss) = losses.get(checkpoint - 1) {
            println!("checkpoint step={checkpoint} loss={loss:.6}");
        }
    }
}
