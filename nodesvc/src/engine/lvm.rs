//! The LVM policy: a device group is a volume group named after it, a
//! volume is a logical volume tagged [`OWNER_TAG`].
//!
//! Every `lvm` command sees only the group's own disks (a `devices/filter`
//! in `--config`), reports as JSON in bytes, and runs through
//! [`Cmd`] with a timeout. One report (`pvs --segments`) gives the whole
//! picture of a VG — sizes, extents, every segment and its LV — and is
//! parsed by the pure [`parse_pvsegs`] into a [`VgSnapshot`].
//!
//! Activation: with device-mapper, LVs are activated normally and exposed
//! as `/dev/<vg>/<lv>`. Without it (`activation: loop`), LVs are allocated
//! contiguously on one PV and exposed as a loop device
//! ([`carina_sys::loopdev`]) over the PV at
//! `pe_start + first_pe × extent_size`, limited to the LV's size. The
//! engine picks the extents itself (best fit) and names them on the
//! `lvcreate` command line, so it knows the offset without asking LVM
//! again; the mapping is re-established from LVM metadata at every rescan.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use async_trait::async_trait;
use carina_sys::blockdev;
use carina_sys::command::{Cmd, CommandError};
use carina_sys::loopdev::{self, LosetupDevice};
use serde::Deserialize;

use super::backend::Backend;
use super::config::{Activation, GroupConfig, Policy};
use super::devnum;
use super::disks::Disk;
use super::error::{Error, Result};
use super::names;
use super::volume::{CreateRequest, GroupCapacity, QuotaMode, Volume};

/// The tag on every LV (and VG) we create; list and delete see nothing else.
pub const OWNER_TAG: &str = "carina.storage.io/owner=carina";

/// How many bytes at each end of a new volume are zeroed, so an old
/// filesystem signature never shows through to the next user.
const WIPE_BYTES: u64 = 512 << 10;

/// An `lvm` command that sees only `devices`.
pub fn lvm_cmd(subcommand: &str, devices: &[PathBuf]) -> Cmd {
    Cmd::new("lvm")
        .arg(subcommand)
        .arg("--config")
        .arg(lvm_config(devices))
        .env("LVM_SUPPRESS_FD_WARNINGS", "1")
}

/// `--config` text: accept only `devices`, no udev.
pub fn lvm_config(devices: &[PathBuf]) -> String {
    let mut filter: Vec<String> = devices
        .iter()
        .map(|d| format!("\"a|^{}$|\"", regex::escape(&d.to_string_lossy())))
        .collect();
    filter.push("\"r|.*|\"".to_string());
    format!(
        "devices{{obtain_device_list_from_udev=0 filter=[{}]}} activation{{udev_sync=0 udev_rules=0}}",
        filter.join(",")
    )
}

const REPORT_FIELDS: &str = "pv_name,pe_start,pv_size,pvseg_start,pvseg_size,lv_name,lv_tags,lv_size,vg_name,vg_extent_size,vg_size,vg_free,vg_tags";

#[derive(Debug, Deserialize)]
struct Report<T> {
    report: Vec<T>,
}

#[derive(Debug, Deserialize)]
struct PvsegReport {
    #[serde(default)]
    pvseg: Vec<PvsegRow>,
}

#[derive(Debug, Deserialize)]
struct PvsegRow {
    pv_name: String,
    pe_start: String,
    pv_size: String,
    pvseg_start: String,
    pvseg_size: String,
    #[serde(default)]
    lv_name: String,
    #[serde(default)]
    lv_tags: String,
    #[serde(default)]
    lv_size: String,
    vg_name: String,
    vg_extent_size: String,
    vg_size: String,
    vg_free: String,
    #[serde(default)]
    vg_tags: String,
}

#[derive(Debug, Deserialize)]
struct PvReport {
    #[serde(default)]
    pv: Vec<PvRow>,
}

#[derive(Debug, Deserialize)]
struct PvRow {
    pv_name: String,
    #[serde(default)]
    vg_name: String,
}

/// A physical volume of the VG.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pv {
    pub path: PathBuf,
    /// Byte offset of extent 0 on the device.
    pub pe_start: u64,
    pub size: u64,
}

/// A run of extents on one PV, free (`lv == None`) or used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    pub pv: PathBuf,
    pub start: u64,
    pub len: u64,
    pub lv: Option<String>,
}

/// One logical volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lv {
    pub name: String,
    pub size: u64,
    pub tags: Vec<String>,
    /// (pv, first extent, extent count) in PV order of appearance.
    pub segments: Vec<(PathBuf, u64, u64)>,
}

