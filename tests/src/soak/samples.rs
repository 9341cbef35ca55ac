//! The samples of a soak run, taken at rest, and the rules they must
//! keep: counts equal to the first sample's, open fds never over the
//! warm-up sample's, and RSS within a bound and without a trend
//! ([`rss_verdict`]); and the table they are printed as.

use anyhow::{Context, Result, ensure};
use serde::Serialize;

/// RSS at any sample may exceed the warm-up sample's by at most this.
pub const RSS_SLACK_MIB: u64 = 16;
/// RSS rising in every one of this many consecutive intervals after
/// warm-up (and by more than [`RSS_TREND_MIB`] in all) is a leak.
pub const RSS_TREND_INTERVALS: usize = 6;
/// The least rise over [`RSS_TREND_INTERVALS`] intervals that is a trend.
pub const RSS_TREND_MIB: u64 = 2;

/// Cycles done, by policy and by access.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Cycles {
    pub lvm: u64,
    pub raw: u64,
    pub host: u64,
    pub block: u64,
    pub filesystem: u64,
}

impl Cycles {
    pub fn total(&self) -> u64 {
        self.lvm + self.raw + self.host
    }
}

/// One measurement at rest.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    pub secs: f64,
    pub cycles: Cycles,
    pub rss_kib: u64,
    pub fds: usize,
    pub threads: u64,
    /// Volumes the node lists (ListLVs).
    pub volumes: usize,
    /// Their names and groups (none at rest, unless one leaked).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub volume_names: Vec<String>,
    /// LVs of the test volume group.
    pub lvs: usize,
    /// Entries of the RAW disks' GPTs.
    pub partitions: usize,
    /// Partitions of the RAW disks the kernel has.
    pub kernel_partitions: usize,
    /// Volume directories in the HOST group's root.
    pub host_dirs: usize,
    /// Loop devices over the test disks' files or devices.
    pub loops: usize,
    /// Mounts under the test directory or of the test devices.
    pub mounts: usize,
    /// Every loop device on the machine (other tests' too).
    pub loops_total: usize,
    /// Every mount in the node's namespace (other tests' too).
    pub mounts_total: usize,
}

