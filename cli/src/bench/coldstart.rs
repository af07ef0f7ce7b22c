//! `sous bench coldstart`: what one start of a recipe's engine costs, phase by phase,
//! over several starts. Each start's total (launch to ready, as `sous serve` measures
//! it), the build's phases (pull and quantize, finding them up to date included) and
//! the phases the engine logged (`sous_engine::serve::logscan::phases`: weights, model
//! loading, torch.compile, graph capture, engine init) are kept; the report gives
//! each one's median and spread. The first start also pays whatever the caches do not
//! hold yet (a compile cache, the page cache of the weights), which the spread shows.
//!
//! Not here: starting and stopping the engine (the command does it through the
//! pipeline, as `sous serve` does).

use serde::Serialize;
use sous_engine::launch::caches::Contents;
use sous_engine::serve::logscan::{Phase, PhaseTime};

use crate::stats::percentile;

/// One start: seconds from launch to ready, and the phases the engine logged.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Start {
    /// Launch to ready.
    pub ready_seconds: f64,
    /// The phases the engine logged, in order.
    pub phases: Vec<PhaseTime>,
    /// What the engine's kept compile caches held as it began (`None` where none are
    /// kept: the native engine).
    pub compile_cache: Option<Contents>,
}

/// One quantity over the starts.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Spread {
    /// What was measured: `ready`, or a phase's label.
    pub what: String,
    /// Starts that reported it.
    pub count: usize,
    /// Median seconds.
    pub median: f64,
    /// Fewest seconds.
    pub min: f64,
    /// Most seconds.
    pub max: f64,
}

/// The report: every start, then the spread of the total and of each phase.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// The recipe's name.
    pub recipe: String,
    /// The starts, in order.
    pub starts: Vec<Start>,
    /// `ready` first, then the phases in the order the engine logs them.
    pub spreads: Vec<Spread>,
}

impl Report {
    /// The report of `starts`.
    pub fn of(recipe: &str, starts: Vec<Start>) -> Report {
        let spread = |what: String, mut values: Vec<f64>| {
            values.sort_by(f64::total_cmp);
            Spread {
                what,
                count: values.len(),
                median: percentile(&values, 50.0),
                min: values.first().copied().unwrap_or(0.0),
                max: values.last().copied().unwrap_or(0.0),
            }
        };
        let mut spreads = vec![spread(
            "ready".into(),
            starts.iter().map(|s| s.ready_seconds).collect(),
        )];
        let mut order: Vec<Phase> = Vec::new();
        for p in starts.iter().flat_map(|s| &s.phases) {
            if !order.contains(&p.phase) {
                order.push(p.phase);
            }
        }
        for phase in order {
            // A phase logged twice in one start (a drafter's weights) counts as its sum.
            let values = starts
                .iter()
                .filter(|s| s.phases.iter().any(|p| p.phase == phase))
                .map(|s| {
                    s.phases
                        .iter()
                        .filter(|p| p.phase == phase)
                        .map(|p| p.seconds)
                        .sum()
                })
                .collect();
            spreads.push(spread(phase.label().into(), values));
        }
        Report {
            recipe: recipe.to_owned(),
            starts,
            spreads,
        }
    }

    /// The table people read.
    pub fn render(&self) -> String {
        let mut out = format!(
            "{} starts of {}\n{:<16} {:>6} {:>9} {:>9} {:>9}\n",
            self.starts.len(),
            self.recipe,
            "",
            "starts",
            "median s",
            "min s",
            "max s"
        );
        for s in &self.spreads {
            out.push_str(&format!(
                "{:<16} {:>6} {:>9.2} {:>9.2} {:>9.2}\n",
                s.what, s.count, s.median, s.min, s.max
            ));
        }
        if self.starts.iter().any(|s| s.compile_cache.is_some()) {
            out.push_str("\nstart  ready s  compile cache at the start\n");
            for (n, s) in self.starts.iter().enumerate() {
                let cache = match s.compile_cache {
                    None => "none kept".to_owned(),
                    Some(c) if c.is_warm() => {
                        format!("warm ({} files, {})", c.files, sous_engine::size::human(c.bytes))
                    }
                    Some(_) => "cold".to_owned(),
                };
                out.push_str(&format!("{:>5} {:>8.2}  {cache}\n", n + 1, s.ready_seconds));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spreads_are_per_phase_over_the_starts_that_logged_it() {
        let at = |phase, seconds| PhaseTime { phase, seconds };
        let starts = vec![
            Start {
                ready_seconds: 30.0,
                phases: vec![at(Phase::Weights, 10.0), at(Phase::Compile, 12.0)],
                compile_cache: Some(Contents::default()),
            },
            Start {
                ready_seconds: 12.0,
                phases: vec![at(Phase::Weights, 4.0), at(Phase::Weights, 1.0)],
                compile_cache: Some(Contents {
                    files: 40,
                    bytes: 2_500_000,
                }),
            },
            Start {
                ready_seconds: 14.0,
                phases: vec![at(Phase::Weights, 6.0)],
                compile_cache: None,
            },
        ];
        let report = Report::of("r", starts);
        let row = |what: &str| {
            report
                .spreads
                .iter()
                .find(|s| s.what == what)
                .expect(what)
                .clone()
        };
        assert_eq!(
            (
                row("ready").count,
                row("ready").median,
                row("ready").min,
                row("ready").max
            ),
            (3, 14.0, 12.0, 30.0)
        );
        // The second start's two weight phases are summed.
        assert_eq!((row("weights").median, row("weights").min), (6.0, 5.0));
        assert_eq!(row("torch.compile").count, 1);
        assert_eq!(
            report.spreads.iter().map(|s| s.what.as_str()).collect::<Vec<_>>(),
            ["ready", "weights", "torch.compile"]
        );
        let table = report.render();
        assert!(table.starts_with("3 starts of r\n"), "{table}");
        assert!(
            table.contains("ready                 3     14.00     12.00     30.00"),
            "{table}"
        );
        assert!(
            table.ends_with(
                "    1    30.00  cold\n    2    12.00  warm (40 files, 2.5 MB)\n    3    14.00  none kept\n"
            ),
            "{table}"
        );
    }
}
