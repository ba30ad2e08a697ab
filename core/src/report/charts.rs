//! SVG charts of the regression report, drawn with plotters' SVG backend:
//!
//! - `speedups.svg`: each throughput ratio (baseline time / candidate time)
//!   of two measured configurations, with its bootstrap CI as whiskers.
//! - `bandwidth.svg`: rows whose baseline is `d2d copy`. Their ratio is
//!   copy time / kernel time over the same bytes, which is the kernel's
//!   bandwidth as a fraction of the device-to-device copy ceiling (1.0).
//! - `tokens.svg`: training-step rows (subject `train_step` or starting with
//!   `tokens/s`): tokens/s = batch x seq_len / (median_ms / 1000), per preset
//!   and mode. A `tokens/s` row's baseline is a target, not a measurement:
//!   it is drawn as the pass threshold of the mode it judges, never as a bar.
//!
//! Every row is a point (or bar) coloured by its trial's verdict, with the
//! baseline run's value as a ring and the row's pass threshold as a tick, so
//! a passing row never looks like a regression. The legend names only what
//! the chart draws. Labels are drawn by hand in two lines, in a margin sized
//! from their length, so none is clipped. A chart without rows in the
//! current run is not drawn; its note says why.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::compare::{RunComparison, SpeedupDiff};
use super::markdown::workload;
use super::{trim_zeros, SpeedupRow, Status};
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

/// A row whose baseline is a stated target rate, not a measurement.
fn is_target_row(r: &SpeedupRow) -> bool {
    r.subject.starts_with("tokens/s")
}

fn is_tokens_row(r: &SpeedupRow) -> bool {
    is_target_row(r) || r.subject == "train_step"
}

/// How a row's point is coloured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mark {
    /// Its trial judged it and it passed.
    Pass,
    /// Its trial judged it and it was falsified.
    Fail,
    /// Not judged on its own (a part of a total, a skipped trial, a mode).
    Context,
}

impl Mark {
    /// The mark of a row with `threshold` from a trial with `status`.
    fn of(threshold: Option<f64>, status: Option<Status>) -> Mark {
        match (threshold, status) {
            (Some(_), Some(Status::Passed)) => Mark::Pass,
            (Some(_), Some(Status::Falsified)) => Mark::Fail,
            _ => Mark::Context,
        }
    }

    fn color(self) -> RGBColor {
        match self {
            Mark::Pass => PASS,
            Mark::Fail => FAIL,
            Mark::Context => CONTEXT,
        }
    }
}

const PASS: RGBColor = RGBColor(0x1a, 0x98, 0x50);
const FAIL: RGBColor = RGBColor(0xd7, 0x30, 0x27);
const CONTEXT: RGBColor = RGBColor(0x8c, 0x8c, 0x8c);
const THRESHOLD: RGBColor = RGBColor(0x7b, 0x32, 0x94);
const GUIDE: RGBColor = RGBColor(0x9e, 0x9e, 0x9e);
const SUBTITLE: RGBColor = RGBColor(0x55, 0x55, 0x55);

/// One row of a chart.
#[derive(Debug, Clone, PartialEq)]
struct Item {
    /// First label line (what was measured).
    title: String,
    /// Second label line (against what, where).
    subtitle: String,
    value: f64,
    low: f64,
    high: f64,
    /// The baseline run's value.
    reference: Option<f64>,
    /// The value the row must reach to pass.
    threshold: Option<f64>,
    mark: Mark,
}

/// What a chart is and says, besides its rows.
struct Spec<'a> {
    file: &'a str,
    title: String,
    x_desc: &'a str,
    /// A vertical guide line across the chart and its legend text.
    guide: Option<(f64, &'a str)>,
    /// Draw bars from 0 (magnitudes) rather than points.
    bars: bool,
    shown: &'a str,
    omitted: &'a str,
}

