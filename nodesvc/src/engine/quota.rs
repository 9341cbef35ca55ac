//! Project quota for HOST volumes: whether the file system under a HOST
//! root enforces per-directory limits, and the commands that set them.
//!
//! Detection reads `/proc/self/mountinfo` (parsed by a pure function) and
//! picks the mount that holds the root. Two set-ups enforce sizes:
//!
//! - XFS mounted with `prjquota`/`pquota`: `xfs_quota -x` puts the volume
//!   directory into a project and sets the project's hard block limit;
//! - ext4 mounted with `prjquota`: `chattr -p <id> +P` puts the directory
//!   into a project, `setquota -P` sets the limit.
//!
//! Anything else only accounts sizes ([`QuotaMode::AccountingOnly`]). The
//! argv of every command is built by a pure function so it can be tested on
//! machines whose kernel has no quota support.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use carina_sys::command::Cmd;
use carina_sys::mount::MountEntry;
use tracing::instrument;

use super::error::{Error, Result};
use super::volume::QuotaMode;

/// Where the kernel lists the mounts this process sees.
pub const MOUNTINFO: &str = "/proc/self/mountinfo";

/// One line of `/proc/self/mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub mount_point: PathBuf,
    /// `ext4`, `xfs`, `fuse.sshfs`, ...
    pub fstype: String,
    pub source: String,
    /// Per-mount options followed by the file system's own options.
    pub options: Vec<String>,
}

impl Mount {
    fn has_option(&self, option: &str) -> bool {
        self.options.iter().any(|o| o == option)
    }
}

/// The mounts of mountinfo text, each line read by [`carina_sys::mount`]'s
/// parser; a line that does not parse is skipped.
pub fn parse_mountinfo(text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(|line| carina_sys::mount::parse_mountinfo(line).ok())
        .flatten()
        .map(Mount::from)
        .collect()
}

impl From<MountEntry> for Mount {
    fn from(m: MountEntry) -> Mount {
        Mount {
            mount_point: m.mount_point,
            fstype: m.fs_type,
            source: m.source.to_string_lossy().into_owned(),
            options: m.options.into_iter().chain(m.super_options).collect(),
        }
    }
}

/// The mount that holds `path` (absolute, symlinks resolved): the longest
/// mount point that is a prefix of it; of mounts stacked on the same point
/// the last one listed, which is the visible one.
pub fn mount_of<'a>(mounts: &'a [Mount], path: &Path) -> Option<&'a Mount> {
    let mut best: Option<&Mount> = None;
    for mount in mounts.iter().filter(|m| path.starts_with(&m.mount_point)) {
        let longer = best.is_none_or(|b| {
            mount.mount_point.components().count() >= b.mount_point.components().count()
        });
        if longer {
            best = Some(mount);
        }
    }
    best
}

/// File systems whose project quota we know how to drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuotaFs {
    Xfs,
    Ext4,
}

/// Project quota that the kernel enforces on one mounted file system.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Enforcement {
    pub fs: QuotaFs,
    /// Where the file system is mounted (the tools take it as argument).
    pub mount_point: PathBuf,
}

/// What a mount offers: `Some` only for the set-ups described in the
/// module header.
pub fn enforcement_of(mount: &Mount) -> Option<Enforcement> {
    let fs = match mount.fstype.as_str() {
        "xfs" if mount.has_option("prjquota") || mount.has_option("pquota") => QuotaFs::Xfs,
        "ext4" if mount.has_option("prjquota") => QuotaFs::Ext4,
        _ => return None,
    };
    Some(Enforcement {
        fs,
        mount_point: mount.mount_point.clone(),
    })
}

/// How the HOST root at `root` is limited: reads the mount table and
/// resolves `root` (which must exist).
pub fn detect(root: &Path) -> Result<Option<Enforcement>> {
    let resolved = root
        .canonicalize()
        .map_err(|e| Error::io("resolve", root, e))?;
    let text = std::fs::read_to_string(MOUNTINFO).map_err(|e| Error::io("read", MOUNTINFO, e))?;
    let mounts = parse_mountinfo(&text);
    Ok(mount_of(&mounts, &resolved).and_then(enforcement_of))
}

