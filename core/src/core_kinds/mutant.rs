//! [`CoreMutant`]: the mutants the core injects itself, needing nothing of
//! the subject; and [`MutantName`], a test's `mutant:`, one of those or one
//! of its subject's.

use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, Deserialize, Deserializer, IntoDeserializer, Visitor};

use super::Check;
use crate::subject::{KindSet, MutantSet};

/// A mutant the core injects itself, valid in every subject's contracts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CoreMutant {
    /// The driver observer loads a PTX module built for an older target
    /// (sm_70) at the first module load of the observed region.
    DriverOlderTargetModule,
    /// The driver observer loads a module right after the upload point.
    DriverModuleAfterUpload,
    /// The driver observer synchronises the stream inside a graph capture.
    DriverSyncInsideCapture,
    /// The driver observer copies 4 bytes device to host right after the
    /// first launch of `driver_span_traffic`'s `from_kernel`.
    DriverCopyToHostInSpan,
    /// `graph_loss_parity`'s graphed arm trains with twice the learning rate.
    WorkloadGraphArmLearningRateDoubled,
    /// `graph_speedup`'s graphed arm sleeps a fixed host delay inside every
    /// timed step.
    WorkloadGraphArmSlowed,
}

impl CoreMutant {
    /// Every core mutant with its name in contracts.
    pub const NAMES: &'static [(CoreMutant, &'static str)] = &[
        (
            CoreMutant::DriverOlderTargetModule,
            "driver_older_target_module",
        ),
        (
            CoreMutant::DriverModuleAfterUpload,
            "driver_module_after_upload",
        ),
        (
            CoreMutant::DriverSyncInsideCapture,
            "driver_sync_inside_capture",
        ),
        (
            CoreMutant::DriverCopyToHostInSpan,
            "driver_copy_to_host_in_span",
        ),
        (
            CoreMutant::WorkloadGraphArmLearningRateDoubled,
            "workload_graph_arm_learning_rate_doubled",
        ),
        (
            CoreMutant::WorkloadGraphArmSlowed,
            "workload_graph_arm_slowed",
        ),
    ];

    /// The name contracts use.
    pub fn name(self) -> &'static str {
        Self::NAMES
            .iter()
            .find(|(m, _)| *m == self)
            .map_or("", |(_, name)| name)
    }

    /// The core mutant named `name`.
    pub fn from_name(name: &str) -> Option<CoreMutant> {
        Self::NAMES
            .iter()
            .find(|(_, n)| *n == name)
            .map(|(m, _)| *m)
    }

    /// Why this mutant cannot take effect on a test whose check is `check`
    /// (checked when a contract loads), or `None`. A driver mutant is
    /// injected by the driver observer, which only the core's driver kinds
    /// attach.
    pub fn refuses<K: KindSet>(self, check: &Check<K>) -> Option<String> {
        const ARM: &str = "acts on the graphed arm of";
        let only_on = match self {
            CoreMutant::WorkloadGraphArmLearningRateDoubled => Some(("graph_loss_parity", ARM)),
            CoreMutant::WorkloadGraphArmSlowed => Some(("graph_speedup", ARM)),
            CoreMutant::DriverCopyToHostInSpan => Some((
                "driver_span_traffic",
                "is injected after the first launch of the `from_kernel` of",
            )),
            _ => None,
        };
        if let Some((kind, acts)) = only_on {
            return (check.kind_name() != kind || !matches!(check, Check::Core(_))).then(|| {
                format!(
                    "mutant `{}` {acts} the core's `{kind}` only; check kind `{}` would never see it",
                    self.name(),
                    check.kind_name()
                )
            });
        }
        match check {
            Check::Core(kind) if kind.observes_driver() => None,
            check => Some(format!(
                "mutant `{}` is injected by the driver observer, which only the core's driver \
                 kinds attach; check kind `{}` would never see it",
                self.name(),
                check.kind_name()
            )),
        }
    }
}

impl fmt::Display for CoreMutant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A test's `mutant:`: one of the core's mutants or one of the subject's
/// (`M`), by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MutantName<M> {
    /// Injected by the core.
    Core(CoreMutant),
    /// Applied by the subject.
    Subject(M),
}

impl<M> MutantName<M> {
    /// The subject's mutant, if this is one.
    pub fn subject(&self) -> Option<&M> {
        match self {
            MutantName::Subject(m) => Some(m),
            MutantName::Core(_) => None,
        }
    }

    /// The core's mutant, if this is one.
    pub fn core(&self) -> Option<CoreMutant> {
        match self {
            MutantName::Core(m) => Some(*m),
            MutantName::Subject(_) => None,
        }
    }
}

impl<M: fmt::Display> fmt::Display for MutantName<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MutantName::Core(m) => m.fmt(f),
            MutantName::Subject(m) => m.fmt(f),
        }
    }
}

impl<'de, M: MutantSet> Deserialize<'de> for MutantName<M> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(NameVisitor(PhantomData))
    }
}

struct NameVisitor<M>(PhantomData<fn() -> M>);

impl<M: MutantSet> Visitor<'_> for NameVisitor<M> {
    type Value = MutantName<M>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the name of a mutant")
    }

    /// The subject's name first; an unknown name is refused with the
    /// subject's list (serde's message) and the core's.
    fn visit_str<E: de::Error>(self, name: &str) -> Result<MutantName<M>, E> {
        let subject =
            M::deserialize(name.into_deserializer()).map_err(|e: de::value::Error| e.to_string());
        match (subject, CoreMutant::from_name(name)) {
            (Ok(m), _) => Ok(MutantName::Subject(m)),
            (Err(_), Some(m)) => Ok(MutantName::Core(m)),
            (Err(e), None) => {
                let core: Vec<String> = CoreMutant::NAMES
                    .iter()
                    .map(|(_, n)| format!("`{n}`"))
                    .collect();
                Err(E::custom(format!(
                    "{e}; or one of the core's mutants: {}",
                    core.join(", ")
                )))
            }
        }
    }
}