/// Draws every chart into `dir` and says what was drawn. `baseline` names
/// the baseline run for charts drawn from its rows.
pub fn write_charts(dir: &Path, cmp: &RunComparison, baseline: &str) -> Result<Vec<Chart>> {
    // A run that measured no speedups still gets the charts: they show the
    // baseline's measurements, labelled as such.
    let from_baseline = !cmp.speedups.iter().any(|s| s.current.is_some());
    let source: Vec<SpeedupDiff> = if from_baseline {
        cmp.speedups
            .iter()
            .map(|s| SpeedupDiff {
                baseline: None,
                current: s.baseline.clone(),
            })
            .collect()
    } else {
        cmp.speedups.clone()
    };
    // Self-test rows measure an injected fault, not the system: not charted.
    let rows: Vec<&SpeedupDiff> = source
        .iter()
        .filter(|s| s.current.as_ref().is_some_and(|r| !r.is_mutant()))
        .collect();
    let of_run = if from_baseline {
        format!(" — baseline `{baseline}` run (the current run measured none)")
    } else {
        String::new()
    };
    Ok(vec![
        draw_or_omit(dir, &speedups_spec(&of_run), speedup_items(&rows))?,
        draw_or_omit(dir, &bandwidth_spec(&of_run), bandwidth_items(&rows))?,
        draw_or_omit(dir, &tokens_spec(&of_run), token_items(&rows))?,
    ])
}

fn speedups_spec(of_run: &str) -> Spec<'static> {
    Spec {
        file: "speedups.svg",
        title: format!("Speedups: baseline time / candidate time{of_run}"),
        x_desc: "ratio (higher: the candidate is faster); whiskers: 95% CI",
        guide: Some((1.0, "1.0: no speedup")),
        bars: false,
        shown: "Each throughput ratio with its confidence interval, coloured by its trial's verdict; the tick is the ratio the trial needs, the ring the baseline run's ratio.",
        omitted: "No speedup rows in the current run (no `throughput_ratio` check ran here), so the speedup chart is omitted.",
    }
}

fn bandwidth_spec(of_run: &str) -> Spec<'static> {
    Spec {
        file: "bandwidth.svg",
        title: format!("Kernel bandwidth as a fraction of the d2d copy ceiling{of_run}"),
        x_desc: "copy time / kernel time over the same bytes; whiskers: 95% CI",
        guide: Some((1.0, "1.0: copy ceiling")),
        bars: false,
        shown: "Each kernel's bandwidth as a fraction of a device-to-device copy of the same bytes (1.0 = copy speed); the tick is the fraction its trial needs.",
        omitted: "No rows with baseline `d2d copy` in the current run, so the bandwidth chart is omitted.",
    }
}

fn tokens_spec(of_run: &str) -> Spec<'static> {
    Spec {
        file: "tokens.svg",
        title: format!("Training throughput (tokens/s) per preset and mode{of_run}"),
        x_desc: "tokens/s = batch x seq_len / median step time",
        guide: None,
        bars: true,
        shown: "Training tokens per second per model preset and step mode, from the median step times; a tick marks a stated tokens/s target.",
        omitted: "No training-step throughput rows (subject `train_step` or `tokens/s...`) in the current run, so the tokens/s chart is omitted.",
    }
}

/// A ratio row as a point with its interval.
fn ratio_item(s: &SpeedupDiff, title: String, subtitle: String) -> Option<Item> {
    let c = s.current.as_ref()?;
    Some(Item {
        title,
        subtitle,
        value: c.ratio,
        low: c.ratio_ci_low,
        high: c.ratio_ci_high,
        reference: s.baseline.as_ref().map(|b| b.ratio),
        threshold: c.threshold,
        mark: Mark::of(c.threshold, c.status),
    })
}

fn speedup_items(rows: &[&SpeedupDiff]) -> Vec<Item> {
    rows.iter()
        .filter_map(|s| {
            let c = s.current.as_ref()?;
            if is_copy_row(c) || is_target_row(c) {
                return None;
            }
            ratio_item(
                s,
                format!("{} {}", c.test_id, c.subject),
                format!("{} vs {}; {}", c.candidate, c.baseline, workload(c)),
            )
        })
        .collect()
}

