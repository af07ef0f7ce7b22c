//! The HTTP API of one Prometheus server (prometheus `docs/querying/api.md`), as
//! `sous bench scrape --prometheus` uses it: instant and range queries, the metric
//! names stored in a window, and the storage retention; each answer's envelope
//! checked, its warnings passed on once, its errors turned into [`ScrapeError`]s.
//!
//! Not here: which queries are asked or what their answers mean ([`super`]).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::Deserialize;
use sous_engine::reporter::Reporter;

use crate::bench::scrape::ScrapeError;
use crate::bench::scrape::promql::Selector;
use crate::bench::scrape::watch::causes;

/// Samples of an instant query: each series' labels and value.
pub(super) type Vector = Vec<(BTreeMap<String, String>, f64)>;

/// The API's answer (`docs/querying/api.md`, "Format overview").
#[derive(Deserialize)]
struct Answer {
    status: String,
    #[serde(default)]
    data: serde_json::Value,
    #[serde(rename = "errorType", default)]
    error_type: Option<String>,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    warnings: Vec<String>,
}

/// One series of a `vector` result.
#[derive(Deserialize)]
struct VectorSample {
    #[serde(default)]
    metric: BTreeMap<String, String>,
    value: (f64, String),
}

/// One series of a `matrix` result.
#[derive(Deserialize)]
struct MatrixSeries {
    values: Vec<(f64, String)>,
}

/// Reads a sample value as Go's `strconv.FormatFloat` writes it (`NaN`, `+Inf`).
fn value(text: &str) -> f64 {
    match text {
        "NaN" => f64::NAN,
        "+Inf" | "Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        other => other.parse().unwrap_or(f64::NAN),
    }
}

/// The HTTP API of one server.
pub(super) struct Api<'a> {
    client: reqwest::Client,
    /// The server's base URL, without a trailing `/`.
    pub(super) base: String,
    reporter: &'a dyn Reporter,
    warned: std::sync::Mutex<BTreeSet<String>>,
}

impl<'a> Api<'a> {
    /// A client of the server at `url`, warning through `reporter`.
    pub(super) fn new(url: &str, reporter: &'a dyn Reporter) -> Result<Api<'a>, ScrapeError> {
        Ok(Api {
            client: reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(10))
                // Prometheus's own --query.timeout is 2 minutes.
                .timeout(Duration::from_secs(150))
                .build()
                .map_err(|e| ScrapeError::PrometheusUnreachable {
                    url: url.to_owned(),
                    error: causes(&e),
                })?,
            base: url.trim_end_matches('/').to_owned(),
            reporter,
            warned: std::sync::Mutex::new(BTreeSet::new()),
        })
    }
}

