//! `.config/nextest.toml` states which cuda trials have the GPU to
//! themselves (the `gpu` group, run alone) and lets every other one share a
//! GPU (`gpu-shared`). The rule lives in that file, as lists of test-name
//! patterns in overrides: the trials that need the whole host alone, those
//! that need one GPU alone (the one `scripts/gpu-suite.sh` lets run beside
//! others on a host of several GPUs) and the data-parallel ones that share
//! every GPU (`gpu-ranks`, in two overrides, the longest first). This test
//! holds the lists to the checks
//! themselves (`needs_the_gpu_alone`, `needs_the_whole_host`). A
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

/// Whether an override puts contract trials in the `gpu-ranks` group.
fn puts_contract_trials_on_every_gpu(o: &toml_edit::Table) -> bool {
    o.get("test-group").and_then(|g| g.as_str()) == Some("gpu-ranks")
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
    patterns(
        |o| puts_contract_trials_alone(o) && is_one_gpu_alone(o) == one_gpu,
        if one_gpu {
            "the trials that need one GPU alone in the `gpu` group"
        } else {
            "the trials that need the host alone in the `gpu` group"
        },
        false,
    )
}

/// The `test(/regex/)` patterns of the overrides that `which` picks: one
/// override, or at least one where `several`.
fn patterns(which: impl Fn(&toml_edit::Table) -> bool, what: &str, several: bool) -> Vec<Regex> {
    let between = Regex::new(r"test\(/(.*?)/\)").expect("a valid pattern");
    let filters: Vec<String> = overrides()
        .iter()
        .filter(|o| which(o))
        .filter_map(|o| o.get("filter").and_then(|f| f.as_str()).map(String::from))
        .collect();
    assert!(
        filters.len() == 1 || (several && !filters.is_empty()),
        "{} override(s) put {what}",
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

/// The untimed trials come first, the timed ones after them. The
/// data-parallel trials that share every GPU (`gpu-ranks`) start before
/// everything: they hold every GPU's lock, so a timed trial waits for the
/// last of them. The trials that need a GPU alone come after every shared
/// trial: on one GPU nextest starts one only when every running test has
/// finished, so one met among the shared trials idles the host while they
/// drain (and the shared trials fill a cold kernel cache for them, many
/// compiling at once).
#[test]
fn the_untimed_trials_come_first_and_the_timed_ones_after() {
    let priority = |o: &toml_edit::Table| {
        o.get("priority")
            .and_then(|p| p.as_integer())
            .unwrap_or_default()
    };
    let overrides = overrides();
    let of = |which: &dyn Fn(&toml_edit::Table) -> bool| -> Vec<i64> {
        overrides
            .iter()
            .filter(|o| which(o))
            .map(priority)
            .collect()
    };
    let alone = of(&puts_contract_trials_alone);
    let ranks = of(&puts_contract_trials_on_every_gpu);
    let shared = of(&|o| !puts_contract_trials_alone(o) && !puts_contract_trials_on_every_gpu(o));
    let highest_alone = alone.iter().copied().max().unwrap_or_default();
    let highest_shared = shared.iter().copied().max().unwrap_or_default();
    assert!(
        shared.iter().all(|&p| p > highest_alone) && highest_alone < 0,
        "the `gpu` overrides' priorities {alone:?} are not below the shared ones' {shared:?} \
         and the default, 0"
    );
    assert!(
        !ranks.is_empty() && ranks.iter().all(|&p| p > highest_shared),
        "the `gpu-ranks` overrides' priorities {ranks:?} are not above the shared ones' {shared:?}"
    );
}

/// Where each cuda trial runs, by what its check says of itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Placement {
    /// `gpu` group, every thread: nothing else on the host.
    HostAlone,
    /// `gpu` group, one GPU to itself.
    GpuAlone,
    /// `gpu-ranks`: a rank on every GPU, beside others like it.
    EveryGpu,
    /// `gpu-shared`.
    Shared,
}

fn placement(needs_the_gpu_alone: bool, needs_the_whole_host: bool) -> Placement {
    match (needs_the_gpu_alone, needs_the_whole_host) {
        (true, true) => Placement::HostAlone,
        (true, false) => Placement::GpuAlone,
        (false, true) => Placement::EveryGpu,
        (false, false) => Placement::Shared,
    }
}

#[test]
fn each_trial_is_placed_by_what_its_check_needs() {
    let (host, one_gpu) = (alone_patterns(false), alone_patterns(true));
    let ranks = patterns(
        puts_contract_trials_on_every_gpu,
        "the data-parallel trials that time nothing in the `gpu-ranks` group",
        true,
    );
    let listed = |ps: &[Regex], name: &str| ps.iter().any(|p| p.is_match(name));
    let contracts =
        load_dir::<Qlora>(&Path::new(ROOT).join("contracts")).expect("the shipped contracts load");
    let mut wrong = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for trial in plan::<Qlora>(contracts)
        .iter()
        .filter(|t| t.backend == Backend::Cuda)
    {
        let name = format!("[cuda] {}", trial.name);
        let check = &trial.test().check;
        let wanted = placement(check.needs_the_gpu_alone(), check.needs_the_whole_host());
        seen.insert(wanted);
        let found = match (
            listed(&host, &name),
            listed(&one_gpu, &name),
            listed(&ranks, &name),
        ) {
            (true, false, false) => Some(Placement::HostAlone),
            (false, true, false) => Some(Placement::GpuAlone),
            (false, false, true) => Some(Placement::EveryGpu),
            (false, false, false) => Some(Placement::Shared),
            _ => None,
        };
        if found != Some(wanted) {
            wrong.push(format!(
                "{name}: listed as {found:?}, its check needs {wanted:?}"
            ));
        }
    }
    for p in [
        Placement::HostAlone,
        Placement::GpuAlone,
        Placement::EveryGpu,
    ] {
        assert!(seen.contains(&p), "no shipped trial is placed {p:?}");
    }
    assert!(
        wrong.is_empty(),
        ".config/nextest.toml's overrides disagree with the checks:\n{}",
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
