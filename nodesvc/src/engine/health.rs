//! A volume's condition as this node sees it now: whether what the volume
//! is made of is still there. A block volume needs its device node (a
//! block device) and the disk or physical volume under it; a loop device
//! whose backing file was deleted is abnormal too, since its data goes
//! with the last close, and so is a device of 0 bytes (a loop device
//! detached or emptied, a medium removed: the node is left, the disk is
//! gone). A HOST volume needs its directory.
//!
//! The checks only look (`stat`, sysfs); they never open a device, so a
//! device that hangs cannot hold up the answer. The first problem found
//! is the message: the device, then the disk, then the directory.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use super::devnum;
use super::volume::Volume;

/// What the node can say of a volume now.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Condition {
    /// The volume cannot be used as it is.
    pub abnormal: bool,
    /// What is wrong, naming the path; empty when normal.
    pub message: String,
}

impl Condition {
    fn abnormal(message: String) -> Condition {
        Condition {
            abnormal: true,
            message,
        }
    }
}

/// The condition of `volume`.
pub async fn condition(volume: &Volume) -> Condition {
    let sysfs = PathBuf::from("/sys");
    condition_under(volume, &sysfs).await
}

async fn condition_under(volume: &Volume, sysfs: &Path) -> Condition {
    match problem(volume, sysfs).await {
        Some(message) => Condition::abnormal(message),
        None => Condition::default(),
    }
}

/// The first problem found: the device, then the disk, then the directory.
async fn problem(volume: &Volume, sysfs: &Path) -> Option<String> {
    if let Some(device) = &volume.device_path
        && let Some(p) = block_device("device", device, sysfs).await
    {
        return Some(p);
    }
    if let Some(disk) = volume.disk.as_deref().filter(|d| d.starts_with('/')) {
        let what = match volume.policy {
            super::Policy::Lvm => "physical volume",
            _ => "disk",
        };
        if let Some(p) = block_device(what, Path::new(disk), sysfs).await {
            return Some(p);
        }
    }
    match &volume.host_path {
        Some(dir) => directory(dir).await,
        None => None,
    }
}

/// Why `path` is no sound block device, if it is not.
async fn block_device(what: &str, path: &Path, sysfs: &Path) -> Option<String> {
    let meta = match tokio::fs::metadata(path).await {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Some(format!("{what} {} is gone", path.display()));
        }
        Err(e) => {
            return Some(format!("{what} {} cannot be examined: {e}", path.display()));
        }
    };
    if !meta.file_type().is_block_device() {
        return Some(format!(
            "{what} {} is no longer a block device",
            path.display()
        ));
    }
    let (major, minor) = devnum::split(meta.rdev());
    let dir = sysfs.join(format!("dev/block/{major}:{minor}"));
    // A disk that went away under its device node (a loop device
    // detached or emptied, a medium removed) reads as 0 sectors.
    if let Ok(sectors) = tokio::fs::read_to_string(dir.join("size")).await
        && sectors.trim() == "0"
    {
        return Some(format!(
            "{what} {} has 0 bytes: the disk behind it is gone",
            path.display()
        ));
    }
    match tokio::fs::read_to_string(dir.join("loop/backing_file")).await {
        Ok(file) if file.trim_end().ends_with("(deleted)") => Some(format!(
            "{what} {} is a loop device whose backing file {} was deleted",
            path.display(),
            file.trim_end().trim_end_matches("(deleted)").trim_end()
        )),
        _ => None,
    }
}

