//! A `carina-node` with one group of each policy, started and killed as a
//! test says ([`Rig`]), and the reads and writes of a volume's bytes that
//! the kill tests check what survived with.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use carina_proto::nodestorage as pb;

use crate::cluster::{NodeArgs, Pki, Service};
use crate::grpc::{Client, create_lv};
use crate::{LoopDisk, VgGuard, lvm, mounts_under, run, unique};

const MIB: u64 = 1 << 20;
/// Each loop disk of a [`Rig`].
const DISK: u64 = 256 * MIB;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    Lvm,
    Raw,
    Host,
}

/// A node with one group of each policy (LVM and RAW each on a loop disk
/// of their own, HOST in a directory), started and killed as the test
/// says. Drops the process first, then the volume group, then the disks.
pub struct Rig {
    pub service: Option<Service>,
    pub args: NodeArgs,
    pki: Pki,
    lvm_group: String,
    raw_group: String,
    host_group: String,
    pub host_root: PathBuf,
    _vg: VgGuard,
    lvm_disk: LoopDisk,
    raw_disk: LoopDisk,
    pub dir: tempfile::TempDir,
}

impl std::fmt::Debug for Rig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rig")
            .field("node", &self.args.name)
            .finish_non_exhaustive()
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        if let Some(mut s) = self.service.take() {
            s.kill();
        }
        // What a test staged or published and did not take down.
        let mut mounts = mounts_under(self.dir.path());
        mounts.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        for m in mounts {
            let _ = run("umount", &["-l", &m.display().to_string()]);
        }
    }
}

impl Rig {
    /// The rig of `test` with its node started.
    pub async fn new(test: &str) -> Result<Rig> {
        let dir = tempfile::Builder::new()
            .prefix(&format!("carina-{test}-"))
            .tempdir()?;
        let lvm_disk = LoopDisk::new(DISK)?;
        let raw_disk = LoopDisk::new(DISK)?;
        let lvm_group = unique("crash-lvm");
        let raw_group = unique("crash-raw");
        let host_group = unique("crash-host");
        let vg = VgGuard::new(&lvm_group, &[&lvm_disk]);
        let host_root = dir.path().join("host");
        std::fs::create_dir_all(&host_root)?;
        let config = serde_json::json!({
            "diskSelector": [
                {"name": lvm_group, "re": [lvm_disk.pattern()], "policy": "LVM", "reserveBytes": 0, "minDiskBytes": MIB},
                {"name": raw_group, "re": [raw_disk.pattern()], "policy": "RAW", "reserveBytes": 0, "minDiskBytes": MIB},
                {"name": host_group, "policy": "HOST", "root": host_root, "reserveBytes": 0},
            ],
            "diskScanInterval": "0",
        });
        let pki = Pki::write(&dir.path().join("pki"))?;
        let name = unique("crash-node");
        let args = NodeArgs::new(
            &name,
            &pki,
            &config.to_string(),
            &dir.path().join("node"),
            &dir.path().join("node.log"),
        )?
        .with_crashpoints()?;
        let mut rig = Rig {
            service: None,
            args,
            pki,
            lvm_group,
            raw_group,
            host_group,
            host_root,
            _vg: vg,
            lvm_disk,
            raw_disk,
            dir,
        };
        rig.start(None).await?;
        Ok(rig)
    }

    /// Starts the node, asked to kill itself at `kill_at` if given.
    pub async fn start(&mut self, kill_at: Option<&str>) -> Result<()> {
        let mut args = self.args.clone();
        if let Some(at) = kill_at {
            args.env
                .push((carina_sys::crashpoint::ENV.to_string(), at.to_string()));
        }
        self.service = Some(args.start().await?);
        Ok(())
    }

    /// A NodeStorage client of the node.
    pub async fn client(&self) -> Result<Client> {
        self.pki
            .node_client(&self.args.name, &self.args.endpoint())
            .await
    }

    /// The group of `policy`.
    pub fn group(&self, policy: Policy) -> &str {
        match policy {
            Policy::Lvm => &self.lvm_group,
            Policy::Raw => &self.raw_group,
            Policy::Host => &self.host_group,
        }
    }

    /// Where the node's journal keeps its record of `volume`.
    pub fn journal_record(&self, volume: &str) -> PathBuf {
        self.args
            .state_dir
            .join("intents")
            .join(format!("{volume}.json"))
    }

