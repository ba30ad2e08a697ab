//! Measures NVRTC's time to compile each kernel module to a cubin on one
//! thread (the best of three), and prints it as the table
//! `qlora::kernels::COMPILE_COST_MS` holds, which orders a cold pre-warm's
//! compilations, the longest first. Run it on the CI machine when a kernel
//! source changes much, and paste its output over the table.
//!
//! ```text
//! cargo run --release -p qlora --example compile_costs [-- <arch, default sm_90> [<part of a module's name>]]
//! ```
//!
//! With a name part, only the modules whose name holds it (to time one
//! module after a change to its source).
use std::time::Instant;

use qlora::gpu::cache::compile_cubin;
use qlora::kernels::MODULES;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let arch = std::env::args().nth(1).unwrap_or_else(|| "sm_90".into());
    let only = std::env::args().nth(2).unwrap_or_default();
    println!("pub const COMPILE_COST_MS: &[(&str, u32)] = &[");
    for module in MODULES.iter().filter(|m| m.name.contains(only.as_str())) {
        let mut best = f64::MAX;
        for _ in 0..3 {
            let start = Instant::now();
            compile_cubin(module, &arch)?;
            best = best.min(start.elapsed().as_secs_f64() * 1e3);
        }
        println!("    ({:?}, {}),", module.name, best.round());
    }
    println!("];");
    Ok(())
}
