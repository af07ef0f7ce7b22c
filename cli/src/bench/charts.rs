//! SVG charts of a report, drawn with `plotters`' SVG backend (text as SVG `<text>`,
//! no font files): output throughput against concurrency, latency percentiles against
//! concurrency (for sweeps; for open-loop sweeps against the offered request rate, the
//! levels at rate `inf` left out), and the TTFT distribution (every workload).

use std::path::{Path, PathBuf};

use plotters::prelude::*;

use super::report::Level;

/// Draws the charts of `levels` into `dir` as `<name>-*.svg`; returns the files.
pub fn draw(dir: &Path, name: &str, levels: &[Level]) -> Result<Vec<PathBuf>, String> {
    let mut files = Vec::new();
    let x = Axis::of(levels);
    if levels.iter().filter(|l| x.value(l).is_some()).count() > 1 {
        let path = dir.join(format!("{name}-throughput.svg"));
        throughput(&path, levels, x).map_err(|e| format!("{}: {e}", path.display()))?;
        files.push(path);
        let path = dir.join(format!("{name}-latency.svg"));
        latency(&path, levels, x).map_err(|e| format!("{}: {e}", path.display()))?;
        files.push(path);
    }
    let path = dir.join(format!("{name}-ttft-cdf.svg"));
    ttft_cdf(&path, levels).map_err(|e| format!("{}: {e}", path.display()))?;
    files.push(path);
    Ok(files)
}

pub(crate) type Result2 = Result<(), Box<dyn std::error::Error>>;

pub(crate) fn top(values: impl Iterator<Item = f64>) -> f64 {
    let max = values.fold(0.0, f64::max);
    if max > 0.0 { max * 1.1 } else { 1.0 }
}

/// One line of a chart, with a dot of `marker` pixels at each point (or none).
pub(crate) struct Line {
    pub(crate) name: String,
    pub(crate) color: RGBAColor,
    pub(crate) points: Vec<(f64, f64)>,
    pub(crate) marker: Option<u32>,
}

/// A chart's title, axis names and y range (`None`: from 0 to above the highest point).
pub(crate) struct Frame<'a> {
    pub(crate) title: &'a str,
    pub(crate) x_desc: &'a str,
    pub(crate) y_desc: &'a str,
    pub(crate) y_max: Option<f64>,
}

/// Draws `lines` on one frame, with a legend; every chart here is this.
pub(crate) fn line_chart(path: &Path, frame: &Frame<'_>, lines: Vec<Line>) -> Result2 {
    let root = SVGBackend::new(path, (800, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let x_max = top(lines.iter().flat_map(|l| l.points.iter().map(|p| p.0)));
    let y_max = frame
        .y_max
        .unwrap_or_else(|| top(lines.iter().flat_map(|l| l.points.iter().map(|p| p.1))));
    let mut chart = ChartBuilder::on(&root)
        .caption(frame.title, ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)?;
    chart
        .configure_mesh()
        .x_desc(frame.x_desc)
        .y_desc(frame.y_desc)
        .draw()?;
    for line in lines {
        let color = line.color;
        chart
            .draw_series(LineSeries::new(line.points.clone(), color.stroke_width(2)))?
            .label(line.name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        if let Some(size) = line.marker {
            chart.draw_series(line.points.iter().map(|p| Circle::new(*p, size, color.filled())))?;
        }
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE)
        .draw()?;
    root.present()?;
    Ok(())
}

/// What the per-level charts plot the levels against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Axis {
    /// The cap on requests in flight (closed-loop sweeps).
    Concurrency,
    /// The offered request rate (open-loop sweeps; levels at rate `inf` have none).
    RequestRate,
}

impl Axis {
    fn of(levels: &[Level]) -> Axis {
        if levels.iter().all(|l| l.traffic.is_closed()) {
            Axis::Concurrency
        } else {
            Axis::RequestRate
        }
    }

    fn value(self, level: &Level) -> Option<f64> {
        match self {
            Axis::Concurrency => Some(level.metrics.max_concurrency as f64),
            Axis::RequestRate => Some(level.traffic.request_rate).filter(|r| r.is_finite()),
        }
    }

    /// `concurrency` or `request rate`, for titles.
    fn what(self) -> &'static str {
        match self {
            Axis::Concurrency => "concurrency",
            Axis::RequestRate => "request rate",
        }
    }

    fn desc(self) -> &'static str {
        match self {
            Axis::Concurrency => "concurrent requests",
            Axis::RequestRate => "requests per second (offered)",
        }
    }
}

/// A line over the levels' concurrency or request rate.
fn per_level(
    levels: &[Level],
    x: Axis,
    name: &str,
    color: RGBColor,
    marker: u32,
    value: fn(&Level) -> f64,
) -> Line {
    Line {
        name: name.to_owned(),
        color: color.to_rgba(),
        points: levels
            .iter()
            .filter_map(|l| Some((x.value(l)?, value(l))))
            .collect(),
        marker: Some(marker),
    }
}

fn throughput(path: &Path, levels: &[Level], x: Axis) -> Result2 {
    let title = format!("Output throughput vs {}", x.what());
    let frame = Frame {
        title: &title,
        x_desc: x.desc(),
        y_desc: "tokens/s",
        y_max: None,
    };
    let lines = vec![
        per_level(levels, x, "all requests", BLUE, 4, |l| {
            l.metrics.output_throughput
        }),
        per_level(levels, x, "per request", RED, 4, |l| {
            l.metrics.mean_request_output_tokens_per_s
        }),
    ];
    line_chart(path, &frame, lines)
}

fn latency(path: &Path, levels: &[Level], x: Axis) -> Result2 {
    let title = format!("Latency percentiles vs {}", x.what());
    let frame = Frame {
        title: &title,
        x_desc: x.desc(),
        y_desc: "milliseconds",
        y_max: None,
    };
    let lines = vec![
        per_level(levels, x, "TTFT p50", BLUE, 3, |l| l.metrics.ttft.median),
        per_level(levels, x, "TTFT p99", CYAN, 3, |l| {
            l.metrics.ttft.at(99.0).unwrap_or(l.metrics.ttft.median)
        }),
        per_level(levels, x, "ITL p50", RED, 3, |l| l.metrics.itl.median),
        per_level(levels, x, "ITL p99", MAGENTA, 3, |l| {
            l.metrics.itl.at(99.0).unwrap_or(l.metrics.itl.median)
        }),
        per_level(levels, x, "TPOT p50", GREEN, 3, |l| l.metrics.tpot.median),
    ];
    line_chart(path, &frame, lines)
}

fn ttft_cdf(path: &Path, levels: &[Level]) -> Result2 {
    let frame = Frame {
        title: "TTFT distribution (CDF)",
        x_desc: "time to first token, ms",
        y_desc: "fraction of requests",
        y_max: Some(1.0),
    };
    let lines = levels
        .iter()
        .enumerate()
        .map(|(i, level)| {
            let mut sorted = level.ttfts_ms.clone();
            sorted.sort_by(f64::total_cmp);
            let n = sorted.len().max(1) as f64;
            Line {
                name: level.traffic.name(),
                color: Palette99::pick(i).to_rgba(),
                points: sorted
                    .iter()
                    .enumerate()
                    .map(|(k, v)| (*v, (k + 1) as f64 / n))
                    .collect(),
                marker: None,
            }
        })
        .collect();
    line_chart(path, &frame, lines)
}
