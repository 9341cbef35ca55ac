//! Reading the node's disks: `lsblk` JSON for the device tree, `blkid -p`
//! for what a disk carries, sysfs for what a loop device is backed by.

use std::path::PathBuf;

use carina_sys::command::Cmd;
use carina_sys::loopdev::{self, LosetupDevice};
use serde::Deserialize;

use super::Disk;
use crate::engine::error::{Error, Result};

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