impl Lv {
    pub fn owned(&self) -> bool {
        self.tags.iter().any(|t| t == OWNER_TAG)
    }
}

/// Everything about one VG from one `pvs --segments` report.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VgSnapshot {
    pub vg: String,
    pub extent_size: u64,
    pub size: u64,
    pub free: u64,
    pub tags: Vec<String>,
    pub pvs: Vec<Pv>,
    pub segments: Vec<Segment>,
    pub lvs: BTreeMap<String, Lv>,
}

fn num(field: &str, value: &str) -> Result<u64> {
    value
        .trim()
        .parse()
        .map_err(|e| Error::parse(format!("lvm report field {field}={value:?}"), e))
}

fn tags(text: &str) -> Vec<String> {
    text.split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(str::to_string)
        .collect()
}

/// Parses `pvs --segments --reportformat json --units b --nosuffix -o
/// <REPORT_FIELDS> -S vg_name=<vg>`. An empty report is an empty snapshot
/// (the VG does not exist yet).
pub fn parse_pvsegs(json: &str) -> Result<VgSnapshot> {
    let report: Report<PvsegReport> =
        serde_json::from_str(json).map_err(|e| Error::parse("lvm pvs report", e))?;
    let mut snap = VgSnapshot::default();
    for row in report.report.into_iter().flat_map(|r| r.pvseg) {
        if snap.vg.is_empty() {
            snap.vg = row.vg_name.clone();
            snap.extent_size = num("vg_extent_size", &row.vg_extent_size)?;
            snap.size = num("vg_size", &row.vg_size)?;
            snap.free = num("vg_free", &row.vg_free)?;
            snap.tags = tags(&row.vg_tags);
        }
        let pv = PathBuf::from(&row.pv_name);
        if !snap.pvs.iter().any(|p| p.path == pv) {
            snap.pvs.push(Pv {
                path: pv.clone(),
                pe_start: num("pe_start", &row.pe_start)?,
                size: num("pv_size", &row.pv_size)?,
            });
        }
        let start = num("pvseg_start", &row.pvseg_start)?;
        let len = num("pvseg_size", &row.pvseg_size)?;
        let lv = (!row.lv_name.is_empty()).then(|| row.lv_name.clone());
        if let Some(name) = &lv {
            let entry = snap.lvs.entry(name.clone()).or_insert_with(|| Lv {
                name: name.clone(),
                size: 0,
                tags: tags(&row.lv_tags),
                segments: Vec::new(),
            });
            entry.size = num("lv_size", &row.lv_size)?;
            entry.segments.push((pv.clone(), start, len));
        }
        snap.segments.push(Segment { pv, start, len, lv });
    }
    Ok(snap)
}

/// Parses `pvs -o pv_name,vg_name` JSON into path → VG name (empty for an
/// orphan PV).
pub fn parse_pv_vgs(json: &str) -> Result<HashMap<PathBuf, String>> {
    let report: Report<PvReport> =
        serde_json::from_str(json).map_err(|e| Error::parse("lvm pvs report", e))?;
    Ok(report
        .report
        .into_iter()
        .flat_map(|r| r.pv)
        .map(|r| (PathBuf::from(r.pv_name), r.vg_name))
        .collect())
}

/// The VG each of `paths` belongs to (only those that are PVs).
pub async fn pv_vg_names(paths: &[PathBuf]) -> Result<HashMap<PathBuf, String>> {
    let out = lvm_cmd("pvs", paths)
        .args(["--reportformat", "json", "-o", "pv_name,vg_name"])
        .run()
        .await?;
    parse_pv_vgs(&out.stdout)
}

impl VgSnapshot {
    /// Our LVs only.
    pub fn owned_lvs(&self) -> impl Iterator<Item = &Lv> {
        self.lvs.values().filter(|lv| lv.owned())
    }

    /// Free segments, smallest first (best fit picks the first that fits).
    fn free_segments(&self) -> Vec<&Segment> {
        let mut free: Vec<&Segment> = self.segments.iter().filter(|s| s.lv.is_none()).collect();
        free.sort_by_key(|s| (s.len, s.pv.clone(), s.start));
        free
    }

    /// The smallest free run of at least `extents`: (pv, first extent).
    pub fn best_fit(&self, extents: u64) -> Option<(PathBuf, u64)> {
        self.free_segments()
            .into_iter()
            .find(|s| s.len >= extents)
            .map(|s| (s.pv.clone(), s.start))
    }

