//! The PromQL of `sous bench scrape --prometheus`: the `--selector` label matchers,
//! checked here and merged into every series selector, and the query that asks the
//! Prometheus server for each figure over a window of `W` seconds ending at the query's
//! evaluation time:
//!
//! - a percentile: `histogram_quantile(q, sum by (le, instance) (increase(<h>_bucket{sel}[Ws])))`
//!   per instance, `sum by (le)` for the instances together;
//! - a histogram's buckets, count and sum: the same `increase` summed, without
//!   `histogram_quantile` (the count and sum of `<h>_count` and `<h>_sum`);
//! - a counter: `sum by (instance) (increase(<c>{sel}[Ws]))`, and `sum(...)`;
//! - accepted draft tokens per position: `sum by (position, instance) (...)`.
//!
//! Not here: which metrics (`super::names`), the HTTP API (`super::prometheus`).

use super::ScrapeError;

/// `--selector`: a PromQL label matcher set such as `{job="vllm",namespace!="test"}`,
/// checked, and kept as written (without its braces) to go inside every selector.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector {
    inner: String,
}

impl Selector {
    /// No matchers: every series of the metric.
    pub const NONE: Selector = Selector { inner: String::new() };

    /// Reads `{label="value", label=~"regex", ...}`: braces around matchers of a label
    /// name, `=`, `!=`, `=~` or `!~`, and a quoted string (`"`, `'` or a backquoted raw
    /// string), separated by commas; `{}` is no matcher.
    pub fn parse(text: &str) -> Result<Selector, ScrapeError> {
        let bad = |why: String| ScrapeError::Selector {
            selector: text.to_owned(),
            why,
        };
        let trimmed = text.trim();
        let Some(inner) = trimmed.strip_prefix('{').and_then(|t| t.strip_suffix('}')) else {
            return Err(bad("it is not enclosed in braces".into()));
        };
        let chars: Vec<char> = inner.chars().collect();
        let mut i = 0;
        let skip_space = |i: &mut usize| {
            while chars.get(*i).is_some_and(|c| c.is_whitespace()) {
                *i += 1;
            }
        };
        loop {
            skip_space(&mut i);
            if i == chars.len() {
                break;
            }
            let start = i;
            while chars
                .get(i)
                .is_some_and(|c| c.is_ascii_alphanumeric() || *c == '_')
            {
                i += 1;
            }
            let label: String = chars[start..i].iter().collect();
            if label.is_empty() || label.starts_with(|c: char| c.is_ascii_digit()) {
                return Err(bad(format!(
                    "expected a label name at `{}`",
                    chars[start..].iter().collect::<String>()
                )));
            }
            if label == "__name__" {
                return Err(bad(
                    "it names the metric (__name__); sous chooses the metrics, the selector only narrows their series".into(),
                ));
            }
            skip_space(&mut i);
            let op = match (chars.get(i), chars.get(i + 1)) {
                (Some('='), Some('~')) | (Some('!'), Some('=')) | (Some('!'), Some('~')) => 2,
                (Some('='), _) => 1,
                _ => return Err(bad(format!("expected =, !=, =~ or !~ after `{label}`"))),
            };
            i += op;
            skip_space(&mut i);
            let Some(&quote) = chars.get(i).filter(|c| matches!(c, '"' | '\'' | '`')) else {
                return Err(bad(format!("the value of `{label}` is not a quoted string")));
            };
            i += 1;
            loop {
                match chars.get(i) {
                    None => return Err(bad(format!("the value of `{label}` has no closing {quote}"))),
                    Some('\\') if quote != '`' => i += 2,
                    Some(c) if *c == quote => {
                        i += 1;
                        break;
                    }
                    Some(_) => i += 1,
                }
            }
            skip_space(&mut i);
            match chars.get(i) {
                None => break,
                Some(',') => i += 1,
                Some(c) => {
                    return Err(bad(format!(
                        "expected a comma or the end after `{label}`, not `{c}`"
                    )));
                }
            }
        }
        Ok(Selector {
            inner: inner.trim().trim_end_matches(',').trim().to_owned(),
        })
    }

    /// The matchers without braces (empty for none).
    pub fn matchers(&self) -> &str {
        &self.inner
    }

    /// `series{matchers}`, or the bare name without matchers.
    pub fn on(&self, series: &str) -> String {
        if self.inner.is_empty() {
            series.to_owned()
        } else {
            format!("{series}{{{}}}", self.inner)
        }
    }
}

/// Whose figures a query asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// One per value of the `instance` label.
    PerInstance,
    /// Every instance summed.
    All,
}

impl Scope {
    /// `sum by (labels..., instance)`, or `sum` with no label to keep.
    fn sum(self, labels: &[&str]) -> String {
        let mut kept: Vec<&str> = labels.to_vec();
        if self == Scope::PerInstance {
            kept.push("instance");
        }
        if kept.is_empty() {
            "sum".to_owned()
        } else {
            format!("sum by ({})", kept.join(", "))
        }
    }
}