/// The capacity report's name for a detection result.
pub fn mode(enforcement: Option<&Enforcement>) -> QuotaMode {
    match enforcement {
        Some(_) => QuotaMode::ProjectQuota,
        None => QuotaMode::AccountingOnly,
    }
}

/// A project id derived from the volume name alone (32-bit FNV-1a), so the
/// same name maps to the same project on every node and after a restart.
/// Never zero: project 0 is the file system's default project.
pub fn project_id(name: &str) -> u32 {
    let hash = name.bytes().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    hash.max(1)
}

/// The first id from `project_id(name)` on (skipping zero) that `taken`
/// does not contain, so two of our volumes never share a project.
pub fn free_project_id(name: &str, taken: impl Fn(u32) -> bool) -> u32 {
    let mut id = project_id(name);
    while taken(id) {
        id = next_project_id(id);
    }
    id
}

/// The id after `id`, wrapping past `u32::MAX` to 1.
fn next_project_id(id: u32) -> u32 {
    id.wrapping_add(1).max(1)
}

/// One command line, program first.
pub type Argv = Vec<OsString>;

fn argv<const N: usize>(parts: [&OsStr; N]) -> Argv {
    parts.iter().map(|p| p.to_os_string()).collect()
}

impl Enforcement {
    /// The commands that put `dir` into project `id` and limit the project
    /// to `bytes`. XFS takes the directory inside an `xfs_quota` command
    /// string, which it splits at blanks, so such a path is refused there.
    pub fn assign_argv(&self, dir: &Path, id: u32, bytes: u64) -> Result<Vec<Argv>> {
        let id_s = id.to_string();
        let mp = self.mount_point.as_os_str();
        match self.fs {
            QuotaFs::Xfs => {
                let dir_s = xfs_command_path(dir)?;
                let project = format!("project -s -p {dir_s} {id}");
                let limit = xfs_limit(id, bytes);
                Ok(vec![argv([
                    "xfs_quota".as_ref(),
                    "-x".as_ref(),
                    "-c".as_ref(),
                    project.as_ref(),
                    "-c".as_ref(),
                    limit.as_ref(),
                    mp,
                ])])
            }
            QuotaFs::Ext4 => Ok(vec![
                argv([
                    "chattr".as_ref(),
                    "-p".as_ref(),
                    id_s.as_ref(),
                    "+P".as_ref(),
                    dir.as_os_str(),
                ]),
                self.limit_argv(id, bytes),
            ]),
        }
    }

    /// The command that sets project `id`'s hard block limit to `bytes`
    /// (zero removes the limit).
    pub fn limit_argv(&self, id: u32, bytes: u64) -> Argv {
        let mp = self.mount_point.as_os_str();
        match self.fs {
            QuotaFs::Xfs => {
                let limit = xfs_limit(id, bytes);
                argv([
                    "xfs_quota".as_ref(),
                    "-x".as_ref(),
                    "-c".as_ref(),
                    limit.as_ref(),
                    mp,
                ])
            }
            QuotaFs::Ext4 => {
                let id_s = id.to_string();
                // setquota takes block limits in KiB: soft, hard, then the
                // inode soft and hard limits (0 = none).
                let kib = bytes.div_ceil(1024).to_string();
                argv([
                    "setquota".as_ref(),
                    "-P".as_ref(),
                    id_s.as_ref(),
                    "0".as_ref(),
                    kib.as_ref(),
                    "0".as_ref(),
                    "0".as_ref(),
                    mp,
                ])
            }
        }
    }

    /// Puts `dir` into project `id` limited to `bytes`.
    #[instrument(skip(self), err, fields(carina.quota.mount = %self.mount_point.display()))]
    pub async fn assign(&self, dir: &Path, id: u32, bytes: u64) -> Result<()> {
        for cmd in self.assign_argv(dir, id, bytes)? {
            run(cmd).await?;
        }
        Ok(())
    }

    /// Sets project `id`'s limit to `bytes` (zero removes it).
    #[instrument(skip(self), err, fields(carina.quota.mount = %self.mount_point.display()))]
    pub async fn set_limit(&self, id: u32, bytes: u64) -> Result<()> {
        run(self.limit_argv(id, bytes)).await
    }
}

