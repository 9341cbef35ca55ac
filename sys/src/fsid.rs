//! Filesystem identity: the UUID in a filesystem's superblock, read from
//! the device (`blkid -p`) and replaced by a new random one.
//!
//! A block copy of a volume carries its source's filesystem UUID. XFS
//! refuses to mount a filesystem whose UUID is already mounted
//! ("Filesystem has duplicate UUID"), and two ext4 filesystems with one
//! UUID make `blkid -U`, `findfs` and `/dev/disk/by-uuid` name either.
//! [`renew_uuid`] gives the filesystem on an unmounted device a UUID of
//! its own:
//!
//! - ext2/3/4: `e2fsck -f -p` first (it replays a journal, and `tune2fs`
//!   rewrites the checksums of a `metadata_csum` filesystem only when it
//!   was freshly checked), then `tune2fs -U random`;
//! - xfs: `xfs_db -x -c "uuid generate"` (what `xfs_admin -U generate`
//!   runs, called directly: that wrapper passes its arguments through a
//!   shell `eval`). It refuses a filesystem whose log holds changes — a
//!   copy of a filesystem frozen while mounted has them — and still exits
//!   0, so the UUID is read back after it; if it is unchanged, the log is
//!   replayed by mounting the device once (`nouuid`: the source may be
//!   mounted) on a fresh private directory, and the change is tried again;
//! - anything else (no filesystem, a partition table, another filesystem)
//!   is left as it is.
//!
//! Every change is checked by reading the UUID back: a tool that exits 0
//! without changing it is [`FsIdError::Unchanged`].

use std::path::{Path, PathBuf};
use std::time::Duration;

use tracing::instrument;

use crate::IoError;
use crate::command::{Cmd, CommandError};
use crate::mount::{self, MountError};

/// A check or a UUID change may touch much of a large filesystem.
const LONG_TIMEOUT: Duration = Duration::from_secs(600);

/// `blkid` exits with 2 when it finds nothing on the device.
const BLKID_NOTHING_FOUND: i32 = 2;

/// Options of the one mount that replays an xfs log: the source of the
/// copy may be mounted with the same UUID, and nothing on the copy runs.
const REPLAY_OPTIONS: &[&str] = &["nouuid", "nodev", "nosuid", "noexec"];

/// Errors of reading and renewing a filesystem's UUID.
#[derive(Debug, thiserror::Error)]
pub enum FsIdError {
    #[error(transparent)]
    Command(#[from] CommandError),
    #[error("replaying the xfs log of {}: {source}", device.display())]
    Replay {
        device: PathBuf,
        #[source]
        source: MountError,
    },
    #[error(transparent)]
    Io(#[from] IoError),
    /// The tool ran without error, but the UUID is what it was.
    #[error("`{command}` left the {fs} UUID of {} as it was ({uuid}): {output}", device.display())]
    Unchanged {
        command: String,
        device: PathBuf,
        fs: &'static str,
        uuid: String,
        output: String,
    },
}

/// A filesystem whose UUID the node can renew.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewable {
    /// ext2, ext3 or ext4 (`tune2fs`).
    Ext,
    /// xfs (`xfs_db`).
    Xfs,
}

impl Renewable {
    pub fn as_str(self) -> &'static str {
        match self {
            Renewable::Ext => "ext",
            Renewable::Xfs => "xfs",
        }
    }
}

/// What `blkid -p` says about a device's content.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Identity {
    /// `TYPE`: `ext4`, `xfs`, `LVM2_member`, ...
    pub fs_type: Option<String>,
    /// `UUID`: the content's own UUID (not a partition's `PART_ENTRY_UUID`
    /// or a table's `PTUUID`).
    pub uuid: Option<String>,
    /// `PTTYPE`: a partition table.
    pub pt_type: Option<String>,
}

impl Identity {
    /// The filesystem whose UUID can be renewed, if the device holds
    /// exactly one such filesystem with a UUID (no partition table).
    pub fn renewable(&self) -> Option<Renewable> {
        if self.pt_type.is_some() || self.uuid.is_none() {
            return None;
        }
        match self.fs_type.as_deref()? {
            "ext2" | "ext3" | "ext4" => Some(Renewable::Ext),
            "xfs" => Some(Renewable::Xfs),
            _ => None,
        }
    }
}

