//! Loop devices: a loop device over a file or block device at a byte
//! offset, limited to a size (the node engine exposes LVM logical volumes
//! this way when the kernel has no device-mapper), found again by backing
//! file and offset, grown in place and detached.
//!
//! Attaching (`LOOP_CONFIGURE`), detaching (`LOOP_CLR_FD`) and growing an
//! attached device in place (`LOOP_SET_STATUS64`; it may be mounted) are
//! ioctls, call sites allowed `unsafe` (with [`crate::coprocess`]'s one,
//! the only ones in the workspace); `losetup`
//! is the fallback for kernels without `LOOP_CONFIGURE`. Attached devices
//! are listed from sysfs ([`list`]) or from `losetup -J -l` output
//! ([`parse_losetup`]).

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::IoError;
use crate::command::{Cmd, CommandError};

/// Errors of attaching, detaching, resizing and listing loop devices.
#[derive(Debug, thiserror::Error)]
pub enum LoopError {
    /// `losetup` (the attach fallback) failed or timed out.
    #[error(transparent)]
    Command(#[from] CommandError),
    /// An ioctl, open or read failed; `action` names it (`LOOP_CONFIGURE`).
    #[error(transparent)]
    Io(#[from] IoError),
    /// Output of `losetup` could not be understood.
    #[error("cannot parse {what}: {reason}")]
    Parse { what: &'static str, reason: String },
    /// The blocking thread that ran the ioctls panicked or was cancelled.
    #[error("{task}: {source}")]
    Task {
        task: &'static str,
        #[source]
        source: tokio::task::JoinError,
    },
}

impl LoopError {
    fn io(action: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        LoopError::Io(IoError::new(action, path, source))
    }

    fn task(task: &'static str) -> impl FnOnce(tokio::task::JoinError) -> Self {
        move |source| LoopError::Task { task, source }
    }
}

type Result<T, E = LoopError> = std::result::Result<T, E>;

#[derive(Debug, Deserialize)]
struct LosetupReport {
    #[serde(default)]
    loopdevices: Vec<LosetupEntry>,
}

/// One row of `losetup -J -l`; `null` where losetup could not read a
/// field (a device being set up or torn down at that moment).
#[derive(Debug, Deserialize)]
struct LosetupEntry {
    name: String,
    #[serde(default)]
    sizelimit: Option<u64>,
    #[serde(default)]
    offset: Option<u64>,
    #[serde(rename = "back-file", default)]
    back_file: Option<String>,
}

/// One attached loop device.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct LosetupDevice {
    pub name: String,
    #[serde(default)]
    pub sizelimit: u64,
    #[serde(default)]
    pub offset: u64,
    #[serde(rename = "back-file")]
    pub back_file: Option<String>,
}

/// Parses `losetup -J -l` (empty output: no loop devices). A device
/// whose offset or size limit losetup could not read (`null`: it was being
/// set up or torn down) is left out.
pub fn parse_losetup(json: &str) -> Result<Vec<LosetupDevice>> {
    if json.trim().is_empty() {
        return Ok(Vec::new());
    }
    let report: LosetupReport = serde_json::from_str(json).map_err(|e| LoopError::Parse {
        what: "losetup output",
        reason: e.to_string(),
    })?;
    Ok(report
        .loopdevices
        .into_iter()
        .filter_map(|e| {
            Some(LosetupDevice {
                name: e.name,
                sizelimit: e.sizelimit?,
                offset: e.offset?,
                back_file: e.back_file,
            })
        })
        .collect())
}

/// Attaches a new loop device over `backing` at `offset` bytes, `size`
/// long: `LOOP_CTL_GET_FREE` + `LOOP_CONFIGURE` (one atomic set-up, no
/// process), falling back to `losetup` on kernels without `LOOP_CONFIGURE`.
pub async fn attach(backing: &Path, offset: u64, size: u64) -> Result<PathBuf> {
    let path = backing.to_path_buf();
    let direct = tokio::task::spawn_blocking(move || configure_blocking(&path, offset, size))
        .await
        .map_err(LoopError::task("loop attach task"))?;
    match direct {
        Ok(dev) => Ok(dev),
        Err(e)
            if e.raw_os_error() == Some(libc::ENOTTY) || e.raw_os_error() == Some(libc::EINVAL) =>
        {
            attach_with_losetup(backing, offset, size).await
        }
        Err(e) => Err(LoopError::io("LOOP_CONFIGURE", backing, e)),
    }
}

async fn attach_with_losetup(backing: &Path, offset: u64, size: u64) -> Result<PathBuf> {
    let out = Cmd::new("losetup")
        .args(["-f", "--show", "--offset"])
        .arg(offset.to_string())
        .arg("--sizelimit")
        .arg(size.to_string())
        .arg(backing)
        .run()
        .await?;
    let dev = out.stdout.trim();
    if dev.is_empty() {
        return Err(LoopError::Parse {
            what: "losetup --show output",
            reason: "no device printed".to_string(),
        });
    }
    Ok(PathBuf::from(dev))
}

/// `struct loop_config` from `<linux/loop.h>`.
#[repr(C)]
#[derive(Clone, Copy)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

impl LoopConfig {
    /// All fields zero, as the kernel expects unused ones.
    const fn zeroed() -> Self {
        LoopConfig {
            fd: 0,
            block_size: 0,
            info: LoopInfo64::zeroed(),
            reserved: [0; 8],
        }
    }
}

const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;

fn configure_blocking(backing: &Path, offset: u64, size: u64) -> std::io::Result<PathBuf> {
    use std::os::fd::AsRawFd;
    let control = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/loop-control")?;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(backing)?;
    // Another process may take the free device between our two calls: the
    // kernel then answers EBUSY and we ask for the next free one.
    for _ in 0..16 {
        // An ioctl has no safe wrapper: `unsafe` is allowed for this call only.
        // SAFETY: LOOP_CTL_GET_FREE takes no argument and returns a number;
        // `control` stays open for the call.
        #[allow(unsafe_code)]
        let n = unsafe { libc::ioctl(control.as_raw_fd(), LOOP_CTL_GET_FREE as _) };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let dev = PathBuf::from(format!("/dev/loop{n}"));
        let loop_file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&dev)?;
        let mut config = LoopConfig::zeroed();
        config.fd = file.as_raw_fd() as u32;
        config.info.lo_offset = offset;
        config.info.lo_sizelimit = size;
        let name = backing.as_os_str().as_encoded_bytes();
        let len = name.len().min(config.info.lo_file_name.len() - 1);
        config.info.lo_file_name[..len].copy_from_slice(&name[..len]);
        // An ioctl has no safe wrapper: `unsafe` is allowed for this call only.
        // SAFETY: `config` is a fully initialised `loop_config` that lives
        // across the call; both descriptors are open.
        #[allow(unsafe_code)]
        let rc = unsafe {
            libc::ioctl(
                loop_file.as_raw_fd(),
                LOOP_CONFIGURE as _,
                &config as *const LoopConfig,
            )
        };
        if rc == 0 {
            return Ok(dev);
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EBUSY) {
            return Err(err);
        }
    }
    Err(std::io::Error::from_raw_os_error(libc::EBUSY))
}

/// Detaches a loop device (`LOOP_CLR_FD`, what `losetup -d` does, without
/// a process per call).
pub async fn detach(dev: &Path) -> Result<()> {
    let path = dev.to_path_buf();
    tokio::task::spawn_blocking(move || {
        clear_fd_blocking(&path).map_err(|e| LoopError::io("LOOP_CLR_FD", path, e))
    })
    .await
    .map_err(LoopError::task("loop detach task"))?
}

const LOOP_CLR_FD: libc::c_ulong = 0x4C01;

fn clear_fd_blocking(dev: &Path) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let file = std::fs::OpenOptions::new().read(true).open(dev)?;
    // An ioctl has no safe wrapper: `unsafe` is allowed for this call only.
    // SAFETY: LOOP_CLR_FD takes no argument; `file` keeps the descriptor
    // open for the duration of the call.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), LOOP_CLR_FD as _, 0) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The attached loop device over `backing` at `offset`, if any.
pub fn find<'a>(
    loops: &'a [LosetupDevice],
    backing: &Path,
    offset: u64,
) -> Option<&'a LosetupDevice> {
    let backing = backing.to_string_lossy();
    loops
        .iter()
        .find(|l| l.offset == offset && l.back_file.as_deref() == Some(&*backing))
}

