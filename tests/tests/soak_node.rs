//! The soak run: one real `carina-node` process (an LVM, a RAW and a
//! HOST group, the LVM and RAW groups on loop disks of their own, the RAW
//! disk shared by the workers; see [`RAW_DISK_PER_WORKER`]; NodeStorage
//! over mutual TLS and the CSI Node service on its unix socket) and
//! [`WORKERS`] workers that loop CreateLV, NodeStageVolume,
//! NodePublishVolume, write + fsync + read back a checksum,
//! NodeUnpublishVolume, NodeUnstageVolume and DeleteLV, rotating the
//! policies and block and filesystem access, for `CARINA_SOAK_DURATION`
//! (`90s`, `10m`, `1h`, `1h30m` or plain seconds; default two minutes,
//! what `make test` runs; `make soak DURATION=1h` for a long run). Any
//! step's error fails the run naming the worker, cycle, step, policy,
//! access and volume.
//!
//! Every `min(60 s, duration / 4)` the workers stop at a barrier between
//! cycles, so nothing is in flight, and the node is measured at rest:
//! its RSS (`VmRSS`) and open fds from `/proc`, the volumes it lists, the
//! LVs of the test volume group, the RAW disks' partitions (GPT entries
//! and the kernel's), the HOST volume directories, the loop devices over
//! the test disks, and the mounts under the test directory or of the
//! test devices. The rules, checked at every sample:
//!
//! - Counts equal the first sample's (taken before the first cycle)
//!   exactly: at rest no volume exists, so one more of anything is a leak.
//! - Open fds never exceed the warm-up sample's (the first one after
//!   cycles began: connections, lazily opened files and the blocking
//!   thread pool exist by then).
//! - RSS: see [`rss_verdict`]. At rest the RSS of a healthy node wanders
//!   by a few MiB (malloc arenas of blocking-pool threads, which come and
//!   go), so a bound on the growth since warm-up ([`RSS_SLACK_MIB`]) and
//!   a trend over at least [`RSS_TREND_INTERVALS`] intervals catch a
//!   leak without flapping. A two-minute run leans on the exact counts;
//!   leaks of memory show in the long runs.
//!
//! The samples are printed as a table and written as JSON to
//! `$CARINA_TEST_LOG_DIR/soak.json` (default `target/test-logs/`), with the
//! node's log beside it. Everything (the node, mounts, the volume group,
//! loop devices, files) is released by guards, also when the run fails.

use std::fmt;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail, ensure};
use carina_proto::csi;
use carina_proto::csi::node_client::NodeClient;
use carina_proto::csi::volume_capability::access_mode::Mode;
use carina_proto::csi::volume_capability::{AccessMode, AccessType, BlockVolume};
use carina_proto::nodestorage as pb;
use carina_tests::cluster::{NodeArgs, Pki, Service};
use carina_tests::csi::mount_cap;
use carina_tests::grpc::{Client, create_lv};
use carina_tests::process::tail;
use carina_tests::soak::{
    Cycles, Sample, check, gpt_partitions, header, mountinfo, row, sample_interval, soak_duration,
};
use carina_tests::{
    LoopDisk, VgGuard, have_root, is_disk_or_partition, loops_backed_by, lvm, run, unique,
};
use serde::Serialize;
use tokio::sync::Barrier;
use tokio::task::JoinSet;
use tonic::transport::Channel;

const MIB: u64 = 1 << 20;
/// Workers cycling volumes at once.
const WORKERS: usize = 4;
/// The LVM disk; at most [`WORKERS`] volumes exist at once.
const LVM_DISK_BYTES: u64 = 512 * MIB;
/// Each RAW disk.
const RAW_DISK_BYTES: u64 = 256 * MIB;
/// Whether each worker makes its RAW volumes on a disk (and group) of its
/// own. They share one: a CreateLV or DeleteLV on it runs `sfdisk`,
/// which holds the whole disk exclusively for its table write, and for
/// those milliseconds the kernel refuses exclusive opens of the disk's
/// partitions, so another worker's NodeStageVolume meets a busy device at
/// `mkfs` or `mount`. The node tries such a step again (`while_busy` in
/// the CSI node); with one disk per worker the soak would not see it.
const RAW_DISK_PER_WORKER: bool = false;
const VOLUME_BYTES: u64 = 32 * MIB;
/// Written, fsynced and read back per cycle.
const WRITE_BYTES: usize = 4 << 20;
/// No single step (an RPC, the write) may take longer.
const STEP_TIMEOUT: Duration = Duration::from_secs(120);