    /// The longest free run, in extents.
    pub fn largest_free_extents(&self) -> u64 {
        self.segments
            .iter()
            .filter(|s| s.lv.is_none())
            .map(|s| s.len)
            .max()
            .unwrap_or(0)
    }

    /// Free extents right after the (single-segment) LV on its PV.
    pub fn free_after(&self, lv: &Lv) -> u64 {
        let Some((pv, start, len)) = lv.segments.last() else {
            return 0;
        };
        let end = start + len;
        self.segments
            .iter()
            .find(|s| s.lv.is_none() && &s.pv == pv && s.start == end)
            .map(|s| s.len)
            .unwrap_or(0)
    }

    fn pv(&self, path: &Path) -> Option<&Pv> {
        self.pvs.iter().find(|p| p.path == path)
    }

    /// Byte offset of an LV's first extent on its PV (loop exposure).
    pub fn byte_offset(&self, lv: &Lv) -> Option<(PathBuf, u64)> {
        let (pv, start, _) = lv.segments.first()?;
        let pe_start = self.pv(pv)?.pe_start;
        Some((pv.clone(), pe_start + start * self.extent_size))
    }

    /// Records an allocation we just made (keeps the cache exact without
    /// asking LVM again).
    fn allocate(&mut self, name: &str, pv: &Path, start: u64, extents: u64, tags: Vec<String>) {
        if let Some(i) = self.segments.iter().position(|s| {
            s.lv.is_none() && s.pv == pv && s.start <= start && start + extents <= s.start + s.len
        }) {
            let free = self.segments.remove(i);
            let mut parts = Vec::new();
            if start > free.start {
                parts.push(Segment {
                    pv: pv.to_path_buf(),
                    start: free.start,
                    len: start - free.start,
                    lv: None,
                });
            }
            parts.push(Segment {
                pv: pv.to_path_buf(),
                start,
                len: extents,
                lv: Some(name.to_string()),
            });
            let end = free.start + free.len;
            if start + extents < end {
                parts.push(Segment {
                    pv: pv.to_path_buf(),
                    start: start + extents,
                    len: end - start - extents,
                    lv: None,
                });
            }
            for (k, p) in parts.into_iter().enumerate() {
                self.segments.insert(i + k, p);
            }
        }
        let lv = self.lvs.entry(name.to_string()).or_insert_with(|| Lv {
            name: name.to_string(),
            size: 0,
            tags,
            segments: Vec::new(),
        });
        lv.segments.push((pv.to_path_buf(), start, extents));
        lv.size += extents * self.extent_size;
        self.free = self.free.saturating_sub(extents * self.extent_size);
    }

    /// Records the removal of an LV.
    fn release(&mut self, name: &str) {
        if let Some(lv) = self.lvs.remove(name) {
            self.free += lv.size;
        }
        for s in &mut self.segments {
            if s.lv.as_deref() == Some(name) {
                s.lv = None;
            }
        }
        // Merge neighbouring free runs on the same PV.
        self.segments.sort_by_key(|s| (s.pv.clone(), s.start));
        let mut merged: Vec<Segment> = Vec::with_capacity(self.segments.len());
        for s in self.segments.drain(..) {
            match merged.last_mut() {
                Some(prev)
                    if prev.lv.is_none()
                        && s.lv.is_none()
                        && prev.pv == s.pv
                        && prev.start + prev.len == s.start =>
                {
                    prev.len += s.len;
                }
                _ => merged.push(s),
            }
        }
        self.segments = merged;
    }
}

/// How this group's LVs become block devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    DeviceMapper,
    Loop,
}

/// An LVM device group.
#[derive(Debug)]
pub struct LvmGroup {
    config: GroupConfig,
    mode: Mode,
    state: Mutex<LvmState>,
}

#[derive(Debug, Default)]
struct LvmState {
    /// The group's disks (the LVM device filter).
    devices: Vec<PathBuf>,
    /// Last known picture of the VG; kept exact by our own mutations and
    /// refreshed on every rescan and list.
    snapshot: Option<VgSnapshot>,
    /// The VG's extent size as last read. Unlike the snapshot it survives
    /// invalidation (a VG's extent size does not change), so
    /// [`Backend::round_size`] always rounds to the real unit.
    extent_size: Option<u64>,
}