    /// Waits for the node to die by the SIGKILL it was asked for.
    pub async fn await_kill(&mut self, point: &str) -> Result<()> {
        let service = self.service.as_mut().context("the node is not running")?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            // Polling a process's exit: there is nothing to watch.
            match service.check_running() {
                Err(e) => {
                    let why = format!("{e:#}");
                    if !why.contains("SIGKILL") {
                        bail!("the node died at {point}, but not by SIGKILL: {why}");
                    }
                    break;
                }
                Ok(()) if Instant::now() > deadline => {
                    bail!("the node did not kill itself at {point} within 30 s")
                }
                Ok(()) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
        // Reaps it.
        if let Some(mut s) = self.service.take() {
            s.kill();
        }
        Ok(())
    }

    /// Stops the node: SIGTERM, then a wait for its exit.
    pub async fn stop(&mut self) {
        if let Some(mut s) = self.service.take() {
            s.stop().await;
        }
    }

    /// LVs in the LVM group's VG.
    pub fn lvs(&self) -> Result<Vec<String>> {
        let out = lvm(
            &[&self.lvm_disk.dev()],
            &["lvs", "--noheadings", "-o", "lv_name", &self.lvm_group],
        )?;
        Ok(out.split_whitespace().map(str::to_string).collect())
    }

    /// Partitions the kernel shows on the RAW disk, and those in its table.
    pub fn partitions(&self) -> Result<(usize, usize)> {
        let sys = Path::new("/sys/block").join(&self.raw_disk.name);
        let kernel = std::fs::read_dir(&sys)?
            .flatten()
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with(&self.raw_disk.name)
            })
            .count();
        let table = match run("sfdisk", &["-J", &self.raw_disk.dev()]) {
            Ok(json) => {
                let v: serde_json::Value = serde_json::from_str(&json)?;
                v["partitiontable"]["partitions"]
                    .as_array()
                    .map_or(0, Vec::len)
            }
            // No table at all: a disk whose last partition went.
            Err(_) => 0,
        };
        Ok((kernel, table))
    }

    /// Loop devices over the LVM disk (one per exposed LV).
    pub fn lvm_loops(&self) -> usize {
        crate::loops_backed_by(&self.lvm_disk.dev()).len()
    }

    /// What is under the HOST root that names `volume`.
    pub fn host_leftovers(&self, volume: &str) -> Vec<PathBuf> {
        walk(&self.host_root)
            .into_iter()
            .filter(|p| p.to_string_lossy().contains(volume))
            .collect()
    }
}

/// Every path under `dir`, depth first (symlinked directories not
/// followed).
pub fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() && !p.is_symlink() {
                out.extend(walk(&p));
            }
            out.push(p);
        }
    }
    out
}

/// Where a volume's bytes are: its block device, or a file in its directory.
fn data_path(v: &pb::LogicVolume) -> PathBuf {
    if v.host_path.is_empty() {
        PathBuf::from(&v.device_path)
    } else {
        Path::new(&v.host_path).join("data")
    }
}

/// Writes `len` bytes of a pattern seeded by `seed` at the start of the
/// volume, synced; returns them.
pub fn fill(v: &pb::LogicVolume, seed: u8, len: u64) -> Result<Vec<u8>> {
    let path = data_path(v);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(!v.host_path.is_empty())
        .open(&path)
        .with_context(|| format!("open {}", path.display()))?;
    let bytes: Vec<u8> = (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect();
    f.write_all(&bytes)?;
    f.sync_all()?;
    Ok(bytes)
}

/// The first `len` bytes of the volume.
pub fn checksum(v: &pb::LogicVolume, len: u64) -> Result<Vec<u8>> {
    let path = data_path(v);
    let mut bytes = vec![0u8; len as usize];
    std::fs::File::open(&path)
        .with_context(|| format!("open {}", path.display()))?
        .read_exact(&mut bytes)?;
    Ok(bytes)
}

/// Whether the ends of a block volume that a create wipes (where
/// filesystem and other signatures are) read as zeros.
pub fn ends_are_zero(v: &pb::LogicVolume) -> Result<bool> {
    let wiped = carina_node::engine::wipe::WIPE_BYTES;
    let mut f = std::fs::File::open(&v.device_path)?;
    let mut buf = vec![0u8; wiped as usize];
    f.read_exact(&mut buf)?;
    let head = buf.iter().all(|b| *b == 0);
    f.seek(SeekFrom::Start(v.size_bytes - wiped))?;
    f.read_exact(&mut buf)?;
    Ok(head && buf.iter().all(|b| *b == 0))
}

/// Fills every MiB of a block volume with a non-zero pattern.
pub fn smear(v: &pb::LogicVolume) -> Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(&v.device_path)?;
    let buf = vec![0xabu8; MIB as usize];
    for _ in 0..v.size_bytes / MIB {
        f.write_all(&buf)?;
    }
    f.sync_all()?;
    Ok(())
}

/// The size the kernel gives a block volume's device.
pub fn device_size(v: &pb::LogicVolume) -> u64 {
    crate::blockdev_size(Path::new(&v.device_path))
}

/// CreateLV of `name`, `size` bytes in `group`; the volume it answers.
pub async fn create(c: &mut Client, name: &str, group: &str, size: u64) -> Result<pb::LogicVolume> {
    c.create_lv(create_lv(name, group, size))
        .await
        .with_context(|| format!("CreateLV {name}"))?
        .into_inner()
        .volume
        .context("CreateLV answered no volume")
}

/// The names ListLVs answers.
pub async fn list(c: &mut Client) -> Result<Vec<String>> {
    let all = c
        .list_l_vs(pb::ListLVsRequest::default())
        .await?
        .into_inner()
        .volumes;
    Ok(all.into_iter().map(|v| v.name).collect())
}