// ---------------------------------------------------------------------------
// What a cycle does
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Policy {
    Lvm,
    Raw,
    Host,
}

const POLICIES: [Policy; 3] = [Policy::Lvm, Policy::Raw, Policy::Host];

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Policy::Lvm => "LVM",
            Policy::Raw => "RAW",
            Policy::Host => "HOST",
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    Block,
    Filesystem,
}

impl fmt::Display for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Access::Block => "block",
            Access::Filesystem => "filesystem",
        })
    }
}

/// Cycle `n` of worker `w`: the policies in turn (each worker starting
/// at another), and for LVM and RAW block and filesystem access in turn;
/// a HOST directory has no block access.
fn plan(w: usize, n: u64) -> (Policy, Access) {
    let k = w as u64 + n;
    let policy = POLICIES[(k % 3) as usize];
    let access = if policy != Policy::Host && (k / 3) % 2 == 1 {
        Access::Block
    } else {
        Access::Filesystem
    };
    (policy, access)
}

fn block_cap() -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_type: Some(AccessType::Block(BlockVolume {})),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    }
}

fn capability(access: Access) -> csi::VolumeCapability {
    match access {
        Access::Block => block_cap(),
        // The driver's default filesystem.
        Access::Filesystem => mount_cap(""),
    }
}

/// `len` bytes of a xorshift sequence from `seed`.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Held (read) while a worker has a target open, (write) to fork.
static TARGETS: RwLock<()> = RwLock::new(());