impl LvmGroup {
    /// A group in device-mapper or loop mode (`activation: auto` picks by
    /// whether the kernel has device-mapper).
    pub fn new(config: GroupConfig, device_mapper: bool) -> Result<LvmGroup> {
        let mode = match config.activation {
            Activation::Loop => Mode::Loop,
            Activation::Dm if !device_mapper => {
                return Err(Error::config(
                    format!("group {}: activation", config.name),
                    "dm requested but the kernel has no device-mapper",
                ));
            }
            Activation::Dm => Mode::DeviceMapper,
            Activation::Auto if device_mapper => Mode::DeviceMapper,
            Activation::Auto => Mode::Loop,
        };
        Ok(LvmGroup {
            config,
            mode,
            state: Mutex::new(LvmState::default()),
        })
    }

    fn vg(&self) -> &str {
        &self.config.name
    }

    fn devices(&self) -> Vec<PathBuf> {
        self.lock().devices.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LvmState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn cmd(&self, subcommand: &str) -> Cmd {
        let cmd = lvm_cmd(subcommand, &self.devices());
        match self.mode {
            Mode::Loop
                if matches!(
                    subcommand,
                    "lvcreate" | "lvextend" | "lvremove" | "vgchange"
                ) =>
            {
                cmd.args(["--driverloaded", "n"])
            }
            _ => cmd,
        }
    }

    /// Reads the VG from LVM and caches it.
    async fn refresh(&self) -> Result<VgSnapshot> {
        let out = self
            .cmd("pvs")
            .args([
                "--segments",
                "--reportformat",
                "json",
                "--units",
                "b",
                "--nosuffix",
                "-o",
                REPORT_FIELDS,
                "-S",
            ])
            .arg(format!("vg_name={}", self.vg()))
            .run()
            .await?;
        let snap = parse_pvsegs(&out.stdout)?;
        let mut state = self.lock();
        if snap.extent_size > 0 {
            state.extent_size = Some(snap.extent_size);
        }
        state.snapshot = Some(snap.clone());
        Ok(snap)
    }

    async fn snapshot(&self) -> Result<VgSnapshot> {
        let cached = self.lock().snapshot.clone();
        match cached {
            Some(s) => Ok(s),
            None => self.refresh().await,
        }
    }

    fn update<F: FnOnce(&mut VgSnapshot)>(&self, f: F) {
        if let Some(s) = self.lock().snapshot.as_mut() {
            f(s);
        }
    }

    fn invalidate(&self) {
        self.lock().snapshot = None;
    }

    /// The block device of an LV, attaching its loop device if needed.
    async fn expose(
        &self,
        snap: &VgSnapshot,
        lv: &Lv,
        loops: Option<&[LosetupDevice]>,
    ) -> Result<PathBuf> {
        match self.mode {
            Mode::DeviceMapper => Ok(PathBuf::from(format!("/dev/{}/{}", self.vg(), lv.name))),
            Mode::Loop => {
                if lv.segments.len() != 1 {
                    return Err(Error::FailedPrecondition {
                        operation: "loop activation",
                        name: lv.name.clone(),
                        reason: format!(
                            "LV has {} segments; loop exposure needs one contiguous segment",
                            lv.segments.len()
                        ),
                    });
                }
                let (pv, offset) = snap.byte_offset(lv).ok_or_else(|| {
                    Error::parse(
                        format!("segments of LV {}", lv.name),
                        "no PV for its first segment",
                    )
                })?;
                let owned_loops;
                let loops = match loops {
                    Some(l) => l,
                    None => {
                        owned_loops = loopdev::list().await?;
                        &owned_loops
                    }
                };
                if let Some(found) = loopdev::find(loops, &pv, offset) {
                    let dev = PathBuf::from(&found.name);
                    if found.sizelimit != lv.size {
                        loopdev::set_size_limit(&dev, lv.size).await?;
                    }
                    return Ok(dev);
                }
                Ok(loopdev::attach(&pv, offset, lv.size).await?)
            }
        }
    }

    fn volume(&self, lv: &Lv, device: PathBuf) -> Result<Volume> {
        let (major, minor) = devnum::of_path(&device)?;
        Ok(Volume {
            name: lv.name.clone(),
            group: self.config.name.clone(),
            policy: Policy::Lvm,
            size_bytes: lv.size,
            device_path: Some(device),
            host_path: None,
            major,
            minor,
            exclusive: false,
            disk: lv
                .segments
                .first()
                .map(|(pv, _, _)| pv.to_string_lossy().into_owned()),
        })
    }

    fn exhausted(&self, requested: u64, snap: &VgSnapshot) -> Error {
        Error::ResourceExhausted {
            group: self.config.name.clone(),
            requested_bytes: requested,
            allocatable_bytes: GroupCapacity::allocatable(snap.free, self.config.reserve_bytes),
        }
    }

    /// Removes an LV we just created after a later step failed.
    async fn roll_back(&self, name: &str) {
        let lv = format!("{}/{}", self.vg(), name);
        if let Err(e) = self.cmd("lvremove").args(["-f", "-y"]).arg(&lv).run().await {
            tracing::error!(lvm.lv = %lv, error = %e, "rollback of a half-created LV failed");
        }
        self.invalidate();
    }

    async fn create_loop(
        &self,
        req: &CreateRequest,
        size: u64,
        snap: &VgSnapshot,
    ) -> Result<Volume> {
        let extents = size / snap.extent_size;
        let (pv, start) = snap
            .best_fit(extents)
            .ok_or_else(|| self.exhausted(size, snap))?;
        let range = format!("{}:{}-{}", pv.display(), start, start + extents - 1);
        let created = self
            .cmd("lvcreate")
            .args([
                "-q",
                "-an",
                "-Zn",
                "-Wn",
                "--alloc",
                "contiguous",
                "--addtag",
                OWNER_TAG,
                "-l",
            ])
            .arg(extents.to_string())
            .arg("-n")
            .arg(&req.name)
            .arg(self.vg())
            .arg(&range)
            .run()
            .await;
        if let Err(e) = created {
            // Our picture was stale (someone else allocated): re-read it.
            self.invalidate();
            return Err(map_lvcreate_error(e, || self.exhausted(size, snap)));
        }
        self.update(|s| s.allocate(&req.name, &pv, start, extents, vec![OWNER_TAG.to_string()]));
        let snap = self.snapshot().await?;
        let Some(lv) = snap.lvs.get(&req.name).cloned() else {
            self.roll_back(&req.name).await;
            return Err(Error::parse(
                format!("LV {}", req.name),
                "created but missing from the cache",
            ));
        };
        let result = async {
            let device = self.expose(&snap, &lv, None).await?;
            wipe_ends(&device, lv.size).await?;
            self.volume(&lv, device)
        }
        .await;
        match result {
            Ok(v) => Ok(v),
            Err(e) => {
                if let Some((pv, offset)) = snap.byte_offset(&lv)
                    && let Ok(loops) = loopdev::list().await
                    && let Some(l) = loopdev::find(&loops, &pv, offset)
                {
                    let _ = loopdev::detach(Path::new(&l.name)).await;
                }
                self.roll_back(&req.name).await;
                Err(e)
            }
        }
    }

    async fn create_dm(&self, req: &CreateRequest, size: u64, snap: &VgSnapshot) -> Result<Volume> {
        let created = self
            .cmd("lvcreate")
            .args(["-q", "-y", "-ay", "-Zy", "-Wy", "--addtag", OWNER_TAG, "-L"])
            .arg(format!("{size}b"))
            .arg("-n")
            .arg(&req.name)
            .arg(self.vg())
            .run()
            .await;
        self.invalidate();
        created.map_err(|e| map_lvcreate_error(e, || self.exhausted(size, snap)))?;
        let snap = self.refresh().await?;
        let lv =
            snap.lvs.get(&req.name).cloned().ok_or_else(|| {
                Error::parse(format!("LV {}", req.name), "created but not reported")
            })?;
        let device = self.expose(&snap, &lv, None).await?;
        match self.volume(&lv, device) {
            Ok(v) => Ok(v),
            Err(e) => {
                self.roll_back(&req.name).await;
                Err(e)
            }
        }
    }
}

/// Fails with `FailedPrecondition` if the block device of volume `volume`
/// is mounted or held open exclusively, so it is not deleted under a user.
fn ensure_unused(dev: &Path, volume: &str) -> Result<()> {
    match blockdev::in_use(dev) {
        Ok(false) => Ok(()),
        Ok(true) => Err(Error::FailedPrecondition {
            operation: "delete",
            name: volume.to_string(),
            reason: format!("{} is in use (mounted or held open)", dev.display()),
        }),
        Err(e) => Err(Error::io("open", dev, e)),
    }
}

/// Maps an `lvcreate`/`lvextend` failure: lack of space is its own kind.
fn map_lvcreate_error(e: CommandError, exhausted: impl FnOnce() -> Error) -> Error {
    let stderr = e.stderr();
    if stderr.contains("Insufficient free space") || stderr.contains("Insufficient suitable") {
        exhausted()
    } else {
        Error::Command(e)
    }
}

/// Zeroes the first and last [`WIPE_BYTES`] of a new device.
async fn wipe_ends(device: &Path, size: u64) -> Result<()> {
    use tokio::io::{AsyncSeekExt, AsyncWriteExt};
    let mut f = tokio::fs::OpenOptions::new()
        .write(true)
        .open(device)
        .await
        .map_err(|e| Error::io("open", device, e))?;
    let n = WIPE_BYTES.min(size);
    let zeros = vec![0u8; n as usize];
    f.write_all(&zeros)
        .await
        .map_err(|e| Error::io("wipe", device, e))?;
    if size > n {
        f.seek(std::io::SeekFrom::Start(size - n))
            .await
            .map_err(|e| Error::io("seek", device, e))?;
        f.write_all(&zeros)
            .await
            .map_err(|e| Error::io("wipe", device, e))?;
    }
    f.sync_all()
        .await
        .map_err(|e| Error::io("sync", device, e))?;
    Ok(())
}

#[async_trait]
impl Backend for LvmGroup {
    fn config(&self) -> &GroupConfig {
        &self.config
    }

