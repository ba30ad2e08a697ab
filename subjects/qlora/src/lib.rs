//! # falsify-qlora
//!
//! The qlora subject of falsify: what the harness core needs to test the
//! [`qlora`] stack. Claims about its CUDA kernels and its QLoRA training
//! step are written as YAML contracts (`contracts/` of the workspace); each
//! falsification test names one of the check kinds here, which measures the
//! claim against the real code, and a mutant that must make it fail.
//!
//! Layout: [`check`] (the kinds, registered with `falsify_core::kinds!`),
//! [`reference`](mod@reference) (the CPU oracle), [`mutant`] (named faults, mapped to the
//! stack's fault knobs or to faulty oracle variants), [`ranks`]
//! (data-parallel ranks as helper processes), [`workload`] (the trainer
//! the core's driver-observed kinds drive), and [`Qlora`], the
//! [`Subject`] the core's engine, CLI and `harness!{}` run. The stack knows
//! nothing of this crate.

pub mod check;
pub mod error;
pub mod mutant;
pub mod ranks;
pub mod reference;
pub mod workload;

use std::path::PathBuf;

use falsify_core::{DeviceFacts, DeviceOptions, HelperRole, Subject, Workload};
use qlora::gpu::{GemmMath, GpuContext, GpuOptions};
use serde::{Deserialize, Serialize};

pub use error::{Error, Result};

/// The qlora stack as a subject of the harness.
#[derive(Debug, Clone, Copy, Default)]
pub struct Qlora;

impl Subject for Qlora {
    const NAME: &'static str = "qlora";
    type Device = GpuContext;
    type Kinds = check::CheckSpec;
    type Mutant = mutant::Mutant;
    type Options = Options;
    type Error = Error;

    fn open_device(options: &Options) -> Result<GpuContext> {
        Ok(GpuContext::new(options.0.clone())?)
    }

    fn device_facts(device: &GpuContext) -> DeviceFacts {
        let f = device.facts();
        DeviceFacts {
            name: f.name.clone(),
            compute_capability: f.compute_capability,
            sm_count: f.sm_count,
            total_memory_bytes: f.total_memory_bytes,
            driver_version: f.driver_version.clone(),
        }
    }

    fn free_memory(device: &GpuContext) -> Result<(u64, u64)> {
        let (free, total) = device.memory_bytes()?;
        Ok((free as u64, total as u64))
    }

    /// The context no longer answers after a sticky fault (e.g. an illegal
    /// address): its stream cannot synchronise, or the context reports an
    /// error.
    fn check_health(device: &mut GpuContext) -> Result<()> {
        device.stream().synchronize()?;
        device.context().check_err()?;
        Ok(())
    }

    /// A configuration the stack refuses before allocating, because it
    /// would not fit the device's memory, a check whose peer (python3
    /// with PEFT) is not installed here, or a figure the driver here does
    /// not report.
    fn does_not_fit(error: &Error) -> bool {
        matches!(
            error,
            Error::Stack(qlora::Error::OutOfMemory { .. })
                | Error::PeerAbsent(_)
                | Error::NotReported(_)
        )
    }

    /// The GPU trainer of the model presets, for the core's driver-observed
    /// kinds.
    fn workload() -> Option<&'static dyn Workload<Self>> {
        Some(&workload::QloraTraining)
    }

    fn helpers() -> &'static [HelperRole] {
        &[HelperRole {
            flag: ranks::RANK_FLAG,
            run: ranks::run_rank_boxed,
        }]
    }
}

/// The stack's device options ([`GpuOptions`]: ordinal, GEMM math, kernel
/// cache directory), as the front ends set them and a trial's process
/// receives them. `Debug` is [`GpuOptions`]'s own, which `run.json`
/// records.
#[derive(Clone, Default)]
pub struct Options(pub GpuOptions);

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// [`Options`] on the wire to a trial's process.
#[derive(Serialize, Deserialize)]
struct OptionsWire {
    ordinal: usize,
    forward_tf32: bool,
    backward_tf32: bool,
    kernel_cache_dir: Option<PathBuf>,
    tuned_gemms: bool,
}

fn math(tf32: bool) -> GemmMath {
    if tf32 {
        GemmMath::Tf32
    } else {
        GemmMath::Fp32
    }
}

impl Serialize for Options {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        OptionsWire {
            ordinal: self.0.ordinal,
            forward_tf32: self.0.forward_math == GemmMath::Tf32,
            backward_tf32: self.0.backward_math == GemmMath::Tf32,
            kernel_cache_dir: self.0.kernel_cache_dir.clone(),
            tuned_gemms: self.0.tuned_gemms,
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for Options {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let w = OptionsWire::deserialize(d)?;
        Ok(Options(GpuOptions {
            ordinal: w.ordinal,
            forward_math: math(w.forward_tf32),
            backward_math: math(w.backward_tf32),
            kernel_cache_dir: w.kernel_cache_dir,
            tuned_gemms: w.tuned_gemms,
        }))
    }
}

impl DeviceOptions for Options {
    fn ordinal(&self) -> usize {
        self.0.ordinal
    }
    fn set_ordinal(&mut self, ordinal: usize) {
        self.0.ordinal = ordinal;
    }
    fn set_kernel_cache_dir(&mut self, dir: PathBuf) {
        self.0.kernel_cache_dir = Some(dir);
    }
}

/// The shipped contracts (`contracts/` of the workspace), for tests.
#[cfg(test)]
pub(crate) fn shipped_contracts() -> Vec<falsify_core::contract::ContractOf<Qlora>> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../contracts");
    match falsify_core::contract::load_dir::<Qlora>(&dir) {
        Ok(c) => c,
        Err(e) => panic!("the shipped contracts do not load: {e:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_travel_whole_and_print_as_the_stacks() {
        let mut options = Options::default();
        options.set_ordinal(1);
        options.set_kernel_cache_dir(PathBuf::from("target/cache"));
        let json = serde_json::to_string(&options).unwrap();
        let back: Options = serde_json::from_str(&json).unwrap();
        assert_eq!(format!("{back:?}"), format!("{options:?}"));
        assert_eq!(
            format!("{options:?}"),
            "GpuOptions { ordinal: 1, forward_math: Tf32, backward_math: Fp32, kernel_cache_dir: Some(\"target/cache\"), tuned_gemms: true }"
        );
    }

    #[test]
    fn out_of_memory_an_absent_peer_or_an_unreported_figure_do_not_fit_and_nothing_else() {
        let oom = Error::Stack(qlora::Error::OutOfMemory {
            model: "m".into(),
            needed_gib: 2.0,
            available_gib: 1.0,
        });
        assert!(Qlora::does_not_fit(&oom));
        assert!(Qlora::does_not_fit(&Error::PeerAbsent("no python3".into())));
        assert!(Qlora::does_not_fit(&Error::NotReported(
            "no nvidia-smi".into()
        )));
        assert!(!Qlora::does_not_fit(&Error::Ranks("x".into())));
    }
}
