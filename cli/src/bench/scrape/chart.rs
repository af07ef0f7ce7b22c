//! `sous bench scrape --svg FILE`: the window's latency percentiles as one SVG of
//! grouped bars, one panel per histogram (TTFT, ITL, TPOT, E2E, each on its own
//! millisecond scale, since E2E is often a thousand times ITL), p50, p90, p95 and p99
//! along each panel, one bar per series: the instances summed and each instance where
//! there are several. A percentile that fell in the `+Inf` bucket is labelled with a
//! `+` (its bar is the largest finite bound). [`draw_live`] and [`draw_prometheus`]
//! choose the series of a live and of a Prometheus report. Drawn with `plotters`' SVG
//! backend, as [`crate::bench::charts`]; not here: the figures themselves.

use std::ops::Range;
use std::path::Path;

use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint, Ranged};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::analyze::analyze;
use super::report::{Latency, PrometheusReport, Report};
use super::{Instance, QUANTILES, ScrapeError};
use crate::bench::charts::top;

/// The histograms charted, in panel order.
const PANELS: [(&str, &str); 4] = [("ttft", "TTFT"), ("itl", "ITL"), ("tpot", "TPOT"), ("e2e", "E2E")];

/// Bar colours, in series order (matplotlib's tab10, which reads well on white).
const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

const WIDTH: u32 = 1000;
const HEADER: u32 = 84;
const PANEL_HEIGHT: u32 = 330;

/// The x axis of a panel: `n` groups of bars, group `g` spanning `g..g + 1`, its label
/// under its middle.
struct Groups(usize);

impl Ranged for Groups {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        let span = f64::from(limit.1 - limit.0);
        limit.0 + (value / self.0.max(1) as f64 * span).round() as i32
    }

    fn key_points<Hint: KeyPointHint>(&self, _hint: Hint) -> Vec<f64> {
        (0..self.0).map(|g| g as f64 + 0.5).collect()
    }

    fn range(&self) -> Range<f64> {
        0.0..self.0 as f64
    }
}

/// One series of bars: a name for the legend and the latency rows it reads.
#[derive(Debug, Clone, Copy)]
pub struct Series<'a> {
    /// `all instances`, an instance, a URL.
    pub name: &'a str,
    /// Its histograms (the first row of each name is charted).
    pub latency: &'a [Latency],
}

/// Writes the chart of `series` to `path` under `title`; the panels are the histograms
/// any series has.
pub fn draw(path: &Path, title: &str, series: &[Series<'_>]) -> Result<(), ScrapeError> {
    draw_svg(path, title, series).map_err(|e| ScrapeError::Chart {
        path: path.display().to_string(),
        error: e.to_string(),
    })
}

/// The chart of live scrapes (`sous bench scrape --svg`): the URLs summed, and each URL
/// alone beside the sum where there are several.
pub fn draw_live(
    path: &Path,
    instances: &[Instance],
    report: &Report,
    scheduled: usize,
) -> Result<(), ScrapeError> {
    // Each URL alone, beside the sum, where there are several.
    let each: Vec<(String, Vec<Latency>)> = if instances.len() > 1 {
        instances
            .iter()
            .map(|i| {
                let alone = analyze(std::slice::from_ref(i), scheduled);
                (i.url.clone(), alone.map(|r| r.latency).unwrap_or_default())
            })
            .collect()
    } else {
        Vec::new()
    };
    let mut series = vec![Series {
        name: if instances.len() > 1 {
            "all URLs"
        } else {
            report.urls.first().map_or("", String::as_str)
        },
        latency: &report.latency,
    }];
    series.extend(each.iter().map(|(name, latency)| Series { name, latency }));
    let title = format!(
        "Latency percentiles over {:.0} s of live scrapes",
        report.window_s
    );
    draw(path, &title, &series)
}

/// The chart of a window Prometheus stored (`sous bench scrape --prometheus --svg`):
/// the instances summed (unless there is only one), then each instance.
pub fn draw_prometheus(path: &Path, report: &PrometheusReport) -> Result<(), ScrapeError> {
    let mut series = Vec::new();
    if report.instances.len() != 1 {
        series.push(Series {
            name: "all instances",
            latency: &report.total.latency,
        });
    }
    for f in &report.instances {
        series.push(Series {
            name: f.instance.as_deref().unwrap_or_default(),
            latency: &f.latency,
        });
    }
    let title = format!(
        "Latency percentiles, {} to {} (Prometheus {})",
        report.start, report.end, report.prometheus
    );
    draw(path, &title, &series)
}

fn row<'a>(series: &Series<'a>, name: &str) -> Option<&'a Latency> {
    series.latency.iter().find(|l| l.name == name)
}