/// Every attached loop device, read from sysfs (no process to spawn:
/// this runs on every create and delete).
pub async fn list() -> Result<Vec<LosetupDevice>> {
    tokio::task::spawn_blocking(|| list_sysfs(Path::new("/sys/block")))
        .await
        .map_err(LoopError::task("loop device listing task"))?
}

/// Reads `<sys_block>/loop*/loop/{backing_file,offset,sizelimit}`; devices
/// without a `loop/` directory are not attached.
pub fn list_sysfs(sys_block: &Path) -> Result<Vec<LosetupDevice>> {
    let entries = match std::fs::read_dir(sys_block) {
        Ok(e) => e,
        Err(e) => return Err(LoopError::io("read", sys_block, e)),
    };
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("loop") {
            continue;
        }
        let dir = entry.path().join("loop");
        let Ok(back) = std::fs::read_to_string(dir.join("backing_file")) else {
            continue;
        };
        let read_num = |f: &str| -> u64 {
            std::fs::read_to_string(dir.join(f))
                .ok()
                .and_then(|t| t.trim().parse().ok())
                .unwrap_or(0)
        };
        out.push(LosetupDevice {
            name: format!("/dev/{name}"),
            sizelimit: read_num("sizelimit"),
            offset: read_num("offset"),
            back_file: Some(back.trim_end_matches('\n').to_string()),
        });
    }
    Ok(out)
}

