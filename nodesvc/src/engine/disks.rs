//! Disk discovery: `lsblk` JSON for the device tree, `blkid -p` for what a
//! disk carries, `losetup` for what a loop device is backed by, and the pure
//! function [`assign`] that decides which disks each group may take.
//!
//! A disk that matches no selector is never touched.

use std::collections::BTreeMap;
use std::path::PathBuf;

use carina_sys::command::Cmd;
use carina_sys::loopdev::{self, LosetupDevice};
use serde::{Deserialize, Serialize};

use super::config::{Config, GroupConfig, Policy};
use super::error::{Error, Result};

/// Prefix of every partition name we create.
pub const PARTITION_PREFIX: &str = "carina.io/";

/// A whole disk as the kernel shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Disk {
    /// Kernel name (`sdb`, `loop3`).
    pub name: String,
    pub path: PathBuf,
    pub size_bytes: u64,
    pub read_only: bool,
    /// Spinning disk (lsblk's ROTA).
    pub rotational: bool,
    /// `disk`, `loop`, ...
    pub kind: String,
    pub major: u32,
    pub minor: u32,
    /// Filesystem or other signature found by `blkid` (`ext4`, `LVM2_member`).
    pub fstype: Option<String>,
    /// Partition-table type (`gpt`, `dos`).
    pub pttype: Option<String>,
    /// Mount points of the disk itself.
    pub mountpoints: Vec<String>,
    /// What uses its partitions or is stacked on it: partition mount points
    /// and holders (`holder:<name>`). A disk that is already ours may have
    /// these (our mounted volumes); any other disk may not.
    pub children_in_use: Vec<String>,
    /// Kernel names of its partitions.
    pub partitions: Vec<String>,
    /// Loop devices: the backing file.
    pub backing_file: Option<String>,
    /// LVM physical volume: the VG it belongs to (filled by the LVM layer).
    pub lvm_vg: Option<String>,
}

/// Why a disk was or was not taken.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DiskStatus {
    pub disk: Disk,
    /// The group that took it.
    pub group: Option<String>,
    /// Why no group took it (empty when one did, or when none matched).
    pub reason: String,
}

#[derive(Debug, Deserialize)]
struct LsblkReport {
    blockdevices: Vec<LsblkDevice>,
}

#[derive(Debug, Deserialize)]
struct LsblkDevice {
    name: String,
    path: Option<String>,
    size: Option<u64>,
    #[serde(default)]
    ro: bool,
    /// `true`/`false`, or `"1"`/`"0"` from older lsblk.
    #[serde(default)]
    rota: Option<serde_json::Value>,
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    mountpoints: Vec<Option<String>>,
    #[serde(rename = "maj:min")]
    maj_min: Option<String>,
    #[serde(default)]
    children: Vec<LsblkDevice>,
}

/// Parses `lsblk -J -b -o NAME,KNAME,PATH,SIZE,RO,ROTA,TYPE,MOUNTPOINTS,MAJ:MIN`.
pub fn parse_lsblk(json: &str) -> Result<Vec<Disk>> {
    let report: LsblkReport =
        serde_json::from_str(json).map_err(|e| Error::parse("lsblk output", e))?;
    let mut disks = Vec::new();
    for dev in report.blockdevices {
        if !matches!(dev.kind.as_str(), "disk" | "loop") {
            continue;
        }
        let (major, minor) = dev
            .maj_min
            .as_deref()
            .and_then(parse_maj_min)
            .unwrap_or((0, 0));
        let mountpoints: Vec<String> = dev.mountpoints.iter().flatten().cloned().collect();
        let mut partitions = Vec::new();
        let mut children_in_use = Vec::new();
        for child in &dev.children {
            children_in_use.extend(child.mountpoints.iter().flatten().cloned());
            if child.kind == "part" {
                partitions.push(child.name.clone());
            } else {
                // Something is stacked on the disk (dm, md, ...).
                children_in_use.push(format!("holder:{}", child.name));
            }
        }
        disks.push(Disk {
            path: PathBuf::from(dev.path.unwrap_or_else(|| format!("/dev/{}", dev.name))),
            name: dev.name,
            size_bytes: dev.size.unwrap_or(0),
            read_only: dev.ro,
            rotational: matches!(dev.rota, Some(serde_json::Value::Bool(true)))
                || dev.rota.as_ref().and_then(|v| v.as_str()) == Some("1"),
            kind: dev.kind,
            major,
            minor,
            fstype: None,
            pttype: None,
            mountpoints,
            children_in_use,
            partitions,
            backing_file: None,
            lvm_vg: None,
        });
    }
    Ok(disks)
}

