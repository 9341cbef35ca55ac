//! What a fresh install of the chart takes: no disk. The chart's default
//! `config` (deploy/helm/carina/values.yaml) names no disks, so no disk a
//! node could have (a loop device, a cloud VM's `vdb` attached by another
//! driver, an `sdb`, an NVMe disk), blank as it may be, goes to a group;
//! a node started on that configuration reports each group with no disks
//! and why (`no_disks`, which the controller turns into the `NoDisks`
//! condition of the node's NodeStorageResource). The chart's node pods
//! tolerate no taint unless told to.

use std::path::Path;

use carina_node::engine::Config;
use carina_node::engine::disks::{self, Disk};
use carina_tests::engine::engine_for;
use carina_tests::have_root;

/// The chart's default values.
fn values() -> serde_json::Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/helm/carina/values.yaml");
    let text = std::fs::read_to_string(&path).expect("values.yaml");
    serde_yaml::from_str(&text).expect("values.yaml is YAML")
}

/// The chart's default `config`, as the ConfigMap's config.json.
fn chart_config() -> String {
    values()["config"].to_string()
}

/// A blank, writable whole disk `name` of 100 GiB of lsblk type `kind`;
/// a loop device is backed by a file.
fn blank(name: &str, kind: &str) -> Disk {
    Disk {
        kind: kind.into(),
        major: 8,
        backing_file: (kind == "loop").then(|| "/var/lib/images/disk.img".into()),
        ..disks::blank_disk(name, 100 << 30)
    }
}

/// No disk of any usual name goes to a group of the default config, and
/// every LVM and RAW group of it is reported as taking none.
#[test]
fn the_default_config_takes_no_disk() {
    let config = Config::from_json(&chart_config()).expect("the chart's config loads");
    assert!(!config.groups.is_empty(), "the default groups are there");
    let seen = [
        blank("loop0", "loop"),
        blank("loop7", "loop"),
        blank("vdb", "disk"),
        blank("vdc", "disk"),
        blank("sdb", "disk"),
        blank("nvme1n1", "disk"),
        blank("xvdf", "disk"),
    ];
    let statuses = disks::assign(&config, &seen, &[]);
    let taken: Vec<_> = statuses
        .iter()
        .filter_map(|s| s.group.as_ref().map(|g| (s.disk.name.as_str(), g.as_str())))
        .collect();
    assert!(taken.is_empty(), "the default config takes {taken:?}");
    let empty = disks::empty_groups(&config, &statuses);
    assert_eq!(
        empty.len(),
        config.groups.len(),
        "every group reports no disks"
    );
    for e in &empty {
        let why = e.to_string();
        assert!(why.contains("names no disks"), "{why}");
    }
}

/// The node pods tolerate no taint by default (a toleration without a key
/// and with operator Exists would tolerate every taint).
#[test]
fn the_default_node_pods_tolerate_no_taint() {
    let tolerations = &values()["node"]["tolerations"];
    let list = tolerations.as_array().expect("node.tolerations is a list");
    assert!(list.is_empty(), "node.tolerations: {tolerations}");
}

/// A node on the default config: its groups, no disks in any, each with
/// its `no_disks` reason, which is what the NoDisks condition shows.
#[tokio::test]
async fn a_node_on_the_default_config_reports_groups_without_disks() {
    if !have_root("a_node_on_the_default_config_reports_groups_without_disks") {
        return;
    }
    let engine = engine_for(&chart_config(), Some(false)).await;
    let capacity = engine.capacity(None).await.expect("capacity");
    let names: Vec<_> = capacity.iter().map(|c| c.group.as_str()).collect();
    assert_eq!(names, ["carina-raw-hdd", "carina-vg-ssd"]);
    for c in &capacity {
        assert!(c.disks.is_empty(), "{} took {:?}", c.group, c.disks);
        assert_eq!(c.total_bytes, 0, "{}", c.group);
        let why = c.no_disks.as_deref().expect("no_disks is set");
        assert!(why.contains("names no disks"), "{why}");
    }
    let taken: Vec<_> = engine
        .disks()
        .into_iter()
        .filter(|s| s.group.is_some())
        .map(|s| s.disk.name)
        .collect();
    assert!(taken.is_empty(), "disks taken: {taken:?}");
}
