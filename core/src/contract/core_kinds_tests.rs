//! The core's kinds and mutants in a subject's contracts: parsed beside the
//! subject's, refused with both lists, checked against the subject when a
//! contract loads, each error located.

use std::path::Path;

use crate::contract::{parse, ContractOf};
use crate::core_kinds::{kinds_markdown, Check, CoreKind, CoreMutant, MutantName, CORE_KINDS};
use crate::testing::{Toy, ToyKinds, ToyMutant};
use crate::Error;

/// A one-test toy contract whose test has `mutant` and `check`.
fn text(mutant: &str, check: &str) -> String {
    format!(
        "metadata: {{id: c, version: '1', description: d}}\nrequires: [cuda]\nfalsification_tests:\n  - id: T-1\n    rule: r\n    prediction: p\n    if_fails: f\n    mutant: {mutant}\n    check: {check}\n"
    )
}

fn load(mutant: &str, check: &str) -> crate::Result<ContractOf<Toy>> {
    parse::<Toy>(Path::new("contracts/c.yaml"), &text(mutant, check))
}

/// The error's line, column and message.
fn refused(mutant: &str, check: &str) -> (usize, usize, String) {
    match load(mutant, check) {
        Err(Error::Contract {
            line,
            column,
            message,
            ..
        }) => (line, column, message),
        other => panic!("{mutant} / {check}: {other:?}"),
    }
}

const PARITY: &str = "{kind: driver_target_parity, model: toy-model, steps: 2}";

#[test]
fn a_core_kind_and_a_core_mutant_load_beside_the_subjects() {
    let c = load("driver_older_target_module", PARITY).unwrap();
    let test = &c.falsification_tests[0];
    assert!(matches!(
        test.check,
        Check::Core(CoreKind::DriverTargetParity(_))
    ));
    assert_eq!(test.check.kind_name(), "driver_target_parity");
    assert_eq!(
        test.mutant,
        MutantName::Core(CoreMutant::DriverOlderTargetModule)
    );
    assert_eq!(test.mutant.to_string(), "driver_older_target_module");
    // A subject's mutant may name a core kind too: the workload applies it.
    let c = load("inflated", PARITY).unwrap();
    let test = &c.falsification_tests[0];
    assert_eq!(test.mutant.subject(), Some(&ToyMutant::Inflated));
    assert_eq!(test.mutant.core(), None);
    // The subject's kinds still parse as the subject's.
    let c = load("inflated", "{kind: compare, value: 1, at_most: 2}").unwrap();
    assert!(matches!(
        c.falsification_tests[0].check,
        Check::Subject(ToyKinds::Compare(_))
    ));
}

#[test]
fn an_unknown_kind_is_refused_with_the_subjects_kinds_and_the_cores() {
    let (line, _, message) = refused("inflated", "{kind: vibe_check}");
    assert_eq!(line, 9);
    assert!(
        message.contains(
            "unknown check kind `vibe_check`; known kinds: compare; the core's kinds: \
             driver_target_parity"
        ),
        "{message}"
    );
}

#[test]
fn an_unknown_mutant_is_refused_with_the_subjects_mutants_and_the_cores() {
    let (line, column, message) = refused("doubled", PARITY);
    assert_eq!((line, column), (8, 13), "{message}");
    assert!(
        message.contains("unknown variant `doubled`, expected `inflated`"),
        "{message}"
    );
    assert!(
        message.contains("or one of the core's mutants: `driver_older_target_module`"),
        "{message}"
    );
}

#[test]
fn a_model_the_workload_does_not_train_is_refused_at_its_key() {
    let check = "\n      kind: driver_target_parity\n      model: gpt-17\n      steps: 2";
    let (line, column, message) = refused("inflated", check);
    assert_eq!((line, column), (11, 14), "{message}");
    assert!(
        message.contains(
            "test `T-1`: model `gpt-17` is not one the workload of subject `toy` trains; \
             its models: toy-model"
        ),
        "{message}"
    );
}

#[test]
fn a_driver_mutant_on_a_subject_kind_is_refused_at_the_mutant() {
    let (line, _, message) = refused(
        "driver_sync_inside_capture",
        "{kind: compare, value: 1, at_most: 2}",
    );
    assert_eq!(line, 8);
    assert!(
        message.contains(
            "mutant `driver_sync_inside_capture` is injected by the driver observer, which only \
             the core's driver kinds attach; check kind `compare` would never see it"
        ),
        "{message}"
    );
}

#[test]
fn the_training_bounds_are_checked() {
    let (_, _, message) = refused(
        "inflated",
        "{kind: driver_target_parity, model: toy-model, steps: 201}",
    );
    assert!(
        message.contains("steps: 201 is above its bound of 200"),
        "{message}"
    );
    let (_, _, message) = refused(
        "inflated",
        "{kind: driver_target_parity, model: toy-model, steps: 1, graf: true}",
    );
    assert!(message.contains("unknown field `graf`"), "{message}");
}

#[test]
fn every_core_mutant_round_trips_through_its_name() {
    for (mutant, name) in CoreMutant::NAMES {
        assert_eq!(CoreMutant::from_name(name), Some(*mutant));
        assert_eq!(mutant.to_string(), *name);
        let parsed: MutantName<ToyMutant> = serde_yaml::from_str(name).unwrap();
        assert_eq!(parsed, MutantName::Core(*mutant));
    }
}

#[test]
fn the_reference_lists_the_subjects_kinds_then_the_cores() {
    let doc = kinds_markdown::<ToyKinds>();
    let (subject, core) = (
        doc.find("#### `compare`").unwrap(),
        doc.find("#### `driver_target_parity`").unwrap(),
    );
    assert!(subject < core, "{doc}");
    assert!(
        doc.contains("Minimal check: `{kind: driver_target_parity, model: tiny, steps: 2}`."),
        "{doc}"
    );
    for kind in CORE_KINDS {
        for (key, _) in kind.example {
            assert!(kind.params.iter().any(|p| p.name == *key), "{key}");
        }
    }
}

