//! The node's device-group configuration: Carina's `config.json`
//! (`diskSelector[]`, `diskScanInterval`, `schedulerStrategy`) plus this
//! project's additions per selector (`reserveBytes`, `activation`, `root`,
//! `minDiskBytes`, `adoptOrphanPVs`).
//!
//! An LVM or RAW selector with no patterns (`"re": []`) is a group that
//! names no disks yet: it takes none, and the node reports it with its
//! `no_disks` reason (the chart's default, so a fresh install takes no
//! disk until the user names them).
//!
//! Parsing is a pure function of the text; every error names the field path
//! (`diskSelector[1].re[0]: invalid regex ...`).

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::Duration;

use regex::Regex;
use serde::{Deserialize, Serialize};

use super::error::{Error, Result};
use super::names;

/// Carina's default free-space reserve per group: 10 GiB.
pub const DEFAULT_RESERVE_BYTES: u64 = 10 << 30;
/// Disks smaller than this are never taken into a group by default.
pub const DEFAULT_MIN_DISK_BYTES: u64 = 16 << 20;
/// Carina's default rescan interval.
pub const DEFAULT_SCAN_INTERVAL: Duration = Duration::from_secs(300);

/// How a device group turns disks into volumes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Policy {
    /// An LVM volume group; volumes are logical volumes.
    #[serde(rename = "LVM")]
    Lvm,
    /// Whole disks carved into GPT partitions.
    #[serde(rename = "RAW")]
    Raw,
    /// Directories under a host path.
    #[serde(rename = "HOST")]
    Host,
}

impl Policy {
    pub fn as_str(self) -> &'static str {
        match self {
            Policy::Lvm => "LVM",
            Policy::Raw => "RAW",
            Policy::Host => "HOST",
        }
    }
}

impl std::fmt::Display for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How LVM logical volumes are made usable as block devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Activation {
    /// Device-mapper when the kernel has it, otherwise `loop`.
    #[default]
    Auto,
    /// Device-mapper activation (`lvchange -ay`).
    Dm,
    /// No device-mapper: contiguous LVs exposed as loop devices at their
    /// offset on the physical volume.
    Loop,
}

/// One validated device group.
#[derive(Debug, Clone)]
pub struct GroupConfig {
    pub name: String,
    pub policy: Policy,
    /// Disk patterns, matched against a disk's path (`/dev/sdb`) and its
    /// kernel name (`sdb`); empty for HOST groups.
    pub patterns: Vec<Regex>,
    pub node_label: Option<String>,
    pub reserve_bytes: u64,
    pub min_disk_bytes: u64,
    pub activation: Activation,
    /// HOST groups: the directory that holds one directory per volume.
    pub root: Option<PathBuf>,
    /// Only disks of this kind: `Some(true)` rotational, `Some(false)`
    /// solid-state, `None` any (Carina v0.9's list form groups by kind).
    pub rotational: Option<bool>,
    /// LVM groups: also take a matched LVM physical volume that belongs to
    /// no volume group (an orphan PV, e.g. left by an old VG or made by
    /// another tool). Off unless the selector says `"adoptOrphanPVs":
    /// true`: a PV is someone's on purpose more often than not.
    pub adopt_orphan_pvs: bool,
}

impl GroupConfig {
    /// True if one pattern matches the disk's path (`/dev/sdb`, what
    /// Carina matches) or its kernel name (`sdb`), so both spellings of an
    /// anchored pattern select the disk.
    pub fn matches(&self, disk_path: &std::path::Path, kernel_name: &str) -> bool {
        let path = disk_path.to_string_lossy();
        self.patterns
            .iter()
            .any(|re| re.is_match(&path) || re.is_match(kernel_name))
    }

    /// True if the group takes disks of this kind (see [`Self::rotational`]).
    pub fn takes_kind(&self, rotational: bool) -> bool {
        self.rotational.is_none_or(|r| r == rotational)
    }
}

