//! A subject for the core's unit tests: no device, no GPU code, one kind
//! that compares a number with a bound (a mutant inflates the number), and
//! contracts written as text.

use std::path::Path;

use serde::Deserialize;

use crate::check::params::NonNegative;
use crate::check::{Backend, Comparator, Here, Measurement, ParamDoc, Validate, BOTH};
use crate::contract::ContractOf;
use crate::subject::{
    BasicOptions, BoxError, DeviceFacts, Kind, NoDevice, Subject, TrainSession, TrainSetup,
    TrialContext, Workload,
};

/// The test subject.
pub struct Toy;

/// The toy's one mutant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToyMutant {
    /// Adds 10 to the compared value.
    Inflated,
}

impl std::fmt::Display for ToyMutant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("inflated")
    }
}

pub mod compare {
    use super::*;

    /// `value <= at_most`; judged on a GPU only where `targets` names it.
    #[derive(Debug, Clone, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct Params {
        pub value: f64,
        pub at_most: NonNegative,
        #[serde(default)]
        pub targets: Vec<String>,
    }

    pub const PARAMS: &[ParamDoc] = &[];
    pub const EXAMPLE: &[(&str, &str)] = &[("value", "1"), ("at_most", "2")];

    impl Validate for Params {
        fn validate(&self) -> Result<(), String> {
            Ok(())
        }
    }

    impl Kind<Toy> for Params {
        fn execute(
            &self,
            _backend: Backend,
            cx: &mut TrialContext<'_, Toy>,
        ) -> crate::Result<Measurement> {
            let inflation = if cx.mutant.is_some() { 10.0 } else { 0.0 };
            let value = self.value + inflation;
            Ok(Measurement::new(
                "value",
                value,
                Comparator::Le,
                self.at_most.0,
                "",
            ))
        }

        fn unjudged_on(&self, backend: Backend, here: &Here) -> Option<String> {
            let gpu = here.gpu.as_ref()?;
            let named = self.targets.is_empty() || self.targets.contains(&gpu.name);
            (backend == Backend::Cuda && !named).then(|| format!("no target for {}", gpu.name))
        }
    }
}

crate::kinds! {
    /// The toy's `check:` block.
    pub enum ToyKinds for Toy {
        Compare(compare) "compare", BOTH, "a number against a bound";
    }
}

impl Subject for Toy {
    const NAME: &'static str = "toy";
    type Device = NoDevice;
    type Kinds = ToyKinds;
    type Mutant = ToyMutant;
    type Options = BasicOptions;
    type Error = crate::Error;

    fn open_device(_options: &BasicOptions) -> crate::Result<NoDevice> {
        Err(crate::Error::CudaUnavailable(
            "the toy subject has no device".into(),
        ))
    }

    fn device_facts(device: &NoDevice) -> DeviceFacts {
        match *device {}
    }

    fn free_memory(device: &NoDevice) -> crate::Result<(u64, u64)> {
        match *device {}
    }

    fn workload() -> Option<&'static dyn Workload<Self>> {
        Some(&ToyWorkload)
    }
}

/// The toy's workload: it names a model, so the core's driver kinds load
/// for it; with no device it never trains.
pub struct ToyWorkload;

impl Workload<Toy> for ToyWorkload {
    fn models(&self) -> &[&'static str] {
        &["toy-model"]
    }

    fn upload_bytes(&self, _setup: &TrainSetup) -> Result<u64, BoxError> {
        Ok(1 << 10)
    }

    fn prepare<'d>(
        &self,
        device: &'d mut NoDevice,
        _setup: &TrainSetup,
        _mutant: Option<&ToyMutant>,
    ) -> Result<Box<dyn TrainSession + 'd>, BoxError> {
        match *device {}
    }
}

/// A contract `id` whose tests are `tests` (YAML list items, indented by
/// two spaces), as if read from `contracts/{id}.yaml`.
pub fn contract(id: &str, requires_cuda: bool, tests: &str) -> ContractOf<Toy> {
    let requires = if requires_cuda { "[cuda]" } else { "[]" };
    let text = format!(
        "metadata:\n  id: {id}\n  version: 1.0.0\n  description: a toy contract\nrequires: {requires}\nfalsification_tests:\n{tests}"
    );
    let path = Path::new("contracts").join(format!("{id}.yaml"));
    match crate::contract::parse::<Toy>(&path, &text) {
        Ok(c) => c,
        Err(e) => panic!("{text}\n{e}"),
    }
}

/// One toy test, as a YAML list item.
pub fn test(id: &str, value: f64, at_most: f64, targets: &[&str]) -> String {
    format!(
        "  - id: {id}\n    rule: r\n    prediction: p\n    if_fails: f\n    mutant: inflated\n    check: {{kind: compare, value: {value}, at_most: {at_most}, targets: [{}]}}\n",
        targets.join(", ")
    )
}