const LOSS_PARITY: &str =
    "{kind: graph_loss_parity, model: toy-model, checkpoints: [2, 4], learning_rate: 0.001}";
const SPEEDUP: &str = "{kind: graph_speedup, model: toy-model, batch: 4}";

/// The two-arm kinds load with their own mutant and refuse the other's, a
/// driver mutant and an unknown model, each located.
#[test]
fn the_two_arm_kinds_take_their_own_mutants_only() {
    let c = load("workload_graph_arm_learning_rate_doubled", LOSS_PARITY).unwrap();
    let test = &c.falsification_tests[0];
    assert!(matches!(
        test.check,
        Check::Core(CoreKind::GraphLossParity(_))
    ));
    assert_eq!(
        test.mutant.core(),
        Some(CoreMutant::WorkloadGraphArmLearningRateDoubled)
    );
    let c = load("workload_graph_arm_slowed", SPEEDUP).unwrap();
    assert!(matches!(
        c.falsification_tests[0].check,
        Check::Core(CoreKind::GraphSpeedup(_))
    ));
    for (mutant, check) in [
        ("workload_graph_arm_slowed", LOSS_PARITY),
        ("workload_graph_arm_learning_rate_doubled", SPEEDUP),
        ("driver_sync_inside_capture", SPEEDUP),
        ("workload_graph_arm_slowed", PARITY),
    ] {
        let (line, _, message) = refused(mutant, check);
        assert!(line > 0 && message.contains(mutant), "{mutant}: {message}");
    }
    let (_, _, message) = refused(
        "workload_graph_arm_slowed",
        "{kind: graph_speedup, model: nope, batch: 4}",
    );
    assert!(message.contains("nope"), "{message}");
}

const SPAN: &str = "{kind: driver_span_traffic, model: toy-model, steps: 2, from_kernel: squared_sum, to_kernel: gradient_clip}";

/// The span kind loads with its mutant (and the general driver mutants);
/// its mutant is refused elsewhere, and its kernel names are required and
/// non-empty.
#[test]
fn the_span_kind_takes_its_own_mutant_and_needs_its_kernel_names() {
    let c = load("driver_copy_to_host_in_span", SPAN).unwrap();
    let test = &c.falsification_tests[0];
    let Check::Core(CoreKind::DriverSpanTraffic(p)) = &test.check else {
        panic!("{:?}", test.check);
    };
    assert_eq!((p.from_kernel.as_str(), p.max), ("squared_sum", 0));
    assert_eq!(test.mutant.core(), Some(CoreMutant::DriverCopyToHostInSpan));
    assert!(load("driver_sync_inside_capture", SPAN).is_ok());
    let capture =
        "{kind: driver_capture, model: toy-model, steps: 2, graph: true, max_syncs_per_step: 1}";
    let (line, _, message) = refused("driver_copy_to_host_in_span", capture);
    assert_eq!(line, 8);
    assert!(
        message.contains(
            "mutant `driver_copy_to_host_in_span` is injected after the first launch of the \
             `from_kernel` of the core's `driver_span_traffic` only; check kind `driver_capture` \
             would never see it"
        ),
        "{message}"
    );
    let (_, _, message) = refused(
        "inflated",
        "{kind: driver_span_traffic, model: toy-model, steps: 2, from_kernel: squared_sum}",
    );
    assert!(message.contains("missing field `to_kernel`"), "{message}");
    let (_, _, message) = refused(
        "inflated",
        "{kind: driver_span_traffic, model: toy-model, steps: 2, from_kernel: '', to_kernel: x}",
    );
    assert!(
        message.contains("from_kernel: must name a kernel"),
        "{message}"
    );
}

const PREWARM: &str = "{kind: driver_prewarm, model: toy-model, steps: 3, batch: 2}";
const CAPTURE: &str =
    "{kind: driver_capture, model: toy-model, steps: 2, graph: true, max_syncs_per_step: 1}";

/// The driver-observed kinds run under the observer and hand the workload
/// the training they drive; the two-arm kinds do neither; every one of the
/// four refuses a model the workload does not train.
#[test]
fn the_driver_kinds_drive_their_training_under_the_observer() {
    for (check, steps, batch, graph) in [
        (PARITY, 2, 1, false),
        (PREWARM, 3, 2, false),
        (CAPTURE, 2, 1, true),
        (SPAN, 2, 1, false),
    ] {
        let c = load("inflated", check).unwrap();
        let kind = &c.falsification_tests[0].check;
        let Check::Core(kind) = kind else {
            panic!("{check}: not a core kind")
        };
        assert!(kind.observes_driver(), "{check}");
        let setup = kind
            .train_setup(7)
            .unwrap_or_else(|| panic!("{check}: no setup"));
        assert_eq!(setup.model, "toy-model", "{check}");
        assert_eq!(
            (setup.steps, setup.batch, setup.graph, setup.seed),
            (steps, batch, graph, 7),
            "{check}"
        );
        let elsewhere = check.replace("toy-model", "gpt-17");
        let (_, _, message) = refused("inflated", &elsewhere);
        assert!(
            message.contains("model `gpt-17` is not one"),
            "{check}: {message}"
        );
    }
    for check in [LOSS_PARITY, SPEEDUP] {
        let c = load("inflated", check).unwrap();
        let Check::Core(kind) = &c.falsification_tests[0].check else {
            panic!("{check}: not a core kind")
        };
        assert!(!kind.observes_driver(), "{check}");
        assert!(kind.train_setup(7).is_none(), "{check}");
    }
}