fn xfs_limit(id: u32, bytes: u64) -> String {
    // xfs_quota reads a number without a unit suffix as bytes.
    format!("limit -p bhard={bytes} {id}")
}

fn xfs_command_path(dir: &Path) -> Result<&str> {
    let refuse = |reason: &str| Error::FailedPrecondition {
        operation: "project quota",
        name: dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        reason: format!("xfs_quota cannot take the path {}: {reason}", dir.display()),
    };
    let s = dir.to_str().ok_or_else(|| refuse("it is not UTF-8"))?;
    if s.chars()
        .any(|c| c.is_whitespace() || c.is_control() || matches!(c, '"' | '\'' | '\\'))
    {
        return Err(refuse("it contains blanks, quotes or backslashes"));
    }
    Ok(s)
}

async fn run(argv: Argv) -> Result<()> {
    let Some((program, args)) = argv.split_first() else {
        return Ok(());
    };
    Cmd::new(program.to_string_lossy()).args(args).run().await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Shaped like a node's mountinfo: root on ext4, an XFS data disk with
    /// project quota, an ext4 disk with project quota under it, a tmpfs with
    /// a space in its mount point, and an overmounted directory.
    const SAMPLE: &str = "\
22 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw,errors=remount-ro
25 22 0:5 / /dev rw,nosuid,relatime shared:2 - devtmpfs udev rw,size=8000k,mode=755
40 22 259:5 / /data rw,noatime shared:20 - xfs /dev/nvme1n1 rw,attr2,inode64,logbufs=8,logbsize=32k,prjquota
41 40 259:6 / /data/ext rw,relatime shared:21 master:3 - ext4 /dev/nvme2n1 rw,prjquota
42 22 0:40 / /mnt/with\\040space rw,relatime shared:22 - tmpfs tmp\\040fs rw,size=1024k
43 22 259:7 / /srv rw,relatime - xfs /dev/sdb rw,attr2,inode64,pqnoenforce
44 22 259:8 / /old rw,relatime - ext4 /dev/sdc rw
45 22 259:9 / /old rw,relatime - xfs /dev/sdd rw,pquota
46 22 259:10 / /plain rw,relatime - btrfs /dev/sde rw,space_cache=v2
this line is not mountinfo
";

    fn mounts() -> Vec<Mount> {
        parse_mountinfo(SAMPLE)
    }

    #[test]
    fn parses_fields_and_options() {
        let m = mounts();
        assert_eq!(m.len(), 9, "{m:#?}");
        assert_eq!(m[2].mount_point, Path::new("/data"));
        assert_eq!(m[2].fstype, "xfs");
        assert_eq!(m[2].source, "/dev/nvme1n1");
        assert!(m[2].has_option("noatime"), "mount options kept");
        assert!(m[2].has_option("prjquota"), "super options kept");
        assert_eq!(m[3].mount_point, Path::new("/data/ext"));
        assert_eq!(m[4].mount_point, Path::new("/mnt/with space"));
        assert_eq!(m[4].source, "tmp fs");
    }

    #[test]
    fn longest_prefix_wins_by_component() {
        let m = mounts();
        let of = |p: &str| mount_of(&m, Path::new(p)).map(|m| m.mount_point.clone());
        assert_eq!(of("/data/ext/vols"), Some("/data/ext".into()));
        assert_eq!(of("/data/ext"), Some("/data/ext".into()));
        assert_eq!(
            of("/data/extra"),
            Some("/data".into()),
            "not a string prefix"
        );
        assert_eq!(of("/var/lib/carina"), Some("/".into()));
        assert_eq!(of("/mnt/with space/x"), Some("/mnt/with space".into()));
        // Two mounts on /old: the later one is on top.
        assert_eq!(
            mount_of(&m, Path::new("/old/v")).map(|m| m.fstype.as_str()),
            Some("xfs")
        );
        assert_eq!(mount_of(&[], Path::new("/x")), None);
    }

    #[test]
    fn detects_only_enforcing_setups() {
        let m = mounts();
        let at = |p: &str| mount_of(&m, Path::new(p)).and_then(enforcement_of);
        assert_eq!(
            at("/data/vols"),
            Some(Enforcement {
                fs: QuotaFs::Xfs,
                mount_point: "/data".into()
            })
        );
        assert_eq!(
            at("/data/ext/vols"),
            Some(Enforcement {
                fs: QuotaFs::Ext4,
                mount_point: "/data/ext".into()
            })
        );
        assert_eq!(at("/old/vols").map(|e| e.fs), Some(QuotaFs::Xfs), "pquota");
        assert_eq!(at("/srv/vols"), None, "pqnoenforce only accounts");
        assert_eq!(at("/var/lib/carina"), None, "ext4 without prjquota");
        assert_eq!(at("/plain/vols"), None, "btrfs");
        assert_eq!(mode(at("/data/vols").as_ref()), QuotaMode::ProjectQuota);
        assert_eq!(mode(None), QuotaMode::AccountingOnly);
    }

    #[test]
    fn reads_this_machines_mount_table() {
        let text = std::fs::read_to_string(MOUNTINFO).expect("mountinfo readable");
        let mounts = parse_mountinfo(&text);
        let root = mount_of(&mounts, Path::new("/")).expect("something is mounted on /");
        assert_eq!(root.mount_point, Path::new("/"));
        assert!(
            detect(Path::new("/")).is_ok(),
            "detection works on a real path"
        );
        assert!(detect(Path::new("/no/such/carina/root")).is_err());
    }

    #[test]
    fn project_ids_are_stable_and_non_zero() {
        // 32-bit FNV-1a reference values.
        assert_eq!(project_id("a"), 0xe40c_292c);
        assert_eq!(project_id(""), 0x811c_9dc5);
        assert_eq!(project_id("pvc-1"), project_id("pvc-1"));
        assert_ne!(project_id("pvc-1"), project_id("pvc-2"));
        let first = project_id("pvc-1");
        assert_eq!(free_project_id("pvc-1", |_| false), first);
        assert_eq!(
            free_project_id("pvc-1", |id| id == first || id == first + 1),
            first + 2
        );
        assert_eq!(next_project_id(u32::MAX), 1, "zero is skipped");
    }

    fn os(args: &[&str]) -> Argv {
        args.iter().map(OsString::from).collect()
    }

    #[test]
    fn xfs_argv() {
        let e = Enforcement {
            fs: QuotaFs::Xfs,
            mount_point: "/data".into(),
        };
        let cmds = e
            .assign_argv(Path::new("/data/vols/pvc-1"), 42, 1 << 30)
            .expect("plain path");
        assert_eq!(
            cmds,
            vec![os(&[
                "xfs_quota",
                "-x",
                "-c",
                "project -s -p /data/vols/pvc-1 42",
                "-c",
                "limit -p bhard=1073741824 42",
                "/data",
            ])]
        );
        assert_eq!(
            e.limit_argv(42, 2 << 30),
            os(&[
                "xfs_quota",
                "-x",
                "-c",
                "limit -p bhard=2147483648 42",
                "/data"
            ])
        );
        assert_eq!(
            e.limit_argv(42, 0),
            os(&["xfs_quota", "-x", "-c", "limit -p bhard=0 42", "/data"])
        );
        for bad in ["/data/my vols/p", "/data/it's/p", "/data/a\\b/p"] {
            let err = e.assign_argv(Path::new(bad), 1, 4096).expect_err(bad);
            assert!(err.to_string().contains("xfs_quota cannot take"), "{err}");
        }
    }

    #[test]
    fn ext4_argv() {
        let e = Enforcement {
            fs: QuotaFs::Ext4,
            mount_point: "/data/ext".into(),
        };
        let cmds = e
            .assign_argv(Path::new("/data/ext/v/pvc 1"), 7, 10 << 20)
            .expect("ext4 takes any path as its own argv entry");
        assert_eq!(
            cmds,
            vec![
                os(&["chattr", "-p", "7", "+P", "/data/ext/v/pvc 1"]),
                os(&["setquota", "-P", "7", "0", "10240", "0", "0", "/data/ext"]),
            ]
        );
        // KiB are rounded up, never down.
        assert_eq!(
            e.limit_argv(7, 1025),
            os(&["setquota", "-P", "7", "0", "2", "0", "0", "/data/ext"])
        );
    }
}
