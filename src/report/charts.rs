//! SVG charts of the regression report, drawn with plotters' SVG backend:
//!
//! - `speedups.svg`: each throughput ratio (baseline time / candidate time)
//!   with its bootstrap CI as whiskers, the baseline run's ratio as a dot.
//! - `bandwidth.svg`: rows whose baseline is `d2d copy`. Their ratio is
//!   copy time / kernel time over the same bytes, which is the kernel's
//!   bandwidth as a fraction of the device-to-device copy ceiling (1.0).
//! - `tokens.svg`: training-step rows (subject `train_step` or starting with
//!   `tokens/s`): tokens/s = batch x seq_len / (median_ms / 1000), per preset
//!   and mode.
//!
//! A chart without rows in the current run is not drawn; its note says why.

use std::path::Path;

use plotters::prelude::*;

use super::compare::{RunComparison, SpeedupDiff};
use super::SpeedupRow;
use crate::error::{Error, Result};

/// One chart of the report: the file written, or why there is none.
#[derive(Debug, Clone, PartialEq)]
pub struct Chart {
    pub title: String,
    /// File name next to `REPORT.md`, when drawn.
    pub file: Option<String>,
    /// One sentence on what the chart shows, or why it was omitted.
    pub note: String,
}

/// The `baseline` column value of the copy-ceiling rows.
pub const COPY_BASELINE: &str = "d2d copy";

fn is_copy_row(r: &SpeedupRow) -> bool {
    r.baseline.trim().eq_ignore_ascii_case(COPY_BASELINE)
}

fn is_tokens_row(r: &SpeedupRow) -> bool {
    r.subject.starts_with("tokens/s") || r.subject == "train_step"
}

/// One bar or interval of a chart.
struct Item {
    label: String,
    value: f64,
    low: f64,
    high: f64,
    /// The baseline run's value, for the dot.
    reference: Option<f64>,
}

/// Draws every chart into `dir` and says what was drawn.
pub fn write_charts(dir: &Path, cmp: &RunComparison) -> Result<Vec<Chart>> {
    // A run that measured no speedups (e.g. CPU-only) still gets the charts:
    // they show the baseline's measurements, labelled as such.
    let from_baseline = !cmp.speedups.iter().any(|s| s.current.is_some());
    let baseline_only: Vec<SpeedupDiff> = if from_baseline {
        cmp.speedups
            .iter()
            .map(|s| SpeedupDiff {
                baseline: None,
                current: s.baseline.clone(),
            })
            .collect()
    } else {
        Vec::new()
    };
    let source = if from_baseline {
        &baseline_only
    } else {
        &cmp.speedups
    };
    // Self-test rows measure an injected fault, not the system: not charted.
    let current: Vec<&SpeedupDiff> = source
        .iter()
        .filter(|s| {
            s.current
                .as_ref()
                .is_some_and(|r| !r.test_id.ends_with("::mutant"))
        })
        .collect();
    let of_run = if from_baseline {
        " (baseline run: the current run measured none)"
    } else {
        ""
    };
    let ratio_item = |s: &SpeedupDiff| -> Option<Item> {
        let c = s.current.as_ref()?;
        Some(Item {
            label: format!(
                "{} {} {} b{} s{}: {} / {}",
                c.test_id, c.subject, c.model, c.batch, c.seq_len, c.baseline, c.candidate
            ),
            value: c.ratio,
            low: c.ratio_ci_low,
            high: c.ratio_ci_high,
            reference: s.baseline.as_ref().map(|b| b.ratio),
        })
    };
    let mut charts = Vec::new();

    let speedups: Vec<Item> = current
        .iter()
        .filter(|s| s.current.as_ref().is_some_and(|r| !is_copy_row(r)))
        .filter_map(|s| ratio_item(s))
        .collect();
    charts.push(draw_or_omit(
        dir,
        "speedups.svg",
        &format!("Speedups (baseline time / candidate time){of_run}"),
        "ratio, 95% CI whiskers; dot: baseline run; red line: 1.0 (no speedup)",
        speedups,
        Some(1.0),
        "Each throughput ratio of the current run with its confidence interval; the dot is the baseline run's ratio.",
        "No speedup rows in the current run (no `throughput_ratio` check ran here), so the speedup chart is omitted.",
    )?);

    let bandwidth: Vec<Item> = current
        .iter()
        .filter(|s| s.current.as_ref().is_some_and(is_copy_row))
        .filter_map(|s| {
            let mut item = ratio_item(s)?;
            if let Some(c) = &s.current {
                item.label = format!("{} {} {}", c.test_id, c.candidate, c.model);
            }
            Some(item)
        })
        .collect();
    charts.push(draw_or_omit(
        dir,
        "bandwidth.svg",
        &format!("Kernel bandwidth as a fraction of the d2d copy ceiling{of_run}"),
        "copy time / kernel time over the same bytes; red line: the copy ceiling",
        bandwidth,
        Some(1.0),
        "Each kernel's bandwidth as a fraction of a device-to-device copy of the same bytes (1.0 = copy speed).",
        "No rows with baseline `d2d copy` in the current run, so the bandwidth chart is omitted.",
    )?);

    let mut tokens: Vec<Item> = Vec::new();
    for s in current
        .iter()
        .filter(|s| s.current.as_ref().is_some_and(is_tokens_row))
    {
        let Some(c) = &s.current else { continue };
        let base = s.baseline.as_ref();
        let per_step = (c.batch * c.seq_len) as f64;
        let rate = |ms: f64| if ms > 0.0 { per_step * 1e3 / ms } else { 0.0 };
        for (mode, ms, base_ms) in [
            (
                &c.baseline,
                c.baseline_median_ms,
                base.map(|b| b.baseline_median_ms),
            ),
            (
                &c.candidate,
                c.candidate_median_ms,
                base.map(|b| b.candidate_median_ms),
            ),
        ] {
            let label = format!("{} b{} s{} {mode}", c.model, c.batch, c.seq_len);
            if tokens.iter().any(|t| t.label == label) {
                continue;
            }
            let value = rate(ms);
            tokens.push(Item {
                label,
                value,
                low: value,
                high: value,
                reference: base_ms.map(rate),
            });
        }
    }
    charts.push(draw_or_omit(
        dir,
        "tokens.svg",
        &format!("Training throughput (tokens/s) per preset and mode{of_run}"),
        "tokens/s = batch x seq_len / median step time; dot: baseline run",
        tokens,
        None,
        "Training tokens per second per model preset and step mode, from the median step times.",
        "No training-step throughput rows (subject `train_step` or `tokens/s...`) in the current run, so the tokens/s chart is omitted.",
    )?);
    Ok(charts)
}

