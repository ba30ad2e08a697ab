//! CSV cells a spreadsheet cannot run.
//!
//! A spreadsheet treats a cell that starts with `=`, `+`, `-` or `@` (or a
//! tab or carriage return before one) as a formula, so a test id, detail or
//! device name read from elsewhere could run `=HYPERLINK(...)` on the
//! reader's machine. OWASP's remedy for CSV injection is to prefix such a
//! cell with a single quote, which spreadsheets show as text. Numbers are
//! left alone: `-0.5` is a number, not a formula, and must stay one; so are
//! comparison operators alone (`==`, `>=`): with nothing to compare there is
//! no formula to run, and a comparator cell must read as written.
//!
//! The prefix is undone when the harness reads its own CSVs back. To keep
//! that exact for every text, a cell that is already quotes followed by a
//! formula character gets one more quote on the way out and loses one on the
//! way in.

use std::borrow::Cow;

/// The characters that make a spreadsheet read a cell as a formula.
const FORMULA_START: [char; 6] = ['=', '+', '-', '@', '\t', '\r'];

/// The quotes of a cell's start and the rest, when the rest starts a formula.
fn formula_after_quotes(cell: &str) -> Option<usize> {
    let rest = cell.trim_start_matches('\'');
    rest.starts_with(FORMULA_START)
        .then_some(cell.len() - rest.len())
}

/// A number a spreadsheet reads as a number (not `inf` or `NaN`, which it
/// would read as a formula naming a function).
fn is_plain_number(cell: &str) -> bool {
    cell.parse::<f64>().is_ok_and(f64::is_finite)
}

/// Comparison operators and nothing else (`==`, `=`, `!=`): a spreadsheet
/// has no operand to evaluate, so nothing can run.
fn is_bare_operator(cell: &str) -> bool {
    !cell.is_empty() && cell.chars().all(|c| matches!(c, '=' | '<' | '>' | '!'))
}

/// The cell as written to a CSV: prefixed with `'` when a spreadsheet would
/// run it as a formula. A cell that already starts with quotes before a
/// formula character gets one more, whatever follows, so that [`restore`]
/// is exact (and reads the `'==` of reports written before operators were
/// exempt as `==`).
pub fn neutralise(cell: &str) -> Cow<'_, str> {
    match formula_after_quotes(cell) {
        Some(0) if is_plain_number(cell) || is_bare_operator(cell) => Cow::Borrowed(cell),
        Some(_) => Cow::Owned(format!("'{cell}")),
        None => Cow::Borrowed(cell),
    }
}

/// The cell as it was before [`neutralise`].
pub fn restore(cell: &str) -> &str {
    match formula_after_quotes(cell) {
        Some(quotes) if quotes > 0 => &cell[1..],
        _ => cell,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formulas_are_prefixed_and_numbers_are_not() {
        assert_eq!(neutralise("=HYPERLINK(\"x\")"), "'=HYPERLINK(\"x\")");
        for cell in ["+1+2", "-1+2", "@SUM(A1)", "\t=1", "\r=1", "-", "-inf"] {
            assert_eq!(neutralise(cell), format!("'{cell}"), "{cell:?}");
        }
        for cell in ["-0.5", "+3", "-1e-7", "F-RMS-001", "rmsnorm", "", "'quoted"] {
            assert_eq!(neutralise(cell), cell, "{cell:?}");
        }
    }

    /// A comparator is not a formula: `==` is written as `==`.
    #[test]
    fn comparison_operators_alone_are_not_formulas() {
        for cell in ["==", "=", "!=", "<=", ">="] {
            assert_eq!(neutralise(cell), cell, "{cell:?}");
        }
        for cell in ["==1", "=A1", "=-1", "= 1", "=\"x\""] {
            assert_eq!(neutralise(cell), format!("'{cell}"), "{cell:?}");
        }
        // Reports written before the exemption read back as the operator.
        assert_eq!(restore("'=="), "==");
    }

    #[test]
    fn restore_undoes_neutralise_for_every_text() {
        for cell in [
            "=1", "'=1", "''=1", "-0.5", "'-0.5", "-x", "plain", "'", "''", "'x", "@", "", "==",
            "'==", "''==",
        ] {
            assert_eq!(restore(&neutralise(cell)), cell, "{cell:?}");
        }
    }

    proptest::proptest! {
        #[test]
        fn restore_undoes_neutralise_for_any_text(cell in "['=+@<>!\t\r-]{0,3}.{0,4}") {
            let written = neutralise(&cell);
            proptest::prop_assert_eq!(restore(&written), cell.as_str());
        }
    }
}