/// Parses `blkid -p -o export` into (TYPE, PTTYPE).
pub fn parse_blkid_export(text: &str) -> (Option<String>, Option<String>) {
    let mut fstype = None;
    let mut pttype = None;
    for line in text.lines() {
        if let Some(v) = line.strip_prefix("TYPE=") {
            fstype = Some(v.to_string());
        } else if let Some(v) = line.strip_prefix("PTTYPE=") {
            pttype = Some(v.to_string());
        }
    }
    (fstype, pttype)
}

/// Parses `"7:3"`.
pub fn parse_maj_min(text: &str) -> Option<(u32, u32)> {
    let (a, b) = text.trim().split_once(':')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

/// Lists the node's whole disks with what they carry.
pub async fn discover() -> Result<Vec<Disk>> {
    let out = Cmd::new("lsblk")
        .args([
            "-J",
            "-b",
            "-o",
            "NAME,KNAME,PATH,SIZE,RO,ROTA,TYPE,MOUNTPOINTS,MAJ:MIN",
        ])
        .run()
        .await?;
    let mut disks = parse_lsblk(&out.stdout)?;
    let loops = list_loops().await?;
    for disk in &mut disks {
        if disk.kind == "loop" {
            disk.backing_file = loops
                .iter()
                .find(|l| l.name == disk.path.to_string_lossy())
                .and_then(|l| l.back_file.clone());
        }
    }
    Ok(disks)
}

/// Fills `fstype`/`pttype` of one disk by probing it (`blkid -p`, no cache).
pub async fn probe(disk: &mut Disk) -> Result<()> {
    match Cmd::new("blkid")
        .args(["-p", "-o", "export"])
        .arg(&disk.path)
        .run()
        .await
    {
        Ok(out) => {
            let (fstype, pttype) = parse_blkid_export(&out.stdout);
            disk.fstype = fstype;
            disk.pttype = pttype;
            Ok(())
        }
        // blkid exits 2 when it finds nothing: a blank disk.
        Err(e) if e.exit_code() == Some(2) => {
            disk.fstype = None;
            disk.pttype = None;
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

/// Every attached loop device, from sysfs ([`loopdev::list`]): no
/// process, and a device another program is setting up or tearing down
/// just then is left out rather than failing the scan (`losetup -J`
/// prints `null` for the fields it cannot read at that moment).
pub async fn list_loops() -> Result<Vec<LosetupDevice>> {
    Ok(loopdev::list().await?)
}

/// Decides which group may take each disk. Pure: the caller has probed the
/// disks and filled `lvm_vg` for LVM physical volumes, and says which RAW
/// disks already hold a partition of ours.
///
/// A disk goes to the first group (in configuration order) one of whose
/// patterns matches its path (`/dev/sdb`) or kernel name (`sdb`), and only
/// if it is usable for that policy: writable, not mounted or stacked on,
/// large enough, not a loop device backed by another block device (our own
/// LV exposures), and either blank or already ours (a PV of this group's
/// VG, a GPT disk with our partitions). An LVM physical volume of no
/// volume group (an orphan) is taken only by a group with
/// `adoptOrphanPVs`. Disks that match no group are reported with no group
/// and no reason, and are never touched.
pub fn assign(
    config: &Config,
    disks: &[Disk],
    raw_disks_with_our_partitions: &[String],
) -> Vec<DiskStatus> {
    let mut out = Vec::with_capacity(disks.len());
    for disk in disks {
        let Some(group) = first_match(config, disk) else {
            out.push(DiskStatus {
                disk: disk.clone(),
                group: None,
                reason: String::new(),
            });
            continue;
        };
        let reason = unusable_reason(disk, group, raw_disks_with_our_partitions);
        out.push(DiskStatus {
            disk: disk.clone(),
            group: reason.is_none().then(|| group.name.clone()),
            reason: reason.unwrap_or_default(),
        });
    }
    out
}

/// The group that has the first claim on `disk`: the first LVM or RAW
/// group, in configuration order, with a pattern that matches it.
fn first_match<'c>(config: &'c Config, disk: &Disk) -> Option<&'c GroupConfig> {
    config.groups.iter().find(|g| {
        g.policy != Policy::Host
            && g.matches(&disk.path, &disk.name)
            && g.takes_kind(disk.rotational)
    })
}

/// Whether any LVM or RAW group's pattern matches `disk`.
pub fn selected(config: &Config, disk: &Disk) -> bool {
    first_match(config, disk).is_some()
}

/// An LVM or RAW group that took no disk at a scan, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EmptyGroup {
    pub group: String,
    /// Its `re` patterns as written.
    pub patterns: Vec<String>,
    /// Every disk the scan saw, with why this group did not take it.
    pub candidates: Vec<Candidate>,
}

/// One disk seen by a scan, from the point of view of one group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Candidate {
    pub path: String,
    pub size_bytes: u64,
    /// `no pattern matches`, `claimed by group "x"`, or why the disk is
    /// unusable (mounted, carries a filesystem, too small, read-only, ...).
    pub why: String,
}