    async fn rescan(&self, disks: &[Disk]) -> Result<()> {
        let mut devices: Vec<PathBuf> = disks.iter().map(|d| d.path.clone()).collect();
        devices.sort();
        {
            let mut state = self.lock();
            // Keep PVs we already have even if discovery missed them this
            // time (a disk never leaves a VG behind our back).
            for d in state.devices.drain(..) {
                if !devices.contains(&d) {
                    devices.push(d);
                }
            }
            state.devices = devices.clone();
        }
        let snap = self.refresh().await?;
        let new: Vec<&Disk> = disks
            .iter()
            .filter(|d| !snap.pvs.iter().any(|p| p.path == d.path))
            .collect();
        if !new.is_empty() {
            let sub = if snap.vg.is_empty() {
                "vgcreate"
            } else {
                "vgextend"
            };
            let mut cmd = self.cmd(sub).arg("-q");
            if sub == "vgcreate" {
                cmd = cmd.args(["--addtag", OWNER_TAG]);
            }
            cmd = cmd.arg(self.vg());
            for d in &new {
                cmd = cmd.arg(&d.path);
            }
            cmd.run().await?;
            tracing::info!(lvm.vg = %self.vg(), disks = ?new.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(), "{sub}");
        }
        let snap = if new.is_empty() {
            snap
        } else {
            self.refresh().await?
        };
        if snap.vg.is_empty() {
            return Ok(());
        }
        match self.mode {
            Mode::DeviceMapper => {
                self.cmd("vgchange")
                    .args(["-ay"])
                    .arg(self.vg())
                    .run()
                    .await?;
            }
            Mode::Loop => {
                let loops = loopdev::list().await?;
                for lv in snap.owned_lvs() {
                    if let Err(e) = self.expose(&snap, lv, Some(&loops)).await {
                        tracing::error!(lvm.vg = %self.vg(), lvm.lv = %lv.name, error = %e, "cannot expose LV");
                    }
                }
            }
        }
        Ok(())
    }

