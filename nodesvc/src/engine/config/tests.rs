//! Tests of config.json parsing: Carina's documented forms, our
//! additions, and errors that name their field.

use std::path::Path;

use super::*;

fn err(text: &str) -> String {
    Config::from_json(text)
        .expect_err("must be rejected")
        .to_string()
}

#[test]
fn parses_carina_example() {
    let cfg = Config::from_json(
        r#"{
          "diskSelector": [
            {"name": "carina-vg-ssd", "re": ["loop2+"], "policy": "LVM", "nodeLabel": "kubernetes.io/hostname"},
            {"name": "carina-raw-hdd", "re": ["vdb+", "sd+"], "policy": "RAW", "nodeLabel": "kubernetes.io/hostname"}
          ],
          "diskScanInterval": "300",
          "schedulerStrategy": "spreadout"
        }"#,
    )
    .expect("valid");
    assert_eq!(cfg.groups.len(), 2);
    assert_eq!(cfg.groups[0].policy, Policy::Lvm);
    assert_eq!(cfg.groups[0].reserve_bytes, DEFAULT_RESERVE_BYTES);
    assert!(cfg.groups[0].matches(Path::new("/dev/loop22"), "loop22"));
    assert!(!cfg.groups[0].matches(Path::new("/dev/sda"), "sda"));
    assert_eq!(cfg.groups[1].policy, Policy::Raw);
    assert_eq!(cfg.scan_interval, Duration::from_secs(300));
    assert_eq!(cfg.scheduler_strategy, SchedulerStrategy::Spreadout);
    assert_eq!(
        cfg.groups[0].node_label.as_deref(),
        Some("kubernetes.io/hostname")
    );
}

/// Carina's documented HOST group: the directory is the one entry of
/// `re`, and no disk is ever matched by it.
#[test]
fn carina_host_form() {
    let cfg = Config::from_json(
        r#"{"diskSelector": [
            {"name": "carina-host", "re": ["/opt/carina-hostpath"], "policy": "HOST", "nodeLabel": "kubernetes.io/hostname"}
          ]}"#,
    )
    .expect("Carina's HOST form loads");
    let g = &cfg.groups[0];
    assert_eq!(g.policy, Policy::Host);
    assert_eq!(g.root.as_deref(), Some(Path::new("/opt/carina-hostpath")));
    assert!(g.patterns.is_empty());
    assert!(!g.matches(Path::new("/opt/carina-hostpath"), "carina-hostpath"));
    // Both spellings at once, when they agree.
    let cfg = Config::from_json(
        r#"{"diskSelector": [{"name": "h", "re": ["/srv/h"], "root": "/srv/h", "policy": "host"}]}"#,
    )
    .expect("agreeing root and re");
    assert_eq!(cfg.groups[0].root.as_deref(), Some(Path::new("/srv/h")));
}

/// A pattern selects a disk by its path (Carina's `lsblk --paths`
/// names) or by its kernel name.
#[test]
fn patterns_match_path_or_kernel_name() {
    let cfg = Config::from_json(
        r#"{"diskSelector": [
            {"name": "by-path", "re": ["^/dev/sdb$"], "policy": "LVM"},
            {"name": "by-name", "re": ["^sdc$"], "policy": "LVM"},
            {"name": "loose", "re": ["loop2+"], "policy": "RAW"}
          ]}"#,
    )
    .expect("valid");
    let m = |g: usize, name: &str| cfg.groups[g].matches(&Path::new("/dev").join(name), name);
    assert!(m(0, "sdb"));
    assert!(!m(0, "sdbb"));
    assert!(!m(0, "sdc"));
    assert!(m(1, "sdc"));
    assert!(!m(1, "sdcd"));
    assert!(m(2, "loop2"));
    assert!(m(2, "loop22"));
    assert!(!m(2, "loop3"));
}

