//! Benchmark results: percentiles, ratios against the physical floor, and
//! the two report files (`benchmarks.json` for tools, `benchmarks.md` for
//! people). Entries are merged by name, so each benchmark group rewrites
//! only its own rows.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

/// One measurement, compared with the raw command it stands on.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Entry {
    pub name: String,
    pub unit: String,
    pub p50: f64,
    pub p99: f64,
    /// The raw command's p50 in the same run (null when there is none).
    pub floor_p50: Option<f64>,
    /// p50 / floor_p50.
    pub ratio: Option<f64>,
    pub iterations: usize,
    /// The table it belongs to in benchmarks.md.
    #[serde(default)]
    pub group: String,
    /// What the floor is.
    #[serde(default)]
    pub floor: String,
}

impl Entry {
    /// One line for the terminal, the name padded to `width`.
    pub fn line(&self, width: usize) -> String {
        let or_dash = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| format!("{v:.3}"));
        format!(
            "{:<width$} p50 {:>10.3} {:<9} p99 {:>10.3}  floor p50 {:>9}  ratio {:>8}",
            self.name,
            self.p50,
            self.unit,
            self.p99,
            or_dash(self.floor_p50),
            or_dash(self.ratio),
        )
    }
}

/// The p-th percentile (nearest rank) of `samples`, in milliseconds.
pub fn percentile_ms(samples: &[Duration], p: f64) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    let mut ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
    ms.sort_by(|a, b| a.total_cmp(b));
    let rank = ((p / 100.0) * ms.len() as f64).ceil() as usize;
    ms[rank.clamp(1, ms.len()) - 1]
}

/// An entry from timed samples against floor samples.
pub fn timed(
    group: &str,
    name: &str,
    floor: &str,
    samples: &[Duration],
    floor_samples: Option<&[Duration]>,
) -> Entry {
    let p50 = percentile_ms(samples, 50.0);
    let floor_p50 = floor_samples.map(|f| percentile_ms(f, 50.0));
    Entry {
        name: name.to_string(),
        unit: "ms".to_string(),
        p50: round3(p50),
        p99: round3(percentile_ms(samples, 99.0)),
        floor_p50: floor_p50.map(round3),
        ratio: floor_p50.filter(|f| *f > 0.0).map(|f| round3(p50 / f)),
        iterations: samples.len(),
        group: group.to_string(),
        floor: floor.to_string(),
    }
}

/// A throughput entry (MiB/s, higher is better) of `bytes` moved in each
/// of `samples` against `bytes` moved by the floor in each of
/// `floor_samples`: p50 is the rate of the median run, p99 that of the p99
/// (slow) run, and the ratio p50 / floor p50 (above 1 beats the floor).
pub fn rate(
    group: &str,
    name: &str,
    floor: &str,
    bytes: u64,
    samples: &[Duration],
    floor_samples: &[Duration],
) -> Entry {
    let mib = bytes as f64 / (1u64 << 20) as f64;
    let per_second = |ms: f64| if ms > 0.0 { mib / (ms / 1000.0) } else { 0.0 };
    let p50 = per_second(percentile_ms(samples, 50.0));
    let floor_p50 = per_second(percentile_ms(floor_samples, 50.0));
    Entry {
        name: name.to_string(),
        unit: "MiB/s".to_string(),
        p50: round3(p50),
        p99: round3(per_second(percentile_ms(samples, 99.0))),
        floor_p50: Some(round3(floor_p50)),
        ratio: (floor_p50 > 0.0).then(|| round3(p50 / floor_p50)),
        iterations: samples.len(),
        group: group.to_string(),
        floor: floor.to_string(),
    }
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// Merges `new` into `<dir>/benchmarks.json` (replacing entries of the
/// same name) and rewrites `<dir>/benchmarks.md` from the merged set.
pub fn write(dir: &Path, new: &[Entry], context: &str) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let json_path = dir.join("benchmarks.json");
    let mut all: Vec<Entry> = match std::fs::read_to_string(&json_path) {
        Ok(text) => {
            serde_json::from_str(&text).with_context(|| format!("parse {}", json_path.display()))?
        }
        Err(_) => Vec::new(),
    };
    for e in new {
        match all.iter_mut().find(|x| x.name == e.name) {
            Some(slot) => *slot = e.clone(),
            None => all.push(e.clone()),
        }
    }
    std::fs::write(&json_path, serde_json::to_string_pretty(&all)? + "\n")?;
    std::fs::write(dir.join("benchmarks.md"), markdown(&all, context))?;
    Ok(())
}