/// Why `path` is no directory, if it is not.
async fn directory(path: &Path) -> Option<String> {
    match tokio::fs::metadata(path).await {
        Ok(m) if m.is_dir() => None,
        Ok(_) => Some(format!(
            "directory {} is no longer a directory",
            path.display()
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Some(format!("directory {} is gone", path.display()))
        }
        Err(e) => Some(format!(
            "directory {} cannot be examined: {e}",
            path.display()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Policy;

    fn host(dir: &Path) -> Volume {
        Volume {
            name: "v".into(),
            group: "g".into(),
            policy: Policy::Host,
            size_bytes: 1,
            device_path: None,
            host_path: Some(dir.to_path_buf()),
            major: 0,
            minor: 0,
            exclusive: false,
            disk: None,
        }
    }

    fn block(device: &Path, disk: &str, policy: Policy) -> Volume {
        Volume {
            device_path: Some(device.to_path_buf()),
            host_path: None,
            disk: Some(disk.to_string()),
            policy,
            ..host(Path::new("/"))
        }
    }

    #[tokio::test]
    async fn a_directory_that_is_there_is_normal_and_a_removed_one_is_not() {
        let root = tempfile::tempdir().expect("temp dir");
        let dir = root.path().join("data");
        std::fs::create_dir(&dir).expect("mkdir");
        assert_eq!(condition(&host(&dir)).await, Condition::default());
        std::fs::remove_dir(&dir).expect("rmdir");
        let c = condition(&host(&dir)).await;
        assert!(c.abnormal);
        assert_eq!(c.message, format!("directory {} is gone", dir.display()));
        std::fs::write(&dir, b"").expect("a file in its place");
        let c = condition(&host(&dir)).await;
        assert!(c.message.contains("no longer a directory"), "{c:?}");
    }

    #[tokio::test]
    async fn a_missing_device_or_disk_is_named() {
        let root = tempfile::tempdir().expect("temp dir");
        let gone = root.path().join("loop99");
        let c = condition(&block(&gone, "/dev/null", Policy::Raw)).await;
        assert_eq!(c.message, format!("device {} is gone", gone.display()));
        // A file is not a block device.
        let file = root.path().join("file");
        std::fs::write(&file, b"x").expect("file");
        let c = condition(&block(&file, "/dev/null", Policy::Raw)).await;
        assert!(c.message.contains("no longer a block device"), "{c:?}");
        // The disk is checked too: /dev/null is a character device.
        let c = condition(&block(&file, &gone.display().to_string(), Policy::Lvm)).await;
        assert!(c.abnormal);
    }

    /// A block device of this machine (any), for the sysfs checks.
    fn some_block_device() -> Option<(PathBuf, u32, u32)> {
        std::fs::read_dir("/dev").ok()?.flatten().find_map(|e| {
            let meta = std::fs::metadata(e.path()).ok()?;
            meta.file_type().is_block_device().then(|| {
                let (major, minor) = devnum::split(meta.rdev());
                (e.path(), major, minor)
            })
        })
    }

    #[tokio::test]
    async fn a_loop_device_whose_backing_file_was_deleted_is_abnormal() {
        let Some((dev, major, minor)) = some_block_device() else {
            eprintln!("no block device on this machine; nothing to check");
            return;
        };
        let sysfs = tempfile::tempdir().expect("temp dir");
        let loop_dir = sysfs.path().join(format!("dev/block/{major}:{minor}/loop"));
        std::fs::create_dir_all(&loop_dir).expect("mkdir");
        let disk = format!("{}", dev.display());
        let volume = block(&dev, &disk, Policy::Raw);
        std::fs::write(loop_dir.join("backing_file"), "/var/disks/a.img\n").expect("write");
        assert_eq!(
            condition_under(&volume, sysfs.path()).await,
            Condition::default()
        );
        std::fs::write(
            loop_dir.join("backing_file"),
            "/var/disks/a.img (deleted)\n",
        )
        .expect("write");
        let c = condition_under(&volume, sysfs.path()).await;
        assert!(c.abnormal);
        assert_eq!(
            c.message,
            format!(
                "device {} is a loop device whose backing file /var/disks/a.img was deleted",
                dev.display()
            )
        );
    }

    #[tokio::test]
    async fn a_device_of_0_bytes_is_abnormal() {
        let Some((dev, major, minor)) = some_block_device() else {
            eprintln!("no block device on this machine; nothing to check");
            return;
        };
        let sysfs = tempfile::tempdir().expect("temp dir");
        let dir = sysfs.path().join(format!("dev/block/{major}:{minor}"));
        std::fs::create_dir_all(&dir).expect("mkdir");
        let volume = block(&dev, &dev.display().to_string(), Policy::Lvm);
        std::fs::write(dir.join("size"), "262144\n").expect("write");
        assert_eq!(
            condition_under(&volume, sysfs.path()).await,
            Condition::default()
        );
        std::fs::write(dir.join("size"), "0\n").expect("write");
        let c = condition_under(&volume, sysfs.path()).await;
        assert!(c.abnormal);
        assert_eq!(
            c.message,
            format!(
                "device {} has 0 bytes: the disk behind it is gone",
                dev.display()
            )
        );
    }
}
