//! The data of the copy tests: pseudo-random bytes, the volumes' devices
//! and directories, writes and SHA-256 checksums (`sha256sum`).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::{Command, Stdio};

use carina_node::engine::Volume;

use crate::{blockdev_size, run};

/// `len` bytes of splitmix64 output from `seed`.
pub fn pseudo_random(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        out.extend_from_slice(&z.to_le_bytes());
    }
    out.truncate(len);
    out
}

pub fn dev(v: &Volume) -> &Path {
    v.device_path.as_deref().expect("a block device")
}

pub fn dir(v: &Volume) -> &Path {
    v.host_path.as_deref().expect("a directory")
}

/// Writes `data` at `offset` of the block device `path` and syncs it.
pub fn write_device(path: &Path, offset: u64, data: &[u8]) {
    let f = OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    f.write_all_at(data, offset).expect("write the device");
    f.sync_all().expect("sync the device");
}

/// SHA-256 of the first `len` bytes of `path` (fails if it is shorter).
pub fn sha256_prefix(path: &Path, len: u64) -> String {
    let script = r#"set -o pipefail; head -c "$1" "$2" | sha256sum"#;
    let hash = run(
        "bash",
        &[
            "-c",
            script,
            "hash",
            &len.to_string(),
            &path.to_string_lossy(),
        ],
    )
    .expect("sha256sum");
    let size = blockdev_size(path);
    assert!(
        size >= len,
        "{} has {size} bytes, not {len}",
        path.display()
    );
    hash.split_whitespace().next().expect("a hash").to_string()
}

/// SHA-256 of `data`.
pub fn sha256_bytes(data: &[u8]) -> String {
    let mut child = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("sha256sum");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(data)
        .expect("feed sha256sum");
    let out = child.wait_with_output().expect("sha256sum");
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .expect("a hash")
        .to_string()
}

/// The filesystem UUID on `dev`, probed from the device.
pub fn fs_uuid(dev: &Path) -> String {
    let uuid = run(
        "blkid",
        &["-p", "-o", "value", "-s", "UUID", &dev.to_string_lossy()],
    )
    .expect("blkid");
    assert!(!uuid.trim().is_empty(), "{} has no UUID", dev.display());
    uuid.trim().to_string()
}

/// Writes `len` pseudo-random bytes to the new file `path` and syncs it.
pub fn write_file(path: &Path, seed: u64, len: usize) -> String {
    let data = pseudo_random(seed, len);
    let mut f = File::create_new(path).expect("create");
    f.write_all(&data).expect("write");
    f.sync_all().expect("fsync");
    sha256_bytes(&data)
}
