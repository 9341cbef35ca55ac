//! The node's device-group configuration: Carina's `config.json`
//! (`diskSelector[]`, `diskScanInterval`, `schedulerStrategy`) plus this
//! project's additions per selector (`reserveBytes`, `activation`, `root`,
//! `minDiskBytes`).
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
                (compile_patterns(at, policy, &self.re)?, None)
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
    };
    Ok(vec![
        group(V09_SSD_GROUP, false),
        group(V09_HDD_GROUP, true),
    ])
}

/// The disk patterns of an LVM or RAW group: at least one, each a valid
/// regex.
fn compile_patterns(at: &str, policy: Policy, re: &[String]) -> Result<Vec<Regex>> {
    let mut patterns = Vec::with_capacity(re.len());
    for (j, re) in re.iter().enumerate() {
        if re.is_empty() {
            return Err(Error::config(format!("{at}.re[{j}]"), "empty pattern"));
        }
        let compiled = Regex::new(re)
            .map_err(|e| Error::config(format!("{at}.re[{j}]"), format!("invalid regex: {e}")))?;
        patterns.push(compiled);
    }
    if patterns.is_empty() {
        return Err(Error::config(
            format!("{at}.re"),
            format!("a {policy} group needs at least one disk pattern"),
        ));
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
mod tests {
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
                r#"{"diskSelector":[{"name":"a","re":[],"policy":"LVM"}]}"#,
                "diskSelector[0].re",
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
}