/// The forms Carina's documentation shows, each loading unchanged.
#[test]
fn carina_documented_forms() {
    // v0.10+ objects, with the diskGroupPolicy line the docs keep.
    let cfg = Config::from_json(
        r#"{"diskSelector": [
              {"name": "carina-vg-ssd", "re": ["loop2+"], "policy": "LVM", "nodeLabel": "kubernetes.io/hostname"},
              {"name": "carina-raw-loop", "re": ["loop4", "loop5"], "policy": "RAW", "nodeLabel": "kubernetes.io/hostname"},
              {"name": "carina-host", "re": ["/opt/carina-hostpath"], "policy": "HOST", "nodeLabel": "kubernetes.io/hostname"}
            ],
            "diskScanInterval": "300", "diskGroupPolicy": "type", "schedulerStrategy": "binpack"}"#,
    )
    .expect("objects with diskGroupPolicy");
    assert_eq!(cfg.groups.len(), 3);
    assert_eq!(cfg.scheduler_strategy, SchedulerStrategy::Binpack);
    assert!(cfg.warnings.iter().any(|w| w.contains("diskGroupPolicy")));
    // v0.9: a list of patterns grouped by disk type, and the
    // documentation's spelling "spradout".
    let cfg = Config::from_json(
        r#"{"diskSelector": ["loop*", "vd*"], "diskScanInterval": "300",
            "diskGroupPolicy": "type", "schedulerStrategy": "spradout"}"#,
    )
    .expect("v0.9 list form");
    let names: Vec<_> = cfg.groups.iter().map(|g| g.name.as_str()).collect();
    assert_eq!(names, [V09_SSD_GROUP, V09_HDD_GROUP]);
    assert!(cfg.groups.iter().all(|g| g.policy == Policy::Lvm));
    assert_eq!(cfg.groups[0].rotational, Some(false));
    assert_eq!(cfg.groups[1].rotational, Some(true));
    assert!(cfg.groups[0].matches(Path::new("/dev/vda"), "vda"));
    assert_eq!(cfg.scheduler_strategy, SchedulerStrategy::Spreadout);
    assert_eq!(cfg.warnings.len(), 2, "{:?}", cfg.warnings);
    // The scheduling-only form.
    let cfg = Config::from_json(
        r#"{"diskScanInterval": "300", "diskGroupPolicy": "type", "schedulerStrategy": "spreadout"}"#,
    )
    .expect("no selectors");
    assert!(cfg.groups.is_empty());
}

#[test]
fn our_additions() {
    let cfg = Config::from_json(
        r#"{"diskSelector": [
            {"name": "fast", "re": ["^loop7$"], "policy": "LVM", "reserveBytes": 0, "activation": "loop", "minDiskBytes": 1},
            {"name": "dirs", "policy": "HOST", "root": "/var/lib/carina/dirs"}
          ], "diskScanInterval": 0, "schedulerStrategy": "binpack"}"#,
    )
    .expect("valid");
    assert_eq!(cfg.groups[0].reserve_bytes, 0);
    assert_eq!(cfg.groups[0].activation, Activation::Loop);
    assert_eq!(
        cfg.groups[1].root.as_deref(),
        Some(std::path::Path::new("/var/lib/carina/dirs"))
    );
    assert_eq!(cfg.scan_interval, Duration::ZERO);
    assert_eq!(cfg.scheduler_strategy, SchedulerStrategy::Binpack);
}

/// A group with no patterns names no disks yet: it loads and takes none
/// (the chart's default). Orphan PVs are taken only when asked.
#[test]
fn groups_without_patterns_and_orphan_pvs() {
    let cfg = Config::from_json(
        r#"{"diskSelector": [
            {"name": "ssd", "re": [], "policy": "LVM"},
            {"name": "raw", "policy": "RAW"},
            {"name": "old", "re": ["^sdc$"], "policy": "LVM", "adoptOrphanPVs": true}
          ]}"#,
    )
    .expect("groups without patterns load");
    assert!(cfg.groups[0].patterns.is_empty());
    assert!(cfg.groups[1].patterns.is_empty());
    assert!(!cfg.groups[0].matches(Path::new("/dev/loop0"), "loop0"));
    assert!(!cfg.groups[0].adopt_orphan_pvs, "off unless asked");
    assert!(cfg.groups[2].adopt_orphan_pvs);
}

