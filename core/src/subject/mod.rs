//! The seam between the harness core and a system under test.
//!
//! The core plans, isolates, times, records and judges trials; a
//! [`Subject`] says what a trial runs on and what it may check: how to open
//! its device for a trial and what the device is ([`DeviceFacts`]), its
//! check kinds (a [`KindSet`] declared with [`crate::kinds!`], parsed
//! strictly, with located errors and parameter docs), its
//! mutants ([`MutantSet`], resolved by name when a contract loads), its
//! errors, and the helper processes its kinds start. Everything else —
//! process isolation, timeouts, CSV, baselines, the report, nextest — is
//! the core's and works for any subject.
//!
//! A subject's kinds implement [`Kind`] and are declared with
//! [`kinds!`](crate::kinds), which makes them a [`KindSet`]; a check gets a
//! [`TrialContext`].
//!
//! A subject with no GPU code at all uses [`NoDevice`] and [`BasicOptions`]:
//! its `cpu` trials run, its `cuda` trials are skipped with the reason.
//!
//! [`Workload`], [`TrainSession`], [`TrainSetup`] and [`OwnCounts`] are
//! what the core's driver-observed kinds will drive: a subject that can
//! train returns a [`Workload`] from [`Subject::workload`].

use std::fmt::{Debug, Display};
use std::path::PathBuf;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

mod kinds;
mod workload;

pub use crate::error::BoxError;
pub use crate::report::meta::DeviceFacts;
pub use kinds::{deserialize_check, reference_markdown, Kind, KindSet, TrialContext};
pub use workload::{OwnCounts, TrainSession, TrainSetup, Workload};

/// A system under test.
///
/// Implemented on a marker type (`pub struct Qlora;`). Every function is
/// called by the core's engine, in the process that runs the trial.
///
/// The subject's own error type (`Error`) is what its kinds return, so a
/// kind keeps its crate's `Result` and [`Subject::does_not_fit`] reads the
/// error without a downcast; the core boxes it ([`crate::Error::Subject`])
/// wherever it keeps it.
pub trait Subject: Send + Sync + Sized + 'static {
    /// The subject's name, e.g. `qlora`: recorded in `run.json`, and the
    /// folder of its baselines, `reports/baseline/<subject>/<gpu-kind>/`.
    const NAME: &'static str;
    /// Whether a contract may mark a test as known to be falsified on this
    /// subject (`known_violation`, naming [`Subject::NAME`]). Only for a
    /// stack we do not own, whose broken claims are findings to report; a
    /// stack of our own (qlora) keeps the default, `false`: its failures
    /// are bugs to fix, never to excuse. A contract that names a subject
    /// that does not accept them is refused when it loads.
    const ACCEPTS_KNOWN_VIOLATIONS: bool = false;
    /// What a `cuda` trial gets (qlora: its GPU context). [`NoDevice`] for a
    /// subject without GPU code.
    type Device: Send;
    /// The subject's check kinds, declared with [`crate::kinds!`].
    type Kinds: KindSet<Subject = Self>;
    /// The subject's mutants: deserialised from their snake_case names,
    /// so an unknown name is refused, located, when a contract loads.
    type Mutant: MutantSet;
    /// Device options the front ends set (ordinal, kernel cache, ...):
    /// serialisable, since they travel to each trial's process.
    type Options: DeviceOptions;
    /// The subject's error.
    type Error: std::error::Error + Send + Sync + 'static;

    /// Opens the device a `cuda` trial runs on.
    fn open_device(options: &Self::Options) -> Result<Self::Device, Self::Error>;

    /// The facts a report row records about `device`.
    fn device_facts(device: &Self::Device) -> DeviceFacts;

    /// Free and total device memory, in bytes.
    fn free_memory(device: &Self::Device) -> Result<(u64, u64), Self::Error>;

    /// Called after a trial failed in this process: `Err` says the device
    /// is lost (a sticky fault); the remaining `cuda` trials of this
    /// process are then recorded as errors with the reason.
    fn check_health(_device: &mut Self::Device) -> Result<(), Self::Error> {
        Ok(())
    }

    /// Whether `error` means "this trial cannot be judged here" (its
    /// configuration does not fit, or a peer it runs beside is not
    /// installed): the trial is then recorded `skipped` with the error, not
    /// `error`.
    fn does_not_fit(_error: &Self::Error) -> bool {
        false
    }

    /// The training workload the core's driver-observed kinds drive;
    /// `None`: those kinds are refused at load time for this subject.
    fn workload() -> Option<&'static dyn Workload<Self>> {
        None
    }

    /// Helper processes this subject's kinds start (e.g. data-parallel
    /// ranks), dispatched by the engine's `run::helper_reply` beside the
    /// trial-process flag.
    fn helpers() -> &'static [HelperRole] {
        &[]
    }
}

