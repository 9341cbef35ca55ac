//! The kernel side of per-pod IO limits: finding a pod's cgroup and
//! reading and writing its block IO throttle files.
//!
//! - cgroup v1: the `blkio` hierarchy (`<root>/blkio`), one file per limit,
//!   `blkio.throttle.{read,write}_{bps,iops}_device`, each line
//!   `MAJ:MIN VALUE`; writing `MAJ:MIN 0` removes a rule.
//! - cgroup v2: the unified hierarchy at `<root>` with the `io` controller,
//!   one file `io.max`, each line `MAJ:MIN rbps=N wbps=N riops=N wiops=N`
//!   where `max` means no limit.
//!
//! A pod's cgroup is the directory the kubelet names after its UID:
//! `pod<uid>` with the cgroupfs driver, `kubepods[-<qos>]-pod<uid with _
//! for ->.slice` with the systemd driver, wherever the kubelet's cgroup
//! root and QoS levels put it. It is found by walking the hierarchy, so
//! neither the driver nor the kubelet's `cgroupRoot` has to be configured.
//! Everything here blocks; the engine calls it on the blocking pool.

use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use crate::engine::error::{Error, Result};

/// Deepest a pod's cgroup is looked for below the hierarchy's root
/// (`<cgroupRoot...>/kubepods/<qos>/pod<uid>` is 3 plus the root's depth).
const MAX_DEPTH: usize = 8;

/// The four limits of one device; zero means none.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Limits {
    pub read_bps: u64,
    pub write_bps: u64,
    pub read_iops: u64,
    pub write_iops: u64,
}

impl Limits {
    pub fn is_none(&self) -> bool {
        *self == Limits::default()
    }
}

/// Which cgroup version carries block IO limits on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hierarchy {
    /// The `blkio` controller's own hierarchy.
    V1 { blkio: PathBuf },
    /// The unified hierarchy with the `io` controller.
    V2 { root: PathBuf },
}

impl Hierarchy {
    /// The hierarchy under `root` (normally `/sys/fs/cgroup`): v1 when a
    /// `blkio` hierarchy with throttling is mounted there (hybrid setups
    /// bind `io` to it), otherwise v2 when the unified hierarchy offers
    /// `io`.
    pub fn detect(root: &Path) -> Result<Hierarchy> {
        let blkio = root.join("blkio");
        if blkio.join(V1_FILES[0].1).exists() {
            return Ok(Hierarchy::V1 { blkio });
        }
        let controllers = root.join("cgroup.controllers");
        match std::fs::read_to_string(&controllers) {
            Ok(c) if c.split_whitespace().any(|c| c == "io") => Ok(Hierarchy::V2 {
                root: root.to_path_buf(),
            }),
            _ => Err(Error::FailedPrecondition {
                operation: "IO limits",
                name: root.display().to_string(),
                reason: "neither a cgroup v1 blkio hierarchy with throttling nor a cgroup v2 \
                         hierarchy with the io controller is mounted there"
                    .to_string(),
            }),
        }
    }

    fn base(&self) -> &Path {
        match self {
            Hierarchy::V1 { blkio } => blkio,
            Hierarchy::V2 { root } => root,
        }
    }

    pub fn version(&self) -> u32 {
        match self {
            Hierarchy::V1 { .. } => 1,
            Hierarchy::V2 { .. } => 2,
        }
    }

    /// Every pod cgroup in the hierarchy, by UID.
    pub fn pods(&self) -> BTreeMap<String, PathBuf> {
        let mut found = BTreeMap::new();
        walk(self.base(), 0, &mut |uid, path| {
            found.insert(uid, path);
            false
        });
        found
    }

    /// The cgroup of pod `uid`, if the kubelet has made it.
    pub fn pod(&self, uid: &str) -> Option<PathBuf> {
        let mut found = None;
        walk(self.base(), 0, &mut |u, path| {
            if u == uid {
                found = Some(path);
                true
            } else {
                false
            }
        });
        found
    }