#[test]
fn errors_name_the_field() {
    let cases = [
        (
            r#"{"diskSelector":[{"name":"a","re":["x"],"policy":"LVM"},{"name":"b","re":["("],"policy":"LVM"}]}"#,
            "diskSelector[1].re[0]: invalid regex",
        ),
        (
            r#"{"diskSelector":[{"name":"a","re":["x"],"policy":"LVM"},{"name":"a","re":["y"],"policy":"RAW"}]}"#,
            "diskSelector[1].name: duplicate group name \"a\"",
        ),
        (
            r#"{"diskSelector":[{"name":"a","re":["x"],"policy":"ZFS"}]}"#,
            "diskSelector[0].policy: unknown policy",
        ),
        (
            r#"{"diskSelector":[{"re":["x"],"policy":"LVM"}]}"#,
            "diskSelector[0].name: missing",
        ),
        (
            r#"{"diskSelector":[{"name":"-a","re":["x"],"policy":"LVM"}]}"#,
            "diskSelector[0].name",
        ),
        (
            r#"{"diskSelector":[{"name":"a","re":["x"],"policy":"RAW","adoptOrphanPVs":true}]}"#,
            "diskSelector[0].adoptOrphanPVs: only LVM groups take physical volumes",
        ),
        (
            r#"{"diskSelector":[{"name":"a","re":["x"],"policy":"LVM","adoptOrphanPVs":"yes"}]}"#,
            "diskSelector[0]",
        ),
        (
            r#"{"diskSelector":[{"name":"a","policy":"HOST"}]}"#,
            "diskSelector[0].re: a HOST group needs its directory",
        ),
        (
            r#"{"diskSelector":[{"name":"a","re":["/a","/b"],"policy":"HOST"}]}"#,
            "diskSelector[0].re: a HOST group takes one directory, not 2 entries",
        ),
        (
            r#"{"diskSelector":[{"name":"a","re":["opt/carina"],"policy":"HOST"}]}"#,
            "diskSelector[0].re[0]: \"opt/carina\" is not an absolute path",
        ),
        (
            r#"{"diskSelector":[{"name":"a","re":["/a"],"root":"/b","policy":"HOST"}]}"#,
            "diskSelector[0].root: \"/b\" differs from the directory \"/a\"",
        ),
        (
            r#"{"diskSelector":[{"name":"a","re":["x"],"root":"/b","policy":"LVM"}]}"#,
            "diskSelector[0].root: only HOST groups take a root",
        ),
        (
            r#"{"diskSelector":[{"name":"a","policy":"HOST","root":"rel/dir"}]}"#,
            "diskSelector[0].root",
        ),
        (
            r#"{"diskSelector":[{"name":"a","re":["x"],"policy":"LVM","activation":"magic"}]}"#,
            "diskSelector[0].activation",
        ),
        (
            r#"{"diskSelector":[{"name":"a","re":["x"],"policy":"RAW","activation":"loop"}]}"#,
            "diskSelector[0].activation",
        ),
        (r#"{"diskScanInterval":"soon"}"#, "diskScanInterval"),
        (r#"{"schedulerStrategy":"random"}"#, "schedulerStrategy"),
        (r#"{"diskSelector": 3}"#, "diskSelector: expected a list"),
        (
            r#"{"diskSelector": ["sd+", {"name": "a"}]}"#,
            "diskSelector[0]",
        ),
        (
            r#"{"diskSelector": ["("]}"#,
            "diskSelector[0]: invalid regex",
        ),
        (r#"{"diskScanInterval": []}"#, "diskScanInterval"),
        (r#"[]"#, "config.json"),
    ];
    for (text, want) in cases {
        let got = err(text);
        assert!(got.contains(want), "{text}: got {got:?}, want {want:?}");
    }
}
