//! What the scale run observes besides the CSI answers: the capacity
//! records as a watch sees them ([`NsrRecorder`], and from its series the
//! freshness of each change, [`freshness`]), the API server's request
//! counter ([`request_counts`]) and a process's CPU time and peak memory
//! ([`ProcStats`]). The parsing and the freshness arithmetic are pure
//! functions with tests; the IO around them is thin.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use carina_api::NodeStorageResource;
use futures::StreamExt;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A node's record as last seen, summed over its groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Figures {
    pub volume_count: u32,
    pub allocatable_bytes: u64,
}

impl Figures {
    fn of(nsr: &NodeStorageResource) -> Figures {
        let groups = nsr.status.as_ref().map(|s| s.groups.as_slice());
        groups
            .unwrap_or_default()
            .iter()
            .fold(Figures::default(), |f, g| Figures {
                volume_count: f.volume_count + g.volume_count,
                allocatable_bytes: f.allocatable_bytes + g.allocatable_bytes,
            })
    }
}

/// Every record seen: per node the volume counts over time (since the
/// recorder's epoch) and the figures last seen.
#[derive(Debug, Clone, Default)]
pub struct Records {
    pub series: HashMap<String, Vec<(Duration, u32)>>,
    pub latest: HashMap<String, Figures>,
}

/// Watches every `NodeStorageResource` and keeps [`Records`]; stops on
/// drop.
#[derive(Debug)]
pub struct NsrRecorder {
    epoch: Instant,
    records: watch::Receiver<Records>,
    task: JoinHandle<()>,
}

impl NsrRecorder {
    pub fn start(client: Client) -> NsrRecorder {
        let epoch = Instant::now();
        let (tx, records) = watch::channel(Records::default());
        let api: Api<NodeStorageResource> = Api::all(client);
        let task = tokio::spawn(async move {
            let mut stream = watcher(api, watcher::Config::default())
                .default_backoff()
                .applied_objects()
                .boxed();
            while let Some(next) = stream.next().await {
                let Ok(nsr) = next else { continue };
                let at = epoch.elapsed();
                let figures = Figures::of(&nsr);
                tx.send_modify(|r| {
                    r.series
                        .entry(nsr.name_any())
                        .or_default()
                        .push((at, figures.volume_count));
                    r.latest.insert(nsr.name_any(), figures);
                });
            }
        });
        NsrRecorder {
            epoch,
            records,
            task,
        }
    }

    /// The time since the recorder started, on the clock of its series.
    pub fn now(&self) -> Duration {
        self.epoch.elapsed()
    }

    /// The same moment on the clock of the series.
    pub fn at(&self, instant: Instant) -> Duration {
        instant.saturating_duration_since(self.epoch)
    }

    pub fn records(&self) -> Records {
        self.records.borrow().clone()
    }

    /// Waits until the records satisfy `done`, at most `within`; the
    /// error shows `what` and the figures last seen.
    pub async fn wait_for(
        &self,
        what: &str,
        within: Duration,
        done: impl Fn(&Records) -> bool,
    ) -> Result<Records> {
        let mut rx = self.records.clone();
        match tokio::time::timeout(within, rx.wait_for(|r| done(r))).await {
            Ok(Ok(r)) => Ok(r.clone()),
            Ok(Err(_)) => bail!("the NodeStorageResource watch ended"),
            Err(_) => {
                let mut latest: Vec<_> = self.records().latest.into_iter().collect();
                latest.sort_by(|a, b| a.0.cmp(&b.0));
                bail!("records not {what} within {within:?}; last seen: {latest:?}")
            }
        }
    }
}

impl Drop for NsrRecorder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// How long after each completed change a node's record showed it.
///
/// `series` is the node's volume count over time, `completions` the times
/// the changes on that node completed, in any order; the k-th completion
/// (by time) is reflected once the count reaches `start + k` (`rising`,
/// creates) or falls to `start - k` (deletes). A change already reflected
/// when it completed counts zero. `None` for a change the series never
/// reflects.
pub fn freshness(
    series: &[(Duration, u32)],
    start: u32,
    rising: bool,
    completions: &[Duration],
) -> Vec<Option<Duration>> {
    let mut done: Vec<Duration> = completions.to_vec();
    done.sort();
    done.iter()
        .enumerate()
        .map(|(k, &t)| {
            let k = u32::try_from(k + 1).unwrap_or(u32::MAX);
            let expected = if rising {
                start.saturating_add(k)
            } else {
                start.saturating_sub(k)
            };
            let reflects = |count: u32| {
                if rising {
                    count >= expected
                } else {
                    count <= expected
                }
            };
            let before = series.iter().rev().find(|(at, _)| *at <= t);
            if before.is_some_and(|(_, c)| reflects(*c)) {
                return Some(Duration::ZERO);
            }
            series
                .iter()
                .find(|(at, c)| *at > t && reflects(*c))
                .map(|(at, _)| *at - t)
        })
        .collect()
}