    /// The limits in force in the cgroup at `dir`, by device.
    pub fn read(&self, dir: &Path) -> Result<BTreeMap<(u32, u32), Limits>> {
        let mut all: BTreeMap<(u32, u32), Limits> = BTreeMap::new();
        match self {
            Hierarchy::V1 { .. } => {
                for (field, file) in V1_FILES {
                    let path = dir.join(file);
                    let text = read_file(&path)?;
                    for (dev, value) in parse_v1(&text).map_err(|r| Error::parse(file, r))? {
                        *field_mut(all.entry(dev).or_default(), field) = value;
                    }
                }
            }
            Hierarchy::V2 { .. } => {
                let text = read_file(&dir.join("io.max"))?;
                all = parse_v2(&text).map_err(|r| Error::parse("io.max", r))?;
            }
        }
        all.retain(|_, l| !l.is_none());
        Ok(all)
    }

    /// The cgroups a pod's limits go into: on v2 the pod's own (its
    /// limits bind everything below it); on v1, whose throttling is flat
    /// (a group's rules do not cover its children), the pod's and every
    /// cgroup below it (the containers), so each carries the rule itself.
    pub fn targets(&self, pod: &Path) -> Vec<PathBuf> {
        let mut dirs = vec![pod.to_path_buf()];
        if let Hierarchy::V1 { .. } = self {
            descendants(pod, 0, &mut dirs);
        }
        dirs
    }

    /// Sets the limits of `dev` to `limits` (all zero removes them) in
    /// every cgroup of [`Self::targets`], returning how many took them.
    /// A failure half-way restores what was already written; a container
    /// cgroup that goes away meanwhile is skipped, the pod's own going
    /// away is [`Error::PodNotFound`].
    pub fn write(&self, pod: &Path, dev: (u32, u32), limits: Limits) -> Result<usize> {
        let mut done: Vec<(PathBuf, Limits)> = Vec::new();
        for dir in self.targets(pod) {
            let before = match self.read(&dir) {
                Ok(mut all) => all.remove(&dev).unwrap_or_default(),
                Err(Error::PodNotFound { .. }) if dir != pod => continue,
                Err(e) => return Err(self.undo(e, dev, &done)),
            };
            match self.write_one(&dir, dev, &limits, &before) {
                Ok(()) => done.push((dir, before)),
                Err(Error::PodNotFound { .. }) if dir != pod => continue,
                Err(e) => return Err(self.undo(e, dev, &done)),
            }
        }
        Ok(done.len())
    }

    fn undo(&self, e: Error, dev: (u32, u32), done: &[(PathBuf, Limits)]) -> Error {
        for (dir, before) in done {
            let _ = self.write_one(dir, dev, before, &Limits::default());
        }
        e
    }

    /// One cgroup; v1 restores its own files written before a failure.
    fn write_one(
        &self,
        dir: &Path,
        dev: (u32, u32),
        limits: &Limits,
        before: &Limits,
    ) -> Result<()> {
        match self {
            Hierarchy::V1 { .. } => {
                for (i, (field, file)) in V1_FILES.iter().enumerate() {
                    let value = format!("{}:{} {}", dev.0, dev.1, field_of(limits, *field));
                    if let Err(e) = write_file(&dir.join(file), &value) {
                        for (field, file) in &V1_FILES[..i] {
                            let old = format!("{}:{} {}", dev.0, dev.1, field_of(before, *field));
                            let _ = write_file(&dir.join(file), &old);
                        }
                        return Err(e);
                    }
                }
                Ok(())
            }
            Hierarchy::V2 { .. } => write_file(&dir.join("io.max"), &format_v2(dev, limits)),
        }
    }
}

