//! The tune report's SVG chart: one horizontal bar per trial (its mean objective and
//! 95 % interval as a whisker), the baseline's mean and interval as a band across all of
//! them, and trials that ran out of memory, broke the SLO or failed marked in red with
//! why. Drawn with `plotters`' SVG backend into a string, so the caller writes the file
//! atomically. Not here: which trials there are or what they mean.

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::{Objective, Outcome, Phase, TrialResult};

/// Width of the label column on the left, in pixels.
const LABELS: i32 = 320;

/// The SVG text of the chart of `results` (the baseline first), bars of the trials
/// that `helped` in green.
pub fn draw(results: &[TrialResult], helped: &[String], objective: Objective) -> Result<String, String> {
    let mut svg = String::new();
    draw_into(&mut svg, results, helped, objective).map_err(|e| e.to_string())?;
    Ok(svg)
}

fn draw_into(
    svg: &mut String,
    results: &[TrialResult],
    helped: &[String],
    objective: Objective,
) -> Result<(), Box<dyn std::error::Error>> {
    let rows = results.len().max(1);
    let height = 120 + 44 * rows as u32;
    let root = SVGBackend::with_string(svg, (1000, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let finite = |v: f64| v.is_finite().then_some(v);
    let x_max = results
        .iter()
        .filter_map(|r| r.estimate)
        .flat_map(|e| [Some(e.mean), finite(e.high)])
        .flatten()
        .fold(0.0, f64::max);
    let x_max = if x_max > 0.0 { x_max * 1.1 } else { 1.0 };
    let title = format!(
        "{} by trial (mean, 95 % interval; {})",
        objective.key(),
        if objective.higher_is_better() {
            "higher is better"
        } else {
            "lower is better"
        }
    );
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(LABELS as u32)
        .build_cartesian_2d(0.0..x_max, -0.5..rows as f64 - 0.5)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .y_labels(0)
        .x_desc(objective.unit())
        .draw()?;

    // Row 0 (the baseline) at the top.
    let row = |i: usize| (rows - 1 - i) as f64;
    if let Some(base) = results.first().and_then(|b| b.estimate) {
        let (low, high) = (base.low.max(0.0), base.high.min(x_max));
        if low < high {
            chart.draw_series(std::iter::once(Rectangle::new(
                [(low, -0.5), (high, rows as f64 - 0.5)],
                RGBColor(200, 200, 200).mix(0.4).filled(),
            )))?;
        }
        chart.draw_series(std::iter::once(PathElement::new(
            vec![(base.mean, -0.5), (base.mean, rows as f64 - 0.5)],
            BLACK.stroke_width(1),
        )))?;
    }
    for (i, r) in results.iter().enumerate() {
        let y = row(i);
        let color = match (r.outcome, r.trial.phase) {
            (Outcome::Ok, Phase::Baseline) => RGBColor(120, 120, 120),
            (Outcome::Ok, _) if helped.contains(&r.trial.id) => RGBColor(40, 150, 60),
            (Outcome::Ok, _) => RGBColor(70, 110, 200),
            _ => RGBColor(200, 50, 50),
        };
        if let Some(e) = r.estimate {
            chart.draw_series(std::iter::once(Rectangle::new(
                [(0.0, y - 0.3), (e.mean, y + 0.3)],
                color.filled(),
            )))?;
            if let (Some(low), Some(high)) = (finite(e.low), finite(e.high)) {
                let (low, high) = (low.max(0.0), high.min(x_max));
                chart.draw_series(std::iter::once(PathElement::new(
                    vec![(low, y), (high, y)],
                    BLACK.stroke_width(2),
                )))?;
                for x in [low, high] {
                    chart.draw_series(std::iter::once(PathElement::new(
                        vec![(x, y - 0.15), (x, y + 0.15)],
                        BLACK.stroke_width(2),
                    )))?;
                }
            }
        }
        let (px, py) = chart.backend_coord(&(0.0, y));
        let label = match r.outcome {
            Outcome::Ok => r.trial.id.clone(),
            Outcome::Oom => format!("{} (out of memory)", r.trial.id),
            Outcome::SloBreach => format!("{} (SLO breach)", r.trial.id),
            Outcome::Failed => format!("{} (failed)", r.trial.id),
            Outcome::Unfit => format!("{} (does not fit)", r.trial.id),
            Outcome::QualityGate => format!("{} (over the quality gate)", r.trial.id),
        };
        let label = shorten(&label, 44);
        let style = ("sans-serif", 14)
            .into_font()
            .color(if r.outcome == Outcome::Ok { &BLACK } else { &RED })
            .pos(Pos::new(HPos::Right, VPos::Center));
        root.draw(&Text::new(label, (px - 8, py), style))?;
        if let Some(e) = r.estimate {
            let (vx, vy) = chart.backend_coord(&(e.mean, y));
            let style = ("sans-serif", 12)
                .into_font()
                .color(&BLACK)
                .pos(Pos::new(HPos::Left, VPos::Bottom));
            root.draw(&Text::new(format!("{:.1}", e.mean), (vx + 4, vy - 12), style))?;
        }
    }
    root.present()?;
    Ok(())
}

/// `text` cut to `max` characters with an ellipsis.
fn shorten(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let mut s: String = text.chars().take(max - 1).collect();
    s.push('…');
    s
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::tune::{Estimate, Trial};

    fn result(trial: Trial, outcome: Outcome, values: &[f64]) -> TrialResult {
        TrialResult {
            trial,
            outcome,
            estimate: Estimate::of(values),
            figures: BTreeMap::new(),
            message: None,
        }
    }

    #[test]
    fn every_trial_is_drawn_and_failures_say_why() {
        let lever = |id: &str| Trial {
            id: id.into(),
            phase: Phase::Lever,
            lever: Some("k".into()),
            settings: Vec::new(),
        };
        let results = vec![
            result(Trial::baseline(), Outcome::Ok, &[7.0, 7.5, 8.0]),
            result(lever("serving.prefix_caching=true"), Outcome::Ok, &[12.0, 12.5]),
            result(lever("memory.gpu_utilization=0.95"), Outcome::Oom, &[]),
            result(lever("serving.max_num_seqs=256"), Outcome::SloBreach, &[9.0]),
        ];
        let svg = draw(
            &results,
            &["serving.prefix_caching=true".into()],
            Objective::OutputThroughput,
        )
        .expect("drawn");
        assert!(svg.starts_with("<svg"), "{svg}");
        for text in [
            "baseline",
            "serving.prefix_caching=true",
            "memory.gpu_utilization=0.95 (out of memory)",
            "serving.max_num_seqs=256 (SLO breach)",
            "12.2",
        ] {
            assert!(svg.contains(text), "`{text}` missing");
        }
        // The green bar of the lever that helped is there.
        assert!(svg.contains("#28963C"), "no green bar: {svg}");
    }

    #[test]
    fn long_labels_are_shortened() {
        assert_eq!(shorten("abcdef", 4), "abc…");
        assert_eq!(shorten("abc", 4), "abc");
    }
}
