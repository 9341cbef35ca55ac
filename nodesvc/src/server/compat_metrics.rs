//! The metric families Go Carina v0.14's node exported, under its names,
//! types, units and labels, so dashboards and alerts written for it keep
//! working after the switch:
//!
//! - `carina_volume_group_stats_*{device_group,nodename}`: the capacity of
//!   each LVM device group (Go exported volume groups only), computed from
//!   the engine's capacity snapshot, the same figures as the page's own
//!   `carina_node_capacity_*` gauges;
//! - `carina_volume_stats_*{namespace,pvc,pv,device_group,nodename}`: the
//!   IO counters of every volume with a block device of its own (LVM, RAW),
//!   read from the kernel's statistics of that device
//!   ([`carina_sys::blockstat`]). HOST volumes are directories with no
//!   device of their own and have no series, as in Go.
//!
//! Listing the volumes may wait on LVM, so the counters are read beside the
//! page ([`super::slow_gauge`]) together with the listing: a page renders
//! the last reading and its age (`carina_node_volume_stats_age_seconds`),
//! never counters of a device number the listing did not just name.
//! `pv` is the PersistentVolume's name: the volume's name on the node, or
//! for a volume taken over from Go Carina (named by its Go id,
//! `volume-<pv>`) the name in its id, as Go labelled it;
//! `namespace` and `pvc` are empty: the node holds no Kubernetes
//! credentials and is not told the claim. There is one series per volume
//! on the node and family, so the label sets are bounded by the node's
//! volumes.

use std::fmt::Write as _;

use carina_csi::legacy::LegacyId;
use carina_sys::blockstat::{self, BlockStat};
use tracing::Instrument as _;

use super::slow_gauge::Reading;
use crate::engine::{CapacitySnapshot, Engine, Policy};

/// One volume's block device counters, read beside the page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeIo {
    /// The volume's name on the node.
    pub volume: String,
    pub group: String,
    pub stat: BlockStat,
}

/// Lists the node's volumes and reads the counters of each one's block
/// device; `None` when the listing failed. A device that vanished between
/// the listing and the read (the volume was deleted) is left out.
pub async fn read_volume_io(engine: &Engine) -> Option<Vec<VolumeIo>> {
    let span = tracing::debug_span!("metrics.volume_io");
    async move {
        let volumes = match engine.list_volumes(None).await {
            Ok(v) => v,
            Err(e) => {
                tracing::debug!(error = %e, "listing the volumes failed");
                return None;
            }
        };
        let read = move || {
            volumes
                .into_iter()
                .filter(|v| v.device_path.is_some() && v.major != 0)
                .filter_map(|v| match blockstat::read(v.major, v.minor) {
                    Ok(stat) => Some(VolumeIo {
                        volume: v.name,
                        group: v.group,
                        stat,
                    }),
                    Err(e) => {
                        tracing::debug!(carina.volume.name = %v.name, error = %e, "no counters");
                        None
                    }
                })
                .collect::<Vec<_>>()
        };
        tokio::task::spawn_blocking(read).await.ok()
    }
    .instrument(span)
    .await
}

/// The `pv` label of the volume named `volume` on the node: the name in
/// a Go Carina id (a taken-over volume keeps its id as its name), else the
/// name itself.
fn pv_label(volume: &str) -> String {
    LegacyId::parse(volume).map_or_else(|| volume.to_string(), |id| id.object)
}

/// Seconds per millisecond tick of the kernel's time counters.
const SECONDS_PER_MS: f64 = 1e-3;

/// One `carina_volume_stats_*` family: name, help, type, and its value
/// from a device's counters.
type Family = (
    &'static str,
    &'static str,
    &'static str,
    fn(&BlockStat) -> f64,
);

/// The ten families Go exported, in its order, with its types and units.
const VOLUME_FAMILIES: [Family; 10] = [
    (
        "reads_completed_total",
        "Reads the volume's device completed.",
        "counter",
        |s| s.reads_completed as f64,
    ),
    (
        "reads_merged_total",
        "Adjacent reads merged into one before reaching the device.",
        "counter",
        |s| s.reads_merged as f64,
    ),
    (
        "read_bytes_total",
        "Bytes read from the volume's device.",
        "counter",
        |s| s.read_bytes() as f64,
    ),
    (
        "read_time_seconds_total",
        "Seconds spent reading, summed over all reads.",
        "counter",
        |s| s.read_ms as f64 * SECONDS_PER_MS,
    ),
    (
        "writes_completed_total",
        "Writes the volume's device completed.",
        "counter",
        |s| s.writes_completed as f64,
    ),
    (
        "writes_merged_total",
        "Adjacent writes merged into one before reaching the device.",
        "counter",
        |s| s.writes_merged as f64,
    ),
    (
        "write_bytes_total",
        "Bytes written to the volume's device.",
        "counter",
        |s| s.written_bytes() as f64,
    ),
    (
        "write_time_seconds_total",
        "Seconds spent writing, summed over all writes.",
        "counter",
        |s| s.write_ms as f64 * SECONDS_PER_MS,
    ),
    (
        "io_now",
        "IOs started on the volume's device and not yet completed.",
        "gauge",
        |s| s.in_flight as f64,
    ),
    (
        "io_time_seconds_total",
        "Seconds during which the volume's device had IO in progress.",
        "counter",
        |s| s.io_ms as f64 * SECONDS_PER_MS,
    ),
];