/// FNV-1a, 64 bits.
fn checksum(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Writes [`WRITE_BYTES`] at the published `target` (the device node
/// itself, or a file in the mounted directory), fsyncs, and reads them
/// back; a block device's buffers are flushed first, so the read comes
/// from the device.
///
/// A child process forked while another worker has its target open holds
/// that fd until it execs; under load that lasted until the other
/// worker's NodeUnpublishVolume, whose `umount` failed "target is busy"
/// (once in 800 block cycles). So targets are open under [`TARGETS`]'s
/// read lock and `blockdev` runs under its write lock: this process never
/// forks while a target is open.
fn write_and_verify(target: &Path, access: Access, seed: u64) -> Result<()> {
    let data = pattern(seed, WRITE_BYTES);
    let path = match access {
        Access::Block => target.to_path_buf(),
        Access::Filesystem => target.join("soak.dat"),
    };
    let open = TARGETS.read().unwrap_or_else(PoisonError::into_inner);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(access == Access::Filesystem)
        .truncate(access == Access::Filesystem)
        .open(&path)
        .with_context(|| format!("open {} for writing", path.display()))?;
    f.write_all(&data)
        .with_context(|| format!("write {}", path.display()))?;
    f.sync_all()
        .with_context(|| format!("fsync {}", path.display()))?;
    drop(f);
    drop(open);
    if access == Access::Block {
        let _no_target_open = TARGETS.write().unwrap_or_else(PoisonError::into_inner);
        run("blockdev", &["--flushbufs", &path.to_string_lossy()])?;
    }
    let _open = TARGETS.read().unwrap_or_else(PoisonError::into_inner);
    let mut back = Vec::with_capacity(WRITE_BYTES);
    std::fs::File::open(&path)
        .and_then(|f| f.take(WRITE_BYTES as u64).read_to_end(&mut back))
        .with_context(|| format!("read back {}", path.display()))?;
    let (wrote, read) = (checksum(&data), checksum(&back));
    ensure!(
        wrote == read && back.len() == WRITE_BYTES,
        "read back {} bytes with checksum {read:016x}, wrote {WRITE_BYTES} with {wrote:016x}",
        back.len()
    );
    Ok(())
}

/// Runs one step with [`STEP_TIMEOUT`]; an error or timeout names it.
async fn step<T, E: fmt::Display>(
    what: impl fmt::Display,
    call: impl std::future::Future<Output = std::result::Result<T, E>>,
) -> Result<T> {
    match tokio::time::timeout(STEP_TIMEOUT, call).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(anyhow!("{what} failed: {e}")),
        Err(_) => Err(anyhow!("{what} did not finish within {STEP_TIMEOUT:?}")),
    }
}

/// What workers and the sampler share: the pause between cycles and the
/// cycle counts.
struct Shared {
    pause: AtomicBool,
    stop: AtomicBool,
    /// Every worker is between cycles, and the sampler may measure.
    at_rest: Barrier,
    /// The sampler is done.
    resume: Barrier,
    /// Cycles done: LVM, RAW, HOST, then block, filesystem.
    done: [AtomicU64; 5],
}

impl Shared {
    fn new() -> Shared {
        Shared {
            pause: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            at_rest: Barrier::new(WORKERS + 1),
            resume: Barrier::new(WORKERS + 1),
            done: Default::default(),
        }
    }

    fn count(&self, policy: Policy, access: Access) {
        let p = POLICIES.iter().position(|p| *p == policy).unwrap_or(0);
        let a = if access == Access::Block { 3 } else { 4 };
        self.done[p].fetch_add(1, Ordering::SeqCst);
        self.done[a].fetch_add(1, Ordering::SeqCst);
    }

    fn cycles(&self) -> Cycles {
        let n = |i: usize| self.done[i].load(Ordering::SeqCst);
        Cycles {
            lvm: n(0),
            raw: n(1),
            host: n(2),
            block: n(3),
            filesystem: n(4),
        }
    }
}

/// One worker's clients and where its volumes go.
struct Worker {
    id: usize,
    storage: Client,
    csi: NodeClient<Channel>,
    node: String,
    groups: [String; 3],
    /// Staging and pod directories are made under here.
    kubelet: PathBuf,
    shared: Arc<Shared>,
}

impl Worker {
    async fn run(mut self) -> Result<()> {
        let mut n = 0u64;
        loop {
            if self.shared.pause.load(Ordering::SeqCst) {
                self.shared.at_rest.wait().await;
                self.shared.resume.wait().await;
            }
            if self.shared.stop.load(Ordering::SeqCst) {
                return Ok(());
            }
            let (policy, access) = plan(self.id, n);
            self.cycle(n, policy, access).await?;
            self.shared.count(policy, access);
            n += 1;
        }
    }

    async fn cycle(&mut self, n: u64, policy: Policy, access: Access) -> Result<()> {
        let name = unique("soak");
        let id = format!("{name}@{}", self.node);
        let at = |step: &str| {
            format!(
                "worker {} cycle {n}: {step} of {policy} {access} volume {id}",
                self.id
            )
        };
        let group = self.groups[POLICIES.iter().position(|p| *p == policy).unwrap_or(0)].clone();
        step(
            at("CreateLV"),
            self.storage
                .create_lv(create_lv(&name, &group, VOLUME_BYTES)),
        )
        .await?;

        let staging = self.kubelet.join("staging").join(&name);
        let pod = self.kubelet.join("pods").join(&name);
        std::fs::create_dir_all(&pod).with_context(|| at("create the pod directory"))?;
        let target = pod.join(match access {
            Access::Block => "dev",
            Access::Filesystem => "mount",
        });
        let path = |p: &Path| p.to_string_lossy().into_owned();
        step(
            at("NodeStageVolume"),
            self.csi.node_stage_volume(csi::NodeStageVolumeRequest {
                volume_id: id.clone(),
                staging_target_path: path(&staging),
                volume_capability: Some(capability(access)),
                ..Default::default()
            }),
        )
        .await?;
        step(
            at("NodePublishVolume"),
            self.csi.node_publish_volume(csi::NodePublishVolumeRequest {
                volume_id: id.clone(),
                staging_target_path: path(&staging),
                target_path: path(&target),
                volume_capability: Some(capability(access)),
                ..Default::default()
            }),
        )
        .await?;

        let (t, seed) = (target.clone(), checksum(name.as_bytes()));
        step(at("write, fsync and read back"), async move {
            tokio::task::spawn_blocking(move || write_and_verify(&t, access, seed))
                .await
                .map_err(anyhow::Error::from)
                .and_then(|r| r)
                .map_err(|e| format!("{e:#}"))
        })
        .await?;

        step(
            at("NodeUnpublishVolume"),
            self.csi
                .node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
                    volume_id: id.clone(),
                    target_path: path(&target),
                }),
        )
        .await?;
        step(
            at("NodeUnstageVolume"),
            self.csi.node_unstage_volume(csi::NodeUnstageVolumeRequest {
                volume_id: id.clone(),
                staging_target_path: path(&staging),
            }),
        )
        .await?;
        // What kubelet removes; a directory still mounted refuses.
        for dir in [&staging, &pod] {
            match std::fs::remove_dir(dir) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    bail!("{}: {e}", at(&format!("remove {}", dir.display())));
                }
                _ => {}
            }
        }
        step(
            at("DeleteLV"),
            self.storage
                .delete_lv(pb::DeleteLvRequest { name: name.clone() }),
        )
        .await?;
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// The node and its storage
// ---------------------------------------------------------------------------