    async fn create(&self, req: &CreateRequest) -> Result<Volume> {
        let snap = self.snapshot().await?;
        if snap.vg.is_empty() {
            return Err(Error::ResourceExhausted {
                group: self.config.name.clone(),
                requested_bytes: req.size_bytes,
                allocatable_bytes: 0,
            });
        }
        // The engine knows no volume of ours by this name; a foreign LV of
        // that name is in the VG only, so this check is ours.
        if let Some(lv) = snap.lvs.get(&req.name) {
            return Err(Error::AlreadyExists {
                name: req.name.clone(),
                group: self.config.name.clone(),
                existing_bytes: lv.size,
                requested_bytes: req.size_bytes,
            });
        }
        // Already rounded to the extent size by the engine (round_size).
        let size = req.size_bytes;
        if size > GroupCapacity::allocatable(snap.free, self.config.reserve_bytes) {
            return Err(self.exhausted(size, &snap));
        }
        match self.mode {
            Mode::Loop => self.create_loop(req, size, &snap).await,
            Mode::DeviceMapper => self.create_dm(req, size, &snap).await,
        }
    }

    async fn get(&self, name: &str) -> Result<Option<Volume>> {
        let snap = self.snapshot().await?;
        let Some(lv) = snap.lvs.get(name).filter(|lv| lv.owned()) else {
            return Ok(None);
        };
        let device = self.expose(&snap, lv, None).await?;
        self.volume(lv, device).map(Some)
    }