/// One `carina_volume_group_stats_*` family: name, help, and its value
/// from a group's capacity.
type GroupFamily = (
    &'static str,
    &'static str,
    fn(&crate::engine::GroupCapacity) -> u64,
);

const GROUP_FAMILIES: [GroupFamily; 4] = [
    (
        "capacity_bytes_total",
        "Size of the LVM device group in bytes.",
        |g| g.total_bytes,
    ),
    (
        "capacity_bytes_used",
        "Bytes of the LVM device group allocated to volumes (size minus free).",
        |g| g.total_bytes.saturating_sub(g.free_bytes),
    ),
    ("lv_total", "Volumes in the LVM device group.", |g| {
        u64::from(g.volume_count)
    }),
    (
        "pv_total",
        "Disks (physical volumes) in the LVM device group.",
        |g| g.disks.len() as u64,
    ),
];

/// Appends the `carina_volume_group_stats_*` gauges of every LVM group in
/// `snapshot` for node `nodename` (already escaped).
pub fn render_groups(out: &mut String, nodename: &str, snapshot: &CapacitySnapshot) {
    for (name, help, value) in GROUP_FAMILIES {
        let _ = writeln!(
            out,
            "# HELP carina_volume_group_stats_{name} {help}\n# TYPE carina_volume_group_stats_{name} gauge"
        );
        for g in snapshot.groups.iter().filter(|g| g.policy == Policy::Lvm) {
            let _ = writeln!(
                out,
                "carina_volume_group_stats_{name}{{device_group=\"{}\",nodename=\"{nodename}\"}} {}",
                carina_proto::metrics::escape_label(&g.group),
                value(g)
            );
        }
    }
}

