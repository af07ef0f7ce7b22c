//! One scrape of a Prometheus `/metrics` page: the classic text exposition format
//! (prometheus/docs `content/docs/instrumenting/exposition_formats.md`: a line is
//! `name{labels} value [timestamp]`, `#` lines are comments) read into samples, with the
//! sums and maxima the figures need. Not here: which metrics make which figure
//! ([`super::server`] for a run, [`super::scrape`] for a window).
//!
//! Parsed by hand rather than with a client crate: the figures need sums over label sets
//! and one label's values, and the Rust crates (`prometheus`, `prometheus-client`) write
//! the format rather than read it.

/// One sample of the exposition.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Metric name, with its `_total`/`_bucket` suffix.
    pub name: String,
    /// Labels.
    pub labels: Vec<(String, String)>,
    /// Value.
    pub value: f64,
}

/// A scrape of `/metrics`.
#[derive(Debug, Clone, Default)]
pub struct Scrape {
    /// Every sample.
    pub samples: Vec<Sample>,
}

impl Scrape {
    /// Parses Prometheus text exposition; lines that are not samples are skipped.
    pub fn parse(text: &str) -> Scrape {
        let samples = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .filter_map(parse_line)
            .collect();
        Scrape { samples }
    }

    /// Several servers' scrapes as one (their samples side by side: sums add up,
    /// maxima are the largest server's); `None` when any server gave none, since a
    /// fleet's counters are only comparable when every server's are there.
    pub fn merged(scrapes: &[Option<Scrape>]) -> Option<Scrape> {
        let mut samples = Vec::new();
        for s in scrapes {
            samples.extend(s.as_ref()?.samples.iter().cloned());
        }
        Some(Scrape { samples })
    }

    /// The sum of every series of `name`, `None` when there is none.
    pub fn sum(&self, name: &str) -> Option<f64> {
        let mut found = None;
        for s in self.samples.iter().filter(|s| s.name == name) {
            *found.get_or_insert(0.0) += s.value;
        }
        found
    }

    /// `name` summed per value of `label`.
    pub fn by_label(&self, name: &str, label: &str) -> Vec<(String, f64)> {
        let mut out: Vec<(String, f64)> = Vec::new();
        for s in self.samples.iter().filter(|s| s.name == name) {
            if let Some((_, v)) = s.labels.iter().find(|(k, _)| k == label) {
                match out.iter_mut().find(|(k, _)| k == v) {
                    Some(slot) => slot.1 += s.value,
                    None => out.push((v.clone(), s.value)),
                }
            }
        }
        out
    }

    /// The largest value of any series of `name`.
    pub fn max(&self, name: &str) -> Option<f64> {
        self.samples
            .iter()
            .filter(|s| s.name == name)
            .map(|s| s.value)
            .reduce(f64::max)
    }
}

fn parse_line(line: &str) -> Option<Sample> {
    let (name, rest) = match line.find('{') {
        Some(open) => {
            let close = open + line[open..].find('}')?;
            (&line[..open], (Some(&line[open + 1..close]), &line[close + 1..]))
        }
        None => {
            let space = line.find([' ', '\t'])?;
            (&line[..space], (None, &line[space..]))
        }
    };
    let (labels, rest) = rest;
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some(Sample {
        name: name.trim().to_owned(),
        labels: labels.map(parse_labels).unwrap_or_default(),
        value,
    })
}

fn parse_labels(text: &str) -> Vec<(String, String)> {
    let mut labels = Vec::new();
    let mut rest = text;
    while let Some(eq) = rest.find('=') {
        let key = rest[..eq].trim().trim_start_matches(',').trim().to_owned();
        let after = &rest[eq + 1..];
        let Some(after) = after.strip_prefix('"') else {
            break;
        };
        let mut value = String::new();
        let mut chars = after.char_indices();
        let mut end = after.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, other)) => value.push(other),
                    None => {}
                },
                '"' => {
                    end = i + 1;
                    break;
                }
                c => value.push(c),
            }
        }
        labels.push((key, value));
        rest = &after[end..];
    }
    labels
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fleets_scrapes_add_up_and_need_every_server() {
        let a = Scrape::parse("vllm:prefix_cache_hits_total 10\nvllm:kv_cache_usage_perc 0.25\n");
        let b = Scrape::parse("vllm:prefix_cache_hits_total 32\nvllm:kv_cache_usage_perc 0.5\n");
        let both = Scrape::merged(&[Some(a.clone()), Some(b)]).expect("merged");
        assert_eq!(both.sum("vllm:prefix_cache_hits_total"), Some(42.0));
        assert_eq!(both.max("vllm:kv_cache_usage_perc"), Some(0.5));
        // A server that did not answer makes the fleet's counters meaningless.
        assert!(Scrape::merged(&[Some(a), None]).is_none());
    }

    #[test]
    fn exposition_lines_parse_with_labels_and_escapes() {
        let s = Scrape::parse(
            "# HELP x y\n# TYPE vllm:prefix_cache_hits_total counter\n\
             vllm:prefix_cache_hits_total{engine=\"0\",model_name=\"m\"} 96.0\n\
             vllm:prefix_cache_hits_total{engine=\"1\",model_name=\"m\"} 4\n\
             plain 3 1700000000\n\
             odd{a=\"x\\\"y,z\",b=\"\"} +Inf\n\
             garbage\n",
        );
        assert_eq!(s.sum("vllm:prefix_cache_hits_total"), Some(100.0));
        assert_eq!(s.sum("plain"), Some(3.0));
        assert_eq!(s.sum("missing"), None);
        let odd = s.samples.iter().find(|x| x.name == "odd").expect("odd");
        assert_eq!(
            odd.labels,
            vec![("a".into(), "x\"y,z".into()), ("b".into(), String::new())]
        );
        assert_eq!(odd.value, f64::INFINITY);
    }
}
