//! The check kinds' parameter reference is current.
//!
//! The book's reference page (docs/src/reference/kinds.md) holds the
//! output of `falsify kinds` verbatim; each kind's
//! documented parameters are exactly the keys its serde `Params` accepts,
//! its documented spellings are serde's, and each default written as YAML is
//! the one the parser fills in.

use std::path::PathBuf;

use falsify_qlora::check::doc::{example_yaml, STEP_MODE_BOUND};
use falsify_qlora::check::{
    reference_markdown, CheckSpec, KindInfo, KindSet, ParamDefault, Piece, KINDS,
};

const BEGIN: &str = "<!-- kinds:begin -->\n";
const END: &str = "<!-- kinds:end -->";
/// A key and a value no kind accepts.
const BAD: &str = "zzz_not_accepted";

/// The text between the reference page's two markers.
fn reference_block() -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/src/reference/kinds.md");
    let text = std::fs::read_to_string(path).expect("docs/src/reference/kinds.md");
    let start = text
        .find(BEGIN)
        .expect("kinds.md has `<!-- kinds:begin -->`")
        + BEGIN.len();
    let len = text[start..]
        .find(END)
        .expect("kinds.md has `<!-- kinds:end -->` after the begin marker");
    text[start..start + len].to_string()
}

fn parse(yaml: &str) -> Result<CheckSpec, String> {
    serde_yaml::from_str(yaml).map_err(|e| e.to_string())
}

/// The names serde lists after "expected" in `error`, e.g. "unknown field
/// `x`, expected one of `a`, `b`" gives `[a, b]`.
fn serde_expected(error: &str) -> Vec<String> {
    let (_, list) = error
        .split_once("expected ")
        .unwrap_or_else(|| panic!("no list of expected names in: {error}"));
    list.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

#[test]
fn the_reference_page_lists_the_kinds_as_generated() {
    let (readme, generated) = (reference_block(), reference_markdown());
    if readme != generated {
        let line = readme
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| readme.lines().count().min(generated.lines().count()));
        panic!(
            "docs/src/reference/kinds.md's check kinds are not current (first difference at line {} of the block: {:?} vs generated {:?}); \
             run `cargo run --release -- kinds` and paste its output between `<!-- kinds:begin -->` and `<!-- kinds:end -->`",
            line + 1,
            readme.lines().nth(line),
            generated.lines().nth(line)
        );
    }
}

#[test]
fn every_example_is_a_valid_check_of_its_kind() {
    for kind in KINDS {
        let yaml = example_yaml(kind, &[]);
        let spec = parse(&yaml).unwrap_or_else(|e| panic!("{yaml}: {e}"));
        assert_eq!(spec.kind_name(), kind.name);
    }
}

/// An unknown key makes serde list every field the kind's `Params` accepts,
/// in declaration order: the documented names must be those.
#[test]
fn the_documented_parameters_are_the_ones_serde_accepts() {
    for kind in KINDS {
        let yaml = format!("{{kind: {}, {BAD}: 1}}", kind.name);
        let error = parse(&yaml).expect_err("an unknown key is refused");
        assert!(error.contains("unknown field"), "{yaml}: {error}");
        let documented: Vec<&str> = kind.params.iter().map(|p| p.name).collect();
        assert_eq!(
            serde_expected(&error),
            documented,
            "the PARAMS of `{}` differ from the fields of its Params",
            kind.name
        );
    }
}

/// The names serde lists when `key` is given an unknown spelling, as a
/// scalar or as the element of a list.
fn serde_variants(kind: &KindInfo, key: &str, wrap: impl Fn(&str) -> String) -> Vec<String> {
    for value in [wrap(BAD), wrap(&format!("[{BAD}]"))] {
        if let Err(e) = parse(&example_yaml(kind, &[(key, &value)])) {
            if e.contains("unknown variant") {
                return serde_expected(&e);
            }
        }
    }
    panic!("`{}`: `{key}` takes no enumerated spelling", kind.name)
}

fn one_ofs(bound: &[Piece]) -> Vec<Vec<String>> {
    let names = |p: &Piece| match p {
        Piece::OneOf(names) => Some(names.iter().map(|n| n.to_string()).collect()),
        _ => None,
    };
    bound.iter().filter_map(names).collect()
}

/// Each documented list of spellings is the one serde accepts; a step
/// mode's seven lists are those of its seven enumerated keys.
#[test]
fn the_documented_spellings_are_the_ones_serde_accepts() {
    let step_mode_keys = [
        "clip",
        "base",
        "backward_math",
        "mlp_activations",
        "backward_weights",
        "lm_head_operands",
        "projection_operands",
    ];
    for kind in KINDS {
        for p in kind.params {
            let lists = one_ofs(p.bound);
            let got: Vec<Vec<String>> = if p.bound == STEP_MODE_BOUND {
                step_mode_keys
                    .iter()
                    .map(|k| serde_variants(kind, p.name, |v| format!("{{{}: {v}}}", k)))
                    .collect()
            } else if lists.len() == 1 {
                vec![serde_variants(kind, p.name, str::to_string)]
            } else {
                assert!(lists.is_empty(), "{}.{}: several lists", kind.name, p.name);
                continue;
            };
            assert_eq!(got, lists, "the spellings of `{}.{}`", kind.name, p.name);
        }
    }
}

/// A default written as YAML parses to what the parser fills in when the
/// key is absent, checked for every such default but the two whose kinds'
/// minimal examples must set them (`sync_count` needs `graph: true`, and a
/// `throughput_ratio` of two equal modes says little).
#[test]
fn the_documented_defaults_are_the_real_ones() {
    let mut unchecked = Vec::new();
    for kind in KINDS {
        let base = example_yaml(kind, &[]);
        let absent = format!("{:?}", parse(&base).expect("the example parses"));
        for p in kind.params {
            let ParamDefault::Yaml(value) = p.default else {
                continue;
            };
            if kind.example.iter().any(|(k, _)| *k == p.name) {
                unchecked.push(format!("{}.{}", kind.name, p.name));
                continue;
            }
            let yaml = example_yaml(kind, &[(p.name, value)]);
            let given = parse(&yaml).unwrap_or_else(|e| panic!("{yaml}: {e}"));
            assert_eq!(
                format!("{given:?}"),
                absent,
                "`{}.{}`: the documented default `{value}` is not the real one",
                kind.name,
                p.name
            );
        }
    }
    assert_eq!(unchecked, ["sync_count.mode", "throughput_ratio.candidate"]);
}

/// Required parameters are required: the example without one is refused.
#[test]
fn the_documented_required_parameters_are_required() {
    for kind in KINDS {
        for p in kind.params {
            if p.default != ParamDefault::Required {
                continue;
            }
            let pairs: Vec<(&str, &str)> = kind
                .example
                .iter()
                .filter(|(k, _)| *k != p.name)
                .copied()
                .collect();
            let body: String = pairs.iter().map(|(k, v)| format!(", {k}: {v}")).collect();
            let yaml = format!("{{kind: {}{body}}}", kind.name);
            let error = parse(&yaml).expect_err("a required parameter is missing");
            assert!(
                error.contains(&format!("missing field `{}`", p.name)),
                "{yaml}: {error}"
            );
        }
    }
}