/// Appends the `carina_volume_stats_*` families of the volumes as last
/// read, and the reading's age, for node `nodename` (already escaped).
/// Nothing before the first reading.
pub fn render_volumes(out: &mut String, nodename: &str, reading: Option<&Reading<Vec<VolumeIo>>>) {
    let Some(Reading {
        value: volumes,
        age,
    }) = reading
    else {
        return;
    };
    for (name, help, kind, value) in VOLUME_FAMILIES {
        let _ = writeln!(
            out,
            "# HELP carina_volume_stats_{name} {help}\n# TYPE carina_volume_stats_{name} {kind}"
        );
        for v in volumes {
            let _ = writeln!(
                out,
                "carina_volume_stats_{name}{{namespace=\"\",pvc=\"\",pv=\"{}\",device_group=\"{}\",nodename=\"{nodename}\"}} {}",
                carina_proto::metrics::escape_label(&pv_label(&v.volume)),
                carina_proto::metrics::escape_label(&v.group),
                value(&v.stat)
            );
        }
    }
    let _ = writeln!(
        out,
        "# HELP carina_node_volume_stats_age_seconds How long ago the carina_volume_stats_* counters were read (each scrape reads again, but renders the last reading when listing the volumes waits on LVM).\n\
         # TYPE carina_node_volume_stats_age_seconds gauge\n\
         carina_node_volume_stats_age_seconds{{node=\"{nodename}\"}} {:.3}",
        age.as_secs_f64()
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{ChangeReason, GroupCapacity, QuotaMode};
    use std::time::Duration;

    fn group(name: &str, policy: Policy) -> GroupCapacity {
        GroupCapacity {
            group: name.into(),
            policy,
            total_bytes: 1000,
            free_bytes: 600,
            reserve_bytes: 10,
            allocatable_bytes: 590,
            largest_allocatable_bytes: 590,
            allocation_unit: 4,
            volume_count: 3,
            quota: QuotaMode::NotApplicable,
            disks: vec!["/dev/loop1".into(), "/dev/loop2".into()],
            no_disks: None,
        }
    }

    fn parse(text: &str) -> prometheus_parse::Scrape {
        prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
            .expect("the text parses")
    }

    fn sample<'a>(
        scrape: &'a prometheus_parse::Scrape,
        metric: &str,
        labels: &[(&str, &str)],
    ) -> Option<&'a prometheus_parse::Sample> {
        scrape
            .samples
            .iter()
            .find(|s| s.metric == metric && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
    }

    #[test]
    fn group_stats_of_lvm_groups_from_the_snapshot() {
        let snap = CapacitySnapshot {
            incarnation: "i".into(),
            generation: 1,
            reason: ChangeReason::Start,
            groups: vec![group("carina-vg-ssd", Policy::Lvm), group("r", Policy::Raw)],
        };
        let mut out = String::new();
        render_groups(&mut out, "node-a", &snap);
        let s = parse(&out);
        let labels = [("device_group", "carina-vg-ssd"), ("nodename", "node-a")];
        for (metric, want) in [
            ("carina_volume_group_stats_capacity_bytes_total", 1000.0),
            ("carina_volume_group_stats_capacity_bytes_used", 400.0),
            ("carina_volume_group_stats_lv_total", 3.0),
            ("carina_volume_group_stats_pv_total", 2.0),
        ] {
            let got = sample(&s, metric, &labels).unwrap_or_else(|| panic!("{metric} in\n{out}"));
            assert_eq!(got.value, prometheus_parse::Value::Gauge(want), "{metric}");
        }
        assert!(
            sample(
                &s,
                "carina_volume_group_stats_capacity_bytes_total",
                &[("device_group", "r")]
            )
            .is_none(),
            "Go exported volume groups only:\n{out}"
        );
    }

    #[test]
    fn volume_stats_in_go_units_types_and_labels() {
        let stat = BlockStat {
            reads_completed: 11,
            reads_merged: 2,
            sectors_read: 8,
            read_ms: 1500,
            writes_completed: 7,
            writes_merged: 1,
            sectors_written: 16,
            write_ms: 250,
            in_flight: 3,
            io_ms: 2000,
            weighted_io_ms: 9,
        };
        let reading = Reading {
            value: vec![VolumeIo {
                volume: "pvc-1".into(),
                group: "carina-vg-ssd".into(),
                stat,
            }],
            age: Duration::from_millis(250),
        };
        let mut out = String::new();
        render_volumes(&mut out, "node-a", Some(&reading));
        let s = parse(&out);
        let labels = [
            ("namespace", ""),
            ("pvc", ""),
            ("pv", "pvc-1"),
            ("device_group", "carina-vg-ssd"),
            ("nodename", "node-a"),
        ];
        use prometheus_parse::Value::{Counter, Gauge};
        for (metric, want) in [
            ("reads_completed_total", Counter(11.0)),
            ("reads_merged_total", Counter(2.0)),
            ("read_bytes_total", Counter(4096.0)),
            ("read_time_seconds_total", Counter(1.5)),
            ("writes_completed_total", Counter(7.0)),
            ("writes_merged_total", Counter(1.0)),
            ("write_bytes_total", Counter(8192.0)),
            ("write_time_seconds_total", Counter(0.25)),
            ("io_now", Gauge(3.0)),
            ("io_time_seconds_total", Counter(2.0)),
        ] {
            let metric = format!("carina_volume_stats_{metric}");
            let got = sample(&s, &metric, &labels).unwrap_or_else(|| panic!("{metric} in\n{out}"));
            assert_eq!(got.value, want, "{metric}");
            assert_eq!(got.labels.len(), labels.len(), "{metric}: {:?}", got.labels);
        }
        assert_eq!(
            sample(
                &s,
                "carina_node_volume_stats_age_seconds",
                &[("node", "node-a")]
            )
            .map(|x| &x.value),
            Some(&Gauge(0.25))
        );
        // A volume taken over from Go Carina is labelled as Go labelled it.
        let go = Reading {
            value: vec![VolumeIo {
                volume: "volume-pvc-0b6f".into(),
                group: "carina-vg-ssd".into(),
                stat,
            }],
            age: Duration::ZERO,
        };
        let mut out = String::new();
        render_volumes(&mut out, "node-a", Some(&go));
        assert!(
            sample(
                &parse(&out),
                "carina_volume_stats_write_bytes_total",
                &[("pv", "pvc-0b6f")]
            )
            .is_some(),
            "{out}"
        );
        assert_eq!(pv_label("pvc-1"), "pvc-1");
        assert_eq!(pv_label("volume-"), "volume-", "not a Go id");
        let mut none = String::new();
        render_volumes(&mut none, "node-a", None);
        assert_eq!(none, "", "nothing before the first reading");
    }
}