/// Every cgroup directory below `dir`.
fn descendants(dir: &Path, depth: usize, out: &mut Vec<PathBuf>) {
    if depth > MAX_DEPTH {
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            out.push(entry.path());
            descendants(&entry.path(), depth + 1, out);
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Field {
    ReadBps,
    WriteBps,
    ReadIops,
    WriteIops,
}

/// The v1 files, in the order they are written.
const V1_FILES: [(Field, &str); 4] = [
    (Field::ReadBps, "blkio.throttle.read_bps_device"),
    (Field::WriteBps, "blkio.throttle.write_bps_device"),
    (Field::ReadIops, "blkio.throttle.read_iops_device"),
    (Field::WriteIops, "blkio.throttle.write_iops_device"),
];

fn field_mut(l: &mut Limits, f: Field) -> &mut u64 {
    match f {
        Field::ReadBps => &mut l.read_bps,
        Field::WriteBps => &mut l.write_bps,
        Field::ReadIops => &mut l.read_iops,
        Field::WriteIops => &mut l.write_iops,
    }
}

fn field_of(l: &Limits, f: Field) -> u64 {
    let mut l = *l;
    *field_mut(&mut l, f)
}

/// A vanished file means the cgroup went away (the pod is gone). So does
/// `ENODEV` from a cgroup being removed: its files fail every operation
/// from the moment the removal begins, while its directory may still be
/// there for a moment. `ENODEV` from a live cgroup is something else (the
/// kernel refusing the device), told apart by whether the cgroup still
/// answers a read of its `cgroup.procs`.
fn gone(path: &Path, e: &std::io::Error) -> bool {
    let Some(dir) = path.parent() else {
        return true;
    };
    matches!(e.kind(), ErrorKind::NotFound)
        || !dir.exists()
        || (e.raw_os_error() == Some(libc::ENODEV)
            && std::fs::read(dir.join("cgroup.procs")).is_err())
}

fn read_file(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|e| {
        if gone(path, &e) {
            cgroup_gone(path)
        } else {
            Error::io("read", path, e)
        }
    })
}

fn write_file(path: &Path, value: &str) -> Result<()> {
    std::fs::write(path, value).map_err(|source| {
        if gone(path, &source) {
            cgroup_gone(path)
        } else {
            Error::Sysfs {
                path: path.to_path_buf(),
                value: value.to_string(),
                source,
            }
        }
    })
}

fn cgroup_gone(path: &Path) -> Error {
    Error::PodNotFound {
        pod_uid: String::new(),
        reason: format!(
            "its cgroup {} went away (the pod was deleted)",
            path.parent().unwrap_or(path).display()
        ),
    }
}

/// Walks the cgroup directories under `dir`, calling `found` with each
/// pod's UID and directory (not descending into pods); stops when it
/// returns true. Unreadable directories are skipped: cgroups come and go
/// while the walk runs.
fn walk(dir: &Path, depth: usize, found: &mut dyn FnMut(String, PathBuf) -> bool) -> bool {
    if depth > MAX_DEPTH {
        return false;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    for entry in entries.flatten() {
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        match pod_uid_of(name) {
            Some(uid) => {
                if found(uid, entry.path()) {
                    return true;
                }
            }
            None => {
                if walk(&entry.path(), depth + 1, found) {
                    return true;
                }
            }
        }
    }
    false
}

/// The pod UID a kubelet cgroup directory is named after, for either
/// cgroup driver: `pod<uid>` (cgroupfs) or `kubepods[-<qos>]-pod<uid with
/// _ for ->.slice` (systemd).
pub fn pod_uid_of(name: &str) -> Option<String> {
    let uid = if let Some(uid) = name.strip_prefix("pod") {
        uid.to_string()
    } else {
        let stem = name.strip_suffix(".slice")?;
        if !stem.starts_with("kubepods") {
            return None;
        }
        let (_, uid) = stem.rsplit_once("-pod")?;
        uid.replace('_', "-")
    };
    valid_uid(&uid).then_some(uid)
}

/// Whether `uid` can be a Kubernetes UID (letters, digits, dashes; what
/// is safe to look for as a directory name).
pub fn valid_uid(uid: &str) -> bool {
    !uid.is_empty()
        && uid.len() <= 128
        && uid.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

fn parse_dev(s: &str) -> Result<(u32, u32), String> {
    let (major, minor) = s
        .split_once(':')
        .ok_or_else(|| format!("{s:?} is not MAJ:MIN"))?;
    let n = |x: &str| {
        x.parse::<u32>()
            .map_err(|_| format!("{s:?} is not MAJ:MIN"))
    };
    Ok((n(major)?, n(minor)?))
}

/// A block device's (major, minor).
pub type Dev = (u32, u32);

/// Lines `MAJ:MIN VALUE` of a v1 throttle file.
pub fn parse_v1(text: &str) -> Result<Vec<(Dev, u64)>, String> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let mut parts = line.split_whitespace();
            let (dev, value) = (parts.next(), parts.next());
            match (dev, value, parts.next()) {
                (Some(dev), Some(value), None) => Ok((
                    parse_dev(dev)?,
                    value
                        .parse()
                        .map_err(|_| format!("{value:?} in {line:?} is not a number"))?,
                )),
                _ => Err(format!("{line:?} is not \"MAJ:MIN VALUE\"")),
            }
        })
        .collect()
}

