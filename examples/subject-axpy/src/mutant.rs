//! The subject's mutants: named faults a falsification test says its check
//! must catch. GPU mutants turn a fault knob of [`AxpyDevice`] on for the
//! trial (a scoped guard turns it off again); cpu mutants swap in a faulty
//! oracle; the workload's mutant changes its pre-warm.
//!
//! [`AxpyDevice`]: crate::device::AxpyDevice

use serde::Deserialize;

use crate::device::Faults;

/// A mutant, by its snake_case name in a contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mutant {
    /// The `axpy` kernel is launched with `a = 1` (a fault knob).
    AxpyDropsAlpha,
    /// The sum of squares leaves the last block's partial out (a fault knob).
    SumDropsLastPartial,
    /// The CPU oracle's `axpy` forgets `a` (a faulty oracle).
    OracleDropsAlpha,
    /// The training workload's pre-warm leaves out the `sgd` module, so the
    /// first step compiles and loads it after the weights are uploaded.
    UpdateModuleLoadedLate,
}

impl Mutant {
    /// Every mutant, in the order of their names.
    pub const ALL: &[Mutant] = &[
        Mutant::AxpyDropsAlpha,
        Mutant::SumDropsLastPartial,
        Mutant::OracleDropsAlpha,
        Mutant::UpdateModuleLoadedLate,
    ];

    /// The name a contract uses.
    pub fn name(self) -> &'static str {
        match self {
            Mutant::AxpyDropsAlpha => "axpy_drops_alpha",
            Mutant::SumDropsLastPartial => "sum_drops_last_partial",
            Mutant::OracleDropsAlpha => "oracle_drops_alpha",
            Mutant::UpdateModuleLoadedLate => "update_module_loaded_late",
        }
    }

    /// The device's fault knobs this mutant turns on (none for a mutant
    /// that is not a knob).
    pub fn faults(self) -> Faults {
        Faults {
            axpy_drops_alpha: self == Mutant::AxpyDropsAlpha,
            sum_drops_last_partial: self == Mutant::SumDropsLastPartial,
        }
    }
}

impl std::fmt::Display for Mutant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_name_parses_back_to_its_mutant() {
        for &m in Mutant::ALL {
            let back: Mutant = serde_yaml::from_str(m.name()).unwrap();
            assert_eq!(back, m);
        }
        assert!(serde_yaml::from_str::<Mutant>("drops_everything").is_err());
    }

    #[test]
    fn only_the_knob_mutants_turn_knobs_on() {
        assert!(Mutant::AxpyDropsAlpha.faults().axpy_drops_alpha);
        assert!(Mutant::SumDropsLastPartial.faults().sum_drops_last_partial);
        assert_eq!(Mutant::OracleDropsAlpha.faults(), Faults::default());
        assert_eq!(Mutant::UpdateModuleLoadedLate.faults(), Faults::default());
    }
}