/// The queries over one window, for one selector.
#[derive(Debug, Clone)]
pub struct Queries<'a> {
    selector: &'a Selector,
    window_s: i64,
}

impl<'a> Queries<'a> {
    /// The queries of a window `window_s` seconds long (evaluated at its end).
    pub fn new(selector: &'a Selector, window_s: i64) -> Queries<'a> {
        Queries { selector, window_s }
    }

    /// `increase(series{sel}[Ws])`.
    fn increase(&self, series: &str) -> String {
        format!("increase({}[{}s])", self.selector.on(series), self.window_s)
    }

    /// The increase of every bucket of the histogram `metric` (without `_bucket`).
    pub fn buckets(&self, metric: &str, scope: Scope) -> String {
        format!(
            "{} ({})",
            scope.sum(&["le"]),
            self.increase(&format!("{metric}_bucket"))
        )
    }

    /// The `q` quantile of the histogram `metric` over the window.
    pub fn quantile(&self, q: f64, metric: &str, scope: Scope) -> String {
        format!("histogram_quantile({q}, {})", self.buckets(metric, scope))
    }

    /// The increase of a counter (a histogram's `_count` or `_sum` too), every other
    /// label summed.
    pub fn counter(&self, series: &str, scope: Scope) -> String {
        format!("{} ({})", scope.sum(&[]), self.increase(series))
    }

    /// The increase of a counter per value of `label`.
    pub fn counter_by(&self, series: &str, label: &str, scope: Scope) -> String {
        format!("{} ({})", scope.sum(&[label]), self.increase(series))
    }

    /// How many series of `series` there are at the evaluation time (Prometheus looks
    /// back 5 minutes for the latest sample of each).
    pub fn present(&self, series: &str) -> String {
        format!("count({})", self.selector.on(series))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_are_checked_and_kept_as_written() {
        let s = Selector::parse(r#" {job="vllm", namespace!~'test.*',pod=~`a\d`,} "#).expect("valid");
        assert_eq!(s.matchers(), r#"job="vllm", namespace!~'test.*',pod=~`a\d`"#);
        assert_eq!(
            s.on("vllm:generation_tokens_total"),
            r#"vllm:generation_tokens_total{job="vllm", namespace!~'test.*',pod=~`a\d`}"#
        );
        let escaped = Selector::parse(r#"{path="a\"}b"}"#).expect("escaped quote");
        assert_eq!(escaped.matchers(), r#"path="a\"}b""#);
        assert_eq!(Selector::parse("{}").expect("empty"), Selector::NONE);
        assert_eq!(Selector::NONE.on("m"), "m");
        for (bad, why) in [
            (r#"job="vllm""#, "not enclosed in braces"),
            (r#"{job="vllm""#, "not enclosed in braces"),
            (r#"{job}"#, "expected =, !=, =~ or !~ after `job`"),
            (r#"{job=vllm}"#, "not a quoted string"),
            (r#"{job="vllm}"#, "no closing \""),
            (r#"{job="a" pod="b"}"#, "expected a comma"),
            (r#"{="a"}"#, "expected a label name"),
            (r#"{1job="a"}"#, "expected a label name"),
            (r#"{__name__="x"}"#, "__name__"),
        ] {
            let err = Selector::parse(bad).expect_err(bad).to_string();
            assert!(err.contains(why), "{bad}: {err}");
            assert!(err.contains(bad), "{bad}: {err}");
        }
    }

    #[test]
    fn queries_read_as_prometheus_documents_them() {
        let sel = Selector::parse(r#"{job="vllm"}"#).expect("valid");
        let q = Queries::new(&sel, 3600);
        let ttft = "vllm:time_to_first_token_seconds";
        assert_eq!(
            q.quantile(0.99, ttft, Scope::PerInstance),
            r#"histogram_quantile(0.99, sum by (le, instance) (increase(vllm:time_to_first_token_seconds_bucket{job="vllm"}[3600s])))"#
        );
        assert_eq!(
            q.quantile(0.5, ttft, Scope::All),
            r#"histogram_quantile(0.5, sum by (le) (increase(vllm:time_to_first_token_seconds_bucket{job="vllm"}[3600s])))"#
        );
        assert_eq!(
            q.counter("vllm:generation_tokens_total", Scope::All),
            r#"sum (increase(vllm:generation_tokens_total{job="vllm"}[3600s]))"#
        );
        assert_eq!(
            q.counter_by(
                "vllm:spec_decode_num_accepted_tokens_per_pos_total",
                "position",
                Scope::PerInstance
            ),
            r#"sum by (position, instance) (increase(vllm:spec_decode_num_accepted_tokens_per_pos_total{job="vllm"}[3600s]))"#
        );
        assert_eq!(
            Queries::new(&Selector::NONE, 60).present("vllm:generation_tokens_total"),
            "count(vllm:generation_tokens_total)"
        );
    }
}