    async fn list(&self) -> Result<Vec<Volume>> {
        let snap = self.refresh().await?;
        let loops = match self.mode {
            Mode::Loop => Some(loopdev::list().await?),
            Mode::DeviceMapper => None,
        };
        let mut out = Vec::new();
        for lv in snap.owned_lvs() {
            let device = self.expose(&snap, lv, loops.as_deref()).await?;
            out.push(self.volume(lv, device)?);
        }
        Ok(out)
    }

    async fn resize(&self, name: &str, size_bytes: u64) -> Result<Volume> {
        let snap = self.refresh().await?;
        let lv = snap
            .lvs
            .get(name)
            .filter(|lv| lv.owned())
            .cloned()
            .ok_or_else(|| Error::VolumeNotFound {
                name: name.to_string(),
            })?;
        // Rounded to the extent size and larger than the LV: the engine's
        // checks.
        let size = size_bytes;
        debug_assert!(size > lv.size, "the engine answers no-ops and shrinks");
        let growth = size.saturating_sub(lv.size);
        if growth > GroupCapacity::allocatable(snap.free, self.config.reserve_bytes) {
            return Err(self.exhausted(growth, &snap));
        }
        let lv_path = format!("{}/{}", self.vg(), name);
        let mut cmd = self
            .cmd("lvextend")
            .args(["-q", "-L"])
            .arg(format!("{size}b"))
            .arg(&lv_path);
        if self.mode == Mode::Loop {
            let extra = growth / snap.extent_size;
            if snap.free_after(&lv) < extra {
                return Err(Error::FailedPrecondition {
                    operation: "resize",
                    name: name.to_string(),
                    reason: format!(
                        "loop activation needs the {extra} extents right after the LV free, and only {} are",
                        snap.free_after(&lv)
                    ),
                });
            }
            let (pv, start, len) = lv.segments[0].clone();
            cmd = cmd.args(["--alloc", "contiguous"]).arg(format!(
                "{}:{}-{}",
                pv.display(),
                start + len,
                start + len + extra - 1
            ));
        }
        let result = cmd.run().await;
        self.invalidate();
        result.map_err(|e| map_lvcreate_error(e, || self.exhausted(growth, &snap)))?;
        let snap = self.refresh().await?;
        let lv = snap
            .lvs
            .get(name)
            .cloned()
            .ok_or_else(|| Error::VolumeNotFound {
                name: name.to_string(),
            })?;
        let device = self.expose(&snap, &lv, None).await?;
        self.volume(&lv, device)
    }

    async fn delete(&self, name: &str) -> Result<()> {
        let snap = self.snapshot().await?;
        let Some(lv) = snap.lvs.get(name).filter(|lv| lv.owned()).cloned() else {
            return Err(Error::VolumeNotFound {
                name: name.to_string(),
            });
        };
        match self.mode {
            Mode::Loop => {
                if let Some((pv, offset)) = snap.byte_offset(&lv) {
                    let loops = loopdev::list().await?;
                    if let Some(l) = loopdev::find(&loops, &pv, offset) {
                        let dev = PathBuf::from(&l.name);
                        ensure_unused(&dev, name)?;
                        loopdev::detach(&dev).await?;
                    }
                }
            }
            Mode::DeviceMapper => {
                ensure_unused(Path::new(&format!("/dev/{}/{}", self.vg(), name)), name)?;
            }
        }
        let result = self
            .cmd("lvremove")
            .args(["-q", "-f", "-y"])
            .arg(format!("{}/{}", self.vg(), name))
            .run()
            .await;
        match result {
            Ok(_) => {
                self.update(|s| s.release(name));
                Ok(())
            }
            Err(e) => {
                self.invalidate();
                Err(e.into())
            }
        }
    }

    async fn capacity(&self) -> Result<GroupCapacity> {
        let snap = self.snapshot().await?;
        let reserve = self.config.reserve_bytes;
        let allocatable = GroupCapacity::allocatable(snap.free, reserve);
        let largest = match self.mode {
            Mode::Loop => snap.largest_free_extents() * snap.extent_size,
            Mode::DeviceMapper => snap.free,
        };
        Ok(GroupCapacity {
            group: self.config.name.clone(),
            policy: Policy::Lvm,
            total_bytes: snap.size,
            free_bytes: snap.free,
            reserve_bytes: reserve,
            allocatable_bytes: allocatable,
            largest_allocatable_bytes: largest.min(allocatable),
            allocation_unit: snap.extent_size.max(1),
            volume_count: snap.owned_lvs().count() as u32,
            quota: QuotaMode::NotApplicable,
            disks: snap
                .pvs
                .iter()
                .map(|p| p.path.to_string_lossy().into_owned())
                .collect(),
            no_disks: None,
        })
    }