/// Parses `blkid -p -o export` (`KEY=value` lines).
pub fn parse_identity(text: &str) -> Identity {
    let mut id = Identity::default();
    for line in text.lines() {
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let slot = match key {
            "TYPE" => &mut id.fs_type,
            "UUID" => &mut id.uuid,
            "PTTYPE" => &mut id.pt_type,
            _ => continue,
        };
        *slot = (!value.is_empty()).then(|| value.to_string());
    }
    id
}

/// `blkid -p -o export <device>`: probes the device itself (no cache).
pub fn blkid_cmd(device: &Path) -> Cmd {
    Cmd::new("blkid").args(["-p", "-o", "export"]).arg(device)
}

/// `e2fsck -f -p <device>`: a forced check that fixes only what is safe.
pub fn e2fsck_cmd(device: &Path) -> Cmd {
    Cmd::new("e2fsck")
        .args(["-f", "-p"])
        .arg(device)
        .timeout(LONG_TIMEOUT)
}

/// `tune2fs -U random <device>`.
pub fn tune2fs_uuid_cmd(device: &Path) -> Cmd {
    Cmd::new("tune2fs")
        .args(["-U", "random"])
        .arg(device)
        .timeout(LONG_TIMEOUT)
}

/// `xfs_db -x -p xfs_admin -c "uuid generate" <device>`.
pub fn xfs_uuid_cmd(device: &Path) -> Cmd {
    Cmd::new("xfs_db")
        .args(["-x", "-p", "xfs_admin", "-c", "uuid generate"])
        .arg(device)
        .timeout(LONG_TIMEOUT)
}

/// What the device holds (an empty [`Identity`] when it is blank).
pub async fn identify(device: &Path) -> Result<Identity, FsIdError> {
    match blkid_cmd(device).run().await {
        Ok(out) => Ok(parse_identity(&out.stdout)),
        Err(e) if e.exit_code() == Some(BLKID_NOTHING_FOUND) => Ok(Identity::default()),
        Err(e) => Err(e.into()),
    }
}

/// What [`renew_uuid`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Renewal {
    /// The filesystem has a new UUID.
    Renewed {
        fs: Renewable,
        old: String,
        new: String,
    },
    /// Nothing whose UUID the node renews (`found` says what is there).
    Left { found: Identity },
}

/// Gives the filesystem on `device` a new random UUID (see the module
/// header). `device` must not be mounted. A mount point for an xfs log
/// replay is made under `scratch` and removed after. Running it again
/// gives another UUID: it never leaves the one it found.
#[instrument(err, fields(device = %device.display()))]
pub async fn renew_uuid(device: &Path, scratch: &Path) -> Result<Renewal, FsIdError> {
    let found = identify(device).await?;
    let (Some(fs), Some(old)) = (found.renewable(), found.uuid.clone()) else {
        return Ok(Renewal::Left { found });
    };
    let output = match fs {
        Renewable::Ext => {
            match e2fsck_cmd(device).run().await {
                Ok(_) => {}
                // 1: errors corrected; 2: corrected, and a mounted root
                // would need a reboot. Both leave a consistent filesystem.
                Err(e) if matches!(e.exit_code(), Some(1 | 2)) => {
                    tracing::info!(error = %e, "e2fsck corrected the copy before its UUID changed");
                }
                Err(e) => return Err(e.into()),
            }
            combined(tune2fs_uuid_cmd(device).run().await?)
        }
        Renewable::Xfs => {
            let first = combined(xfs_uuid_cmd(device).run().await?);
            if uuid_of(device).await?.as_deref() != Some(old.as_str()) {
                first
            } else {
                tracing::info!("the xfs log of the copy holds changes; replaying it by a mount");
                replay_xfs_log(device, scratch).await?;
                combined(xfs_uuid_cmd(device).run().await?)
            }
        }
    };
    let new = uuid_of(device).await?;
    match new {
        Some(new) if new != old => {
            tracing::info!(fs = fs.as_str(), %old, %new, "the copy's filesystem has a UUID of its own");
            Ok(Renewal::Renewed { fs, old, new })
        }
        _ => Err(FsIdError::Unchanged {
            command: match fs {
                Renewable::Ext => tune2fs_uuid_cmd(device).line(),
                Renewable::Xfs => xfs_uuid_cmd(device).line(),
            },
            device: device.to_path_buf(),
            fs: fs.as_str(),
            uuid: old,
            output: output.chars().take(400).collect(),
        }),
    }
}

