//! Taking the scrapes of `sous bench scrape`: every URL now, then on the schedule, all
//! URLs of a round at once. The first round must reach every URL and find an inference
//! server's metrics there; a later round that fails for a URL is skipped with a warning.
//! Not here: what the scrapes say ([`super::analyze`]).

use std::time::Duration;

use sous_engine::reporter::Reporter;

use super::{Instance, ScrapeError, Taken, families, metrics_url, schedule};
use crate::bench::prom::Scrape;

/// Scrapes `urls` (base URLs or metrics URLs) over `window`, every `interval`; returns
/// each URL's scrapes and the number of rounds scheduled.
pub async fn watch(
    urls: &[String],
    window: Duration,
    interval: Duration,
    reporter: &dyn Reporter,
) -> Result<(Vec<Instance>, usize), ScrapeError> {
    let targets: Vec<String> = urls.iter().map(|u| metrics_url(u)).collect();
    let times = schedule(window, interval);
    let client = reqwest::Client::new();
    let timeout = interval.clamp(Duration::from_secs(1), Duration::from_secs(10));
    let mut instances: Vec<Instance> = targets
        .iter()
        .map(|url| Instance {
            url: url.clone(),
            taken: Vec::new(),
        })
        .collect();
    let start = tokio::time::Instant::now();
    for (round, at) in times.iter().enumerate() {
        tokio::time::sleep_until(start + *at).await;
        let at_s = start.elapsed().as_secs_f64();
        reporter.status(
            "scrape",
            &format!(
                "{}/{} of {} URL{}",
                round + 1,
                times.len(),
                targets.len(),
                if targets.len() == 1 { "" } else { "s" }
            ),
        );
        let results =
            futures_util::future::join_all(targets.iter().map(|url| fetch(&client, url, timeout))).await;
        for (instance, result) in instances.iter_mut().zip(results) {
            match result {
                Ok(scrape) => {
                    if round == 0 && families(&scrape).is_empty() {
                        return Err(ScrapeError::NoMetrics {
                            url: instance.url.clone(),
                        });
                    }
                    instance.taken.push(Taken { round, at_s, scrape });
                }
                Err(error) if round == 0 => {
                    return Err(ScrapeError::Unreachable {
                        url: instance.url.clone(),
                        error,
                    });
                }
                Err(e) => reporter.warn(&format!(
                    "scrape {}/{}: skipped {}: {e}",
                    round + 1,
                    times.len(),
                    instance.url
                )),
            }
        }
    }
    Ok((instances, times.len()))
}

/// One scrape of a metrics URL.
async fn fetch(client: &reqwest::Client, url: &str, timeout: Duration) -> Result<Scrape, String> {
    let response = client
        .get(url)
        .timeout(timeout)
        .send()
        .await
        .map_err(|e| causes(&e.without_url()))?;
    if !response.status().is_success() {
        return Err(format!("it answered {}", response.status()));
    }
    let text = response.text().await.map_err(|e| causes(&e.without_url()))?;
    Ok(Scrape::parse(&text))
}

/// An error and its sources on one line (reqwest's own message says little:
/// "error sending request").
pub(super) fn causes(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}