/// Unmounts (lazily, deepest first) every mount under `root` on drop.
struct Unmounter {
    root: PathBuf,
}

impl Drop for Unmounter {
    fn drop(&mut self) {
        let mut mounts: Vec<PathBuf> = mountinfo("self")
            .into_iter()
            .map(|m| m.target)
            .filter(|t| t.starts_with(&self.root))
            .collect();
        mounts.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        for m in mounts {
            let _ = run("umount", &["-l", &m.to_string_lossy()]);
        }
    }
}

/// A running `carina-node` with its groups: one LVM, one HOST, and one
/// RAW group for all workers or one per worker (see
/// [`RAW_DISK_PER_WORKER`]). Fields drop in order:
/// the node stops, the test mounts go, then the VG, the disks and files.
struct Rig {
    node: Service,
    args: NodeArgs,
    pki: Pki,
    _unmount: Unmounter,
    lvm_group: String,
    host_group: String,
    raw_groups: Vec<String>,
    host_root: PathBuf,
    kubelet: PathBuf,
    dir: PathBuf,
    _vg: VgGuard,
    lvm_disk: LoopDisk,
    raw_disks: Vec<LoopDisk>,
    _dir: tempfile::TempDir,
}

impl Rig {
    async fn start(log: &Path) -> Result<Rig> {
        let tmp = tempfile::Builder::new().prefix("carina-soak-").tempdir()?;
        let dir = tmp.path().canonicalize()?;
        let raw_count = if RAW_DISK_PER_WORKER { WORKERS } else { 1 };
        let raw_disks = (0..raw_count)
            .map(|_| LoopDisk::new(RAW_DISK_BYTES))
            .collect::<Result<Vec<_>>>()?;
        let lvm_disk = LoopDisk::new(LVM_DISK_BYTES)?;
        let (lvm_group, host_group) = (unique("soak-lvm"), unique("soak-host"));
        let raw_groups: Vec<String> = raw_disks.iter().map(|_| unique("soak-raw")).collect();
        let vg = VgGuard::new(&lvm_group, &[&lvm_disk]);
        let host_root = dir.join("host");
        let kubelet = dir.join("kubelet");
        std::fs::create_dir_all(&host_root)?;
        // kubelet makes the staging directory's parent.
        std::fs::create_dir_all(kubelet.join("staging"))?;
        let disk = |group: &str, policy: &str, d: &LoopDisk| {
            format!(
                r#"{{"name":"{group}","re":["{}"],"policy":"{policy}","reserveBytes":0,"minDiskBytes":1048576}}"#,
                d.pattern()
            )
        };
        let mut selectors = vec![
            disk(&lvm_group, "LVM", &lvm_disk),
            format!(
                r#"{{"name":"{host_group}","policy":"HOST","root":"{}","reserveBytes":0}}"#,
                host_root.display()
            ),
        ];
        for (group, d) in raw_groups.iter().zip(&raw_disks) {
            selectors.push(disk(group, "RAW", d));
        }
        let config = format!(
            r#"{{"diskSelector":[{}],"diskScanInterval":"0"}}"#,
            selectors.join(",")
        );
        let pki = Pki::write(&dir.join("pki"))?;
        let args = NodeArgs::new(&unique("soak-node"), &pki, &config, &dir.join("node"), log)?;
        let node = args.start().await?;
        Ok(Rig {
            node,
            args,
            pki,
            _unmount: Unmounter { root: dir.clone() },
            lvm_group,
            host_group,
            raw_groups,
            host_root,
            kubelet,
            dir,
            _vg: vg,
            lvm_disk,
            raw_disks,
            _dir: tmp,
        })
    }

    async fn storage(&self) -> Result<Client> {
        self.pki
            .node_client(&self.args.name, &self.args.endpoint())
            .await
    }

    async fn worker(&self, id: usize, shared: &Arc<Shared>) -> Result<Worker> {
        Ok(Worker {
            id,
            storage: self.storage().await?,
            csi: NodeClient::new(self.node.channel().await?),
            node: self.args.name.clone(),
            groups: [
                self.lvm_group.clone(),
                self.raw_groups[id % self.raw_groups.len()].clone(),
                self.host_group.clone(),
            ],
            kubelet: self.kubelet.clone(),
            shared: shared.clone(),
        })
    }

