//! One churn, start to end, with what it observed: [`ScaleCluster::run`].
//!
//! The order: claims made; the capacity watch started and every node's
//! first record taken; the API server's request counter and the
//! controller's and extender's CPU time read; the creates; the checks;
//! the claims deleted; the deletes; the checks. The request counter and
//! CPU time are read again right after each phase, so the checks' own
//! requests are not counted. Freshness is computed from the watch's
//! series once the records have converged.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use anyhow::{Context, Result};

use super::ScaleCluster;
use super::checks;
use super::churn::{self, CreatePhase, DeletePhase};
use super::observe::{NsrRecorder, ProcStats, counts_delta, freshness, scrape_requests};

/// What one run observed.
#[derive(Debug, Clone)]
pub struct Run {
    pub create: CreatePhase,
    pub delete: DeletePhase,
    /// Per created volume: how long after `CreateVolume` returned its
    /// node's record showed it.
    pub create_freshness: Vec<Duration>,
    /// Likewise per deleted volume.
    pub delete_freshness: Vec<Duration>,
    /// API server requests during the two phases, per resource.
    pub requests: BTreeMap<String, f64>,
    /// CPU time during the two phases; peak memory over the whole run.
    pub controller: ProcStats,
    pub extender: ProcStats,
}

impl Run {
    /// CSI calls repeated after a retryable failure.
    pub fn retries(&self) -> u32 {
        let c: u32 = self.create.created.iter().map(|c| c.attempts - 1).sum();
        let d: u32 = self.delete.deleted.iter().map(|d| d.attempts - 1).sum();
        c + d
    }
}

/// CPU and request counters at one moment.
struct Mark {
    requests: BTreeMap<String, f64>,
    controller: ProcStats,
    extender: ProcStats,
}

impl ScaleCluster {
    async fn mark(&self) -> Result<Mark> {
        let pid = |p: Option<u32>, what: &str| p.with_context(|| format!("{what} not running"));
        Ok(Mark {
            requests: scrape_requests(&self.client()).await?,
            controller: ProcStats::read(pid(self.controller_pid(), "controller")?)?,
            extender: ProcStats::read(pid(self.extender().pid(), "extender")?)?,
        })
    }

    /// Creates [`super::Shape::volumes`] volumes, checks, deletes them
    /// all, checks; fails on the first error or failed check.
    pub async fn run(&mut self) -> Result<Run> {
        let mut planned = churn::plan(self.shape.volumes);
        churn::make_claims(self, &mut planned).await?;

        let recorder = NsrRecorder::start(self.client());
        let names = self.node_names();
        let first = recorder
            .wait_for("listed for every node", super::WAIT, |r| {
                names.iter().all(|n| r.latest.contains_key(n))
            })
            .await?;
        let initial = first.latest.clone();
        let start_counts: HashMap<String, u32> = initial
            .iter()
            .map(|(n, f)| (n.clone(), f.volume_count))
            .collect();

        let m0 = self.mark().await?;
        let create = churn::create_all(self, &planned).await?;
        let m1 = self.mark().await?;
        self.check_running()?;
        checks::after_creates(self, &planned, &create, &initial, &recorder).await?;

        churn::delete_claims(self).await?;
        let m2 = self.mark().await?;
        let delete = churn::delete_all(self, &create.created).await?;
        let m3 = self.mark().await?;
        self.check_running()?;
        checks::after_deletes(self, &initial, &recorder).await?;

        let records = recorder.records();
        let mut create_freshness = Vec::new();
        let mut delete_freshness = Vec::new();
        for name in &names {
            let series = records.series.get(name).map(Vec::as_slice).unwrap_or(&[]);
            let start = start_counts.get(name).copied().unwrap_or(0);
            let made: Vec<Duration> = create
                .created
                .iter()
                .filter(|c| &c.node == name)
                .map(|c| recorder.at(c.done))
                .collect();
            let gone: Vec<Duration> = delete
                .deleted
                .iter()
                .filter(|d| &d.node == name)
                .map(|d| recorder.at(d.done))
                .collect();
            let peak = start + u32::try_from(made.len())?;
            for (f, into, what) in [
                (
                    freshness(series, start, true, &made),
                    &mut create_freshness,
                    "create",
                ),
                (
                    freshness(series, peak, false, &gone),
                    &mut delete_freshness,
                    "delete",
                ),
            ] {
                for d in f {
                    into.push(d.with_context(|| {
                        format!("a {what} on {name} never showed in its record: {series:?}")
                    })?);
                }
            }
        }

        let mut requests = counts_delta(&m0.requests, &m1.requests);
        for (k, v) in counts_delta(&m2.requests, &m3.requests) {
            *requests.entry(k).or_insert(0.0) += v;
        }
        let cpu = |a: &ProcStats, b: &ProcStats, c: &ProcStats, d: &ProcStats| ProcStats {
            cpu_seconds: (b.cpu_seconds - a.cpu_seconds) + (d.cpu_seconds - c.cpu_seconds),
            peak_rss_bytes: d.peak_rss_bytes,
        };
        Ok(Run {
            controller: cpu(
                &m0.controller,
                &m1.controller,
                &m2.controller,
                &m3.controller,
            ),
            extender: cpu(&m0.extender, &m1.extender, &m2.extender, &m3.extender),
            create,
            delete,
            create_freshness,
            delete_freshness,
            requests,
        })
    }
}
