//! `.config/nextest.toml` states which cuda trials have the GPU to
//! themselves (the `gpu` group, run alone) and lets every other one share a
//! GPU (`gpu-shared`). The rule lives in that file, as lists of test-name
//! patterns in two overrides: the trials that need the whole host alone and
//! those that need one GPU alone (the one `scripts/gpu-suite.sh` lets run
//! beside others on a host of several GPUs). This test holds the lists to
//! the checks themselves (`needs_the_gpu_alone`, `needs_the_whole_host`). A
//! timed trial added to a contract without a line in the file fails here,
//! not as a noisy timing on the GPU.

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

/// Whether an override is the one whose `threads-required` line
/// `scripts/gpu-suite.sh` rewrites on a host of several GPUs: the trials
/// that need one GPU, not the host, alone.
fn is_one_gpu_alone(o: &toml_edit::Table) -> bool {
    o.get("threads-required")
        .and_then(|t| t.as_value())
        .and_then(|v| v.decor().suffix())
        .and_then(|s| s.as_str())
        .is_some_and(|comment| comment.contains("# one GPU alone"))
}

/// The `test(/regex/)` patterns of the overrides that put contract trials
/// in the `gpu` group and are (`one_gpu`) or are not the one-GPU override.
fn alone_patterns(one_gpu: bool) -> Vec<Regex> {
    let between = Regex::new(r"test\(/(.*?)/\)").expect("a valid pattern");
    let filters: Vec<String> = overrides()
        .iter()
        .filter(|o| puts_contract_trials_alone(o) && is_one_gpu_alone(o) == one_gpu)
        .filter_map(|o| o.get("filter").and_then(|f| f.as_str()).map(String::from))
        .collect();
    assert!(
        filters.len() == 1,
        "one override puts the contract trials that need {} alone in the `gpu` group, not {}",
        if one_gpu { "one GPU" } else { "the host" },
        filters.len()
    );
    filters
        .iter()
        .flat_map(|f| {
            between
                .captures_iter(f)
                .map(|c| c[1].to_string())
                .collect::<Vec<_>>()
        })
        .map(|p| Regex::new(&p).expect("the filter's patterns are valid regexes"))
        .collect()
}

/// The trials that need the GPU alone start after every other test: nextest
/// starts one only when every running test has finished, so one met among the
/// shared trials idles the host while they drain (and the shared trials fill
/// a cold kernel cache for them, many compiling at once).
#[test]
fn the_trials_run_alone_come_last() {
    let priority = |o: &toml_edit::Table| {
        o.get("priority")
            .and_then(|p| p.as_integer())
            .unwrap_or_default()
    };
    let overrides = overrides();
    let alone: Vec<i64> = overrides
        .iter()
        .filter(|o| puts_contract_trials_alone(o))
        .map(priority)
        .collect();
    let others: Vec<i64> = overrides
        .iter()
        .filter(|o| !puts_contract_trials_alone(o))
        .map(priority)
        .collect();
    let highest_alone = alone.iter().copied().max().unwrap_or_default();
    assert!(
        others.iter().all(|&p| p > highest_alone) && highest_alone < 0,
        "the `gpu` overrides' priorities {alone:?} are not below the others' {others:?} \
         and the default, 0"
    );
}

#[test]
fn the_trials_run_alone_are_exactly_those_whose_check_needs_the_gpu_alone() {
    let (host, one_gpu) = (alone_patterns(false), alone_patterns(true));
    let contracts =
        load_dir::<Qlora>(&Path::new(ROOT).join("contracts")).expect("the shipped contracts load");
    let mut wrong = Vec::new();
    let (mut alone, mut whole_host) = (0, 0);
    for trial in plan::<Qlora>(contracts)
        .iter()
        .filter(|t| t.backend == Backend::Cuda)
    {
        let name = format!("[cuda] {}", trial.name);
        let check = &trial.test().check;
        let in_host = host.iter().any(|p| p.is_match(&name));
        let in_one_gpu = one_gpu.iter().any(|p| p.is_match(&name));
        let needs_host = check.needs_the_gpu_alone() && check.needs_the_whole_host();
        let needs_gpu = check.needs_the_gpu_alone() && !needs_host;
        alone += usize::from(check.needs_the_gpu_alone());
        whole_host += usize::from(needs_host);
        if (in_host, in_one_gpu) != (needs_host, needs_gpu) {
            wrong.push(format!(
                "{name}: listed for the host {in_host}, for one GPU {in_one_gpu}; \
                 needs the host alone {needs_host}, one GPU alone {needs_gpu}"
            ));
        }
    }
    assert!(alone > 0, "no shipped trial needs the GPU alone");
    assert!(whole_host > 0, "no shipped trial needs the host alone");
    assert!(
        wrong.is_empty(),
        ".config/nextest.toml's `gpu` overrides disagree with the checks:\n{}",
        wrong.join("\n")
    );
}

/// Every override names its test group: `.ci/run` checks that each filter
/// still matches a test through nextest's listing of the test groups, which
/// leaves out an override that sets none (a priority alone, say), so such an
/// override would fail CI there for a reason no test here names.
#[test]
fn every_override_names_a_test_group() {
    let without: Vec<String> = overrides()
        .iter()
        .filter(|o| o.get("test-group").is_none())
        .map(|o| {
            o.get("filter")
                .and_then(|f| f.as_str())
                .unwrap_or("(no filter)")
                .to_string()
        })
        .collect();
    assert!(
        without.is_empty(),
        "overrides without a test-group (.ci/run cannot check their filters): {without:?}"
    );
}

/// A trial that needs the whole host alone (data-parallel ranks beside
/// their collectives, the PyTorch peer, the pre-warm's pool of compiler
/// threads) keeps CUDA's default hardware queues; the harness asks for one
/// queue only for the trials alone on one GPU whose check runs one stream.
#[test]
fn the_trials_that_need_the_whole_host_keep_cudas_default_queues() {
    let contracts =
        load_dir::<Qlora>(&Path::new(ROOT).join("contracts")).expect("the shipped contracts load");
    let planned = plan::<Qlora>(contracts);
    let cuda = || planned.iter().filter(|t| t.backend == Backend::Cuda);
    let wrong: Vec<&str> = cuda()
        .filter(|t| t.test().check.needs_the_whole_host() && t.test().check.runs_on_one_stream())
        .map(|t| t.name.as_str())
        .collect();
    assert!(
        wrong.is_empty(),
        "whole-host trials asking for one queue: {wrong:?}"
    );
    let one_stream = cuda()
        .filter(|t| t.test().check.needs_the_gpu_alone() && t.test().check.runs_on_one_stream())
        .count();
    assert!(one_stream > 0, "no trial alone on its GPU runs one stream");
}
