//! The core's own check kinds and mutants, valid in every subject's
//! contracts beside the subject's.
//!
//! A test's `check:` is a [`Check`]: one of the core's kinds ([`CoreKind`])
//! or one of its subject's ([`KindSet`](crate::subject::KindSet)); the `kind:` name picks, and an
//! unknown name is refused with both lists. Its `mutant:` is a
//! [`MutantName`]: one of the core's ([`CoreMutant`]) or one of the
//! subject's. The core's kinds are generic over the subject: they drive its
//! [`Workload`](crate::subject::Workload) and judge what the driver
//! observer recorded.
//!
//! To add a core kind: a module here with its strict `Params` (implementing
//! [`CoreCheck`]), `PARAMS` and `EXAMPLE`, and one line in the
//! `core_kinds!` list below. To add a core mutant: a variant of
//! [`CoreMutant`] with its name in [`CoreMutant::NAMES`] and, in
//! [`CoreMutant::refuses`], the checks it cannot take effect on.

mod check;
pub mod drive;
mod driver_capture;
mod driver_prewarm;
mod driver_span_traffic;
mod driver_target_parity;
mod evidence;
mod mutant;
mod train;
mod two_arms;

use falsify_observer::DriverObserver;

use crate::check::{Backend, Here, KindInfo, Measurement, Validate, CUDA, DEFAULT_TIMEOUT_S};
use crate::subject::{Subject, TrainSetup, TrialContext};
use crate::workload::{graph_loss_parity, graph_speedup};
use train::Training;

pub use check::{kinds_markdown, Check};
pub use mutant::{CoreMutant, MutantName};

/// What a core kind's trial gets: the trial's context (seed, device, the
/// subject's mutant for the workload's `prepare`) and the core mutant to
/// inject, if any.
pub struct CoreTrial<'c, 'a, S: Subject> {
    pub cx: &'c mut TrialContext<'a, S>,
    /// The core mutant of a self-test (or `--inject`) trial.
    pub mutant: Option<CoreMutant>,
    /// The driver observer, attached in this process for a check that
    /// [observes the driver](CoreCheck::observes_driver); `None` otherwise.
    pub observer: Option<&'c DriverObserver>,
}

/// A core kind's parameters: parsed strictly, checked across fields
/// ([`Validate`]), checked against the subject when a contract loads, and
/// executed for any subject.
pub trait CoreCheck: Validate {
    /// Runs the measurement for the subject `S`.
    fn execute<S: Subject>(
        &self,
        backend: Backend,
        trial: CoreTrial<'_, '_, S>,
    ) -> crate::Result<Measurement>;

    /// The training this check drives under the driver observer; `None`
    /// for a check that does not. The next three methods follow from it.
    fn driven_training(&self) -> Option<Training<'_>> {
        None
    }

    /// Whether the subject `S` can run this check: `Err((key, why))` names
    /// the parameter the error is located at (e.g. `model`), or `""` for the
    /// check as a whole. Called when a contract loads. By default, whether
    /// `S`'s workload trains the driven training's model.
    fn validate_for<S: Subject>(&self) -> Result<(), (&'static str, String)> {
        self.driven_training()
            .map_or(Ok(()), |t| t.validate_for::<S>())
    }

    /// Whether a trial of this check runs under the driver observer (so
    /// the driver mutants can take effect on it).
    fn observes_driver(&self) -> bool {
        self.driven_training().is_some()
    }

    /// The training this check drives, for the workload's process
    /// environment ([`Workload::process_env`](crate::subject::Workload::process_env));
    /// `None` for a check that trains nothing.
    fn train_setup(&self, seed: u64) -> Option<TrainSetup> {
        self.driven_training().map(|t| t.setup(seed))
    }

    /// See [`Kind::unjudged_on`](crate::subject::Kind::unjudged_on).
    fn unjudged_on(&self, _backend: Backend, _here: &Here) -> Option<String> {
        None
    }

    /// See [`Kind::check_budget`](crate::subject::Kind::check_budget).
    fn check_budget(&self, _backend: Backend, _here: &Here) -> Result<(), String> {
        Ok(())
    }

    /// See [`Kind::default_timeout_s`](crate::subject::Kind::default_timeout_s).
    fn default_timeout_s(&self) -> f64 {
        DEFAULT_TIMEOUT_S
    }

    /// See [`Kind::needs_the_gpu_alone`](crate::subject::Kind::needs_the_gpu_alone).
    fn needs_the_gpu_alone(&self) -> bool {
        false
    }

    /// See [`Kind::needs_the_whole_host`](crate::subject::Kind::needs_the_whole_host).
    fn needs_the_whole_host(&self) -> bool {
        false
    }

    /// See [`Kind::runs_on_one_stream`](crate::subject::Kind::runs_on_one_stream).
    fn runs_on_one_stream(&self) -> bool {
        false
    }
}