/// A validated node configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub groups: Vec<GroupConfig>,
    /// Zero disables the periodic rescan.
    pub scan_interval: Duration,
    pub scheduler_strategy: SchedulerStrategy,
    /// The text it was parsed from, kept so it can be shown and pushed.
    pub source: String,
    /// What was accepted but deserves a warning (older Carina spellings);
    /// the caller logs them.
    pub warnings: Vec<String>,
}

/// Node choice policy, read by the control plane.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SchedulerStrategy {
    #[default]
    Spreadout,
    Binpack,
}

impl Config {
    /// Parses and validates `config.json` text.
    pub fn from_json(text: &str) -> Result<Config> {
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| Error::config("config.json", e.to_string()))?;
        if !value.is_object() {
            return Err(Error::config("config.json", "expected a JSON object"));
        }
        let raw = RawConfig::deserialize(value)
            .map_err(|e| Error::config("config.json", e.to_string()))?;
        raw.validate(text)
    }

    pub fn group(&self, name: &str) -> Option<&GroupConfig> {
        self.groups.iter().find(|g| g.name == name)
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            groups: Vec::new(),
            scan_interval: DEFAULT_SCAN_INTERVAL,
            scheduler_strategy: SchedulerStrategy::default(),
            source: "{}".to_string(),
            warnings: Vec::new(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawConfig {
    /// A list of selector objects, or Carina v0.9's list of patterns.
    #[serde(default)]
    disk_selector: Option<serde_json::Value>,
    /// Carina v0.9: how the list of patterns is grouped; only `type`.
    #[serde(default)]
    disk_group_policy: Option<String>,
    #[serde(default)]
    disk_scan_interval: Option<serde_json::Value>,
    #[serde(default)]
    scheduler_strategy: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawSelector {
    name: Option<String>,
    #[serde(default)]
    re: Vec<String>,
    policy: Option<String>,
    node_label: Option<String>,
    reserve_bytes: Option<u64>,
    min_disk_bytes: Option<u64>,
    activation: Option<String>,
    root: Option<String>,
    #[serde(rename = "adoptOrphanPVs")]
    adopt_orphan_pvs: Option<bool>,
}

impl RawConfig {
    fn validate(self, text: &str) -> Result<Config> {
        let scan_interval = match &self.disk_scan_interval {
            None => DEFAULT_SCAN_INTERVAL,
            Some(value) => parse_interval(value)?,
        };
        let mut warnings = Vec::new();
        let scheduler_strategy = match self.scheduler_strategy.as_deref() {
            None | Some("") => SchedulerStrategy::default(),
            Some(s) if s.eq_ignore_ascii_case("spreadout") => SchedulerStrategy::Spreadout,
            Some(s) if s.eq_ignore_ascii_case("binpack") => SchedulerStrategy::Binpack,
            // Carina's own documentation spells it so.
            Some(s) if s.eq_ignore_ascii_case("spradout") => {
                warnings.push(
                    "schedulerStrategy: \"spradout\" is read as \"spreadout\"; write spreadout"
                        .to_string(),
                );
                SchedulerStrategy::Spreadout
            }
            Some(other) => {
                return Err(Error::config(
                    "schedulerStrategy",
                    format!("unknown strategy {other:?} (expected binpack or spreadout)"),
                ));
            }
        };
        let selectors = match self.disk_selector {
            None | Some(serde_json::Value::Null) => Vec::new(),
            Some(serde_json::Value::Array(items)) => items,
            Some(other) => {
                return Err(Error::config(
                    "diskSelector",
                    format!("expected a list, not {other}"),
                ));
            }
        };
        let groups = if !selectors.is_empty() && selectors.iter().all(|v| v.is_string()) {
            type_groups(&selectors, self.disk_group_policy.as_deref(), &mut warnings)?
        } else {
            if let Some(policy) = self.disk_group_policy.as_deref() {
                warnings.push(format!(
                    "diskGroupPolicy {policy:?} is ignored: the diskSelector entries name their groups"
                ));
            }
            let mut seen = HashSet::new();
            let mut groups = Vec::with_capacity(selectors.len());
            for (i, value) in selectors.into_iter().enumerate() {
                let at = format!("diskSelector[{i}]");
                let sel = RawSelector::deserialize(value)
                    .map_err(|e| Error::config(at.clone(), e.to_string()))?;
                let group = sel.validate(&at)?;
                if !seen.insert(group.name.clone()) {
                    return Err(Error::config(
                        format!("{at}.name"),
                        format!("duplicate group name {:?}", group.name),
                    ));
                }
                groups.push(group);
            }
            groups
        };
        Ok(Config {
            groups,
            scan_interval,
            scheduler_strategy,
            source: text.to_string(),
            warnings,
        })
    }
}

impl RawSelector {
    fn validate(self, at: &str) -> Result<GroupConfig> {
        let name = self
            .name
            .ok_or_else(|| Error::config(format!("{at}.name"), "missing"))?;
        names::check_group_name(&name)
            .map_err(|reason| Error::config(format!("{at}.name"), reason))?;
        let policy = match self.policy.as_deref() {
            Some(p) if p.eq_ignore_ascii_case("lvm") => Policy::Lvm,
            Some(p) if p.eq_ignore_ascii_case("raw") => Policy::Raw,
            Some(p) if p.eq_ignore_ascii_case("host") => Policy::Host,
            Some(other) => {
                return Err(Error::config(
                    format!("{at}.policy"),
                    format!("unknown policy {other:?} (expected LVM, RAW or HOST)"),
                ));
            }
            None => return Err(Error::config(format!("{at}.policy"), "missing")),
        };
        let (patterns, root) = match policy {
            // A HOST group names one directory; the rest name disks.
            Policy::Host => (Vec::new(), Some(host_root(at, self.root, &self.re)?)),
            _ => {
                if self.root.is_some() {
                    return Err(Error::config(
                        format!("{at}.root"),
                        format!("only HOST groups take a root, not {policy}"),
                    ));
                }
                (compile_patterns(at, &self.re)?, None)
            }
        };
        let activation = match self.activation.as_deref() {
            None | Some("auto") => Activation::Auto,
            Some("dm") => Activation::Dm,
            Some("loop") => Activation::Loop,
            Some(other) => {
                return Err(Error::config(
                    format!("{at}.activation"),
                    format!("unknown activation {other:?} (expected auto, dm or loop)"),
                ));
            }
        };
        if policy != Policy::Lvm && activation != Activation::Auto {
            return Err(Error::config(
                format!("{at}.activation"),
                "only LVM groups take an activation mode",
            ));
        }
        if policy != Policy::Lvm && self.adopt_orphan_pvs.is_some() {
            return Err(Error::config(
                format!("{at}.adoptOrphanPVs"),
                format!("only LVM groups take physical volumes, not {policy}"),
            ));
        }
        Ok(GroupConfig {
            name,
            policy,
            patterns,
            node_label: self.node_label.filter(|l| !l.is_empty()),
            reserve_bytes: self.reserve_bytes.unwrap_or(DEFAULT_RESERVE_BYTES),
            min_disk_bytes: self.min_disk_bytes.unwrap_or(DEFAULT_MIN_DISK_BYTES),
            activation,
            root,
            rotational: None,
            adopt_orphan_pvs: self.adopt_orphan_pvs.unwrap_or(false),
        })
    }
}

/// Names of the groups Carina v0.9 made from a list of patterns.
pub const V09_SSD_GROUP: &str = "carina-vg-ssd";
pub const V09_HDD_GROUP: &str = "carina-vg-hdd";

/// Carina v0.9's form, `"diskSelector": ["loop*", "vd*"]` with
/// `"diskGroupPolicy": "type"`: the disks any pattern matches, grouped by
/// kind into the LVM groups `carina-vg-ssd` and `carina-vg-hdd`.
fn type_groups(
    patterns: &[serde_json::Value],
    policy: Option<&str>,
    warnings: &mut Vec<String>,
) -> Result<Vec<GroupConfig>> {
    let mut compiled = Vec::with_capacity(patterns.len());
    for (j, re) in patterns.iter().filter_map(|v| v.as_str()).enumerate() {
        if re.is_empty() {
            return Err(Error::config(format!("diskSelector[{j}]"), "empty pattern"));
        }
        compiled.push(Regex::new(re).map_err(|e| {
            Error::config(format!("diskSelector[{j}]"), format!("invalid regex: {e}"))
        })?);
    }
    match policy {
        None | Some("type") => {}
        Some(other) => warnings.push(format!(
            "diskGroupPolicy {other:?}: disks are grouped by type, the only policy"
        )),
    }
    warnings.push(format!(
        "diskSelector is a list of patterns (Carina v0.9): read as the LVM groups \
         {V09_SSD_GROUP} (solid-state disks) and {V09_HDD_GROUP} (rotational disks)"
    ));
    let group = |name: &str, rotational: bool| GroupConfig {
        name: name.to_string(),
        policy: Policy::Lvm,
        patterns: compiled.clone(),
        node_label: None,
        reserve_bytes: DEFAULT_RESERVE_BYTES,
        min_disk_bytes: DEFAULT_MIN_DISK_BYTES,
        activation: Activation::Auto,
        root: None,
        rotational: Some(rotational),
        adopt_orphan_pvs: false,
    };
    Ok(vec![
        group(V09_SSD_GROUP, false),
        group(V09_HDD_GROUP, true),
    ])
}

/// The disk patterns of an LVM or RAW group, each a valid regex. None at
/// all is a group that names no disks yet: it takes none.
fn compile_patterns(at: &str, re: &[String]) -> Result<Vec<Regex>> {
    let mut patterns = Vec::with_capacity(re.len());
    for (j, re) in re.iter().enumerate() {
        if re.is_empty() {
            return Err(Error::config(format!("{at}.re[{j}]"), "empty pattern"));
        }
        let compiled = Regex::new(re)
            .map_err(|e| Error::config(format!("{at}.re[{j}]"), format!("invalid regex: {e}")))?;
        patterns.push(compiled);
    }
    Ok(patterns)
}

/// The directory of a HOST group, in either spelling: ours, `"root":
/// "/dir"`, or Carina's, one absolute path in `re` (`"re":
/// ["/opt/carina-hostpath"]`). Both at once must agree.
fn host_root(at: &str, root: Option<String>, re: &[String]) -> Result<PathBuf> {
    let from_re = match re {
        [] => None,
        [dir] => Some(dir),
        _ => {
            return Err(Error::config(
                format!("{at}.re"),
                format!("a HOST group takes one directory, not {} entries", re.len()),
            ));
        }
    };
    let (field, dir) = match (&root, from_re) {
        (Some(root), Some(dir)) if root != dir => {
            return Err(Error::config(
                format!("{at}.root"),
                format!("{root:?} differs from the directory {dir:?} in re[0]; give one"),
            ));
        }
        (Some(root), _) => (format!("{at}.root"), root),
        (None, Some(dir)) => (format!("{at}.re[0]"), dir),
        (None, None) => {
            return Err(Error::config(
                format!("{at}.re"),
                "a HOST group needs its directory, as re: [\"/dir\"] or root: \"/dir\"",
            ));
        }
    };
    let path = PathBuf::from(dir);
    if !path.is_absolute() {
        return Err(Error::config(
            field,
            format!("{dir:?} is not an absolute path"),
        ));
    }
    Ok(path)
}

/// Carina writes the interval as a string of seconds (`"300"`); numbers are
/// accepted too. Zero disables the periodic rescan.
fn parse_interval(value: &serde_json::Value) -> Result<Duration> {
    let secs = match value {
        serde_json::Value::Number(n) => n.as_u64(),
        serde_json::Value::String(s) => s.trim().trim_end_matches('s').parse::<u64>().ok(),
        _ => None,
    };
    secs.map(Duration::from_secs).ok_or_else(|| {
        Error::config(
            "diskScanInterval",
            format!("{value} is not a whole number of seconds"),
        )
    })
}

#[cfg(test)]
mod tests;