/// A mutant of a subject: a named fault a falsification test says must make
/// its check fail. Parsed from its name (serde, snake_case), shown by it
/// (`Display`). Implemented for every type with these traits.
pub trait MutantSet:
    Clone + Eq + Debug + Display + DeserializeOwned + Send + Sync + 'static
{
}

impl<T> MutantSet for T where
    T: Clone + Eq + Debug + Display + DeserializeOwned + Send + Sync + 'static
{
}

/// What the front ends set in a subject's device options, whatever else
/// the options hold.
pub trait DeviceOptions:
    Clone + Default + Debug + Serialize + DeserializeOwned + Send + Sync + 'static
{
    /// The CUDA device ordinal `cuda` trials run on.
    fn ordinal(&self) -> usize;
    /// Sets the ordinal (the front ends: cargo-nextest's `gpu` group slot).
    fn set_ordinal(&mut self, ordinal: usize);
    /// Where compiled kernels are kept between the trial processes of a
    /// run (the front ends: `target/falsify-kernel-cache`). A subject
    /// without a kernel cache ignores it.
    fn set_kernel_cache_dir(&mut self, _dir: PathBuf) {}
}

/// The device options of a subject that has only an ordinal to set.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BasicOptions {
    /// The CUDA device ordinal.
    pub ordinal: usize,
}

impl DeviceOptions for BasicOptions {
    fn ordinal(&self) -> usize {
        self.ordinal
    }
    fn set_ordinal(&mut self, ordinal: usize) {
        self.ordinal = ordinal;
    }
}

/// The device of a subject without GPU code: there is none, so no value of
/// this type exists, and the subject's `open_device` always fails.
#[derive(Debug)]
pub enum NoDevice {}

/// A helper process a subject's kinds start from the front end's own
/// executable: started with `flag` as its first argument and its job on
/// stdin; `run` answers with the line the front end prints on stdout.
#[derive(Debug, Clone, Copy)]
pub struct HelperRole {
    /// The first argument that selects this role, e.g. `__falsify-rank`.
    pub flag: &'static str,
    /// Runs the job (its stdin's text) and returns the reply line.
    pub run: fn(&str) -> Result<String, BoxError>,
}