/// The UUID of what `device` holds, if it has one.
pub async fn uuid_of(device: &Path) -> Result<Option<String>, FsIdError> {
    Ok(identify(device).await?.uuid)
}

fn combined(out: crate::command::Output) -> String {
    format!("{}{}", out.stdout, out.stderr).trim().to_string()
}

/// Mounts and unmounts the xfs on `device` once, which replays its log.
async fn replay_xfs_log(device: &Path, scratch: &Path) -> Result<(), FsIdError> {
    let at = scratch.join(format!(
        "carina-xfs-replay-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0)
    ));
    // A new directory (never one that exists, nor a link), for root only.
    tokio::fs::DirBuilder::new()
        .mode(0o700)
        .create(&at)
        .await
        .map_err(|e| IoError::new("make the mount point of an xfs log replay", &at, e))?;
    let options: Vec<String> = REPLAY_OPTIONS.iter().map(|o| o.to_string()).collect();
    let replay = |source| FsIdError::Replay {
        device: device.to_path_buf(),
        source,
    };
    let mounted = mount::mount(device, &at, "xfs", &options).await;
    let unmounted = match &mounted {
        Ok(()) => mount::unmount(&at).await,
        Err(_) => Ok(()),
    };
    match (mounted, unmounted) {
        (Ok(()), Ok(())) => {
            tokio::fs::remove_dir(&at)
                .await
                .map_err(|e| IoError::new("remove the mount point of an xfs log replay", &at, e))?;
            Ok(())
        }
        (Err(e), _) => {
            let _ = tokio::fs::remove_dir(&at).await;
            Err(replay(e))
        }
        // Still mounted: the directory stays, and the copy fails.
        (Ok(()), Err(e)) => Err(replay(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::{mutated_text, noisy_text};
    use proptest::prelude::*;

    /// Captured from `blkid -p -o export` on a copied xfs volume.
    const XFS: &str = "DEVNAME=/dev/loop7\nUUID=b9ed6156-9cb1-4a34-8d0a-21779d0beff9\nBLOCK_SIZE=512\nTYPE=xfs\nUSAGE=filesystem\n";
    /// An ext4 filesystem on a RAW volume's GPT partition.
    const EXT4_PART: &str = "DEVNAME=/dev/loop0p1\nUUID=19a43026-0a7c-4d6f-8905-4bfe6027141b\nVERSION=1.0\n\
        FSLASTBLOCK=327680\nBLOCK_SIZE=4096\nTYPE=ext4\nUSAGE=filesystem\nPART_ENTRY_SCHEME=gpt\n\
        PART_ENTRY_NAME=carina.io/x\nPART_ENTRY_UUID=60d46e21-e251-4486-9dc4-38c27227d8bd\n\
        PART_ENTRY_TYPE=0fc63daf-8483-4772-8e79-3d69d8477de4\nPART_ENTRY_NUMBER=1\n";

    #[test]
    fn the_content_uuid_is_read_not_a_partitions_or_a_tables() {
        let xfs = parse_identity(XFS);
        assert_eq!(xfs.renewable(), Some(Renewable::Xfs));
        assert_eq!(
            xfs.uuid.as_deref(),
            Some("b9ed6156-9cb1-4a34-8d0a-21779d0beff9")
        );
        let ext4 = parse_identity(EXT4_PART);
        assert_eq!(ext4.renewable(), Some(Renewable::Ext));
        assert_eq!(
            ext4.uuid.as_deref(),
            Some("19a43026-0a7c-4d6f-8905-4bfe6027141b")
        );
        for (text, what) in [
            (
                "DEVNAME=/dev/loop4\nPTUUID=77e0\nPTTYPE=gpt\n",
                "a partition table",
            ),
            (
                "DEVNAME=/dev/loop5\nUUID=x\nVERSION=LVM2 001\nTYPE=LVM2_member\nUSAGE=raid\n",
                "an LVM label",
            ),
            (
                "DEVNAME=/dev/loop5\nUUID=1\nTYPE=btrfs\n",
                "another filesystem",
            ),
            (
                "DEVNAME=/dev/loop5\nTYPE=ext4\n",
                "a filesystem without a UUID",
            ),
            (
                "DEVNAME=/dev/loop5\nUUID=1\nTYPE=ext4\nPTTYPE=dos\n",
                "a filesystem and a table",
            ),
            ("", "nothing"),
        ] {
            assert_eq!(parse_identity(text).renewable(), None, "{what}");
        }
        assert_eq!(parse_identity("UUID=\nTYPE=xfs\n").uuid, None);
        assert_eq!(parse_identity("DEVNAME=/dev/x\n"), Identity::default());
    }

    #[test]
    fn the_commands_are_argv_with_long_timeouts() {
        let dev = Path::new("/dev/loop3");
        assert_eq!(blkid_cmd(dev).line(), "blkid -p -o export /dev/loop3");
        assert_eq!(e2fsck_cmd(dev).line(), "e2fsck -f -p /dev/loop3");
        assert_eq!(tune2fs_uuid_cmd(dev).line(), "tune2fs -U random /dev/loop3");
        let xfs = xfs_uuid_cmd(dev);
        assert_eq!(xfs.program(), "xfs_db");
        // One argument: xfs_db runs it as one command.
        assert!(xfs.arguments().iter().any(|a| a == "uuid generate"));
        for cmd in [e2fsck_cmd(dev), tune2fs_uuid_cmd(dev), xfs_uuid_cmd(dev)] {
            assert_eq!(cmd.time_limit(), LONG_TIMEOUT, "{cmd}");
        }
    }

    proptest! {
        /// Any report gives a UUID only as a `UUID=` line shows it, and a
        /// renewable filesystem only with a UUID and no table.
        #[test]
        fn identities_of_any_report(text in prop_oneof![noisy_text(), mutated_text(XFS), mutated_text(EXT4_PART)]) {
            let id = parse_identity(&text);
            if let Some(uuid) = &id.uuid {
                prop_assert!(text.lines().any(|l| l.strip_prefix("UUID=") == Some(uuid.as_str())));
            }
            if id.renewable().is_some() {
                prop_assert!(id.uuid.is_some() && id.pt_type.is_none());
            }
        }
    }

    /// Renewing on real files (the tools work on regular files as on
    /// devices): ext4 gets a new UUID each time, a blank or unknown
    /// device is left as it is.
    #[tokio::test]
    async fn renews_ext4_and_leaves_the_rest() {
        if Cmd::new("tune2fs")
            .run()
            .await
            .is_err_and(|e| matches!(e, CommandError::Spawn { .. }))
        {
            eprintln!("SKIP renews_ext4_and_leaves_the_rest: tune2fs is not installed");
            return;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let img = dir.path().join("disk.img");
        std::fs::File::create(&img)
            .and_then(|f| f.set_len(32 << 20))
            .expect("image");
        match renew_uuid(&img, dir.path()).await.expect("blank") {
            Renewal::Left { found } => assert_eq!(found, Identity::default()),
            other => panic!("{other:?}"),
        }
        Cmd::new("mkfs.ext4")
            .args(["-q", "-F"])
            .arg(&img)
            .run()
            .await
            .expect("mkfs");
        let first = uuid_of(&img).await.expect("uuid").expect("a uuid");
        let Renewal::Renewed { fs, old, new } = renew_uuid(&img, dir.path()).await.expect("renew")
        else {
            panic!("not renewed")
        };
        assert_eq!((fs, old.as_str()), (Renewable::Ext, first.as_str()));
        assert_ne!(new, first);
        assert_eq!(uuid_of(&img).await.expect("uuid"), Some(new.clone()));
        let Renewal::Renewed { new: again, .. } =
            renew_uuid(&img, dir.path()).await.expect("renew")
        else {
            panic!("not renewed")
        };
        assert_ne!(again, new);
    }
}
