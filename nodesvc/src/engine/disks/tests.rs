//! Disk discovery parsed from captured tool output, the assignment rules,
//! and the reasons given for groups without disks.

use super::*;
use crate::engine::config::Config;

const LSBLK: &str = include_str!("../testdata/lsblk.json");

fn config(text: &str) -> Config {
    Config::from_json(text).expect("valid config")
}

/// A blank 1 GiB loop disk backed by a file.
fn disk(name: &str) -> Disk {
    Disk {
        backing_file: Some("/var/tmp/pool.img".into()),
        ..blank_disk(name, 1 << 30)
    }
}

#[test]
fn parses_real_lsblk() {
    let disks = parse_lsblk(LSBLK).expect("parses");
    assert_eq!(disks.len(), 2);
    assert_eq!(disks[0].name, "loop0");
    assert_eq!(disks[0].size_bytes, 1_073_741_824);
    assert_eq!((disks[0].major, disks[0].minor), (7, 0));
    assert!(disks[0].mountpoints.is_empty());
    assert_eq!(disks[1].partitions, vec!["loop1p1".to_string()]);
}

#[test]
fn parses_blkid_and_maj_min() {
    let (fs, pt) = parse_blkid_export("DEVNAME=/dev/loop0\nUUID=x\nTYPE=ext4\nUSAGE=filesystem\n");
    assert_eq!((fs.as_deref(), pt), (Some("ext4"), None));
    let (fs, pt) = parse_blkid_export("DEVNAME=/dev/loop1\nPTUUID=y\nPTTYPE=gpt\n");
    assert_eq!((fs, pt.as_deref()), (None, Some("gpt")));
    assert_eq!(parse_maj_min("259:12"), Some((259, 12)));
    assert_eq!(parse_maj_min("x"), None);
}

#[test]
fn assignment_rules() {
    let cfg = config(
        r#"{"diskSelector": [
            {"name": "vg1", "re": ["^loop[0-4]$"], "policy": "LVM", "minDiskBytes": 1048576},
            {"name": "raw1", "re": ["^loop[3-9]$"], "policy": "RAW"}
        ]}"#,
    );
    let mut d = vec![
        disk("loop0"),
        disk("loop1"),
        disk("loop2"),
        disk("loop3"),
        disk("loop5"),
        disk("loop6"),
        disk("loop7"),
        disk("sda"),
        disk("loop8"),
        disk("loop9"),
    ];
    d[1].fstype = Some("ext4".into());
    d[2].lvm_vg = Some("vg1".into());
    d[2].fstype = Some("LVM2_member".into());
    d[3].lvm_vg = Some("other".into());
    d[4].pttype = Some("gpt".into());
    d[4].partitions = vec!["loop5p1".into()];
    d[5].pttype = Some("gpt".into());
    d[6].mountpoints = vec!["/mnt".into()];
    // Our RAW disk with a mounted volume stays ours; a foreign one with a
    // mounted partition is in use.
    d[4].children_in_use = vec!["/var/lib/kubelet/x".into()];
    d[5].children_in_use = vec!["/srv".into()];
    d[8].backing_file = Some("/dev/loop0".into());
    d[9].size_bytes = 4096;
    let s = assign(&cfg, &d, &["loop5".to_string()]);
    let got: Vec<_> = s
        .iter()
        .map(|s| {
            (
                s.disk.name.as_str(),
                s.group.as_deref(),
                !s.reason.is_empty(),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            ("loop0", Some("vg1"), false),  // blank
            ("loop1", None, true),          // has ext4
            ("loop2", Some("vg1"), false),  // already our PV
            ("loop3", None, true),          // PV of another VG (and vg1 wins the match)
            ("loop5", Some("raw1"), false), // GPT with our partition
            ("loop6", None, true),          // foreign GPT
            ("loop7", None, true),          // mounted
            ("sda", None, false),           // matches nothing: untouched, no reason
            ("loop8", None, true),          // loop over a block device
            ("loop9", None, true),          // too small
        ]
    );
    assert!(
        s[3].reason.contains("another volume group"),
        "{}",
        s[3].reason
    );
    let groups = by_group(&s);
    assert_eq!(groups["vg1"].len(), 2);
    assert_eq!(groups["raw1"].len(), 1);
}

