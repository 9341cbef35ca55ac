//! Per-pod IO limits on this node's volumes.
//!
//! The node holds no Kubernetes credentials: a caller (the control plane
//! watching Pods, or an operator with `carinactl`) says which pod UID gets
//! which limits on which volume, and the engine writes them into that
//! pod's cgroup for the volume's device ([`cgroup`] does the kernel side).
//! Nothing is recorded besides the cgroups themselves: what is listed is
//! read back from them, a pod's limits vanish with its cgroup, and a
//! restarted node reports what is in force.
//!
//! The kernel throttles whole disks: a RAW volume's (a partition's) limits
//! go on its disk, so a pod's limits on RAW volumes of one disk are one
//! rule, listed under each of those volumes.

pub mod cgroup;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use tracing::instrument;

pub use self::cgroup::{Hierarchy, Limits};
use super::Engine;
use super::error::{Error, Result};

/// Where the cgroup hierarchies are mounted unless told otherwise.
pub const DEFAULT_CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// A pod's limits on one volume, as read back from its cgroup.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PodLimit {
    pub pod_uid: String,
    pub volume: String,
    pub major: u32,
    pub minor: u32,
    pub limits: Limits,
    pub cgroup: PathBuf,
    pub cgroup_version: u32,
    /// cgroups carrying the rule (the pod's, and on v1 each below it).
    pub cgroups: u32,
    /// cgroups that should carry it.
    pub cgroups_expected: u32,
}

/// The node's block volumes by the device their limits go on.
type Devices = BTreeMap<(u32, u32), Vec<String>>;

/// The device the kernel throttles for a volume's `dev`: the device
/// itself, or for a partition its disk (block IO throttling works per
/// disk and refuses partitions with `ENODEV`), read from `sys`/dev/block.
pub fn throttled_device(sys: &Path, dev: (u32, u32)) -> Result<(u32, u32)> {
    let node = sys.join(format!("dev/block/{}:{}", dev.0, dev.1));
    if !node.join("partition").exists() {
        return Ok(dev);
    }
    let parent = node.join("../dev");
    let text = std::fs::read_to_string(&parent).map_err(|e| Error::io("read", &parent, e))?;
    let (major, minor) = text
        .trim()
        .split_once(':')
        .ok_or_else(|| Error::parse(parent.display().to_string(), "not MAJ:MIN"))?;
    let n = |x: &str| {
        x.parse::<u32>()
            .map_err(|_| Error::parse(parent.display().to_string(), "not MAJ:MIN"))
    };
    Ok((n(major)?, n(minor)?))
}

const SYS: &str = "/sys";

impl Engine {
    fn cgroup_root(&self) -> PathBuf {
        self.inner.cgroup_root.clone()
    }

    /// This node's block volumes by the device their limits go on.
    async fn volume_devices(&self) -> Result<Devices> {
        let mut devices = Devices::new();
        for v in self.list_volumes(None).await? {
            if v.device_path.is_none() || (v.major, v.minor) == (0, 0) {
                continue;
            }
            // A partition gone meanwhile (deleted) has no limits to show.
            if let Ok(dev) = throttled_device(Path::new(SYS), (v.major, v.minor)) {
                devices.entry(dev).or_default().push(v.name);
            }
        }
        Ok(devices)
    }

    /// Sets `pod_uid`'s limits on `volume` (all zero removes them) and
    /// returns them as read back; `None` when they were removed.
    #[instrument(skip(self), err(level = "info"))]
    pub async fn set_pod_io_limits(
        &self,
        pod_uid: &str,
        volume: &str,
        limits: Limits,
    ) -> Result<Option<PodLimit>> {
        check_uid(pod_uid)?;
        let v = self.get_volume(volume).await?;
        if v.device_path.is_none() || (v.major, v.minor) == (0, 0) {
            return Err(Error::FailedPrecondition {
                operation: "IO limits",
                name: volume.to_string(),
                reason: format!(
                    "a {} volume is a directory without a block device of its own; \
                     IO limits apply to block devices (LVM and RAW volumes)",
                    v.policy
                ),
            });
        }
        let (root, uid, name) = (self.cgroup_root(), pod_uid.to_string(), v.name.clone());
        let dev = throttled_device(Path::new(SYS), (v.major, v.minor))?;
        blocking("setting IO limits", move || {
            let h = Hierarchy::detect(&root)?;
            let pod = find_pod(&h, &uid)?;
            let written = h.write(&pod, dev, limits).map_err(|e| with_uid(e, &uid))?;
            tracing::info!(
                k8s.pod.uid = %uid,
                cgroup = %pod.display(),
                cgroups = written,
                device = %format_args!("{}:{}", dev.0, dev.1),
                ?limits,
                "IO limits written"
            );
            let devices = Devices::from([(dev, vec![name])]);
            Ok(read_pod(&h, &uid, &pod, &devices)
                .map_err(|e| with_uid(e, &uid))?
                .into_iter()
                .next())
        })
        .await
    }

