//! The parameter reference of the check kinds, generated from the registry.
//!
//! Each kind declares its parameters as data next to its `Params` struct
//! (`PARAMS`, a slice of [`ParamDoc`]) and a minimal valid check block
//! (`EXAMPLE`); the `registry!` line hands both to [`super::KindInfo`], and
//! [`reference_markdown`] renders them. Bounds name the constants the code
//! enforces ([`Piece::Int`], [`Piece::Real`]), so a changed bound changes
//! the reference; `tests/kinds.rs` checks the names, the spellings and the
//! defaults against serde, and the README's copy against this text.

use std::fmt::Write;

use qlora::model::PRESETS;

use super::params::MIN_TIMEOUT_S;
use super::training::CPU_MAX_BASE_PARAMS;
use super::{Backend, CheckSpec, KindInfo, KINDS};
use Piece::{Int, OneOf, Presets, Text};

/// One documented parameter of a check kind.
#[derive(Debug, Clone, Copy)]
pub struct ParamDoc {
    /// The key in the `check:` block.
    pub name: &'static str,
    /// What an absent key means.
    pub default: ParamDefault,
    /// The values it accepts, in pieces (see [`Piece`]).
    pub bound: &'static [Piece],
    /// What it does, in a few words.
    pub meaning: &'static str,
}

/// What an absent parameter means.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ParamDefault {
    /// The parameter must be given.
    Required,
    /// The default, as YAML the parser reads (a test parses it and compares
    /// it with the default the parser fills in).
    Yaml(&'static str),
    /// No single value: what omitting it means, in words (e.g. "the preset's").
    Otherwise(&'static str),
}

/// A piece of a bound's text.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Piece {
    /// Words, as written.
    Text(&'static str),
    /// A whole number: the constant the code checks against.
    Int(usize),
    /// A real number: the constant the code checks against.
    Real(f64),
    /// The names of the model presets.
    Presets,
    /// The accepted spellings of an enumerated value (a test compares them
    /// with serde's list).
    OneOf(&'static [&'static str]),
}

/// The spellings of [`super::op::Pass`].
pub const PASSES: &[&str] = &["forward", "backward"];

/// The spellings of [`super::params::Precision`].
pub const PRECISIONS: &[&str] = &["f32", "tf32", "f16", "bf16"];

/// The spellings of a step mode's defaults, the default of every `mode`,
/// `baseline` and `candidate` that has one.
pub const DEFAULT_STEP_MODE: &str =
    "{graph: false, clip: global, base: fp32, backward_math: fp32, mlp_activations: recompute, backward_weights: shared, lm_head_operands: f32, projection_operands: f32}";

/// The bound of a step mode, written out once for every kind that takes one.
pub const STEP_MODE_BOUND: &[Piece] = &[
    Text("`{graph, clip, base, backward_math, mlp_activations, backward_weights, lm_head_operands, projection_operands}`; `clip`: "),
    OneOf(&["global", "per_layer"]),
    Text("; `base`: "),
    OneOf(&["fp32", "nf4"]),
    Text("; `backward_math`: "),
    OneOf(&["fp32", "tf32"]),
    Text("; `mlp_activations`: "),
    OneOf(&["recompute", "keep"]),
    Text("; `backward_weights`: "),
    OneOf(&["shared", "transposed"]),
    Text("; `lm_head_operands`: "),
    OneOf(&["f32", "f16"]),
    Text("; `projection_operands`: "),
    OneOf(&["f32", "f16"]),
];

/// The bound of a `model`: any preset.
pub const MODEL_BOUND: &[Piece] = &[Text("a preset: "), Presets];

/// The bound of a `model` a training check may also run on cpu.
pub const TRAINING_MODEL_BOUND: &[Piece] = &[
    Text("a preset: "),
    Presets,
    Text("; on cpu at most "),
    Int(CPU_MAX_BASE_PARAMS),
    Text(" frozen parameters"),
];

/// The default optimiser hyper-parameters, as YAML.
pub const DEFAULT_HYPER: &str = "{lr: 0.001, max_grad_norm: 1, weight_decay: 0}";

/// The bound of `hyper`.
pub const HYPER_BOUND: &[Piece] = &[Text(
    "`{lr, max_grad_norm, weight_decay}`: `lr`, `max_grad_norm` > 0, `weight_decay` >= 0",
)];

