//! Reads a captured aprender-train stderr file and prints what the subject's
//! stderr witness makes of it (no GPU needed):
//!
//! ```text
//! witness stderr.txt 100     # 100 = train_step calls the run made
//! ```
//!
//! Exit status 0 when the run stayed on the GPU path and reported one loss
//! per train_step, 1 otherwise, 2 when the file cannot be read.

use std::process::ExitCode;

use clap::Parser;
use falsify_aprender_train::StderrWitness;

#[derive(Parser)]
#[command(about = "Summarise a captured aprender-train stderr")]
struct Args {
    /// The captured stderr.
    file: std::path::PathBuf,
    /// train_step calls the run made (steps · batch).
    train_steps: usize,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let text = match std::fs::read_to_string(&args.file) {
        Ok(text) => text,
        Err(error) => {
            eprintln!("witness: {}: {error}", args.file.display());
            return ExitCode::from(2);
        }
    };
    let witness = StderrWitness::parse(&text);
    print_summary(&witness);
    match witness.check(args.train_steps) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            println!("verdict error={error}");
            ExitCode::from(1)
        }
    }
}

fn print_summary(witness: &StderrWitness) {
    println!("device={:?}", witness.device);
    println!(
        "kernel_target={:?} cublas={:?}",
        witness.kernel_target, witness.cublas
    );
    for prewarm in &witness.prewarm {
        println!("prewarm line={} {:?}", prewarm.line, prewarm.value);
    }
    println!("upload={:?}", witness.upload);
    let after = witness.compilations_after_upload();
    println!(
        "compilations total={} after_upload={}",
        witness.compilations.len(),
        after.len()
    );
    for compilation in after {
        println!(
            "compiled_after_upload line={} cache={:?} name={}",
            compilation.line, compilation.cache, compilation.name
        );
    }
    for capture in &witness.captures {
        println!("capture line={} {:?}", capture.line, capture.value);
    }
    for detour in &witness.module_load_detours {
        println!("module_load_detour line={} {}", detour.line, detour.value);
    }
    for problem in &witness.problems {
        println!(
            "problem line={} kind={} {}",
            problem.line, problem.kind, problem.text
        );
    }
    println!("losses count={} {:?}", witness.losses.len(), witness.losses);
}