    /// Measures the node and its storage (the workers are at rest).
    async fn sample(&mut self, client: &mut Client, secs: f64, cycles: Cycles) -> Result<Sample> {
        self.node.check_running()?;
        let pid = self.node.pid().context("the node is not running")?;
        let volume_names: Vec<String> = client
            .list_l_vs(pb::ListLVsRequest::default())
            .await
            .context("ListLVs")?
            .into_inner()
            .volumes
            .into_iter()
            .map(|v| format!("{} in {}", v.name, v.device_group))
            .collect();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        let field = |name: &str| -> Result<u64> {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok())
                .with_context(|| format!("{name} in /proc/{pid}/status"))
        };
        let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))?.count();
        let lvs = lvm(
            &[&self.lvm_disk.dev()],
            &["lvs", "--noheadings", "-o", "lv_name", &self.lvm_group],
        )?
        .lines()
        .filter(|l| !l.trim().is_empty())
        .count();
        let (mut partitions, mut kernel_partitions) = (0, 0);
        for d in &self.raw_disks {
            partitions += gpt_partitions(&d.dev())?;
            let prefix = format!("{}p", d.name);
            kernel_partitions += std::fs::read_dir(format!("/sys/block/{}", d.name))?
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
                .count();
        }
        let host_dirs = std::fs::read_dir(&self.host_root)?
            .flatten()
            .filter(|e| e.file_name() != ".carina")
            .count();
        let all_loops = run("losetup", &["-n", "-O", "NAME,BACK-FILE", "-l"])?;
        let disks: Vec<&LoopDisk> = std::iter::once(&self.lvm_disk)
            .chain(&self.raw_disks)
            .collect();
        let loops = all_loops
            .lines()
            .filter(|l| {
                let back = l.split_whitespace().nth(1).unwrap_or_default();
                disks.iter().any(|d| Path::new(back) == d.file())
            })
            .count()
            + disks
                .iter()
                .map(|d| loops_backed_by(&d.dev()).len())
                .sum::<usize>();
        let mounts = mountinfo(&pid.to_string());
        let mapper = format!("/dev/mapper/{}-", self.lvm_group.replace('-', "--"));
        let ours = mounts
            .iter()
            .filter(|m| {
                m.target.starts_with(&self.dir)
                    || m.source.starts_with(&mapper)
                    || disks
                        .iter()
                        .any(|d| is_disk_or_partition(&m.source, &d.dev()))
            })
            .count();
        Ok(Sample {
            secs,
            cycles,
            rss_kib: field("VmRSS:")?,
            fds,
            threads: field("Threads:")?,
            volumes: volume_names.len(),
            volume_names,
            lvs,
            partitions,
            kernel_partitions,
            host_dirs,
            loops,
            mounts: ours,
            loops_total: all_loops.lines().count(),
            mounts_total: mounts.len(),
        })
    }
}

#[derive(Serialize)]
struct Report<'a> {
    duration_secs: f64,
    interval_secs: f64,
    workers: usize,
    volume_bytes: u64,
    write_bytes: usize,
    cycles_per_minute: f64,
    verdict: String,
    node_log: &'a Path,
    samples: &'a [Sample],
}

fn log_dir() -> PathBuf {
    carina_tests::test_log_dir()
}

/// A worker's end, for the error: a failure names its step.
fn worker_end(r: Option<std::result::Result<Result<()>, tokio::task::JoinError>>) -> anyhow::Error {
    match r {
        Some(Ok(Err(e))) => e,
        Some(Ok(Ok(()))) => anyhow!("a worker stopped before it was told to"),
        Some(Err(e)) => anyhow!("a worker panicked: {e}"),
        None => anyhow!("no workers left"),
    }
}