/// The bound as Markdown text.
pub fn bound_text(bound: &[Piece]) -> String {
    bound.iter().map(piece_text).collect()
}

fn piece_text(piece: &Piece) -> String {
    match piece {
        Piece::Text(t) => (*t).to_string(),
        Piece::Int(n) => int_text(*n),
        Piece::Real(x) => real_text(*x),
        Piece::Presets => code_list(PRESETS.iter().map(|p| p.name)),
        Piece::OneOf(names) => code_list(names.iter().copied()),
    }
}

fn code_list<'a>(names: impl Iterator<Item = &'a str>) -> String {
    names
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `2^k` for large powers of two, else the digits with thousands separators.
fn int_text(n: usize) -> String {
    if n >= 1 << 16 && n.is_power_of_two() {
        return format!("2^{}", n.trailing_zeros());
    }
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) && digits.len() > 4 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A whole power of two as `2^k`, otherwise in exponent notation (`2e10`).
fn real_text(x: f64) -> String {
    let whole = x.fract() == 0.0 && (1.0..1e18).contains(&x);
    if whole && (x as u64).is_power_of_two() {
        int_text(x as usize)
    } else {
        format!("{x:e}")
    }
}

fn default_text(default: ParamDefault) -> String {
    match default {
        ParamDefault::Required => "required".into(),
        ParamDefault::Yaml(v) => format!("`{v}`"),
        ParamDefault::Otherwise(t) => t.into(),
    }
}

/// A kind's minimal check block as one line of flow YAML, with `extra`
/// pairs appended (or replacing the example's value of the same key).
pub fn example_yaml(kind: &KindInfo, extra: &[(&str, &str)]) -> String {
    let mut pairs: Vec<(&str, &str)> = kind
        .example
        .iter()
        .filter(|(k, _)| !extra.iter().any(|(e, _)| e == k))
        .copied()
        .collect();
    pairs.extend_from_slice(extra);
    let body: Vec<String> = pairs.iter().map(|(k, v)| format!(", {k}: {v}")).collect();
    format!("{{kind: {}{}}}", kind.name, body.concat())
}

/// The default timeout of a kind, read from its parsed example, and the
/// floor of a test's own `timeout_s`.
fn timeout_text(kind: &KindInfo) -> Option<String> {
    let spec: CheckSpec = serde_yaml::from_str(&example_yaml(kind, &[])).ok()?;
    Some(format!(
        "{} s; a test's `timeout_s` may set another, of at least {MIN_TIMEOUT_S} s",
        spec.default_timeout_s()
    ))
}

fn kind_markdown(out: &mut String, kind: &KindInfo) -> std::fmt::Result {
    let backends: Vec<&str> = kind.backends.iter().map(|b| Backend::as_str(*b)).collect();
    writeln!(out, "#### `{}`\n", kind.name)?;
    writeln!(
        out,
        "Measures {}. Runs on: {}.",
        kind.measures,
        backends.join(", ")
    )?;
    if let Some(t) = timeout_text(kind) {
        writeln!(out, "Default timeout: {t}.")?;
    }
    writeln!(out, "Minimal check: `{}`.\n", example_yaml(kind, &[]))?;
    writeln!(out, "| parameter | default | bound | meaning |")?;
    writeln!(out, "| --- | --- | --- | --- |")?;
    for p in kind.params {
        writeln!(
            out,
            "| `{}` | {} | {} | {} |",
            p.name,
            default_text(p.default),
            bound_text(p.bound),
            p.meaning
        )?;
    }
    Ok(())
}

/// The Markdown reference of every registered kind: what it measures, where
/// it runs, a minimal check block, and a table of its parameters (default
/// or "required", bound, meaning). `falsify kinds` prints it; the README
/// holds a copy that a test keeps current.
pub fn reference_markdown() -> String {
    let mut out = String::new();
    for (i, kind) in KINDS.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        // Writing into a String cannot fail.
        let _ = kind_markdown(&mut out, kind);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_read_as_the_bounds_are_written() {
        assert_eq!(int_text(64), "64");
        assert_eq!(int_text(1_000), "1000");
        assert_eq!(int_text(10_000), "10,000");
        assert_eq!(int_text(100_000), "100,000");
        assert_eq!(int_text(1 << 20), "2^20");
        assert_eq!(real_text((1u64 << 30) as f64), "2^30");
        assert_eq!(real_text(2e10), "2e10");
        assert_eq!(real_text(5e8), "5e8");
    }
}