/// The kube-apiserver's `apiserver_request_total`, summed per resource
/// (`""` for requests without one, e.g. `/metrics` itself).
pub fn request_counts(metrics: &str) -> BTreeMap<String, f64> {
    let mut counts = BTreeMap::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once('}') else {
            continue;
        };
        let Ok(value) = value.trim().parse::<f64>() else {
            continue;
        };
        let resource = labels
            .split("\",")
            .find_map(|l| l.strip_prefix("resource=\""))
            .map(|r| r.trim_end_matches('"'))
            .unwrap_or_default();
        *counts.entry(resource.to_string()).or_insert(0.0) += value;
    }
    counts
}

/// `after - before` per resource.
pub fn counts_delta(
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
) -> BTreeMap<String, f64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, v)| *v > 0.0)
        .collect()
}

/// Scrapes the API server's `/metrics` with `client` (the admin).
pub async fn scrape_requests(client: &Client) -> Result<BTreeMap<String, f64>> {
    let req = http::Request::get("/metrics").body(Vec::new())?;
    let text = client
        .request_text(req)
        .await
        .context("GET /metrics on kube-apiserver")?;
    Ok(request_counts(&text))
}

/// CPU time and peak resident memory of a process, from `/proc`.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ProcStats {
    /// User plus system time.
    pub cpu_seconds: f64,
    /// `VmHWM`: the peak resident set.
    pub peak_rss_bytes: u64,
}

impl ProcStats {
    /// Reads `/proc/<pid>/stat` and `/proc/<pid>/status`.
    pub fn read(pid: u32) -> Result<ProcStats> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .with_context(|| format!("read /proc/{pid}/stat"))?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .with_context(|| format!("read /proc/{pid}/status"))?;
        let ticks = cpu_ticks(&stat).with_context(|| format!("parse /proc/{pid}/stat"))?;
        Ok(ProcStats {
            cpu_seconds: ticks as f64 / clock_ticks() as f64,
            peak_rss_bytes: peak_rss(&status)
                .with_context(|| format!("no VmHWM in /proc/{pid}/status"))?,
        })
    }
}

/// `utime + stime` (fields 14 and 15) of a `/proc/<pid>/stat` line. The
/// command name (field 2) is in parentheses and may hold spaces, so the
/// fields are counted after its closing parenthesis.
pub fn cpu_ticks(stat: &str) -> Option<u64> {
    let (_, after) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = after.split_whitespace().collect();
    // `after` starts at field 3 (state).
    let utime: u64 = fields.get(14 - 3)?.parse().ok()?;
    let stime: u64 = fields.get(15 - 3)?.parse().ok()?;
    Some(utime + stime)
}

/// `VmHWM` of a `/proc/<pid>/status` text, in bytes.
pub fn peak_rss(status: &str) -> Option<u64> {
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// Clock ticks per second (`getconf CLK_TCK`; 100, the Linux value, if
/// that cannot be run).
fn clock_ticks() -> u64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .filter(|t| *t > 0)
        .unwrap_or(100)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_change_already_shown_counts_zero_and_a_late_one_its_delay() {
        let series = [(ms(0), 0), (ms(90), 1), (ms(300), 2)];
        // First create done at 100 (shown at 90), second at 120 (shown
        // at 300).
        let f = freshness(&series, 0, true, &[ms(120), ms(100)]);
        assert_eq!(f, vec![Some(ms(0)), Some(ms(180))]);
    }

    #[test]
    fn deletes_count_down_and_an_unshown_change_is_none() {
        let series = [(ms(0), 3), (ms(50), 2)];
        let f = freshness(&series, 3, false, &[ms(40), ms(60)]);
        assert_eq!(f, vec![Some(ms(10)), None]);
    }

    #[test]
    fn request_counts_sum_per_resource() {
        let text = r#"# HELP apiserver_request_total x
# TYPE apiserver_request_total counter
apiserver_request_total{code="201",component="apiserver",dry_run="",group="carina.storage.io",resource="logicvolumes",scope="cluster",subresource="",verb="POST",version="v1"} 7
apiserver_request_total{code="200",component="apiserver",dry_run="",group="carina.storage.io",resource="logicvolumes",scope="cluster",subresource="status",verb="APPLY",version="v1"} 3
apiserver_request_total{code="200",component="",dry_run="",group="",resource="",scope="",subresource="/metrics",verb="GET",version=""} 2
apiserver_request_duration_seconds_count{resource="logicvolumes"} 99
"#;
        let c = request_counts(text);
        assert_eq!(c.get("logicvolumes"), Some(&10.0));
        assert_eq!(c.get(""), Some(&2.0));
        assert_eq!(c.len(), 2);
        let later = BTreeMap::from([("logicvolumes".to_string(), 15.0), ("".to_string(), 2.0)]);
        assert_eq!(
            counts_delta(&c, &later),
            BTreeMap::from([("logicvolumes".to_string(), 5.0)])
        );
    }

    #[test]
    fn cpu_ticks_skip_a_command_name_with_spaces() {
        let stat = "42 (carina node) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 9 0 1 1 1";
        assert_eq!(cpu_ticks(stat), Some(300));
        assert_eq!(cpu_ticks("42 (x) S 1"), None);
    }

    #[test]
    fn peak_rss_from_vmhwm() {
        let status = "Name:\tx\nVmPeak:\t 2000 kB\nVmHWM:\t    1536 kB\nVmRSS:\t 1000 kB\n";
        assert_eq!(peak_rss(status), Some(1536 * 1024));
        assert_eq!(peak_rss("Name:\tx\n"), None);
    }
}
