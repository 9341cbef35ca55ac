//! Volumes made by hand exactly as Go Carina v0.14.0 made them on a node,
//! for the tests of taking them over: an untagged LV `volume-<pv>`
//! ([`go_lvcreate`]), a directory `host-<pv>` of mode 0777 with no marker
//! ([`go_host_dir`]), and the data put in them and read back.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use carina_node::engine::detect_device_mapper;

use crate::{MountGuard, lvm, run};

/// A loop device over a window of a disk, detached on drop.
#[derive(Debug)]
pub struct Window(String);

impl Drop for Window {
    fn drop(&mut self) {
        let _ = run("losetup", &["-d", &self.0]);
    }
}

/// A block device showing LV `vg/lv` as it is on disk: its device-mapper
/// node, or (without device-mapper) a loop device over its one segment.
pub fn lv_device(devs: &[&str], vg: &str, lv: &str) -> (String, Option<Window>) {
    if detect_device_mapper() {
        return (format!("/dev/{vg}/{lv}"), None);
    }
    let num = |args: &[&str]| -> u64 {
        lvm(devs, args)
            .expect("lvm report")
            .trim()
            .parse()
            .expect("a number")
    };
    let bytes = ["--noheadings", "--units", "b", "--nosuffix", "-o"];
    let lv_path = format!("{vg}/{lv}");
    let extent = num(&[&["vgs"], &bytes[..], &["vg_extent_size", vg]].concat());
    let size = num(&[&["lvs"], &bytes[..], &["lv_size", &lv_path]].concat());
    let ranges = lvm(
        devs,
        &["lvs", "--noheadings", "-o", "seg_pe_ranges", &lv_path],
    )
    .expect("lvs");
    // "/dev/loopN:first-last"
    let (pv, range) = ranges.trim().rsplit_once(':').expect("pv:range");
    let first: u64 = range
        .split('-')
        .next()
        .expect("first")
        .parse()
        .expect("extent");
    let pe_start = num(&[&["pvs"], &bytes[..], &["pe_start", pv]].concat());
    let offset = (pe_start + first * extent).to_string();
    let dev = run(
        "losetup",
        &[
            "-f",
            "--show",
            "-o",
            &offset,
            "--sizelimit",
            &size.to_string(),
            pv,
        ],
    )
    .expect("losetup");
    let dev = dev.trim().to_string();
    (dev.clone(), Some(Window(dev)))
}

/// Makes the LV `vg/lv` of `size` bytes as Go Carina did: no tags.
pub fn go_lvcreate(devs: &[&str], vg: &str, lv: &str, size: u64) {
    let size = format!("{size}b");
    let mut args = vec!["lvcreate", "-q", "-n", lv, "-L", &size, "-W", "y", "-y"];
    if !detect_device_mapper() {
        // No activation without device-mapper (nor zeroing, which needs it).
        args.extend(["-an", "-Zn", "--driverloaded", "n"]);
    }
    args.push(vg);
    lvm(devs, &args).expect("lvcreate");
}

/// Makes the LV as [`go_lvcreate`] and puts a file system of type
/// `fstype` (`ext4`, `xfs`) with `data.txt` holding `content` in it.
pub fn go_lv_with_data(devs: &[&str], vg: &str, lv: &str, size: u64, fstype: &str, content: &str) {
    go_lvcreate(devs, vg, lv, size);
    let (dev, window) = lv_device(devs, vg, lv);
    put_data_on(&dev, fstype, content);
    drop(window);
}

/// Formats `dev` with ext4 and writes `content` to `data.txt` in it.
pub fn put_data(dev: &str, content: &str) {
    put_data_on(dev, "ext4", content);
}

/// Formats `dev` with `fstype` and writes `content` to `data.txt` in it.
pub fn put_data_on(dev: &str, fstype: &str, content: &str) {
    match fstype {
        "xfs" => run("mkfs.xfs", &["-q", "-f", dev]),
        _ => run(&format!("mkfs.{fstype}"), &["-q", "-F", dev]),
    }
    .expect("mkfs");
    let dir = tempfile::tempdir().expect("tempdir");
    let m = MountGuard::mount(dev, dir.path(), Some(fstype), None).expect("mount");
    std::fs::write(dir.path().join("data.txt"), content).expect("write");
    drop(m);
}

/// The content of `data.txt` on `dev`'s file system (of any type).
pub fn read_data(dev: &Path) -> String {
    let dir = tempfile::tempdir().expect("tempdir");
    let m = MountGuard::mount(&dev.to_string_lossy(), dir.path(), None, Some("ro")).expect("mount");
    let text = std::fs::read_to_string(dir.path().join("data.txt")).expect("read");
    drop(m);
    text
}

/// Makes `<root>/<name>` as Go Carina did (mode 0777, no marker) with
/// `data.txt` holding `content` in it.
pub fn go_host_dir(root: &Path, name: &str, content: &str) -> PathBuf {
    let dir = root.join(name);
    std::fs::create_dir(&dir).expect("mkdir");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    std::fs::write(dir.join("data.txt"), content).expect("write");
    dir
}