fn markdown(all: &[Entry], context: &str) -> String {
    let mut out = String::from("# Benchmarks\n\n");
    out.push_str("Written by `make bench` and `make bench-scale` (the scale simulation: many `carina-node` processes, the controller and the extender as processes, volumes churned through the kube path); each rewrites only its own rows. Every figure is measured side by side with its physical floor (the raw command) in the same run where one exists; the ratio is p50 / floor p50, so for times (ms, s) below 1 beats the floor and for rates (req/s, MiB/s) above 1 does. Absolute numbers depend on the machine; the ratios are the point.\n\n");
    out.push_str(context);
    out.push_str("\n\n");
    let mut groups: Vec<&str> = Vec::new();
    for e in all {
        if !groups.contains(&e.group.as_str()) {
            groups.push(&e.group);
        }
    }
    for g in groups {
        out.push_str(&format!("## {g}\n\n| measurement | unit | p50 | p99 | floor | floor p50 | ratio | iterations |\n|---|---|---|---|---|---|---|---|\n"));
        for e in all.iter().filter(|e| e.group == g) {
            let fmt = |v: Option<f64>| v.map(|x| format!("{x:.3}")).unwrap_or_else(|| "—".into());
            out.push_str(&format!(
                "| {} | {} | {:.3} | {:.3} | {} | {} | {} | {} |\n",
                e.name,
                e.unit,
                e.p50,
                e.p99,
                if e.floor.is_empty() { "—" } else { &e.floor },
                fmt(e.floor_p50),
                fmt(e.ratio),
                e.iterations
            ));
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_by_nearest_rank() {
        let s: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile_ms(&s, 50.0), 50.0);
        assert_eq!(percentile_ms(&s, 99.0), 99.0);
        assert_eq!(percentile_ms(&[Duration::from_millis(7)], 99.0), 7.0);
        assert_eq!(percentile_ms(&[], 50.0), 0.0);
    }

    #[test]
    fn ratio_against_floor() {
        let a = [Duration::from_millis(11); 3];
        let f = [Duration::from_millis(10); 3];
        let e = timed("g", "n", "raw", &a, Some(&f));
        assert_eq!(e.ratio, Some(1.1));
        assert_eq!(e.floor_p50, Some(10.0));
        let e = timed("g", "n", "", &a, None);
        assert_eq!(e.ratio, None);
    }

    #[test]
    fn rates_in_mib_per_second() {
        // 100 MiB in 1 s (median) and 2 s (slowest), against 0.5 s.
        let a = [
            Duration::from_secs(1),
            Duration::from_secs(1),
            Duration::from_secs(2),
        ];
        let f = [Duration::from_millis(500); 3];
        let e = rate("g", "n", "dd", 100 << 20, &a, &f);
        assert_eq!(e.unit, "MiB/s");
        assert_eq!(e.p50, 100.0);
        assert_eq!(e.p99, 50.0);
        assert_eq!(e.floor_p50, Some(200.0));
        assert_eq!(e.ratio, Some(0.5));
        assert_eq!(e.iterations, 3);
    }

    #[test]
    fn merge_replaces_by_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = timed("g", "one", "", &[Duration::from_millis(1)], None);
        let b = timed("g", "two", "", &[Duration::from_millis(2)], None);
        write(dir.path(), &[a.clone(), b], "ctx").expect("write");
        let a2 = timed("g", "one", "", &[Duration::from_millis(5)], None);
        write(dir.path(), &[a2], "ctx").expect("write");
        let all: Vec<Entry> = serde_json::from_str(
            &std::fs::read_to_string(dir.path().join("benchmarks.json")).expect("read"),
        )
        .expect("json");
        assert_eq!(all.len(), 2);
        assert_eq!(all[0].p50, 5.0);
        let md = std::fs::read_to_string(dir.path().join("benchmarks.md")).expect("md");
        assert!(md.contains("| one | ms | 5.000"), "{md}");
    }

    #[test]
    fn a_group_written_alone_keeps_the_other_groups() {
        // `make bench` and `make bench-scale` each write only their group.
        let dir = tempfile::tempdir().expect("tempdir");
        let bench = timed("bench", "b", "", &[Duration::from_millis(1)], None);
        let scale = timed("scale", "s", "", &[Duration::from_millis(2)], None);
        write(dir.path(), &[bench], "ctx").expect("write");
        write(dir.path(), &[scale], "ctx").expect("write");
        let again = timed("bench", "b", "", &[Duration::from_millis(3)], None);
        write(dir.path(), &[again], "ctx").expect("write");
        let md = std::fs::read_to_string(dir.path().join("benchmarks.md")).expect("md");
        assert!(
            md.contains("## bench\n") && md.contains("## scale\n"),
            "{md}"
        );
        assert!(
            md.contains("| b | ms | 3.000") && md.contains("| s | ms | 2.000"),
            "{md}"
        );
    }
}