fn ms_text(v: f64, beyond: bool) -> String {
    let mark = if beyond { "+" } else { "" };
    if v >= 100.0 {
        format!("{v:.0}{mark}")
    } else if v >= 10.0 {
        format!("{v:.1}{mark}")
    } else {
        format!("{v:.2}{mark}")
    }
}

fn draw_svg(path: &Path, title: &str, series: &[Series<'_>]) -> Result<(), Box<dyn std::error::Error>> {
    let panels: Vec<(&str, &str)> = PANELS
        .iter()
        .copied()
        .filter(|(name, _)| series.iter().any(|s| row(s, name).is_some()))
        .collect();
    let columns = if panels.len() > 1 { 2 } else { 1 };
    let rows = panels.len().div_ceil(columns).max(1);
    let height = HEADER + PANEL_HEIGHT * rows as u32;
    let root = SVGBackend::new(path, (WIDTH, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let (header, body) = root.split_vertically(HEADER);
    header.draw(&Text::new(
        title.to_owned(),
        (WIDTH as i32 / 2, 10),
        ("sans-serif", 18)
            .into_font()
            .color(&BLACK)
            .pos(Pos::new(HPos::Center, VPos::Top)),
    ))?;
    header.draw(&Text::new(
        "milliseconds; bucket-interpolated (Prometheus histogram_quantile); + : in the +Inf bucket, the largest finite bound",
        (WIDTH as i32 / 2, 36),
        ("sans-serif", 12)
            .into_font()
            .color(&RGBColor(90, 90, 90))
            .pos(Pos::new(HPos::Center, VPos::Top)),
    ))?;
    // The legend: a swatch and the name of each series, in a row.
    let legend_font = ("sans-serif", 13).into_font().color(&BLACK);
    let widths: Vec<i32> = series
        .iter()
        .map(|s| 22 + 8 * s.name.chars().count() as i32 + 18)
        .collect();
    let mut x = (WIDTH as i32 - widths.iter().sum::<i32>()).max(10) / 2;
    for (i, s) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        header.draw(&Rectangle::new([(x, 58), (x + 14, 72)], color.filled()))?;
        header.draw(&Text::new(s.name.to_owned(), (x + 20, 58), legend_font.clone()))?;
        x += widths[i];
    }
    if panels.is_empty() {
        body.draw(&Text::new(
            "no latency histogram in the window",
            (WIDTH as i32 / 2, PANEL_HEIGHT as i32 / 2),
            ("sans-serif", 16)
                .into_font()
                .color(&BLACK)
                .pos(Pos::new(HPos::Center, VPos::Center)),
        ))?;
        root.present()?;
        return Ok(());
    }
    let areas = body.split_evenly((rows, columns));
    for ((name, label), area) in panels.iter().zip(areas.iter()) {
        panel(area, name, label, series)?;
    }
    root.present()?;
    Ok(())
}

/// One histogram's panel: four groups of bars.
fn panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    name: &str,
    label: &str,
    series: &[Series<'_>],
) -> Result<(), Box<dyn std::error::Error>>
where
    DB::ErrorType: 'static,
{
    let values: Vec<Vec<Option<(f64, bool)>>> = series
        .iter()
        .map(|s| {
            QUANTILES
                .iter()
                .map(|(_, key)| {
                    let l = row(s, name)?;
                    Some((l.percentile(key)?, l.beyond_last_bucket.contains(key)))
                })
                .collect()
        })
        .collect();
    let y_max = top(values.iter().flatten().flatten().map(|(v, _)| *v)) * 1.08;
    let x = Groups(QUANTILES.len());
    let mut chart = ChartBuilder::on(area)
        .caption(format!("{label} percentiles"), ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(28)
        .y_label_area_size(60)
        .build_cartesian_2d(x, 0.0..y_max)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .light_line_style(WHITE)
        .y_label_formatter(&|v: &f64| {
            if y_max >= 20.0 {
                format!("{v:.0}")
            } else {
                format!("{v:.1}")
            }
        })
        .x_label_formatter(&|v: &f64| {
            QUANTILES
                .get(v.floor().max(0.0) as usize)
                .map_or(String::new(), |(_, key)| (*key).to_owned())
        })
        .y_desc("ms")
        .draw()?;
    let n = series.len().max(1) as f64;
    let slot = 0.8 / n;
    let label_size = if n <= 2.0 { 11 } else { 9 };
    for (s, per_q) in values.iter().enumerate() {
        let color = COLORS[s % COLORS.len()];
        for (g, value) in per_q.iter().enumerate() {
            let Some((v, beyond)) = *value else { continue };
            let x0 = g as f64 + 0.1 + slot * s as f64;
            let x1 = x0 + slot * 0.88;
            chart.draw_series(std::iter::once(Rectangle::new(
                [(x0, 0.0), (x1, v)],
                color.filled(),
            )))?;
            if n <= 4.0 {
                chart.draw_series(std::iter::once(Text::new(
                    ms_text(v, beyond),
                    ((x0 + x1) / 2.0, v),
                    ("sans-serif", label_size)
                        .into_font()
                        .color(&BLACK)
                        .pos(Pos::new(HPos::Center, VPos::Bottom)),
                )))?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::scrape::report::Bucket;

    fn latency(name: &'static str, label: &'static str, scale: f64) -> Latency {
        Latency {
            name,
            metric: format!("vllm:{name}"),
            count: 10.0,
            sum_s: 1.0,
            mean_ms: Some(100.0 * scale),
            p50_ms: Some(50.0 * scale),
            p90_ms: Some(90.0 * scale),
            p95_ms: Some(95.0 * scale),
            p99_ms: Some(99.0 * scale),
            beyond_last_bucket: vec!["p99"],
            buckets: vec![Bucket {
                le: "+Inf".into(),
                count: 10.0,
            }],
            label,
        }
    }

    #[test]
    fn the_chart_names_every_series_and_percentile() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("latency.svg");
        let a = [latency("ttft", "TTFT", 1.0), latency("e2e", "E2E", 40.0)];
        let b = [latency("ttft", "TTFT", 1.5), latency("itl", "ITL", 0.2)];
        let series = [
            Series {
                name: "all instances",
                latency: &a,
            },
            Series {
                name: "10.0.0.2:8000",
                latency: &b,
            },
        ];
        draw(&path, "Latency percentiles, test", &series).expect("drawn");
        let svg = std::fs::read_to_string(&path).expect("written");
        for text in [
            "Latency percentiles, test",
            "all instances",
            "10.0.0.2:8000",
            "TTFT percentiles",
            "ITL percentiles",
            "E2E percentiles",
            "p50",
            "p99",
            "3960+",
        ] {
            assert!(svg.contains(text), "{text} missing");
        }
        // No TPOT in any series: no panel for it.
        assert!(!svg.contains("TPOT"));
        let empty = dir.path().join("empty.svg");
        draw(&empty, "nothing", &[]).expect("drawn");
        assert!(
            std::fs::read_to_string(&empty)
                .expect("written")
                .contains("no latency histogram")
        );
        let err = draw(Path::new("/nonexistent/dir/x.svg"), "t", &series).expect_err("no dir");
        assert!(err.to_string().contains("/nonexistent/dir/x.svg"), "{err}");
    }
}
