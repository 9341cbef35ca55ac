//! Why a group took no disk: each LVM or RAW group left empty by a scan,
//! with every disk seen and the reason the group did not take it.

use serde::Serialize;

use super::DiskStatus;
use super::assign::first_match;
use crate::engine::config::{Config, GroupConfig, Policy};

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