/// `struct loop_info64` from `<linux/loop.h>`.
#[repr(C)]
#[derive(Clone, Copy)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; 64],
    lo_crypt_name: [u8; 64],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
}

impl LoopInfo64 {
    /// All fields zero, as the kernel expects unused ones.
    const fn zeroed() -> Self {
        LoopInfo64 {
            lo_device: 0,
            lo_inode: 0,
            lo_rdevice: 0,
            lo_offset: 0,
            lo_sizelimit: 0,
            lo_number: 0,
            lo_encrypt_type: 0,
            lo_encrypt_key_size: 0,
            lo_flags: 0,
            lo_file_name: [0; 64],
            lo_crypt_name: [0; 64],
            lo_encrypt_key: [0; 32],
            lo_init: [0; 2],
        }
    }
}

const LOOP_SET_STATUS64: libc::c_ulong = 0x4C04;
const LOOP_GET_STATUS64: libc::c_ulong = 0x4C05;

/// Changes the size limit of an attached loop device in place; the kernel
/// updates the device size at once, also while it is mounted. Retries a
/// few times on `EAGAIN` (the kernel's page-cache flush can race).
pub async fn set_size_limit(dev: &Path, size: u64) -> Result<()> {
    let dev = dev.to_path_buf();
    let result = tokio::task::spawn_blocking(move || {
        let mut last = None;
        for attempt in 0..5 {
            match set_size_limit_blocking(&dev, size) {
                Ok(()) => return Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {
                    last = Some(e);
                    std::thread::sleep(std::time::Duration::from_millis(20 << attempt));
                }
                Err(e) => return Err(LoopError::io("LOOP_SET_STATUS64", dev, e)),
            }
        }
        Err(LoopError::io(
            "LOOP_SET_STATUS64",
            dev,
            last.unwrap_or_else(|| std::io::Error::from_raw_os_error(libc::EAGAIN)),
        ))
    })
    .await;
    match result {
        Ok(r) => r,
        Err(join) => Err(LoopError::task("loop resize task")(join)),
    }
}