/// Declares the core's kinds from one line each, as
/// [`kinds!`](crate::kinds) does a subject's: `Variant(module) "name",
/// backends, "what it measures";`.
macro_rules! core_kinds {
    ($($variant:ident($module:ident) $kind:literal, $backends:expr, $measures:literal;)*) => {
        /// The core's kinds, in the order `falsify kinds` lists them.
        pub const CORE_KINDS: &[KindInfo] = &[
            $(KindInfo {
                name: $kind,
                measures: $measures,
                backends: $backends,
                params: $module::PARAMS,
                example: $module::EXAMPLE,
            },)*
        ];

        /// A check of one of the core's kinds, with its parameters.
        #[derive(Debug, Clone)]
        pub enum CoreKind {
            $($variant($module::Params),)*
        }

        impl CoreKind {
            /// The `kind:` name.
            pub fn kind_name(&self) -> &'static str {
                match self {
                    $(Self::$variant(_) => $kind,)*
                }
            }

            /// Parses the rest of a `check:` mapping as the parameters of
            /// the core kind `kind`; `None` when no core kind has that name.
            pub(crate) fn parse<'de, A: serde::de::MapAccess<'de>>(
                kind: &str,
                map: A,
            ) -> Option<Result<Self, A::Error>> {
                match kind {
                    $($kind => Some(crate::check::parse_params(map).map(Self::$variant)),)*
                    _ => None,
                }
            }

            /// See [`CoreCheck::validate_for`].
            pub fn validate_for<S: Subject>(&self) -> Result<(), (&'static str, String)> {
                match self {
                    $(Self::$variant(p) => p.validate_for::<S>(),)*
                }
            }

            /// See [`CoreCheck::observes_driver`].
            pub fn observes_driver(&self) -> bool {
                match self {
                    $(Self::$variant(p) => p.observes_driver(),)*
                }
            }

            /// See [`CoreCheck::train_setup`].
            pub fn train_setup(&self, seed: u64) -> Option<TrainSetup> {
                match self {
                    $(Self::$variant(p) => p.train_setup(seed),)*
                }
            }

            /// See [`CoreCheck::unjudged_on`].
            pub fn unjudged_on(&self, backend: Backend, here: &Here) -> Option<String> {
                match self {
                    $(Self::$variant(p) => p.unjudged_on(backend, here),)*
                }
            }

            /// See [`CoreCheck::check_budget`].
            pub fn check_budget(&self, backend: Backend, here: &Here) -> Result<(), String> {
                match self {
                    $(Self::$variant(p) => p.check_budget(backend, here),)*
                }
            }

            /// See [`CoreCheck::default_timeout_s`].
            pub fn default_timeout_s(&self) -> f64 {
                match self {
                    $(Self::$variant(p) => p.default_timeout_s(),)*
                }
            }

            /// See [`CoreCheck::needs_the_gpu_alone`].
            pub fn needs_the_gpu_alone(&self) -> bool {
                match self {
                    $(Self::$variant(p) => p.needs_the_gpu_alone(),)*
                }
            }

            /// See [`CoreCheck::needs_the_whole_host`].
            pub fn needs_the_whole_host(&self) -> bool {
                match self {
                    $(Self::$variant(p) => p.needs_the_whole_host(),)*
                }
            }

            /// See [`CoreCheck::runs_on_one_stream`].
            pub fn runs_on_one_stream(&self) -> bool {
                match self {
                    $(Self::$variant(p) => p.runs_on_one_stream(),)*
                }
            }

            /// See [`CoreCheck::execute`].
            pub fn execute<S: Subject>(
                &self,
                backend: Backend,
                trial: CoreTrial<'_, '_, S>,
            ) -> crate::Result<Measurement> {
                match self {
                    $(Self::$variant(p) => p.execute(backend, trial),)*
                }
            }
        }
    };
}

core_kinds! {
    DriverTargetParity(driver_target_parity) "driver_target_parity", CUDA,
        "module images the CUDA driver loads while the subject trains whose target is not the device's sm_XY (observed, not asked)";
    DriverPrewarm(driver_prewarm) "driver_prewarm", CUDA,
        "module loads and JIT compilations the CUDA driver sees after the subject's weights are uploaded (observed, not asked)";
    DriverCapture(driver_capture) "driver_capture", CUDA,
        "host syncs inside the subject's CUDA-graph captures, with capture results, replays and syncs per step (observed, not asked)";
    DriverSpanTraffic(driver_span_traffic) "driver_span_traffic", CUDA,
        "device-to-host copies and host syncs in each step's span from the first launch of one named kernel to the last launch of another (observed, not asked)";
    GraphLossParity(graph_loss_parity) "graph_loss_parity", CUDA,
        "largest absolute difference of the graphed and un-graphed losses at checkpoint steps, each arm of the subject's workload a process of its own";
    GraphSpeedup(graph_speedup) "graph_speedup", CUDA,
        "median un-graphed / graphed ms per step of the subject's workload after warm-up, each arm a process of its own";
}
