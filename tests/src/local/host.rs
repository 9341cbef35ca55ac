//! What a kubelet node leaves on the host, and how the harness takes it
//! away: mounts under the cluster's folder, the pod bridge, the cgroup
//! parent of every pod, and container shims that outlive their containerd.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use crate::run;

/// The host's address on its default route: what the kubelet reports as
/// the Node's InternalIP and where pods reach the apiserver.
pub fn default_route_ip() -> Result<Ipv4Addr> {
    // Any address off the local networks; nothing is sent.
    let out = run("ip", &["-4", "route", "get", "192.0.2.254"])
        .or_else(|_| run("ip", &["-4", "route", "get", "8.8.8.8"]))
        .context("ask the kernel for the default route")?;
    parse_route_source(&out).with_context(|| format!("no source address in `ip route get`: {out}"))
}

/// The `src` field of `ip route get` output.
fn parse_route_source(out: &str) -> Option<Ipv4Addr> {
    let mut words = out.split_whitespace();
    while let Some(w) = words.next() {
        if w == "src" {
            return words.next()?.parse().ok();
        }
    }
    None
}

/// Bind-mounts `dir` onto itself and makes it a shared mount, so a mount a
/// container makes below it with Bidirectional propagation shows on the
/// host (the host's `/` may be private). Undone by [`unmount_under`].
pub fn make_shared(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir)?;
    let d = dir.to_str().context("UTF-8 path")?;
    run("mount", &["--bind", d, d])?;
    run("mount", &["--make-rshared", d])?;
    Ok(())
}

/// Mount points at or below `dir`, from /proc/self/mountinfo, deepest
/// first.
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut mounts: Vec<PathBuf> = carina_sys::mount::parse_mountinfo(&text)
        .unwrap_or_default()
        .into_iter()
        .map(|m| m.mount_point)
        .filter(|p| p.starts_with(dir))
        .collect();
    mounts.sort_by_key(|m| std::cmp::Reverse(m.components().count()));
    mounts.dedup();
    mounts
}

/// Unmounts everything at or below `dir`, deepest first (lazily, so a
/// mount still busy goes once its last user does).
pub fn unmount_under(dir: &Path) {
    // A shared bind mount of itself appears twice; go until none is left.
    for _ in 0..4 {
        let mounts = mounts_under(dir);
        if mounts.is_empty() {
            return;
        }
        for m in mounts {
            let _ = run("umount", &["-l", &m.to_string_lossy()]);
        }
    }
}

/// The cgroup hierarchies of this host: every cgroup v1 controller mount
/// and the cgroup2 mount, from /proc/self/mountinfo.
pub fn cgroup_mounts() -> Vec<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    carina_sys::mount::parse_mountinfo(&text)
        .unwrap_or_default()
        .into_iter()
        .filter(|m| m.fs_type == "cgroup" || m.fs_type == "cgroup2")
        .map(|m| m.mount_point)
        .collect()
}

/// Creates the cgroup `/<name>` in every hierarchy: the parent the kubelet
/// puts its pods under (`cgroupRoot`), so they are found and removed.
pub fn create_cgroup(name: &str) -> Result<()> {
    for hierarchy in cgroup_mounts() {
        let dir = hierarchy.join(name);
        std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    }
    Ok(())
}

/// Removes the cgroup `/<name>` and everything below it in every
/// hierarchy, first moving out any process still in it (children first:
/// a cgroup directory is removed with rmdir, once empty).
pub fn remove_cgroup(name: &str) -> Result<()> {
    let mut left = Vec::new();
    for hierarchy in cgroup_mounts() {
        let top = hierarchy.join(name);
        if !top.exists() {
            continue;
        }
        let mut dirs = Vec::new();
        collect_dirs(&top, &mut dirs);
        dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
        for dir in dirs {
            if std::fs::remove_dir(&dir).is_err() && dir.exists() {
                left.push(dir);
            }
        }
    }
    if !left.is_empty() {
        bail!("cgroups still in use: {left:?}");
    }
    Ok(())
}

fn collect_dirs(dir: &Path, out: &mut Vec<PathBuf>) {
    out.push(dir.to_path_buf());
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                collect_dirs(&e.path(), out);
            }
        }
    }
}

/// The pids of processes whose command line contains `needle` (e.g. a
/// containerd socket path every shim of that containerd is started with).
pub fn pids_with_argument(needle: &str) -> Vec<u32> {
    let me = std::process::id();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(needle))
        })
        .collect()
}

/// SIGKILLs every process whose command line contains `needle`.
pub fn kill_with_argument(needle: &str) {
    for pid in pids_with_argument(needle) {
        let _ = run("kill", &["-KILL", &pid.to_string()]);
    }
}

/// Deletes the network interface `name` if it exists.
pub fn delete_link(name: &str) {
    if Path::new("/sys/class/net").join(name).exists() {
        let _ = run("ip", &["link", "delete", name]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_source_is_read() {
        let out = "8.8.8.8 via 192.0.2.1 dev eth0 src 192.0.2.2 uid 0 \n    cache \n";
        assert_eq!(parse_route_source(out), Some(Ipv4Addr::new(192, 0, 2, 2)));
        assert_eq!(parse_route_source("unreachable"), None);
    }
}