fn bandwidth_items(rows: &[&SpeedupDiff]) -> Vec<Item> {
    rows.iter()
        .filter_map(|s| {
            let c = s.current.as_ref()?;
            if !is_copy_row(c) {
                return None;
            }
            ratio_item(
                s,
                format!("{} {}", c.test_id, c.subject),
                format!("{}, {}", c.candidate, workload(c)),
            )
        })
        .collect()
}

/// Tokens/s per (preset, mode): each measured mode once; a target row's
/// measurement replaces an earlier one of the same mode and brings its
/// target as the threshold, and its configuration's peak device memory
/// where the row has it. Grouped by preset, in first-seen order.
fn token_items(rows: &[&SpeedupDiff]) -> Vec<Item> {
    let mut items: Vec<Item> = Vec::new();
    let mut peaks: Vec<Option<f64>> = Vec::new();
    for s in rows {
        let Some(c) = s.current.as_ref().filter(|c| is_tokens_row(c)) else {
            continue;
        };
        let peak = c.peak_device_gib;
        for item in tokens_of(c, s.baseline.as_ref()) {
            match items
                .iter()
                .position(|i| i.title == item.title && i.subtitle == item.subtitle)
            {
                Some(k) if item.threshold.is_some() => (items[k], peaks[k]) = (item, peak),
                Some(_) => {}
                None => {
                    items.push(item);
                    peaks.push(peak);
                }
            }
        }
    }
    for (item, peak) in items.iter_mut().zip(&peaks) {
        if let Some(gib) = peak {
            item.subtitle = format!("{}, peak {gib:.2} GiB", item.subtitle);
        }
    }
    let mut presets: Vec<String> = Vec::new();
    for i in &items {
        if !presets.contains(&i.title) {
            presets.push(i.title.clone());
        }
    }
    items.sort_by_key(|i| presets.iter().position(|p| *p == i.title));
    items
}

/// The tokens/s items of one row: for a target row, the measured mode with
/// the target as its threshold (judged only when its trial was); for a
/// step comparison, both modes.
fn tokens_of(c: &SpeedupRow, base: Option<&SpeedupRow>) -> Vec<Item> {
    let per_step = (c.batch * c.seq_len) as f64;
    let rate = |ms: f64| if ms > 0.0 { per_step * 1e3 / ms } else { 0.0 };
    let title = format!("{}, batch {} x seq {}", c.model, c.batch, c.seq_len);
    let item = |mode: &str, ms: f64, base_ms: Option<f64>| Item {
        title: title.clone(),
        subtitle: mode.to_string(),
        value: rate(ms),
        low: rate(ms),
        high: rate(ms),
        reference: base_ms.map(rate),
        threshold: None,
        mark: Mark::Context,
    };
    if !is_target_row(c) {
        return vec![
            item(
                &c.baseline,
                c.baseline_median_ms,
                base.map(|b| b.baseline_median_ms),
            ),
            item(
                &c.candidate,
                c.candidate_median_ms,
                base.map(|b| b.candidate_median_ms),
            ),
        ];
    }
    // The ratio is rate / target, so its interval scales to tokens/s.
    let target = rate(c.baseline_median_ms);
    let judged = matches!(c.status, Some(Status::Passed | Status::Falsified));
    let threshold = judged.then_some(target);
    let mut measured = item(
        &c.candidate,
        c.candidate_median_ms,
        base.map(|b| b.candidate_median_ms),
    );
    measured.low = c.ratio_ci_low * target;
    measured.high = c.ratio_ci_high * target;
    measured.threshold = threshold;
    measured.mark = Mark::of(threshold, c.status);
    vec![measured]
}

fn draw_or_omit(dir: &Path, spec: &Spec, items: Vec<Item>) -> Result<Chart> {
    let path = dir.join(spec.file);
    if items.is_empty() {
        // A chart of an earlier run must not pass for this one.
        if path.exists() {
            std::fs::remove_file(&path).map_err(|e| Error::io(&path, e))?;
        }
        return Ok(Chart {
            title: spec.title.clone(),
            file: None,
            note: spec.omitted.into(),
        });
    }
    let svg =
        render(spec, &items).map_err(|e| Error::io(&path, std::io::Error::other(e.to_string())))?;
    super::write_bytes_atomic(&path, svg.as_bytes())?;
    Ok(Chart {
        title: spec.title.clone(),
        file: Some(spec.file.into()),
        note: spec.shown.into(),
    })
}

