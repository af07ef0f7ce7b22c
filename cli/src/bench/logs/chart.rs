//! `sous bench logs --svg FILE`: the pictures of the Titan report, drawn with `plotters`'
//! SVG backend. The first panel is generation throughput against requests running, one
//! line per instance through the median of each level with the band from its minimum to
//! its maximum; with several logs a second panel is the histogram of the cluster's
//! per-minute totals (over the minutes when all instances were active, or any when they
//! never all were), with P50, P95 and P99 marked.

use std::path::Path;

use plotters::prelude::*;

use super::report::{ClusterSummary, LogsReport};
use crate::bench::charts::top;

/// Draws `report` into `path`.
pub fn draw(path: &Path, report: &LogsReport) -> Result<(), String> {
    draw_svg(path, report).map_err(|e| e.to_string())
}

fn draw_svg(path: &Path, report: &LogsReport) -> Result<(), Box<dyn std::error::Error>> {
    let cluster = report.cluster.as_ref().map(|c| {
        if c.all_active.minutes > 0 {
            ("all instances active", &c.all_active)
        } else {
            ("any instance active", &c.any_active)
        }
    });
    let height = if cluster.is_some() { 960 } else { 480 };
    let root = SVGBackend::new(path, (900, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let (upper, lower) = if cluster.is_some() {
        let (a, b) = root.split_vertically(480);
        (a, Some(b))
    } else {
        (root.clone(), None)
    };
    curves(&upper, report)?;
    if let (Some(area), Some((label, summary))) = (lower, cluster) {
        minutes(
            &area,
            label,
            summary,
            report.cluster.as_ref().map_or(0, |c| c.instances.len()),
        )?;
    }
    root.present()?;
    Ok(())
}

fn curves<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    report: &LogsReport,
) -> Result<(), Box<dyn std::error::Error>>
where
    DB::ErrorType: 'static,
{
    let x_max = report
        .instances
        .iter()
        .flat_map(|i| i.curve.iter().map(|p| f64::from(p.running)))
        .fold(1.0, f64::max)
        + 0.5;
    let y_max = top(report
        .instances
        .iter()
        .flat_map(|i| i.curve.iter().map(|p| p.generation_tok_s.max)));
    let mut chart = ChartBuilder::on(area)
        .caption("Generation throughput vs requests running", ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(64)
        .build_cartesian_2d(-0.5..x_max, 0.0..y_max)?;
    // Whole numbers of requests only, and no fine grid.
    let whole = |x: &f64| {
        if (x - x.round()).abs() < 1e-6 && *x >= 0.0 {
            format!("{x:.0}")
        } else {
            String::new()
        }
    };
    chart
        .configure_mesh()
        .light_line_style(TRANSPARENT)
        .x_labels((x_max.ceil() as usize * 2 + 2).min(40))
        .x_label_formatter(&whole)
        .y_label_formatter(&|y| format!("{y:.0}"))
        .x_desc("requests running (vLLM's Running: N reqs)")
        .y_desc("generation tokens/s")
        .draw()?;
    for (index, instance) in report.instances.iter().enumerate() {
        let color = Palette99::pick(index).to_rgba();
        let points: Vec<(f64, f64)> = instance
            .curve
            .iter()
            .map(|p| (f64::from(p.running), p.generation_tok_s.p50))
            .collect();
        // The band: up along the maxima, back along the minima.
        let mut band: Vec<(f64, f64)> = instance
            .curve
            .iter()
            .map(|p| (f64::from(p.running), p.generation_tok_s.max))
            .collect();
        band.extend(
            instance
                .curve
                .iter()
                .rev()
                .map(|p| (f64::from(p.running), p.generation_tok_s.min)),
        );
        chart.draw_series(std::iter::once(Polygon::new(band, color.mix(0.18).filled())))?;
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
            .label(format!("{} (median, min-max band)", instance.name))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        chart.draw_series(points.iter().map(|p| Circle::new(*p, 4, color.filled())))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .border_style(BLACK)
        .background_style(WHITE)
        .draw()?;
    Ok(())
}

fn minutes<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    label: &str,
    summary: &ClusterSummary,
    instances: usize,
) -> Result<(), Box<dyn std::error::Error>>
where
    DB::ErrorType: 'static,
{
    let totals = &summary.totals;
    let max = totals.iter().copied().fold(0.0, f64::max).max(1.0);
    let bins = 30usize;
    let width = max / bins as f64;
    let mut counts = vec![0u32; bins];
    for &t in totals {
        let i = ((t / width) as usize).min(bins - 1);
        counts[i] += 1;
    }
    let y_max = f64::from(counts.iter().copied().max().unwrap_or(1)) * 1.15;
    let title = format!(
        "Cluster generation tok/s per minute ({} instances summed, {} minutes with {label})",
        instances, summary.minutes
    );
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 18))
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(64)
        .build_cartesian_2d(0.0..max * 1.02, 0.0..y_max.max(1.0))?;
    let whole = |y: &f64| {
        if (y - y.round()).abs() < 1e-6 {
            format!("{y:.0}")
        } else {
            String::new()
        }
    };
    chart
        .configure_mesh()
        .light_line_style(TRANSPARENT)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&whole)
        .x_desc("generation tokens/s, sum of each instance's highest sample in the minute")
        .y_desc("minutes")
        .draw()?;
    let blue = BLUE.mix(0.6);
    chart.draw_series(counts.iter().enumerate().map(|(i, &c)| {
        let x0 = i as f64 * width;
        Rectangle::new([(x0, 0.0), (x0 + width, f64::from(c))], blue.filled())
    }))?;
    if let Some(d) = &summary.distribution {
        for (name, value, color) in [
            ("P50", d.p50, GREEN),
            ("P95", d.p95, MAGENTA),
            ("P99", d.p99, RED),
        ] {
            let style = color.stroke_width(2);
            chart
                .draw_series(LineSeries::new(vec![(value, 0.0), (value, y_max)], style))?
                .label(format!("{name} = {value:.0} tok/s"))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .border_style(BLACK)
        .background_style(WHITE)
        .draw()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::analyze;
    use super::super::testing::*;
    use super::*;

    #[test]
    fn the_chart_has_every_instance_and_the_percentiles() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("logs.svg");
        let report = analyze(&fixtures(), &options()).expect("analyze");
        draw(&path, &report).expect("draw");
        let svg = std::fs::read_to_string(&path).expect("svg");
        for name in ["instance-0 (median", "instance-1 (median", "instance-2 (median"] {
            assert!(svg.contains(name), "{name}");
        }
        // All-active minutes [580, 885]: P50 732.5, P95 869.75, P99 881.95.
        for mark in [
            "P50 = 732 tok/s",
            "P95 = 870 tok/s",
            "P99 = 882 tok/s",
            "2 minutes with all",
        ] {
            assert!(svg.contains(mark), "{mark}");
        }
        // One log: the curve alone.
        let one = analyze(&[fixture("instance-0.log")], &options()).expect("analyze");
        draw(&path, &one).expect("draw");
        let svg = std::fs::read_to_string(&path).expect("svg");
        assert!(svg.contains("instance-0 (median") && !svg.contains("P50"));
    }
}
