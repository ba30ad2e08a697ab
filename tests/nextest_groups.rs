//! `.config/nextest.toml` states which cuda trials have the GPU to
//! themselves (the `gpu` group, run alone) and lets every other one share a
//! GPU (`gpu-shared`). The rule lives in that file, as a list of test-name
//! patterns; this test holds the list to the checks themselves: a cuda trial
//! of the shipped contracts matches the list exactly when its check
//! `needs_the_gpu_alone`. A timed trial added to a contract without a line
//! in the file fails here, not as a noisy timing on the GPU.

use std::path::Path;

use falsify_core::check::Backend;
use falsify_core::contract::load_dir;
use falsify_core::run::plan;
use falsify_qlora::Qlora;
use regex::Regex;
use toml_edit::DocumentMut;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The overrides of the default profile in `.config/nextest.toml`.
fn overrides() -> Vec<toml_edit::Table> {
    let text = std::fs::read_to_string(Path::new(ROOT).join(".config/nextest.toml"))
        .expect("reads .config/nextest.toml");
    let doc: DocumentMut = text.parse().expect(".config/nextest.toml is TOML");
    doc["profile"]["default"]["overrides"]
        .as_array_of_tables()
        .expect("the default profile has overrides")
        .iter()
        .cloned()
        .collect()
}

/// Whether an override puts contract trials in the `gpu` group.
fn puts_contract_trials_alone(o: &toml_edit::Table) -> bool {
    o.get("test-group").and_then(|g| g.as_str()) == Some("gpu")
        && o.get("filter")
            .and_then(|f| f.as_str())
            .is_some_and(|f| f.contains("binary_id(falsify::contracts)"))
}

/// The `test(/regex/)` patterns of the override that puts contract trials
/// in the `gpu` group.
fn alone_patterns() -> Vec<Regex> {
    let overrides = overrides();
    let filter = overrides
        .iter()
        .find(|o| puts_contract_trials_alone(o))
        .and_then(|o| o.get("filter").and_then(|f| f.as_str()))
        .expect("an override puts contract trials in the `gpu` group");
    let between = Regex::new(r"test\(/(.*?)/\)").expect("a valid pattern");
    between
        .captures_iter(filter)
        .map(|c| Regex::new(&c[1]).expect("the filter's patterns are valid regexes"))
        .collect()
}

/// The trials that need the GPU alone start before every other test: nextest
/// starts one only when every running test has finished, so one met among the
/// shared trials idles the host while they drain.
#[test]
fn the_trials_run_alone_come_first() {
    let priority = |o: &toml_edit::Table| {
        o.get("priority")
            .and_then(|p| p.as_integer())
            .unwrap_or_default()
    };
    let overrides = overrides();
    let alone = overrides
        .iter()
        .find(|o| puts_contract_trials_alone(o))
        .map(priority)
        .expect("an override puts contract trials in the `gpu` group");
    let others: Vec<i64> = overrides
        .iter()
        .filter(|o| !puts_contract_trials_alone(o))
        .map(priority)
        .collect();
    assert!(
        others.iter().all(|&p| p < alone),
        "the `gpu` override's priority {alone} does not outrank the others' {others:?} \
         (the default is 0)"
    );
}

#[test]
fn the_trials_run_alone_are_exactly_those_whose_check_needs_the_gpu_alone() {
    let patterns = alone_patterns();
    assert!(!patterns.is_empty(), "the `gpu` override names no trials");
    let contracts =
        load_dir::<Qlora>(&Path::new(ROOT).join("contracts")).expect("the shipped contracts load");
    let mut wrong = Vec::new();
    let mut alone = 0;
    for trial in plan::<Qlora>(contracts)
        .iter()
        .filter(|t| t.backend == Backend::Cuda)
    {
        let name = format!("[cuda] {}", trial.name);
        let listed = patterns.iter().any(|p| p.is_match(&name));
        let needs = trial.test().check.needs_the_gpu_alone();
        alone += usize::from(needs);
        if listed != needs {
            wrong.push(format!(
                "{name}: listed {listed}, needs the GPU alone {needs}"
            ));
        }
    }
    assert!(alone > 0, "no shipped trial needs the GPU alone");
    assert!(
        wrong.is_empty(),
        ".config/nextest.toml's `gpu` override disagrees with the checks:\n{}",
        wrong.join("\n")
    );
}