/// A group whose patterns match nothing is reported with every disk
/// seen and why it was not taken; one whose disk another group claimed
/// says which group.
#[test]
fn groups_without_disks_say_why() {
    let cfg = config(
        r#"{"diskSelector": [
            {"name": "first", "re": ["^/dev/loop0$"], "policy": "LVM"},
            {"name": "second", "re": ["^loop0$"], "policy": "RAW"},
            {"name": "typo", "re": ["^/dev/sdx$"], "policy": "LVM"},
            {"name": "fussy", "re": ["^loop1$"], "policy": "LVM"},
            {"name": "h", "re": ["/srv/h"], "policy": "HOST"}
        ]}"#,
    );
    let mut d = vec![disk("loop0"), disk("loop1")];
    d[1].fstype = Some("ext4".into());
    let s = assign(&cfg, &d, &[]);
    assert_eq!(s[0].group.as_deref(), Some("first"));
    let empty = empty_groups(&cfg, &s);
    let names: Vec<_> = empty.iter().map(|e| e.group.as_str()).collect();
    assert_eq!(
        names,
        ["second", "typo", "fussy"],
        "HOST groups take no disks"
    );
    let whys =
        |i: usize| -> Vec<String> { empty[i].candidates.iter().map(|c| c.why.clone()).collect() };
    assert_eq!(
        whys(0),
        ["claimed by group \"first\"", "no pattern matches"]
    );
    assert_eq!(whys(1), ["no pattern matches", "no pattern matches"]);
    assert_eq!(whys(2), ["no pattern matches", "carries ext4"]);
    let line = empty[1].to_string();
    assert!(line.contains("group \"typo\" took no disk"), "{line}");
    assert!(line.contains("^/dev/sdx$"), "{line}");
    assert!(
        line.contains("/dev/loop1 (1073741824 bytes): no pattern matches"),
        "{line}"
    );
    let none = empty_groups(&cfg, &[]);
    assert!(none[0].to_string().ends_with("the scan saw no disks"));
}

/// An LVM physical volume of no volume group is someone's unless the
/// selector says to adopt it; a group with no patterns takes nothing
/// and says so.
#[test]
fn orphan_pvs_and_groups_without_patterns() {
    let mut orphan = disk("loop4");
    orphan.fstype = Some("LVM2_member".into());
    orphan.lvm_vg = Some(String::new());
    let disks = [orphan, disk("loop5")];
    let strict =
        config(r#"{"diskSelector": [{"name": "vg", "re": ["^loop4$"], "policy": "LVM"}]}"#);
    let s = assign(&strict, &disks, &[]);
    assert_eq!(s[0].group, None);
    assert_eq!(s[0].reason, ORPHAN_PV);
    let adopting = config(
        r#"{"diskSelector": [{"name": "vg", "re": ["^loop4$"], "policy": "LVM", "adoptOrphanPVs": true}]}"#,
    );
    assert_eq!(
        assign(&adopting, &disks, &[])[0].group.as_deref(),
        Some("vg")
    );

    let unnamed = config(
        r#"{"diskSelector": [{"name": "ssd", "re": [], "policy": "LVM"}, {"name": "raw", "re": [], "policy": "RAW"}]}"#,
    );
    let s = assign(&unnamed, &disks, &[]);
    assert!(s.iter().all(|s| s.group.is_none() && s.reason.is_empty()));
    let empty = empty_groups(&unnamed, &s);
    assert_eq!(empty.len(), 2);
    let line = empty[0].to_string();
    assert!(line.contains("group \"ssd\" names no disks"), "{line}");
}

/// Carina v0.9's list of patterns: one LVM group per disk kind.
#[test]
fn v09_type_groups_split_by_kind() {
    let cfg = config(r#"{"diskSelector": ["loop+"], "diskGroupPolicy": "type"}"#);
    let mut d = vec![disk("loop0"), disk("loop1"), disk("sda")];
    d[1].rotational = true;
    let s = assign(&cfg, &d, &[]);
    let got: Vec<_> = s.iter().map(|s| s.group.as_deref()).collect();
    assert_eq!(got, [Some("carina-vg-ssd"), Some("carina-vg-hdd"), None]);
    let rotational: Vec<_> = parse_lsblk(
        r#"{"blockdevices": [
            {"name": "sda", "path": "/dev/sda", "size": 1, "rota": true, "type": "disk"},
            {"name": "sdb", "path": "/dev/sdb", "size": 1, "rota": "0", "type": "disk"},
            {"name": "sdc", "path": "/dev/sdc", "size": 1, "rota": "1", "type": "disk"}
        ]}"#,
    )
    .expect("parses")
    .iter()
    .map(|d| d.rotational)
    .collect();
    assert_eq!(rotational, [true, false, true]);
}

/// A new warning only when what the patterns match changes.
#[test]
fn same_cause_ignores_disks_no_pattern_matches() {
    let cfg = config(
        r#"{"diskSelector": [
            {"name": "first", "re": ["^loop0$"], "policy": "LVM"},
            {"name": "fussy", "re": ["^loop1$"], "policy": "LVM"}
        ]}"#,
    );
    let mut d = vec![disk("loop0"), disk("loop1")];
    d[1].fstype = Some("ext4".into());
    let before = empty_groups(&cfg, &assign(&cfg, &d, &[]));
    d.push(disk("loop7"));
    let more = empty_groups(&cfg, &assign(&cfg, &d, &[]));
    assert!(before[0].same_cause(&more[0]), "an unrelated disk appeared");
    d[1].fstype = Some("xfs".into());
    let other = empty_groups(&cfg, &assign(&cfg, &d, &[]));
    assert!(!before[0].same_cause(&other[0]), "its disk changed");
}