/// Font sizes as plotters takes them (the SVG gets size / 1.24 px).
const TITLE_FONT: f64 = 18.0;
const LABEL_FONT: f64 = 13.0;
const SUBTITLE_FONT: f64 = 11.0;

/// A generous estimate of a text's width in pixels (DejaVu Sans advances
/// average about 0.6 em; wide capitals and digits are allowed for).
fn text_px(text: &str, font: f64) -> u32 {
    (text.chars().count() as f64 * font / 1.24 * 0.66).ceil() as u32
}

const PLOT_PX: u32 = 560;
const RIGHT_MARGIN: u32 = 60;
const ROW_PX: u32 = 42;
const LEGEND_ROW_PX: u32 = 24;

/// One entry of a legend: how it is drawn, and its text.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Key {
    Point(Mark),
    Ring,
    Tick,
    Guide,
}

fn legend(spec: &Spec, items: &[Item]) -> Vec<(Key, String)> {
    let mut keys = Vec::new();
    for (mark, text) in [
        (Mark::Pass, "passes"),
        (Mark::Fail, "falsified"),
        (Mark::Context, "not judged on its own"),
    ] {
        if items.iter().any(|i| i.mark == mark) {
            keys.push((Key::Point(mark), text.to_string()));
        }
    }
    if items.iter().any(|i| i.reference.is_some()) {
        keys.push((Key::Ring, "baseline run".to_string()));
    }
    if items.iter().any(|i| i.threshold.is_some()) {
        keys.push((Key::Tick, "pass threshold".to_string()));
    }
    if let Some((_, text)) = spec.guide {
        keys.push((Key::Guide, text.to_string()));
    }
    keys
}

/// Legend entries in rows that fit `width`.
fn legend_rows(keys: &[(Key, String)], width: u32) -> Vec<Vec<(Key, String)>> {
    let mut rows: Vec<Vec<(Key, String)>> = vec![Vec::new()];
    let mut used = 0;
    for key in keys {
        let w = legend_width(&key.1);
        if used + w > width && used > 0 {
            rows.push(Vec::new());
            used = 0;
        }
        used += w;
        if let Some(row) = rows.last_mut() {
            row.push(key.clone());
        }
    }
    rows
}

fn legend_width(text: &str) -> u32 {
    36 + text_px(text, LABEL_FONT)
}

/// The smallest "nice" number (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8 x 10^k) at
/// least `x`, so the axis ends on a round value.
fn nice_ceiling(x: f64) -> f64 {
    if !(x > 0.0 && x.is_finite()) {
        return 1.0;
    }
    let scale = 10f64.powf(x.log10().floor());
    [1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0]
        .iter()
        .map(|m| m * scale)
        .find(|v| *v >= x * (1.0 - 1e-12))
        .unwrap_or(10.0 * scale)
}

/// Axis tick text: `450k` rather than `450000.0`.
fn tick(v: f64) -> String {
    if v.abs() >= 1e4 {
        format!("{}k", trim_zeros(&format!("{:.1}", v / 1e3)))
    } else {
        trim_zeros(&format!("{v:.2}")).to_string()
    }
}

type Drawn = std::result::Result<(), Box<dyn std::error::Error>>;