impl Api<'_> {
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// `GET` (with `params` in the URL) or `POST` (as a form) of an API path; the
    /// answer's `data`. `what` names the request in errors.
    async fn call(
        &self,
        path: &str,
        params: &[(&str, String)],
        post: bool,
        what: &str,
    ) -> Result<serde_json::Value, ScrapeError> {
        let url = self.url(path);
        let request = if post {
            self.client.post(&url).form(params)
        } else {
            self.client.get(&url).query(params)
        };
        let response = request
            .send()
            .await
            .map_err(|e| ScrapeError::PrometheusUnreachable {
                url: url.clone(),
                error: causes(&e.without_url()),
            })?;
        let status = response.status();
        let body = response
            .text()
            .await
            .map_err(|e| ScrapeError::PrometheusUnreachable {
                url: url.clone(),
                error: causes(&e.without_url()),
            })?;
        let answer: Option<Answer> = serde_json::from_str(&body).ok();
        match answer {
            Some(a) if a.status == "error" => Err(ScrapeError::PrometheusRefused {
                url,
                query: what.to_owned(),
                error: match (a.error_type, a.error) {
                    (Some(t), Some(e)) => format!("{t}: {e}"),
                    (None, Some(e)) => e,
                    (Some(t), None) => t,
                    (None, None) => format!("status error ({status})"),
                },
            }),
            Some(a) if status.is_success() && a.status == "success" => {
                for w in a.warnings {
                    let fresh = self
                        .warned
                        .lock()
                        .map(|mut seen| seen.insert(w.clone()))
                        .unwrap_or(false);
                    if fresh {
                        self.reporter.warn(&format!("Prometheus at {}: {w}", self.base));
                    }
                }
                Ok(a.data)
            }
            _ if !status.is_success() => Err(ScrapeError::PrometheusStatus {
                url,
                query: what.to_owned(),
                status: status.as_u16(),
                body: body.chars().take(200).collect::<String>().trim().to_owned(),
            }),
            _ => Err(ScrapeError::PrometheusBody {
                url,
                query: what.to_owned(),
                error: format!(
                    "`{}`",
                    body.chars()
                        .take(120)
                        .collect::<String>()
                        .trim()
                        .replace('\n', " ")
                ),
            }),
        }
    }

    /// An instant query at `time`.
    pub(super) async fn query(&self, promql: &str, time: i64) -> Result<Vector, ScrapeError> {
        let data = self
            .call(
                "/api/v1/query",
                &[("query", promql.to_owned()), ("time", time.to_string())],
                true,
                promql,
            )
            .await?;
        let body_error = |error: String| ScrapeError::PrometheusBody {
            url: self.url("/api/v1/query"),
            query: promql.to_owned(),
            error,
        };
        match data.get("resultType").and_then(|t| t.as_str()) {
            Some("vector") => {
                let samples: Vec<VectorSample> =
                    serde_json::from_value(data.get("result").cloned().unwrap_or_default())
                        .map_err(|e| body_error(e.to_string()))?;
                Ok(samples
                    .into_iter()
                    .map(|s| (s.metric, value(&s.value.1)))
                    .collect())
            }
            Some("scalar") => {
                let (_, v): (f64, String) =
                    serde_json::from_value(data.get("result").cloned().unwrap_or_default())
                        .map_err(|e| body_error(e.to_string()))?;
                Ok(vec![(BTreeMap::new(), value(&v))])
            }
            other => Err(body_error(format!("a result of type {other:?}"))),
        }
    }

    /// The first time within `start..=end` (every `step` seconds) at which `promql`
    /// has a value, if any.
    pub(super) async fn first_value(
        &self,
        promql: &str,
        start: i64,
        end: i64,
        step: i64,
    ) -> Result<Option<i64>, ScrapeError> {
        let data = self
            .call(
                "/api/v1/query_range",
                &[
                    ("query", promql.to_owned()),
                    ("start", start.to_string()),
                    ("end", end.to_string()),
                    ("step", step.to_string()),
                ],
                true,
                promql,
            )
            .await?;
        let series: Vec<MatrixSeries> =
            serde_json::from_value(data.get("result").cloned().unwrap_or_default()).map_err(|e| {
                ScrapeError::PrometheusBody {
                    url: self.url("/api/v1/query_range"),
                    query: promql.to_owned(),
                    error: e.to_string(),
                }
            })?;
        Ok(series
            .iter()
            .flat_map(|s| s.values.first())
            .map(|(t, _)| *t as i64)
            .min())
    }

    /// The metric names of the series matching `selector` within `start..=end`.
    pub(super) async fn names(
        &self,
        selector: &Selector,
        start: i64,
        end: i64,
    ) -> Result<(Vec<String>, String), ScrapeError> {
        let mut params = vec![("start", start.to_string()), ("end", end.to_string())];
        let mut what = "/api/v1/label/__name__/values".to_owned();
        if !selector.matchers().is_empty() {
            let matcher = format!("{{{}}}", selector.matchers());
            what.push_str(&format!("?match[]={matcher}"));
            params.push(("match[]", matcher));
        }
        let data = self
            .call("/api/v1/label/__name__/values", &params, false, &what)
            .await?;
        let names = serde_json::from_value(data).map_err(|e| ScrapeError::PrometheusBody {
            url: self.url("/api/v1/label/__name__/values"),
            query: what.clone(),
            error: e.to_string(),
        })?;
        Ok((names, what))
    }

    /// The server's `storageRetention` (`15d`, `15d or 10GiB`), when it says.
    pub(super) async fn retention(&self) -> Option<String> {
        let data = self
            .call(
                "/api/v1/status/runtimeinfo",
                &[],
                false,
                "/api/v1/status/runtimeinfo",
            )
            .await
            .ok()?;
        data.get("storageRetention")?.as_str().map(str::to_owned)
    }
}

/// The time part of a `storageRetention` (`15d`, `15d or 10GiB`, `1y2w`) in seconds,
/// in Prometheus's units (`model.ParseDuration`: a year is 365 days); `None` for a
/// size-only or unreadable one.
pub(super) fn retention_s(text: &str) -> Option<i64> {
    let first = text.split(" or ").next()?.trim();
    let mut total: i64 = 0;
    let mut rest = first;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        let n: i64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let (unit, len) = [
            ("ms", 0.001),
            ("s", 1.0),
            ("m", 60.0),
            ("h", 3600.0),
            ("d", 86_400.0),
            ("w", 604_800.0),
            ("y", 31_536_000.0),
        ]
        .iter()
        .find(|(u, _)| rest.starts_with(u))
        .map(|(u, s)| (*s, u.len()))?;
        rest = &rest[len..];
        total = total.checked_add((n as f64 * unit) as i64)?;
    }
    (total > 0).then_some(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retention_and_values_read_as_prometheus_writes_them() {
        assert_eq!(retention_s("15d"), Some(15 * 86_400));
        assert_eq!(retention_s("15d or 10GiB"), Some(15 * 86_400));
        assert_eq!(retention_s("1y2w"), Some(365 * 86_400 + 14 * 86_400));
        assert_eq!(retention_s("90m"), Some(5400));
        assert_eq!(retention_s("10GiB"), None);
        assert_eq!(retention_s(""), None);
        assert_eq!(retention_s("0s"), None);
        assert!(value("NaN").is_nan());
        assert_eq!(value("+Inf"), f64::INFINITY);
        assert_eq!(value("1.5e-05"), 1.5e-05);
    }
}
