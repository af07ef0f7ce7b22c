//! SVG charts of a report, drawn with `plotters`' SVG backend (text as SVG `<text>`,
//! no font files): output throughput against concurrency, latency percentiles against
//! concurrency (for sweeps), and the TTFT distribution (every workload).

use std::path::{Path, PathBuf};

use plotters::prelude::*;

use super::report::Level;

/// Draws the charts of `levels` into `dir` as `<name>-*.svg`; returns the files.
pub fn draw(dir: &Path, name: &str, levels: &[Level]) -> Result<Vec<PathBuf>, String> {
    let mut files = Vec::new();
    if levels.len() > 1 {
        let path = dir.join(format!("{name}-throughput.svg"));
        throughput(&path, levels).map_err(|e| format!("{}: {e}", path.display()))?;
        files.push(path);
        let path = dir.join(format!("{name}-latency.svg"));
        latency(&path, levels).map_err(|e| format!("{}: {e}", path.display()))?;
        files.push(path);
    }
    let path = dir.join(format!("{name}-ttft-cdf.svg"));
    ttft_cdf(&path, levels).map_err(|e| format!("{}: {e}", path.display()))?;
    files.push(path);
    Ok(files)
}

type Result2 = Result<(), Box<dyn std::error::Error>>;

fn top(values: impl Iterator<Item = f64>) -> f64 {
    let max = values.fold(0.0, f64::max);
    if max > 0.0 { max * 1.1 } else { 1.0 }
}

fn throughput(path: &Path, levels: &[Level]) -> Result2 {
    let root = SVGBackend::new(path, (800, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let xs: Vec<f64> = levels.iter().map(|l| l.metrics.max_concurrency as f64).collect();
    let x_max = top(xs.iter().copied());
    let y_max = top(levels.iter().map(|l| l.metrics.output_throughput));
    let mut chart = ChartBuilder::on(&root)
        .caption("Output throughput vs concurrency", ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)?;
    chart
        .configure_mesh()
        .x_desc("concurrent requests")
        .y_desc("tokens/s")
        .draw()?;
    let all: Vec<(f64, f64)> = levels
        .iter()
        .map(|l| (l.metrics.max_concurrency as f64, l.metrics.output_throughput))
        .collect();
    chart
        .draw_series(LineSeries::new(all.clone(), BLUE.stroke_width(2)))?
        .label("all requests")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE));
    chart.draw_series(all.iter().map(|p| Circle::new(*p, 4, BLUE.filled())))?;
    let per: Vec<(f64, f64)> = levels
        .iter()
        .map(|l| {
            (
                l.metrics.max_concurrency as f64,
                l.metrics.mean_request_output_tokens_per_s,
            )
        })
        .collect();
    chart
        .draw_series(LineSeries::new(per.clone(), RED.stroke_width(2)))?
        .label("per request")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED));
    chart.draw_series(per.iter().map(|p| Circle::new(*p, 4, RED.filled())))?;
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE)
        .draw()?;
    root.present()?;
    Ok(())
}

fn latency(path: &Path, levels: &[Level]) -> Result2 {
    let root = SVGBackend::new(path, (800, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let x_max = top(levels.iter().map(|l| l.metrics.max_concurrency as f64));
    type Pick = fn(&Level) -> f64;
    let picks: [(&str, RGBColor, Pick); 5] = [
        ("TTFT p50", BLUE, |l: &Level| l.metrics.ttft.median),
        ("TTFT p99", CYAN, |l: &Level| {
            l.metrics.ttft.at(99.0).unwrap_or(l.metrics.ttft.median)
        }),
        ("ITL p50", RED, |l: &Level| l.metrics.itl.median),
        ("ITL p99", MAGENTA, |l: &Level| {
            l.metrics.itl.at(99.0).unwrap_or(l.metrics.itl.median)
        }),
        ("TPOT p50", GREEN, |l: &Level| l.metrics.tpot.median),
    ];
    type Series<'a> = (&'a str, RGBColor, Vec<(f64, f64)>);
    let series: Vec<Series> = picks
        .into_iter()
        .map(|(name, color, f)| {
            (
                name,
                color,
                levels
                    .iter()
                    .map(|l| (l.metrics.max_concurrency as f64, f(l)))
                    .collect(),
            )
        })
        .collect();
    let y_max = top(series.iter().flat_map(|(_, _, s)| s.iter().map(|p| p.1)));
    let mut chart = ChartBuilder::on(&root)
        .caption("Latency percentiles vs concurrency", ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max)?;
    chart
        .configure_mesh()
        .x_desc("concurrent requests")
        .y_desc("milliseconds")
        .draw()?;
    for (name, color, points) in series {
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        chart.draw_series(points.iter().map(|p| Circle::new(*p, 3, color.filled())))?;
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE)
        .draw()?;
    root.present()?;
    Ok(())
}

fn ttft_cdf(path: &Path, levels: &[Level]) -> Result2 {
    let root = SVGBackend::new(path, (800, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let x_max = top(levels.iter().flat_map(|l| l.ttfts_ms.iter().copied()));
    let mut chart = ChartBuilder::on(&root)
        .caption("TTFT distribution (CDF)", ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..x_max, 0.0..1.0)?;
    chart
        .configure_mesh()
        .x_desc("time to first token, ms")
        .y_desc("fraction of requests")
        .draw()?;
    for (i, level) in levels.iter().enumerate() {
        let mut sorted = level.ttfts_ms.clone();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len().max(1) as f64;
        let points: Vec<(f64, f64)> = sorted
            .iter()
            .enumerate()
            .map(|(k, v)| (*v, (k + 1) as f64 / n))
            .collect();
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))?
            .label(format!("concurrency {}", level.metrics.max_concurrency))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE)
        .draw()?;
    root.present()?;
    Ok(())
}