fn set_size_limit_blocking(dev: &Path, size: u64) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(dev)?;
    let fd = file.as_raw_fd();
    let mut info = LoopInfo64::zeroed();
    // An ioctl has no safe wrapper: `unsafe` is allowed for this call only.
    // SAFETY: `info` is a properly sized, zero-initialised `loop_info64`
    // (plain old data) that the kernel fills; `fd` stays open for the call
    // because `file` outlives it.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::ioctl(fd, LOOP_GET_STATUS64 as _, &mut info as *mut LoopInfo64) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    info.lo_sizelimit = size;
    // An ioctl has no safe wrapper: `unsafe` is allowed for this call only.
    // SAFETY: `info` is the `loop_info64` the kernel just filled, with only
    // the size limit changed; the kernel reads it, and `fd` is still open.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::ioctl(fd, LOOP_SET_STATUS64 as _, &info as *const LoopInfo64) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_losetup() {
        let loops = parse_losetup(
            r#"{"loopdevices": [{"name": "/dev/loop1", "sizelimit": 0, "offset": 0, "autoclear": false,
                "ro": false, "back-file": "/tmp/t2.img", "dio": false, "log-sec": 512}]}"#,
        )
        .expect("parses");
        assert_eq!(loops[0].back_file.as_deref(), Some("/tmp/t2.img"));
        assert!(parse_losetup("").expect("empty is none").is_empty());
        // A device caught mid-teardown: null fields, left out.
        let loops = parse_losetup(
            r#"{"loopdevices": [{"name": "/dev/loop1", "sizelimit": null, "offset": null,
                "autoclear": false, "ro": false, "back-file": null, "dio": false, "log-sec": 512},
                {"name": "/dev/loop2", "sizelimit": 0, "offset": 4096, "back-file": "/d.img"}]}"#,
        )
        .expect("parses");
        assert_eq!(loops.len(), 1);
        assert_eq!(loops[0].name, "/dev/loop2");
    }

    #[test]
    fn structs_have_the_kernel_layout() {
        assert_eq!(std::mem::size_of::<LoopInfo64>(), 232);
        assert_eq!(std::mem::size_of::<LoopConfig>(), 304);
    }

    #[test]
    fn lists_from_a_sysfs_tree() {
        let dir = tempfile::tempdir().expect("tempdir");
        let l3 = dir.path().join("loop3/loop");
        std::fs::create_dir_all(&l3).expect("mkdir");
        std::fs::write(l3.join("backing_file"), "/dev/loop0\n").expect("write");
        std::fs::write(l3.join("offset"), "1048576\n").expect("write");
        std::fs::write(l3.join("sizelimit"), "8388608\n").expect("write");
        // loop4 exists but is not attached: no loop/ directory.
        std::fs::create_dir_all(dir.path().join("loop4")).expect("mkdir");
        std::fs::create_dir_all(dir.path().join("sda")).expect("mkdir");
        let loops = list_sysfs(dir.path()).expect("lists");
        assert_eq!(
            loops,
            vec![LosetupDevice {
                name: "/dev/loop3".into(),
                sizelimit: 8388608,
                offset: 1048576,
                back_file: Some("/dev/loop0".into()),
            }]
        );
    }

    #[test]
    fn finds_by_backing_and_offset() {
        let loops = vec![
            LosetupDevice {
                name: "/dev/loop5".into(),
                sizelimit: 100,
                offset: 1048576,
                back_file: Some("/dev/loop0".into()),
            },
            LosetupDevice {
                name: "/dev/loop6".into(),
                sizelimit: 100,
                offset: 2097152,
                back_file: Some("/dev/loop0".into()),
            },
        ];
        let hit = find(&loops, Path::new("/dev/loop0"), 2097152).expect("found");
        assert_eq!(hit.name, "/dev/loop6");
        assert!(find(&loops, Path::new("/dev/loop1"), 2097152).is_none());
    }
}
