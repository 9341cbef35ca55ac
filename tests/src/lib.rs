//! Shared test harness: loop-device disks, volume-group and mount guards,
//! unique names, and the root/CI policy.
//!
//! Everything a test makes is released by a guard's `Drop`, so cleanup runs
//! also when the test panics. Under `CI=true` a test that cannot get what it
//! needs (root, a loop device) fails instead of skipping.

pub mod bcache;
pub mod bridge;
pub mod cgroup;
pub mod chart;
pub mod cluster;
pub mod containerd;
pub mod copy;
pub mod csi;
pub mod csi_direct;
pub mod csi_node;
pub mod engine;
pub mod faults;
pub mod fuzz;
pub mod gocarina;
pub mod grpc;
pub mod identity;
pub mod jaeger;
pub mod killed_node;
pub mod kube;
pub mod local;
pub mod lvmlock;
pub mod manifests;
pub mod metrics;
pub mod migration;
pub mod ports;
pub mod process;
pub mod sanity;
pub mod scale;
pub mod snapshots;
pub mod soak;
pub mod spans;
pub mod vm;
pub mod workload;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{Context, Result, bail};

/// A name no other test (or test process) uses: `prefix-<pid>-<n>`.
pub fn unique(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// True when running under CI, where skipping is a failure.
pub fn in_ci() -> bool {
    std::env::var("CI")
        .map(|v| v == "true" || v == "1")
        .unwrap_or(false)
}

/// Whether the process may manage block devices. Outside CI a test without
/// root is skipped (see [`skip`]) and returns early; under CI it panics.
pub fn have_root(test: &str) -> bool {
    // SAFETY-free check: root's home is not a reliable signal, the uid is.
    let uid = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(1).map(str::to_string))
        })
        .unwrap_or_default();
    if uid == "0" {
        return true;
    }
    skip(test, "needs root");
    false
}

/// The environment variable naming the file where skipped tests are
/// recorded (hack/test.sh sets it per tier and counts the records as
/// skipped, not passed).
pub const SKIP_FILE_ENV: &str = "CARINA_TEST_SKIP_FILE";

/// Declares that `test` cannot run here and will return early. Under CI
/// this panics: there a skip is a failure. Otherwise it prints
/// `SKIP <test>: <reason>` and appends `<binary>\t<test>\t<reason>` to
/// `$CARINA_TEST_SKIP_FILE`, so the run's summary counts the test as
/// skipped although libtest reports it as passed. `<test>` is libtest's
/// name of the test when called on the test's own thread.
pub fn skip(test: &str, reason: &str) {
    if in_ci() {
        panic!("{test}: {reason} (CI=true, so this is a failure, not a skip)");
    }
    eprintln!("SKIP {test}: {reason}");
    let Some(file) = std::env::var_os(SKIP_FILE_ENV) else {
        return;
    };
    let line = skip_record(
        std::env::current_exe().ok().as_deref(),
        std::thread::current().name(),
        test,
        reason,
    );
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&file)
        .and_then(|mut f| std::io::Write::write_all(&mut f, line.as_bytes()));
    if let Err(e) = written {
        panic!("{test}: cannot record the skip in {file:?}: {e}");
    }
}

/// One line of the skip file: the test binary (without cargo's hash), the
/// test (libtest's thread name if there is one, else `test`) and the
/// reason, tab-separated, on one line.
fn skip_record(exe: Option<&Path>, thread: Option<&str>, test: &str, reason: &str) -> String {
    let binary = exe
        .and_then(Path::file_stem)
        .map(|s| s.to_string_lossy().into_owned())
        .map(|s| match s.rsplit_once('-') {
            Some((name, hash))
                if hash.len() == 16 && hash.chars().all(|c| c.is_ascii_hexdigit()) =>
            {
                name.to_string()
            }
            _ => s,
        })
        .unwrap_or_else(|| "?".to_string());
    let name = match thread {
        Some(t) if !t.is_empty() && t != "main" && !t.starts_with("tokio-runtime") => t,
        _ => test,
    };
    let clean = |s: &str| s.replace(['\t', '\n', '\r'], " ");
    format!("{binary}\t{}\t{}\n", clean(name), clean(reason))
}