/// The role of `helpers` that `flag` selects.
pub(crate) fn helper_by_flag<'a>(helpers: &'a [HelperRole], flag: &str) -> Option<&'a HelperRole> {
    helpers.iter().find(|h| h.flag == flag)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::{Backend, Here, Measurement, Validate, CPU};

    /// A fake subject whose workload counts what it was asked to do.
    struct Fake;

    #[derive(Debug, Clone, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct NoParams {}

    impl Validate for NoParams {
        fn validate(&self) -> Result<(), String> {
            Ok(())
        }
    }

    impl Kind<Fake> for NoParams {
        fn execute(
            &self,
            _backend: Backend,
            _cx: &mut TrialContext<'_, Fake>,
        ) -> Result<Measurement, crate::Error> {
            Ok(Measurement::new(
                "m",
                0.0,
                crate::check::Comparator::Le,
                1.0,
                "",
            ))
        }
    }

    mod nothing {
        pub(super) use super::NoParams as Params;
        pub const PARAMS: &[crate::check::ParamDoc] = &[];
        pub const EXAMPLE: &[(&str, &str)] = &[];
    }

    crate::kinds! {
        enum FakeKinds for Fake {
            Nothing(nothing) "nothing", CPU, "nothing at all";
        }
    }

    #[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
    #[serde(rename_all = "snake_case")]
    enum FakeMutant {
        LossFrozen,
    }

    impl std::fmt::Display for FakeMutant {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("loss_frozen")
        }
    }

    /// A device that remembers the uploads and steps.
    #[derive(Default)]
    struct FakeDevice {
        uploaded: u64,
        steps: usize,
    }

    impl Subject for Fake {
        const NAME: &'static str = "fake";
        type Device = FakeDevice;
        type Kinds = FakeKinds;
        type Mutant = FakeMutant;
        type Options = BasicOptions;
        type Error = crate::Error;

        fn open_device(_options: &BasicOptions) -> Result<FakeDevice, crate::Error> {
            Ok(FakeDevice::default())
        }
        fn device_facts(_device: &FakeDevice) -> DeviceFacts {
            DeviceFacts {
                name: "fake".into(),
                compute_capability: (9, 0),
                sm_count: 1,
                total_memory_bytes: 1 << 20,
                driver_version: "13.0".into(),
            }
        }
        fn free_memory(_device: &FakeDevice) -> Result<(u64, u64), crate::Error> {
            Ok((1 << 19, 1 << 20))
        }
        fn workload() -> Option<&'static dyn Workload<Self>> {
            Some(&FakeWorkload)
        }
    }

    struct FakeWorkload;

    struct FakeSession<'d> {
        device: &'d mut FakeDevice,
        frozen: bool,
    }

    impl TrainSession for FakeSession<'_> {
        fn step(&mut self) -> Result<f32, BoxError> {
            self.device.steps += 1;
            Ok(if self.frozen {
                1.0
            } else {
                1.0 / self.device.steps as f32
            })
        }
    }

    impl Workload<Fake> for FakeWorkload {
        fn models(&self) -> &[&'static str] {
            &["one"]
        }
        fn upload_bytes(&self, setup: &TrainSetup) -> Result<u64, BoxError> {
            if self.models().contains(&setup.model.as_str()) {
                Ok(4 * setup.batch as u64)
            } else {
                Err(format!("no model `{}`", setup.model).into())
            }
        }
        fn prepare<'d>(
            &self,
            device: &'d mut FakeDevice,
            setup: &TrainSetup,
            mutant: Option<&FakeMutant>,
        ) -> Result<Box<dyn TrainSession + 'd>, BoxError> {
            device.uploaded += self.upload_bytes(setup)?;
            let frozen = mutant == Some(&FakeMutant::LossFrozen);
            Ok(Box::new(FakeSession { device, frozen }))
        }
    }

    fn setup(model: &str) -> TrainSetup {
        TrainSetup {
            model: model.into(),
            batch: 2,
            seq_len: None,
            graph: false,
            steps: 3,
            seed: 7,
            learning_rate: None,
        }
    }

    /// The calls a driver-observed kind makes, in its order, through the
    /// trait objects a subject hands out; the defaults say "nothing".
    #[test]
    fn a_workload_is_driven_through_the_seam() {
        let workload = Fake::workload().expect("the fake subject trains");
        let setup = setup("one");
        assert_eq!(workload.upload_bytes(&setup).unwrap(), 8);
        assert!(workload.upload_bytes(&self::setup("two")).is_err());
        assert!(workload
            .process_env(&setup, std::path::Path::new("scratch"))
            .is_empty());
        let mut device = Fake::open_device(&BasicOptions::default()).unwrap();
        let losses: Vec<f32> = {
            let mut session = workload.prepare(&mut device, &setup, None).unwrap();
            assert_eq!(session.own_counts(), None);
            (0..setup.steps).map(|_| session.step().unwrap()).collect()
        };
        assert!(losses.windows(2).all(|w| w[1] < w[0]), "{losses:?}");
        assert_eq!((device.uploaded, device.steps), (8, 3));
        let mut session = workload
            .prepare(&mut device, &setup, Some(&FakeMutant::LossFrozen))
            .unwrap();
        assert_eq!(session.step().unwrap(), 1.0);
    }

    /// The hooks a subject need not write say: healthy, fits, no helpers.
    #[test]
    fn the_defaults_of_a_subject_ask_nothing() {
        let mut device = FakeDevice::default();
        assert!(Fake::check_health(&mut device).is_ok());
        assert!(!Fake::does_not_fit(&crate::Error::NothingSelected(
            "x".into()
        )));
        assert!(Fake::helpers().is_empty());
        assert_eq!(Fake::device_facts(&device).compute_capability, (9, 0));
        let mut options = BasicOptions::default();
        options.set_ordinal(3);
        options.set_kernel_cache_dir(PathBuf::from("ignored"));
        assert_eq!(options.ordinal(), 3);
        assert_eq!(OwnCounts::default().modules_loaded, None);
        let kind: FakeKinds = serde_yaml::from_str("kind: nothing").unwrap();
        assert_eq!(kind.kind_name(), "nothing");
        assert!(kind.supports(Backend::Cpu) && !kind.supports(Backend::Cuda));
        assert_eq!(kind.unjudged_on(Backend::Cpu, &Here::default()), None);
    }
}