/// The chart as SVG: rows top to bottom in item order.
fn render(spec: &Spec, items: &[Item]) -> std::result::Result<String, Box<dyn std::error::Error>> {
    let label_px = items
        .iter()
        .map(|i| text_px(&i.title, LABEL_FONT).max(text_px(&i.subtitle, SUBTITLE_FONT)))
        .max()
        .unwrap_or(100)
        + 28;
    let keys = legend(spec, items);
    let width = (label_px + PLOT_PX + RIGHT_MARGIN)
        .max(text_px(&spec.title, TITLE_FONT) + 40)
        .max(text_px(spec.x_desc, LABEL_FONT) + label_px + 40);
    let legend_rows = legend_rows(&keys, width - 40);
    let legend_px = 16 + LEGEND_ROW_PX * legend_rows.len() as u32;
    let height = 110 + ROW_PX * items.len() as u32 + legend_px;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (width, height)).into_drawing_area();
        root.fill(&WHITE)?;
        let (upper, lower) = root.split_vertically(height - legend_px);
        draw_rows(&upper, spec, items, label_px)?;
        draw_legend(&lower, &legend_rows, spec.bars)?;
        root.present()?;
    }
    Ok(svg)
}

fn x_range(spec: &Spec, items: &[Item]) -> f64 {
    let max = items
        .iter()
        .flat_map(|i| {
            [
                Some(i.high),
                Some(i.value),
                i.reference,
                i.threshold,
                spec.guide.map(|g| g.0),
            ]
        })
        .flatten()
        .filter(|v| v.is_finite())
        .fold(0.0f64, f64::max);
    nice_ceiling(max * 1.05)
}

fn draw_rows(
    area: &DrawingArea<SVGBackend, Shift>,
    spec: &Spec,
    items: &[Item],
    label_px: u32,
) -> Drawn {
    let n = items.len();
    // Row k spans [k, k + 1) from the bottom; the first item is the top row.
    let row = |k: usize| (n - 1 - k) as f64;
    let x_max = x_range(spec, items);
    let mut chart = ChartBuilder::on(area)
        .caption(&spec.title, ("sans-serif", TITLE_FONT))
        .margin_top(12)
        .margin_left(12)
        .margin_right(RIGHT_MARGIN)
        .x_label_area_size(48)
        .y_label_area_size(label_px)
        .build_cartesian_2d(0.0..x_max, 0.0..n as f64)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        // The labels are drawn by hand (two lines each), so the axis has
        // neither labels nor tick marks of its own.
        .y_labels(1)
        .y_label_formatter(&|_| String::new())
        .set_tick_mark_size(LabelAreaPosition::Left, 0)
        .x_label_formatter(&|v| tick(*v))
        .label_style(("sans-serif", LABEL_FONT))
        .axis_desc_style(("sans-serif", LABEL_FONT))
        .x_desc(spec.x_desc)
        .draw()?;
    if let Some((x, _)) = spec.guide {
        chart.draw_series(std::iter::once(PathElement::new(
            vec![(x, 0.0), (x, n as f64)],
            GUIDE.stroke_width(2),
        )))?;
    }
    for (k, item) in items.iter().enumerate() {
        draw_item(&mut chart, spec, item, row(k))?;
        let (x0, y) = chart.backend_coord(&(0.0, row(k) + 0.5));
        draw_label(area, item, x0 - 10, y)?;
    }
    Ok(())
}

type Chart2d<'a, 'b> = ChartContext<
    'a,
    SVGBackend<'b>,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;

/// Draws one row, the rows `[k, k + 1)` of the y axis.
fn draw_item(chart: &mut Chart2d, spec: &Spec, item: &Item, k: f64) -> Drawn {
    let color = item.mark.color();
    let at = |x: f64| (x, k + 0.5);
    if spec.bars {
        let bar = Rectangle::new(
            [(0.0, k + 0.2), (item.value, k + 0.8)],
            color.mix(0.75).filled(),
        );
        chart.draw_series(std::iter::once(bar))?;
    }
    if item.low < item.high {
        let whisker = color.stroke_width(2);
        chart.draw_series(std::iter::once(PathElement::new(
            vec![at(item.low), at(item.high)],
            whisker,
        )))?;
        for end in [item.low, item.high] {
            chart.draw_series(std::iter::once(
                EmptyElement::at(at(end)) + PathElement::new(vec![(0, -5), (0, 5)], whisker),
            ))?;
        }
    }
    if !spec.bars {
        chart.draw_series(std::iter::once(Circle::new(
            at(item.value),
            5,
            color.filled(),
        )))?;
    }
    if let Some(t) = item.threshold {
        chart.draw_series(std::iter::once(
            EmptyElement::at(at(t))
                + PathElement::new(vec![(0, -15), (0, 15)], THRESHOLD.stroke_width(3)),
        ))?;
    }
    if let Some(r) = item.reference {
        chart.draw_series(std::iter::once(Circle::new(
            at(r),
            7,
            BLACK.stroke_width(2),
        )))?;
    }
    Ok(())
}