/// Waits until `done` holds, asking every 20 ms, at most `within`: the
/// wait for a condition a test cannot be told of. Fails naming `what`.
pub async fn wait_until(
    what: &str,
    within: std::time::Duration,
    mut done: impl FnMut() -> bool,
) -> Result<()> {
    let deadline = std::time::Instant::now() + within;
    while !done() {
        if std::time::Instant::now() >= deadline {
            bail!("not within {within:?}: {what}");
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    Ok(())
}

/// Runs a command, failing with its stderr.
pub fn run(program: &str, args: &[&str]) -> Result<String> {
    let out = Command::new(program)
        .args(args)
        .env("LVM_SUPPRESS_FD_WARNINGS", "1")
        .output()
        .with_context(|| format!("run {program}"))?;
    if !out.status.success() {
        bail!(
            "{program} {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The size of the block device `dev` in bytes, as the kernel reports it.
pub fn blockdev_size(dev: &Path) -> u64 {
    run("blockdev", &["--getsize64", &dev.to_string_lossy()])
        .expect("blockdev")
        .trim()
        .parse()
        .expect("number")
}

/// What `stat -f -c format` prints for the file system holding `path`
/// (`%S %b %f %a`: block size, blocks, free, available), as numbers in
/// order: the kernel's view, independent of Carina's.
pub fn stat_fs<T>(path: &Path, format: &str) -> Vec<T>
where
    T: std::str::FromStr,
    T::Err: std::fmt::Debug,
{
    run("stat", &["-f", "-c", format, &path.to_string_lossy()])
        .expect("stat -f")
        .split_whitespace()
        .map(|w| w.parse().expect("number"))
        .collect()
}

/// A sparse file attached to a loop device (with partition scanning).
/// Dropping detaches every loop device stacked on it, the device itself,
/// and removes the file.
#[derive(Debug)]
pub struct LoopDisk {
    /// `/dev/loopN`
    pub path: PathBuf,
    /// `loopN`
    pub name: String,
    file: PathBuf,
    /// Detached by the test ([`LoopDisk::detach`]): the number may belong
    /// to another disk by the time this drops.
    detached: bool,
    _dir: tempfile::TempDir,
}

impl LoopDisk {
    /// Detaches the loop device now, as a disk that disappears; the drop
    /// then only removes the file. Fails if the kernel refuses.
    pub fn detach(&mut self) -> Result<()> {
        run("losetup", &["-d", &self.dev()])?;
        self.detached = true;
        Ok(())
    }

    /// The backing file.
    pub fn file(&self) -> &Path {
        &self.file
    }

    /// A new loop disk of `size_bytes`. Under CI a failure panics.
    pub fn new(size_bytes: u64) -> Result<LoopDisk> {
        match Self::try_new(size_bytes) {
            Ok(d) => Ok(d),
            Err(e) if in_ci() => panic!("cannot get a loop device under CI: {e:#}"),
            Err(e) => Err(e),
        }
    }

    fn try_new(size_bytes: u64) -> Result<LoopDisk> {
        let dir = tempfile::Builder::new()
            .prefix("carina-disk-")
            .tempdir_in(disk_dir())?;
        let file = dir.path().join("disk.img");
        let f = std::fs::File::create(&file)?;
        f.set_len(size_bytes)?;
        drop(f);
        let file_str = file.to_string_lossy().into_owned();
        let dev = run("losetup", &["-f", "--show", "-P", &file_str])?;
        let path = PathBuf::from(dev.trim());
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .context("losetup printed no device")?;
        Ok(LoopDisk {
            path,
            name,
            file,
            detached: false,
            _dir: dir,
        })
    }

    /// The device path as a string.
    pub fn dev(&self) -> String {
        self.path.to_string_lossy().into_owned()
    }

    /// A selector pattern that matches exactly this disk.
    pub fn pattern(&self) -> String {
        format!("^{}$", self.name)
    }
}

/// Loop devices whose backing file is `dev` (stacked on it).
pub fn loops_backed_by(dev: &str) -> Vec<String> {
    let Ok(out) = run("losetup", &["-n", "-O", "NAME,BACK-FILE", "-l"]) else {
        return Vec::new();
    };
    out.lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let name = it.next()?;
            let back = it.next()?;
            // A loop device set up inside a container that mounts the
            // host's /dev names its backing device relative to that mount
            // (`/loop0` for `/dev/loop0`) once the container is gone.
            let same = back == dev || dev.strip_prefix("/dev") == Some(back);
            same.then(|| name.to_string())
        })
        .collect()
}

impl Drop for LoopDisk {
    fn drop(&mut self) {
        if self.detached {
            let _ = std::fs::remove_file(&self.file);
            return;
        }
        let dev = self.dev();
        for stacked in loops_backed_by(&dev) {
            let _ = run("umount", &["-l", &stacked]);
            let _ = run("losetup", &["-d", &stacked]);
        }
        // Partitions of this disk may carry mounts too.
        if let Ok(mounts) = std::fs::read_to_string("/proc/self/mounts") {
            for line in mounts.lines() {
                let mut f = line.split_whitespace();
                if let (Some(src), Some(target)) = (f.next(), f.next())
                    && is_disk_or_partition(src, &dev)
                {
                    let _ = run("umount", &["-l", target]);
                }
            }
        }
        let _ = run("losetup", &["-d", &dev]);
        let _ = std::fs::remove_file(&self.file);
    }
}

/// True for `dev` itself or one of its partitions (`/dev/loop1p2`), not for
/// another device that shares the prefix (`/dev/loop10`).
pub fn is_disk_or_partition(source: &str, dev: &str) -> bool {
    match source.strip_prefix(dev) {
        Some("") => true,
        Some(rest) => rest
            .strip_prefix('p')
            .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit())),
        None => false,
    }
}

/// Where loop-disk backing files go: `CARINA_TEST_DISK_DIR` or the system
/// temp dir.
fn disk_dir() -> PathBuf {
    std::env::var_os("CARINA_TEST_DISK_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir)
}

/// `config.json` text with one LVM or RAW group (`policy`) that takes
/// exactly `disks`, with `reserve` bytes kept free and no periodic rescan.
pub fn disk_group_config(group: &str, policy: &str, disks: &[&LoopDisk], reserve: u64) -> String {
    let patterns: Vec<String> = disks
        .iter()
        .map(|d| format!("\"{}\"", d.pattern()))
        .collect();
    format!(
        r#"{{"diskSelector":[{{"name":"{group}","re":[{}],"policy":"{policy}","reserveBytes":{reserve},"minDiskBytes":1048576}}],"diskScanInterval":"0"}}"#,
        patterns.join(",")
    )
}

/// LVM `--config` text that makes LVM see only `devices`, each read
/// afresh: no scan hints, which go stale when LVM in another mount
/// namespace (a node pod, with its own `/run/lvm`) changes a disk.
pub fn lvm_filter(devices: &[&str]) -> String {
    let accept: Vec<String> = devices.iter().map(|d| format!("\"a|^{d}$|\"")).collect();
    format!(
        "devices{{obtain_device_list_from_udev=0 hints=\"none\" filter=[{},\"r|.*|\"]}} activation{{udev_sync=0 udev_rules=0}}",
        accept.join(",")
    )
}

/// Runs an `lvm` subcommand that sees only `devices`.
pub fn lvm(devices: &[&str], args: &[&str]) -> Result<String> {
    let config = lvm_filter(devices);
    let mut argv = vec![args[0], "--config", &config];
    argv.extend_from_slice(&args[1..]);
    run("lvm", &argv)
}

/// Removes a volume group (and its PV labels) on drop. Declare it after the
/// `LoopDisk`s it lives on, so it drops first.
#[derive(Debug)]
pub struct VgGuard {
    pub name: String,
    pub devices: Vec<String>,
}

impl VgGuard {
    pub fn new(name: &str, devices: &[&LoopDisk]) -> VgGuard {
        VgGuard {
            name: name.to_string(),
            devices: devices.iter().map(|d| d.dev()).collect(),
        }
    }
}

impl Drop for VgGuard {
    fn drop(&mut self) {
        let devs: Vec<&str> = self.devices.iter().map(String::as_str).collect();
        for dev in &devs {
            for stacked in loops_backed_by(dev) {
                let _ = run("umount", &["-l", &stacked]);
                let _ = run("losetup", &["-d", &stacked]);
            }
        }
        let _ = lvm(
            &devs,
            &["vgremove", "-ff", "-y", "--driverloaded", "n", &self.name],
        );
        for dev in &devs {
            let _ = lvm(&devs, &["pvremove", "-ff", "-y", dev]);
        }
        forget_vg_metadata(&self.name);
    }
}

/// Removes the metadata backups LVM keeps of the volume group `name`
/// (`backup/archive_dir` and `backup/backup_dir`). Every test makes
/// volume groups with unique names; without this each leaves files
/// behind, and LVM commands slow down as the archive grows.
pub fn forget_vg_metadata(name: &str) {
    static DIRS: std::sync::OnceLock<Vec<PathBuf>> = std::sync::OnceLock::new();
    let dirs = DIRS.get_or_init(|| {
        let out = run(
            "lvmconfig",
            &[
                "--typeconfig",
                "full",
                "backup/archive_dir",
                "backup/backup_dir",
            ],
        )
        .unwrap_or_default();
        out.lines()
            .filter_map(|l| l.split_once('='))
            .map(|(_, v)| PathBuf::from(v.trim().trim_matches('"')))
            .collect()
    });
    for dir in dirs {
        let _ = std::fs::remove_file(dir.join(name));
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let file = entry.file_name();
            let Some(rest) = file.to_str().and_then(|f| f.strip_prefix(name)) else {
                continue;
            };
            // `<vg>_<seqno>-<random>.vg`
            let is_archive = rest
                .strip_prefix('_')
                .and_then(|r| r.strip_suffix(".vg"))
                .is_some_and(|r| r.chars().all(|c| c.is_ascii_digit() || c == '-'));
            if is_archive {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
}

/// Where tests keep logs and reports: `$CARINA_TEST_LOG_DIR`, else the
/// workspace's `target/test-logs` (made if missing).
pub fn test_log_dir() -> PathBuf {
    let dir = std::env::var_os("CARINA_TEST_LOG_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/test-logs"));
    let _ = std::fs::create_dir_all(&dir);
    dir
}

/// Mount points at or under `root`, as this process's mountinfo lists
/// them (a mount point with a space reads back with it).
pub fn mounts_under(root: &Path) -> Vec<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|m| PathBuf::from(m.replace("\\040", " ")))
        .filter(|m| m.starts_with(root))
        .collect()
}

/// Unmounts (lazily) on drop.
#[derive(Debug)]
pub struct MountGuard {
    pub target: PathBuf,
}

impl MountGuard {
    /// Mounts `source` at `target` with optional `-t` and `-o`.
    pub fn mount(
        source: &str,
        target: &Path,
        fstype: Option<&str>,
        options: Option<&str>,
    ) -> Result<MountGuard> {
        std::fs::create_dir_all(target)?;
        let target_s = target.to_string_lossy().into_owned();
        let mut args: Vec<&str> = Vec::new();
        if let Some(t) = fstype {
            args.extend(["-t", t]);
        }
        if let Some(o) = options {
            args.extend(["-o", o]);
        }
        args.extend([source, &target_s]);
        run("mount", &args)?;
        Ok(MountGuard {
            target: target.to_path_buf(),
        })
    }
}

impl Drop for MountGuard {
    fn drop(&mut self) {
        let t = self.target.to_string_lossy().into_owned();
        let _ = run("umount", &[&t]).or_else(|_| run("umount", &["-l", &t]));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_of_a_disk_only() {
        assert!(is_disk_or_partition("/dev/loop1", "/dev/loop1"));
        assert!(is_disk_or_partition("/dev/loop1p2", "/dev/loop1"));
        assert!(!is_disk_or_partition("/dev/loop10", "/dev/loop1"));
        assert!(!is_disk_or_partition("/dev/loop10p1", "/dev/loop1"));
        assert!(!is_disk_or_partition("/dev/loop1p", "/dev/loop1"));
    }

    #[test]
    fn a_skip_record_names_the_binary_and_libtests_test() {
        let exe = Path::new("/t/deps/engine_host-0123456789abcdef");
        assert_eq!(
            skip_record(Some(exe), Some("host_lifecycle"), "given", "needs root"),
            "engine_host\thost_lifecycle\tneeds root\n"
        );
        // Off the test's thread the given name stands in; tabs and
        // newlines in a reason cannot split the record.
        assert_eq!(
            skip_record(Some(exe), Some("tokio-runtime-worker"), "given", "a\tb\nc"),
            "engine_host\tgiven\ta b c\n"
        );
        let plain = Path::new("/t/kube_e2e");
        assert_eq!(skip_record(Some(plain), None, "x", "r"), "kube_e2e\tx\tr\n");
    }

    #[test]
    fn unique_names_differ() {
        assert_ne!(unique("t"), unique("t"));
    }

    #[test]
    fn filter_accepts_only_the_devices() {
        let f = lvm_filter(&["/dev/loop3"]);
        assert!(f.contains(r#""a|^/dev/loop3$|","r|.*|""#), "{f}");
    }
}
