//! What a soak run measures outside the node's own answers: the mounts
//! of a process and the entries of a disk's GPT.

use std::path::PathBuf;

use anyhow::{Context, Result, ensure};

/// One mount: its mount point and its source.
#[derive(Debug, Clone)]
pub struct Mount {
    pub target: PathBuf,
    pub source: String,
}

/// The mounts of `/proc/<pid>/mountinfo` (`self` for this process): the
/// mount point (field 5, `\040` escapes undone) and the source (after
/// the ` - ` separator and the fs type).
pub fn mountinfo(pid: &str) -> Vec<Mount> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let target = l.split(' ').nth(4)?;
            let (_, tail) = l.split_once(" - ")?;
            let source = tail.split(' ').nth(1)?;
            Some(Mount {
                target: PathBuf::from(target.replace("\\040", " ")),
                source: source.to_string(),
            })
        })
        .collect()
}

/// Entries of the GPT on `dev`; none when it has no partition table yet.
pub fn gpt_partitions(dev: &str) -> Result<usize> {
    let out = std::process::Command::new("sfdisk")
        .args(["-J", dev])
        .output()
        .context("run sfdisk")?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        ensure!(
            stderr.contains("does not contain a recognized partition table"),
            "sfdisk -J {dev}: {}",
            stderr.trim()
        );
        return Ok(0);
    }
    let table: serde_json::Value =
        serde_json::from_slice(&out.stdout).with_context(|| format!("sfdisk -J {dev} output"))?;
    Ok(table["partitiontable"]["partitions"]
        .as_array()
        .map_or(0, Vec::len))
}