/// [`Candidate::why`] of a disk no pattern of the group matches.
pub const NO_PATTERN_MATCHES: &str = "no pattern matches";

impl EmptyGroup {
    /// Whether `other` has the same cause: the same patterns, matching the
    /// same disks for the same reasons. Disks no pattern matches are left
    /// out, so unrelated devices appearing do not make a new warning.
    pub fn same_cause(&self, other: &EmptyGroup) -> bool {
        let matched = |e: &EmptyGroup| -> Vec<(String, String)> {
            e.candidates
                .iter()
                .filter(|c| c.why != NO_PATTERN_MATCHES)
                .map(|c| (c.path.clone(), c.why.clone()))
                .collect()
        };
        self.patterns == other.patterns && matched(self) == matched(other)
    }
}

impl std::fmt::Display for EmptyGroup {
    /// One line: the group, its patterns and each disk with its reason;
    /// a group with no patterns says that it names no disks.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.patterns.is_empty() {
            return write!(
                f,
                "group {:?} names no disks: its selector's re is empty, so it takes none \
                 (name this node's disks in re, e.g. [\"^sdb$\"])",
                self.group
            );
        }
        write!(
            f,
            "group {:?} took no disk: patterns [{}] (matched against /dev/<name> and <name>)",
            self.group,
            self.patterns.join(", ")
        )?;
        if self.candidates.is_empty() {
            return f.write_str("; the scan saw no disks");
        }
        f.write_str("; disks seen: ")?;
        for (i, c) in self.candidates.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{} ({} bytes): {}", c.path, c.size_bytes, c.why)?;
        }
        Ok(())
    }
}

/// The LVM and RAW groups of `config` that no disk of `statuses` went to
/// (pure), each with every disk seen and why the group did not take it.
pub fn empty_groups(config: &Config, statuses: &[DiskStatus]) -> Vec<EmptyGroup> {
    config
        .groups
        .iter()
        .filter(|g| g.policy != Policy::Host)
        .filter(|g| !statuses.iter().any(|s| s.group.as_ref() == Some(&g.name)))
        .map(|g| EmptyGroup {
            group: g.name.clone(),
            patterns: g
                .patterns
                .iter()
                .map(|re| re.as_str().to_string())
                .collect(),
            candidates: statuses
                .iter()
                .map(|s| Candidate {
                    path: s.disk.path.to_string_lossy().into_owned(),
                    size_bytes: s.disk.size_bytes,
                    why: why_not(config, g, s),
                })
                .collect(),
        })
        .collect()
}

/// Why `group` did not take the disk of `status`.
fn why_not(config: &Config, group: &GroupConfig, status: &DiskStatus) -> String {
    let disk = &status.disk;
    if !group.matches(&disk.path, &disk.name) {
        return NO_PATTERN_MATCHES.into();
    }
    if !group.takes_kind(disk.rotational) {
        let kind = if disk.rotational {
            "rotational"
        } else {
            "solid-state"
        };
        return format!("a {kind} disk; the group takes the other kind");
    }
    match first_match(config, disk) {
        Some(first) if first.name != group.name => {
            format!("claimed by group {:?}", first.name)
        }
        _ if status.reason.is_empty() => "not taken".into(),
        _ => status.reason.clone(),
    }
}