/// The two label lines of a row, right-aligned against the y axis at `x`.
fn draw_label(area: &DrawingArea<SVGBackend, Shift>, item: &Item, x: i32, y: i32) -> Drawn {
    let right = |font: f64, color: &'static RGBColor| {
        TextStyle::from(("sans-serif", font).into_font())
            .color(color)
            .pos(Pos::new(HPos::Right, VPos::Center))
    };
    area.draw(&Text::new(
        item.title.clone(),
        (x, y - 8),
        right(LABEL_FONT, &BLACK),
    ))?;
    area.draw(&Text::new(
        item.subtitle.clone(),
        (x, y + 9),
        right(SUBTITLE_FONT, &SUBTITLE),
    ))?;
    Ok(())
}

/// The legend below the plot; `bars` draws the verdict keys as the bars
/// the chart draws rather than points.
fn draw_legend(
    area: &DrawingArea<SVGBackend, Shift>,
    rows: &[Vec<(Key, String)>],
    bars: bool,
) -> Drawn {
    let left = |font: f64| {
        TextStyle::from(("sans-serif", font).into_font()).pos(Pos::new(HPos::Left, VPos::Center))
    };
    for (r, keys) in rows.iter().enumerate() {
        let y = 8 + LEGEND_ROW_PX as i32 * r as i32 + LEGEND_ROW_PX as i32 / 2;
        let mut x = 20;
        for (key, text) in keys {
            draw_key(area, *key, (x + 10, y), bars)?;
            area.draw(&Text::new(text.clone(), (x + 24, y), left(LABEL_FONT)))?;
            x += legend_width(text) as i32;
        }
    }
    Ok(())
}