#[allow(clippy::too_many_arguments)]
fn draw_or_omit(
    dir: &Path,
    file: &str,
    title: &str,
    x_desc: &str,
    items: Vec<Item>,
    rule: Option<f64>,
    shown: &str,
    omitted: &str,
) -> Result<Chart> {
    let path = dir.join(file);
    if items.is_empty() {
        // A chart of an earlier run must not pass for this one.
        if path.exists() {
            std::fs::remove_file(&path).map_err(|e| Error::io(&path, e))?;
        }
        return Ok(Chart {
            title: title.into(),
            file: None,
            note: omitted.into(),
        });
    }
    let svg = render(title, x_desc, &items, rule)
        .map_err(|e| Error::io(&path, std::io::Error::other(e.to_string())))?;
    super::write_bytes_atomic(&path, svg.as_bytes())?;
    Ok(Chart {
        title: title.into(),
        file: Some(file.into()),
        note: shown.into(),
    })
}

/// Draws horizontal intervals (or bars, when low == high) with one row per item.
fn render(
    title: &str,
    x_desc: &str,
    items: &[Item],
    rule: Option<f64>,
) -> std::result::Result<String, Box<dyn std::error::Error>> {
    // Row 0 is drawn at the bottom; reverse so the first item reads first.
    let items: Vec<&Item> = items.iter().rev().collect();
    let n = items.len();
    let longest = items.iter().map(|i| i.label.len()).max().unwrap_or(10);
    let label_px = (longest as u32 * 7 + 20).clamp(120, 560);
    let height = 120 + 34 * n as u32;
    let x_max = items
        .iter()
        .flat_map(|i| {
            [
                i.high,
                i.value,
                i.reference.unwrap_or(0.0),
                rule.unwrap_or(0.0),
            ]
        })
        .filter(|v| v.is_finite())
        .fold(0.0f64, f64::max)
        * 1.1;
    let x_max = if x_max > 0.0 { x_max } else { 1.0 };
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (label_px + 560, height)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(label_px)
            // Integer ranges are inclusive in plotters: 0..=n-1 gives n rows.
            .build_cartesian_2d(0.0..x_max, (0..n - 1).into_segmented())?;
        let labels: Vec<String> = items.iter().map(|i| i.label.clone()).collect();
        chart
            .configure_mesh()
            .disable_y_mesh()
            .label_style(("sans-serif", 13))
            .axis_desc_style(("sans-serif", 13))
            .y_labels(n)
            .y_label_formatter(&|v| match v {
                SegmentValue::CenterOf(i) => labels.get(*i).cloned().unwrap_or_default(),
                _ => String::new(),
            })
            .x_desc(x_desc)
            .draw()?;
        let is_bar = items.iter().all(|i| i.low == i.high);
        if is_bar {
            chart.draw_series(items.iter().enumerate().map(|(k, i)| {
                let mut bar = Rectangle::new(
                    [
                        (0.0, SegmentValue::Exact(k)),
                        (i.value, SegmentValue::Exact(k + 1)),
                    ],
                    BLUE.mix(0.6).filled(),
                );
                bar.set_margin(5, 5, 0, 0);
                bar
            }))?;
        } else {
            chart.draw_series(items.iter().enumerate().map(|(k, i)| {
                ErrorBar::new_horizontal(
                    SegmentValue::CenterOf(k),
                    i.low,
                    i.value,
                    i.high,
                    BLUE.filled(),
                    10,
                )
            }))?;
        }
        chart.draw_series(items.iter().enumerate().filter_map(|(k, i)| {
            i.reference
                .map(|r| Circle::new((r, SegmentValue::CenterOf(k)), 4, BLACK.filled()))
        }))?;
        if let Some(x) = rule {
            chart.draw_series(std::iter::once(PathElement::new(
                vec![(x, SegmentValue::Exact(0)), (x, SegmentValue::Last)],
                RED.stroke_width(1),
            )))?;
        }
        root.present()?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(label: &str, v: f64) -> Item {
        Item {
            label: label.into(),
            value: v,
            low: v * 0.9,
            high: v * 1.1,
            reference: Some(v * 1.05),
        }
    }

    #[test]
    fn renders_an_svg_with_labels() {
        let svg = render("t", "x", &[item("a b", 1.2), item("c", 0.8)], Some(1.0)).unwrap();
        assert!(svg.starts_with("<svg"));
        assert!(svg.contains("a b"));
    }
}