/// The workers' loop and the samples at rest; returns the samples taken
/// (also when it fails: then with the error).
async fn soak(rig: &mut Rig, duration: Duration, samples: &mut Vec<Sample>) -> Result<()> {
    let interval = sample_interval(duration);
    let shared = Arc::new(Shared::new());
    let mut client = rig.storage().await?;
    let mut workers = JoinSet::new();
    let mut ready = Vec::new();
    for id in 0..WORKERS {
        ready.push(rig.worker(id, &shared).await?);
    }
    println!("{}", header());
    let started = Instant::now();
    samples.push(rig.sample(&mut client, 0.0, shared.cycles()).await?);
    println!("{}", row(&samples[0], None));
    for w in ready {
        workers.spawn(w.run());
    }
    let count = (duration.as_secs_f64() / interval.as_secs_f64()).round() as u32;
    for k in 1..=count {
        let due = tokio::time::Instant::from_std(started + interval * k);
        tokio::select! {
            _ = tokio::time::sleep_until(due) => {}
            r = workers.join_next() => return Err(worker_end(r)),
        }
        shared.pause.store(true, Ordering::SeqCst);
        tokio::select! {
            _ = shared.at_rest.wait() => {}
            r = workers.join_next() => return Err(worker_end(r)),
        }
        let s = rig
            .sample(
                &mut client,
                started.elapsed().as_secs_f64(),
                shared.cycles(),
            )
            .await?;
        println!("{}", row(&s, samples.last()));
        samples.push(s);
        check(samples)?;
        if k == count {
            shared.stop.store(true, Ordering::SeqCst);
        }
        shared.pause.store(false, Ordering::SeqCst);
        shared.resume.wait().await;
    }
    while let Some(r) = workers.join_next().await {
        r??;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_soak_at_rest_nothing_grows() -> Result<()> {
    if !have_root("node_soak_at_rest_nothing_grows") {
        return Ok(());
    }
    let duration = soak_duration(std::env::var("CARINA_SOAK_DURATION").ok().as_deref())?;
    let logs = log_dir();
    let node_log = logs.join("soak-node.log");
    let mut rig = Rig::start(&node_log).await?;
    println!(
        "soak: {WORKERS} workers for {duration:?}, a sample every {:?}; node {} (log {})",
        sample_interval(duration),
        rig.args.name,
        node_log.display()
    );
    let mut samples = Vec::new();
    let outcome = soak(&mut rig, duration, &mut samples).await;
    let (first, last) = (samples.first(), samples.last());
    let cycles_per_minute = match (first, last) {
        (Some(f), Some(l)) if l.secs > f.secs => l.cycles.total() as f64 * 60.0 / l.secs,
        _ => 0.0,
    };
    let verdict = match &outcome {
        Ok(()) => "pass".to_string(),
        Err(e) => format!("fail: {e:#}"),
    };
    let report = Report {
        duration_secs: duration.as_secs_f64(),
        interval_secs: sample_interval(duration).as_secs_f64(),
        workers: WORKERS,
        volume_bytes: VOLUME_BYTES,
        write_bytes: WRITE_BYTES,
        cycles_per_minute,
        verdict,
        node_log: &node_log,
        samples: &samples,
    };
    let json = logs.join("soak.json");
    std::fs::write(&json, serde_json::to_string_pretty(&report)?)?;
    if let (Some(f), Some(l)) = (samples.get(1).or(first), last) {
        println!(
            "soak: {} cycles ({} LVM, {} RAW, {} HOST; {} block, {} filesystem), {cycles_per_minute:.1} cycles/min; RSS {:.1} -> {:.1} MiB from warm-up; fds {} -> {}; report {}",
            l.cycles.total(),
            l.cycles.lvm,
            l.cycles.raw,
            l.cycles.host,
            l.cycles.block,
            l.cycles.filesystem,
            f.rss_kib as f64 / 1024.0,
            l.rss_kib as f64 / 1024.0,
            f.fds,
            l.fds,
            json.display()
        );
    }
    outcome.map_err(|e| {
        anyhow!(
            "{e:#}\nnode log ({}), last lines:\n{}",
            node_log.display(),
            tail(&node_log, 20)
        )
    })?;
    rig.node.stop().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_worker_cycles_every_policy_and_both_accesses() {
        for w in 0..WORKERS {
            let plans: Vec<_> = (0..6).map(|n| plan(w, n)).collect();
            for p in POLICIES {
                assert!(plans.iter().any(|(q, _)| *q == p), "worker {w}: {plans:?}");
            }
            for (p, a) in [(Policy::Lvm, Access::Block), (Policy::Raw, Access::Block)] {
                assert!(plans.contains(&(p, a)), "worker {w}: {plans:?}");
            }
            assert!(!plans.contains(&(Policy::Host, Access::Block)));
        }
    }

    #[test]
    fn checksums_tell_patterns_apart() {
        let a = pattern(1, 4096);
        assert_eq!(a.len(), 4096);
        assert_eq!(checksum(&a), checksum(&pattern(1, 4096)));
        assert_ne!(checksum(&a), checksum(&pattern(2, 4096)));
    }
}
