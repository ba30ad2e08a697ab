//! CSV cells a spreadsheet cannot run.
//!
//! A spreadsheet treats a cell that starts with `=`, `+`, `-` or `@` (or a
//! tab or carriage return before one) as a formula, so a test id, detail or
//! device name read from elsewhere could run `=HYPERLINK(...)` on the
//! reader's machine. OWASP's remedy for CSV injection is to prefix such a
//! cell with a single quote, which spreadsheets show as text. Numbers are
//! left alone: `-0.5` is a number, not a formula, and must stay one.
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

/// The cell as written to a CSV: prefixed with `'` when a spreadsheet would
/// run it as a formula.
pub fn neutralise(cell: &str) -> Cow<'_, str> {
    match formula_after_quotes(cell) {
        Some(0) if is_plain_number(cell) => Cow::Borrowed(cell),
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

    #[test]
    fn restore_undoes_neutralise_for_every_text() {
        for cell in [
            "=1", "'=1", "''=1", "-0.5", "'-0.5", "-x", "plain", "'", "''", "'x", "@", "",
        ] {
            assert_eq!(restore(&neutralise(cell)), cell, "{cell:?}");
        }
    }
}