/// [`DiskStatus::reason`] of an orphan PV an LVM group did not take.
pub const ORPHAN_PV: &str =
    "LVM physical volume of no volume group (set adoptOrphanPVs on the selector to take it)";

fn unusable_reason(disk: &Disk, group: &GroupConfig, ours: &[String]) -> Option<String> {
    let (policy, min_bytes) = (group.policy, group.min_disk_bytes);
    let group_name = group.name.as_str();
    if disk.read_only {
        return Some("read-only".into());
    }
    if !disk.mountpoints.is_empty() {
        return Some(format!("in use ({})", disk.mountpoints.join(", ")));
    }
    if disk.kind == "loop" {
        match &disk.backing_file {
            None => return Some("loop device without a backing file".into()),
            Some(f) if f.starts_with("/dev/") => {
                return Some(format!("loop device over block device {f}"));
            }
            Some(_) => {}
        }
    }
    // A disk that is already ours keeps its group while our volumes on it
    // are mounted or activated; any other disk with users is off limits.
    let already_ours = match policy {
        Policy::Lvm => disk.lvm_vg.as_deref() == Some(group_name),
        Policy::Raw => ours.iter().any(|d| d == &disk.name),
        Policy::Host => false,
    };
    if !already_ours && !disk.children_in_use.is_empty() {
        return Some(format!("in use ({})", disk.children_in_use.join(", ")));
    }
    if disk.size_bytes < min_bytes {
        return Some(format!(
            "too small ({} bytes, at least {min_bytes})",
            disk.size_bytes
        ));
    }
    if already_ours {
        return None;
    }
    match policy {
        Policy::Lvm => match (&disk.lvm_vg, &disk.fstype) {
            (Some(vg), _) if vg.is_empty() && group.adopt_orphan_pvs => None,
            (Some(vg), _) if vg.is_empty() => Some(ORPHAN_PV.into()),
            (Some(vg), _) => Some(format!("physical volume of another volume group {vg:?}")),
            (None, Some(fs)) => Some(format!("carries {fs}")),
            (None, None) if disk.pttype.is_some() || !disk.partitions.is_empty() => {
                Some("carries a partition table".into())
            }
            (None, None) => None,
        },
        Policy::Raw => {
            if let Some(fs) = &disk.fstype {
                Some(format!("carries {fs}"))
            } else if disk.pttype.is_some() || !disk.partitions.is_empty() {
                Some("carries partitions that are not ours".into())
            } else {
                None
            }
        }
        Policy::Host => Some("HOST groups take no disks".into()),
    }
}

/// Groups the assigned disks by group name.
pub fn by_group(statuses: &[DiskStatus]) -> BTreeMap<String, Vec<Disk>> {
    let mut map: BTreeMap<String, Vec<Disk>> = BTreeMap::new();
    for s in statuses {
        if let Some(g) = &s.group {
            map.entry(g.clone()).or_default().push(s.disk.clone());
        }
    }
    map
}

/// A blank, writable loop disk of `size_bytes` with nothing on it, for
/// tests (the engine's own, and elsewhere with the `testkit` feature).
#[cfg(any(test, feature = "testkit"))]
pub fn blank_disk(name: &str, size_bytes: u64) -> Disk {
    Disk {
        name: name.into(),
        path: PathBuf::from(format!("/dev/{name}")),
        size_bytes,
        read_only: false,
        rotational: false,
        kind: "loop".into(),
        major: 7,
        minor: 0,
        fstype: None,
        pttype: None,
        mountpoints: vec![],
        children_in_use: vec![],
        partitions: vec![],
        backing_file: None,
        lvm_vg: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LSBLK: &str = include_str!("testdata/lsblk.json");

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
        let (fs, pt) =
            parse_blkid_export("DEVNAME=/dev/loop0\nUUID=x\nTYPE=ext4\nUSAGE=filesystem\n");
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
        let whys = |i: usize| -> Vec<String> {
            empty[i].candidates.iter().map(|c| c.why.clone()).collect()
        };
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
}