impl Sample {
    /// What must not change at rest.
    pub fn counts(&self) -> [(&'static str, usize); 7] {
        [
            ("volumes listed by the node", self.volumes),
            ("LVs in the test VG", self.lvs),
            ("GPT partitions on the RAW disks", self.partitions),
            ("kernel partitions of the RAW disks", self.kernel_partitions),
            ("HOST volume directories", self.host_dirs),
            ("loop devices over the test disks", self.loops),
            ("mounts under the test dir or of test devices", self.mounts),
        ]
    }
}

/// The RSS rule over the samples' RSS in KiB and thread counts (index 0
/// before any cycle, 1 the warm-up sample): (a) no sample after warm-up
/// exceeds it by more than [`RSS_SLACK_MIB`]; (b) over the last
/// [`RSS_TREND_INTERVALS`] intervals, leaving out those in which the node
/// gained threads, RSS does not rise in every one by a total of more
/// than [`RSS_TREND_MIB`].
///
/// Why: at rest the node's RSS moves by a few MiB either way as
/// blocking-pool threads (and their malloc arenas) come and go, so an
/// exact or small bound would flap; 16 MiB is several times that noise
/// and far below what a leak of a few KiB per cycle reaches in an hour at
/// ~100 cycles a minute. A leak too slow to cross the bound in the run
/// still rises at every sample, while noise goes down or stays flat
/// (the same pages at rest) within a few samples: six rises in a row, at
/// a minute each, is a trend, not chance. An interval in which the
/// blocking pool grew is no evidence either way: each new thread brings
/// its stack and a malloc arena, about half a MiB, once (a one-hour run
/// saw 1.8 MiB with the pool going from 10 to 14 threads, and a few KiB
/// per interval otherwise). The trend needs six samples after warm-up,
/// so the two-minute run (three) checks the bound only. What this misses:
/// a leak of less than about 600 bytes per cycle crosses neither in an
/// hour.
pub fn rss_verdict(rss: &[u64], threads: &[u64]) -> Result<()> {
    let Some(&warm) = rss.get(1) else {
        return Ok(());
    };
    for (i, &kib) in rss.iter().enumerate().skip(2) {
        ensure!(
            kib <= warm + RSS_SLACK_MIB * 1024,
            "RSS at sample {i} is {} MiB, more than {RSS_SLACK_MIB} MiB over the warm-up sample's {} MiB",
            kib / 1024,
            warm / 1024
        );
    }
    let after = &rss[1..];
    if after.len() > RSS_TREND_INTERVALS {
        let from = rss.len() - RSS_TREND_INTERVALS - 1;
        let last = &rss[from..];
        let pool = threads.get(from..).unwrap_or_default();
        // The intervals in which the thread count did not grow.
        let steady: Vec<(u64, u64)> = last
            .windows(2)
            .zip(
                pool.windows(2)
                    .map(|t| t[1] > t[0])
                    .chain(std::iter::repeat(false)),
            )
            .filter(|(_, grew)| !grew)
            .map(|(w, _)| (w[0], w[1]))
            .collect();
        let rising = !steady.is_empty() && steady.iter().all(|(a, b)| b > a);
        let rise: u64 = steady.iter().map(|(a, b)| b.saturating_sub(*a)).sum();
        ensure!(
            !(rising && rise > RSS_TREND_MIB * 1024),
            "RSS rose in each of the last {RSS_TREND_INTERVALS} intervals (those in which the node gained no thread), by {rise} KiB in all: {last:?} KiB, threads {pool:?}"
        );
    }
    Ok(())
}

/// The rules of the module header, for the newest sample.
pub fn check(samples: &[Sample]) -> Result<()> {
    let (Some(first), Some(last)) = (samples.first(), samples.last()) else {
        return Ok(());
    };
    let changed: Vec<String> = first
        .counts()
        .iter()
        .zip(last.counts())
        .filter(|((_, was), (_, now))| was != now)
        .map(|((what, was), (_, now))| format!("{what} {now} (was {was})"))
        .collect();
    ensure!(
        changed.is_empty(),
        "leak at {:.0} s (at rest, after {} cycles; counts before the first cycle in brackets): {}; the node lists {:?}",
        last.secs,
        last.cycles.total(),
        changed.join(", "),
        last.volume_names
    );
    if let Some(warm) = samples.get(1) {
        ensure!(
            last.fds <= warm.fds,
            "fd leak at {:.0} s: the node has {} open fds, {} at the warm-up sample",
            last.secs,
            last.fds,
            warm.fds
        );
    }
    let rss: Vec<u64> = samples.iter().map(|s| s.rss_kib).collect();
    let threads: Vec<u64> = samples.iter().map(|s| s.threads).collect();
    rss_verdict(&rss, &threads).with_context(|| format!("memory leak at {:.0} s", last.secs))
}

pub fn header() -> String {
    format!(
        "{:>7} {:>6} {:>6} {:>6} {:>6} {:>8} {:>5} {:>5} {:>4} {:>5} {:>5} {:>5} {:>6} {:>7}",
        "time_s",
        "LVM",
        "RAW",
        "HOST",
        "cyc/m",
        "RSS_MiB",
        "fds",
        "thr",
        "LVs",
        "parts",
        "hdirs",
        "loops",
        "mounts",
        "m_total"
    )
}

pub fn row(s: &Sample, prev: Option<&Sample>) -> String {
    let rate = match prev {
        Some(p) if s.secs > p.secs => {
            (s.cycles.total() - p.cycles.total()) as f64 * 60.0 / (s.secs - p.secs)
        }
        _ => 0.0,
    };
    format!(
        "{:>7.0} {:>6} {:>6} {:>6} {:>6.1} {:>8.1} {:>5} {:>5} {:>4} {:>5} {:>5} {:>5} {:>6} {:>7}",
        s.secs,
        s.cycles.lvm,
        s.cycles.raw,
        s.cycles.host,
        rate,
        s.rss_kib as f64 / 1024.0,
        s.fds,
        s.threads,
        s.lvs,
        s.partitions,
        s.host_dirs,
        s.loops,
        s.mounts,
        s.mounts_total
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rss_noise_passes_and_growth_fails() {
        let mib = |v: &[u64]| v.iter().map(|m| m * 1024).collect::<Vec<_>>();
        let same = |n: usize| vec![10u64; n];
        // Warm-up jump, then wandering by a few MiB.
        let rss = mib(&[20, 30, 33, 29, 31, 35, 30, 30, 32]);
        assert!(rss_verdict(&rss, &same(rss.len())).is_ok());
        // Over the slack.
        let rss = mib(&[20, 30, 35, 47]);
        assert!(rss_verdict(&rss, &same(rss.len())).is_err());
        // A slow, steady rise under the slack.
        let rss = mib(&[20, 30, 30, 31, 32, 33, 34, 35, 36]);
        let err = rss_verdict(&rss, &same(rss.len())).expect_err("trend");
        assert!(err.to_string().contains("rose in each"), "{err}");
        // The same rise is a trend even when threads come and go in
        // between (a steady rise shows in the other intervals too).
        let threads = [4, 10, 10, 12, 12, 12, 14, 14, 14];
        assert!(rss_verdict(&rss, &threads).is_err());
        // Six rises of a few KiB each are noise.
        let rss = [20480, 30720, 30721, 30722, 30723, 30724, 30725, 30726];
        assert!(rss_verdict(&rss, &same(rss.len())).is_ok());
        // The one-hour run's samples: a few KiB a minute, and 1.8 MiB in
        // the minute the pool grew from 10 to 14 threads.
        let rss = [
            31448, 36880, 37996, 38020, 38044, 38092, 38096, 38112, 39976, 40048, 40120,
        ];
        let threads = [4, 10, 9, 10, 10, 10, 10, 10, 14, 14, 14];
        assert!(rss_verdict(&rss, &threads).is_ok());
        // Without the thread growth the same numbers are a trend.
        assert!(rss_verdict(&rss, &same(rss.len())).is_err());
    }
}