fn draw_key(
    area: &DrawingArea<SVGBackend, Shift>,
    key: Key,
    (x, y): (i32, i32),
    bars: bool,
) -> Drawn {
    match key {
        Key::Point(mark) if bars => area.draw(&Rectangle::new(
            [(x - 7, y - 6), (x + 7, y + 6)],
            mark.color().mix(0.75).filled(),
        ))?,
        Key::Point(mark) => area.draw(&Circle::new((x, y), 5, mark.color().filled()))?,
        Key::Ring => area.draw(&Circle::new((x, y), 7, BLACK.stroke_width(2)))?,
        Key::Tick => area.draw(&PathElement::new(
            vec![(x, y - 9), (x, y + 9)],
            THRESHOLD.stroke_width(3),
        ))?,
        Key::Guide => area.draw(&PathElement::new(
            vec![(x, y - 9), (x, y + 9)],
            GUIDE.stroke_width(2),
        ))?,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(title: &str, v: f64, threshold: Option<f64>, mark: Mark) -> Item {
        Item {
            title: title.into(),
            subtitle: "candidate vs baseline; a workload".into(),
            value: v,
            low: v * 0.9,
            high: v * 1.1,
            reference: Some(v * 1.05),
            threshold,
            mark,
        }
    }

    fn spec() -> Spec<'static> {
        speedups_spec("")
    }

    /// Whether the SVG has a text element reading `text`.
    fn has_text(svg: &str, text: &str) -> bool {
        svg.split("<text").skip(1).any(|t| {
            t.split_once('>')
                .and_then(|(_, body)| body.split("</text>").next())
                .is_some_and(|body| body.trim() == text)
        })
    }

    /// A target row of `mode` measured at 12 ms, with `peak` GiB.
    fn target_row(mode: &str, peak: Option<f64>) -> SpeedupRow {
        SpeedupRow {
            run_id: "r".into(),
            contract: "train-throughput-v1".into(),
            test_id: "F-TPUT-003".into(),
            status: Some(Status::Passed),
            threshold: Some(1.0),
            subject: "tokens/s".into(),
            model: "qwen2.5-0.5b".into(),
            batch: 4,
            seq_len: 256,
            baseline: "target 79000 tokens/s on H100".into(),
            candidate: mode.into(),
            baseline_median_ms: 13.0,
            candidate_median_ms: 12.0,
            ratio: 13.0 / 12.0,
            ratio_ci_low: 1.07,
            ratio_ci_high: 1.09,
            repeats: 20,
            device: "NVIDIA H100 80GB HBM3".into(),
            peak_device_gib: peak,
            baseline_peak_device_gib: None,
            clocks: String::new(),
        }
    }

    #[test]
    fn a_target_row_shows_its_peak_memory_and_replaces_its_modes_context_row() {
        // A step comparison of "graphed" against "eager", then the target
        // row of "graphed": one "graphed" item, the target's, with its peak.
        let mut comparison = target_row("graphed", None);
        comparison.subject = "train_step".into();
        comparison.baseline = "eager".into();
        comparison.threshold = None;
        let diffs = [
            SpeedupDiff {
                baseline: None,
                current: Some(comparison),
            },
            SpeedupDiff {
                baseline: None,
                current: Some(target_row("graphed", Some(3.456))),
            },
            SpeedupDiff {
                baseline: None,
                current: Some(target_row("fast", None)),
            },
        ];
        let items = token_items(&diffs.iter().collect::<Vec<_>>());
        let subtitles: Vec<&str> = items.iter().map(|i| i.subtitle.as_str()).collect();
        assert_eq!(subtitles, ["eager", "graphed, peak 3.46 GiB", "fast"]);
        assert!(items[1].threshold.is_some());
    }

    #[test]
    fn renders_labels_thresholds_and_a_legend_of_what_is_drawn() {
        let items = [
            item("a b", 1.2, Some(1.1), Mark::Pass),
            item("c", 0.8, Some(1.1), Mark::Fail),
        ];
        let svg = render(&spec(), &items).unwrap();
        assert!(svg.starts_with("<svg"));
        assert!(has_text(&svg, "a b") && has_text(&svg, "c"));
        for text in [
            "passes",
            "falsified",
            "baseline run",
            "pass threshold",
            "1.0: no speedup",
        ] {
            assert!(has_text(&svg, text), "{text}");
        }
        assert!(
            !has_text(&svg, "not judged on its own"),
            "no context row is drawn"
        );
        let no_reference = [Item {
            reference: None,
            threshold: None,
            ..item("x", 1.0, None, Mark::Context)
        }];
        let svg = render(&spec(), &no_reference).unwrap();
        assert!(!has_text(&svg, "baseline run") && !has_text(&svg, "pass threshold"));
    }

    #[test]
    fn the_label_margin_holds_the_longest_label() {
        let long = "K".repeat(140);
        let items = [item(&long, 1.0, None, Mark::Context)];
        let svg = render(&spec(), &items).unwrap();
        // The label is right-aligned at the axis; its start must be inside the image.
        let width = svg
            .split("width=\"")
            .nth(1)
            .and_then(|s| s.split('"').next())
            .and_then(|s| s.parse::<u32>().ok())
            .unwrap();
        assert!(width >= text_px(&long, LABEL_FONT) + PLOT_PX, "{width}");
    }

    #[test]
    fn axes_end_on_round_values_with_short_ticks() {
        assert_eq!(nice_ceiling(1.68), 2.0);
        assert_eq!(nice_ceiling(0.97), 1.0);
        assert_eq!(nice_ceiling(437_000.0), 500_000.0);
        assert_eq!(nice_ceiling(1.05), 1.2);
        assert_eq!(tick(450_000.0), "450k");
        assert_eq!(tick(0.25), "0.25");
        assert_eq!(tick(1.0), "1");
    }
}