    fn round_size(&self, size_bytes: u64) -> Option<u64> {
        let extent = self
            .lock()
            .extent_size
            .filter(|e| *e > 0)
            .unwrap_or(4 << 20);
        names::round_up(size_bytes, extent)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PVSEGS: &str = include_str!("testdata/pvs_segments.json");

    #[test]
    fn parses_real_report() {
        let s = parse_pvsegs(PVSEGS).expect("parses");
        assert_eq!(s.vg, "tvg");
        assert_eq!(s.extent_size, 4 << 20);
        assert_eq!(s.size, 1_602_224_128);
        assert_eq!(s.free, 1_392_508_928);
        assert_eq!(s.pvs.len(), 2);
        assert_eq!(s.pvs[0].pe_start, 1 << 20);
        assert_eq!(s.lvs.len(), 2);
        assert!(s.lvs["lv1"].owned());
        assert_eq!(
            s.lvs["lv3"].segments,
            vec![(PathBuf::from("/dev/loop0"), 25, 25)]
        );
        assert_eq!(s.largest_free_extents(), 205);
        // best fit prefers the smaller free run that is large enough
        assert_eq!(s.best_fit(100), Some((PathBuf::from("/dev/loop1"), 0)));
        assert_eq!(s.best_fit(200), Some((PathBuf::from("/dev/loop0"), 50)));
        assert_eq!(s.best_fit(206), None);
        let lv3 = &s.lvs["lv3"];
        assert_eq!(
            s.byte_offset(lv3),
            Some((PathBuf::from("/dev/loop0"), (1 << 20) + 25 * (4 << 20)))
        );
        assert_eq!(s.free_after(lv3), 205);
        assert_eq!(s.free_after(&s.lvs["lv1"]), 0);
    }

    #[test]
    fn empty_report_is_no_vg() {
        let s = parse_pvsegs(r#"{"report": [{"pvseg": []}]}"#).expect("parses");
        assert!(s.vg.is_empty());
        assert_eq!(s.largest_free_extents(), 0);
    }

    #[test]
    fn allocate_and_release_keep_the_picture_exact() {
        let mut s = parse_pvsegs(PVSEGS).expect("parses");
        let before = s.clone();
        s.allocate(
            "new",
            Path::new("/dev/loop0"),
            60,
            10,
            vec![OWNER_TAG.into()],
        );
        assert_eq!(s.free, before.free - 10 * (4 << 20));
        assert_eq!(s.lvs["new"].size, 10 * (4 << 20));
        let free0: Vec<_> = s
            .segments
            .iter()
            .filter(|x| x.lv.is_none() && x.pv == Path::new("/dev/loop0"))
            .map(|x| (x.start, x.len))
            .collect();
        assert_eq!(free0, vec![(50, 10), (70, 185)]);
        s.release("new");
        assert_eq!(s.free, before.free);
        assert_eq!(s.largest_free_extents(), 205);
        assert!(!s.lvs.contains_key("new"));
    }

    #[test]
    fn pv_vg_report() {
        let m = parse_pv_vgs(r#"{"report":[{"pv":[{"pv_name":"/dev/loop0","vg_name":"tvg"},{"pv_name":"/dev/loop4","vg_name":""}]}]}"#)
            .expect("parses");
        assert_eq!(m[Path::new("/dev/loop0")], "tvg");
        assert_eq!(m[Path::new("/dev/loop4")], "");
    }

    #[test]
    fn config_filters_only_our_devices() {
        let c = lvm_config(&[PathBuf::from("/dev/loop3")]);
        assert!(c.contains(r#"filter=["a|^/dev/loop3$|","r|.*|"]"#), "{c}");
        assert!(c.contains("udev_sync=0"));
    }

    #[test]
    fn insufficient_space_is_exhaustion() {
        let e = CommandError::Failed {
            command: "lvm lvcreate".into(),
            status: "exit status: 5".into(),
            code: Some(5),
            stderr: "Insufficient suitable contiguous allocatable extents for logical volume x: 25 more required".into(),
        };
        let mapped = map_lvcreate_error(e, || Error::ResourceExhausted {
            group: "g".into(),
            requested_bytes: 1,
            allocatable_bytes: 0,
        });
        assert!(matches!(mapped, Error::ResourceExhausted { .. }));
        let other = CommandError::Failed {
            command: "lvm".into(),
            status: "5".into(),
            code: Some(5),
            stderr: "boom".into(),
        };
        assert!(matches!(
            map_lvcreate_error(other, || unreachable!()),
            Error::Command(_)
        ));
    }
}