    /// Removes `pod_uid`'s limits on this node's volumes (only on
    /// `volume` when given); returns how many devices had some. A pod
    /// without a cgroup has none.
    #[instrument(skip(self), err(level = "info"))]
    pub async fn clear_pod_io_limits(&self, pod_uid: &str, volume: Option<&str>) -> Result<u32> {
        check_uid(pod_uid)?;
        let mut devices = self.volume_devices().await?;
        if let Some(volume) = volume {
            let v = self.get_volume(volume).await?;
            devices.retain(|_, names| names.contains(&v.name));
        }
        let (root, uid) = (self.cgroup_root(), pod_uid.to_string());
        blocking("clearing IO limits", move || {
            // Without a block IO controller no pod has limits.
            let Ok(h) = Hierarchy::detect(&root) else {
                return Ok(0);
            };
            let Some(pod) = h.pod(&uid) else {
                return Ok(0);
            };
            let mut cleared = 0;
            let mut devs: Vec<(u32, u32)> = read_pod(&h, &uid, &pod, &devices)?
                .iter()
                .map(|l| (l.major, l.minor))
                .collect();
            devs.dedup();
            for dev in devs {
                match h.write(&pod, dev, Limits::default()) {
                    Ok(_) => cleared += 1,
                    // Gone meanwhile: its limits went with it.
                    Err(Error::PodNotFound { .. }) => return Ok(cleared),
                    Err(e) => return Err(with_uid(e, &uid)),
                }
            }
            tracing::info!(k8s.pod.uid = %uid, cleared, "IO limits removed");
            Ok(cleared)
        })
        .await
    }

    /// The limits in force on this node's volumes (one pod's, or all).
    #[instrument(skip(self), err(level = "info"))]
    pub async fn pod_io_limits(&self, pod_uid: Option<&str>) -> Result<Vec<PodLimit>> {
        if let Some(uid) = pod_uid {
            check_uid(uid)?;
        }
        let devices = self.volume_devices().await?;
        let (root, only) = (self.cgroup_root(), pod_uid.map(str::to_string));
        blocking("listing IO limits", move || {
            let h = Hierarchy::detect(&root)?;
            let pods = match only {
                Some(uid) => h.pod(&uid).map(|p| (uid, p)).into_iter().collect(),
                None => h.pods(),
            };
            let mut all = Vec::new();
            for (uid, pod) in pods {
                match read_pod(&h, &uid, &pod, &devices) {
                    Ok(limits) => all.extend(limits),
                    // Deleted while listing.
                    Err(Error::PodNotFound { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
            all.sort_by(|a, b| (&a.pod_uid, &a.volume).cmp(&(&b.pod_uid, &b.volume)));
            Ok(all)
        })
        .await
    }
}

fn check_uid(uid: &str) -> Result<()> {
    if cgroup::valid_uid(uid) {
        Ok(())
    } else {
        Err(Error::invalid(
            "pod_uid",
            format!("{uid:?} is not a pod UID (1 to 128 letters, digits and dashes)"),
        ))
    }
}

fn find_pod(h: &Hierarchy, uid: &str) -> Result<PathBuf> {
    h.pod(uid).ok_or_else(|| Error::PodNotFound {
        pod_uid: uid.to_string(),
        reason: format!(
            "no cgroup of the pod in the cgroup v{} hierarchy (not started yet, or gone)",
            h.version()
        ),
    })
}

fn with_uid(e: Error, uid: &str) -> Error {
    match e {
        Error::PodNotFound { reason, .. } => Error::PodNotFound {
            pod_uid: uid.to_string(),
            reason,
        },
        other => other,
    }
}

/// The limits in `pod`'s cgroup on `devices`, with how many of its
/// target cgroups carry each.
fn read_pod(h: &Hierarchy, uid: &str, pod: &Path, devices: &Devices) -> Result<Vec<PodLimit>> {
    let own = h.read(pod)?;
    let targets = h.targets(pod);
    let mut out = Vec::new();
    for (dev, limits) in own {
        let Some(volumes) = devices.get(&dev) else {
            continue;
        };
        let carrying = targets
            .iter()
            .filter(|dir| {
                h.read(dir)
                    .is_ok_and(|all| all.get(&dev).is_some_and(|l| *l == limits))
            })
            .count();
        out.extend(volumes.iter().map(|volume| PodLimit {
            pod_uid: uid.to_string(),
            volume: volume.clone(),
            major: dev.0,
            minor: dev.1,
            limits,
            cgroup: pod.to_path_buf(),
            cgroup_version: h.version(),
            cgroups: carrying as u32,
            cgroups_expected: targets.len() as u32,
        }));
    }
    Ok(out)
}

async fn blocking<T: Send + 'static>(
    what: &'static str,
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    let span = tracing::Span::current();
    tokio::task::spawn_blocking(move || span.in_scope(f))
        .await
        .map_err(|e| Error::task(what, e))?
}