/// Lines `MAJ:MIN rbps=N wbps=N riops=N wiops=N` of `io.max`.
pub fn parse_v2(text: &str) -> Result<BTreeMap<(u32, u32), Limits>, String> {
    let mut all = BTreeMap::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let mut parts = line.split_whitespace();
        let dev = parse_dev(parts.next().unwrap_or_default())?;
        let mut limits = Limits::default();
        for kv in parts {
            let (key, value) = kv
                .split_once('=')
                .ok_or_else(|| format!("{kv:?} in {line:?} is not key=value"))?;
            let value = match value {
                "max" => 0,
                v => v
                    .parse()
                    .map_err(|_| format!("{kv:?} in {line:?} is not a number"))?,
            };
            let field = match key {
                "rbps" => Field::ReadBps,
                "wbps" => Field::WriteBps,
                "riops" => Field::ReadIops,
                "wiops" => Field::WriteIops,
                _ => continue,
            };
            *field_mut(&mut limits, field) = value;
        }
        all.insert(dev, limits);
    }
    Ok(all)
}

/// The `io.max` line that sets `limits` on `dev` (`max` for none).
pub fn format_v2(dev: (u32, u32), limits: &Limits) -> String {
    let v = |n: u64| {
        if n == 0 {
            "max".to_string()
        } else {
            n.to_string()
        }
    };
    format!(
        "{}:{} rbps={} wbps={} riops={} wiops={}",
        dev.0,
        dev.1,
        v(limits.read_bps),
        v(limits.write_bps),
        v(limits.read_iops),
        v(limits.write_iops)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0b0e005c-39ec-4719-bbfe-78aadbc3e4ad";

    #[test]
    fn pod_directories_of_both_drivers() {
        assert_eq!(pod_uid_of(&format!("pod{UID}")).as_deref(), Some(UID));
        let systemd = UID.replace('-', "_");
        for qos in ["kubepods", "kubepods-burstable", "kubepods-besteffort"] {
            assert_eq!(
                pod_uid_of(&format!("{qos}-pod{systemd}.slice")).as_deref(),
                Some(UID),
                "{qos}"
            );
        }
        for not in [
            "kubepods",
            "burstable",
            "kubepods.slice",
            "kubepods-burstable.slice",
            "pod",
            "pod../x",
            "system-pod1.slice",
            "cri-containerd-abc.scope",
        ] {
            assert_eq!(pod_uid_of(not), None, "{not}");
        }
    }

    #[test]
    fn v1_lines_parse_and_refuse_garbage() {
        assert_eq!(
            parse_v1("7:3 1048576\n259:12 10\n").expect("parses"),
            vec![((7, 3), 1048576), ((259, 12), 10)]
        );
        assert_eq!(parse_v1("").expect("parses"), vec![]);
        for bad in ["7:3", "7 3", "7:x 1", "7:3 -1", "7:3 1 2"] {
            assert!(parse_v1(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn v2_lines_round_trip_with_max_for_none() {
        let l = Limits {
            read_bps: 2097152,
            write_bps: 0,
            read_iops: 0,
            write_iops: 120,
        };
        let line = format_v2((8, 16), &l);
        assert_eq!(line, "8:16 rbps=2097152 wbps=max riops=max wiops=120");
        assert_eq!(parse_v2(&line).expect("parses")[&(8, 16)], l);
        assert!(parse_v2("8:16 rbps=x").is_err());
        assert!(parse_v2("8 rbps=1").is_err());
    }

    /// A v1 hierarchy in a temporary folder: the files a kernel makes, so
    /// the walk, the read-back and the rollback are exercised.
    fn v1_tree(dir: &Path, pods: &[&str]) -> Hierarchy {
        let blkio = dir.join("blkio");
        for p in pods {
            let pod = blkio.join(p);
            std::fs::create_dir_all(&pod).expect("the stand-in tree");
            for (_, file) in V1_FILES {
                std::fs::write(pod.join(file), "").expect("the stand-in tree");
            }
        }
        std::fs::write(blkio.join(V1_FILES[0].1), "").expect("the stand-in tree");
        Hierarchy::detect(dir).expect("a v1 tree")
    }

    #[test]
    fn finds_pods_under_any_cgroup_root() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let systemd = format!("kubepods-besteffort-pod{}.slice", UID.replace('-', "_"));
        let h = v1_tree(
            tmp.path(),
            &[
                &format!("custom/root/kubepods/burstable/pod{UID}"),
                &format!("kubepods.slice/kubepods-besteffort.slice/{systemd}"),
            ],
        );
        assert_eq!(h.version(), 1);
        let pods = h.pods();
        assert_eq!(pods.len(), 1, "one UID, two layouts: {pods:?}");
        assert!(h.pod(UID).is_some());
        assert!(h.pod("11111111-2222-3333-4444-555555555555").is_none());
    }

    #[test]
    fn v1_write_reads_back_and_zero_removes() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let pod_dir = format!("kubepods/pod{UID}");
        let h = v1_tree(tmp.path(), &[&pod_dir, &format!("{pod_dir}/container-a")]);
        let pod = h.pod(UID).expect("parses");
        let container = pod.join("container-a");
        let l = Limits {
            read_bps: 1,
            write_bps: 2,
            read_iops: 3,
            write_iops: 4,
        };
        // v1 throttling is flat: the container's cgroup gets the rule too.
        assert_eq!(h.write(&pod, (7, 3), l).expect("parses"), 2);
        // The stand-in keeps only the last write per file, as if one
        // device had rules.
        assert_eq!(h.read(&pod).expect("parses")[&(7, 3)], l);
        assert_eq!(h.read(&container).expect("parses")[&(7, 3)], l);
        assert_eq!(h.write(&pod, (7, 3), Limits::default()).expect("parses"), 2);
        assert!(h.read(&pod).expect("parses").is_empty());
        assert!(h.read(&container).expect("parses").is_empty());
    }

    #[test]
    fn a_vanished_cgroup_is_pod_not_found() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let h = v1_tree(tmp.path(), &[&format!("kubepods/pod{UID}")]);
        let pod = h.pod(UID).expect("parses");
        std::fs::remove_dir_all(&pod).expect("the stand-in tree");
        let err = h
            .write(&pod, (7, 3), Limits::default())
            .expect_err("refused");
        assert!(matches!(err, Error::PodNotFound { .. }), "{err}");
    }

    #[test]
    fn no_io_controller_is_a_precondition() {
        let tmp = tempfile::tempdir().expect("tempdir");
        std::fs::write(tmp.path().join("cgroup.controllers"), "cpu memory pids\n")
            .expect("the stand-in tree");
        let err = Hierarchy::detect(tmp.path()).expect_err("refused");
        assert!(matches!(err, Error::FailedPrecondition { .. }), "{err}");
        std::fs::write(tmp.path().join("cgroup.controllers"), "cpu io memory\n")
            .expect("the stand-in tree");
        assert_eq!(Hierarchy::detect(tmp.path()).expect("parses").version(), 2);
    }
}
