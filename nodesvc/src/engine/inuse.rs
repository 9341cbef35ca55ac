//! Whether a volume is still in use on this node, from the mount table:
//! a filesystem on its device mounted anywhere (staged, bind-published),
//! its device node bind-mounted (a published raw block volume), or its
//! HOST directory (or a directory inside it) bind-mounted. A delete of a
//! volume in use is refused: after a network partition the control plane
//! may have given the volume up and recreated its claim elsewhere while
//! the old pod still runs here, and deleting would pull the storage from
//! under it.

use std::path::{Path, PathBuf};

use carina_sys::mount::MountTable;

use super::volume::Volume;

/// The mount points through which `volume` is in use, per `table`.
/// `host_dir` is the volume's HOST directory with symlinks resolved, as
/// mountinfo spells paths.
pub fn mounts_of(table: &MountTable, volume: &Volume, host_dir: Option<&Path>) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    if let Some(device) = &volume.device_path {
        let in_dev = device
            .strip_prefix("/dev")
            .ok()
            .map(|p| Path::new("/").join(p));
        for e in table.entries() {
            let mounted = volume.major != 0 && e.major == volume.major && e.minor == volume.minor;
            let node_bound = e.fs_type == "devtmpfs" && in_dev.as_deref() == Some(e.root.as_path());
            if mounted || node_bound {
                out.push(e.mount_point.clone());
            }
        }
    }
    if let Some(dir) = host_dir
        && let Some((major, minor, root)) = table.locate(dir)
    {
        for e in table.entries() {
            if e.major == major && e.minor == minor && e.root.starts_with(&root) {
                out.push(e.mount_point.clone());
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use carina_sys::mount::parse_mountinfo;

    use super::*;
    use crate::engine::config::Policy;

    const TABLE: &str = "\
22 1 253:1 / / rw,relatime - ext4 /dev/vda1 rw
23 22 0:5 / /dev rw,nosuid - devtmpfs udev rw
40 22 7:3 / /var/lib/kubelet/plugins/staging/pv1 rw - ext4 /dev/loop3 rw
41 22 7:3 / /var/lib/kubelet/pods/p/volumes/pv1/mount rw - ext4 /dev/loop3 rw
42 22 0:5 /loop4 /var/lib/kubelet/pods/p/volumeDevices/pv2 rw - devtmpfs udev rw
43 22 253:1 /srv/host/v3 /var/lib/kubelet/pods/p/volumes/pv3/mount rw - ext4 /dev/vda1 rw
44 22 253:1 /srv/host/v33 /var/lib/kubelet/pods/p/volumes/pv33/mount rw - ext4 /dev/vda1 rw
";

    fn table() -> MountTable {
        MountTable::from_entries(parse_mountinfo(TABLE).expect("parses"))
    }

    fn volume(device: Option<&str>, major: u32, minor: u32, host: Option<&str>) -> Volume {
        Volume {
            name: "v".into(),
            group: "g".into(),
            policy: if host.is_some() {
                Policy::Host
            } else {
                Policy::Lvm
            },
            size_bytes: 1,
            device_path: device.map(PathBuf::from),
            host_path: host.map(PathBuf::from),
            major,
            minor,
            exclusive: false,
            disk: None,
        }
    }

    #[test]
    fn staged_published_and_bound_volumes_are_in_use() {
        let t = table();
        let staged = mounts_of(&t, &volume(Some("/dev/loop3"), 7, 3, None), None);
        assert_eq!(staged.len(), 2, "{staged:?}");
        let block = mounts_of(&t, &volume(Some("/dev/loop4"), 7, 4, None), None);
        assert_eq!(
            block,
            [PathBuf::from("/var/lib/kubelet/pods/p/volumeDevices/pv2")]
        );
        let host = Path::new("/srv/host/v3");
        let dir = mounts_of(&t, &volume(None, 0, 0, Some("/srv/host/v3")), Some(host));
        assert_eq!(
            dir,
            [PathBuf::from("/var/lib/kubelet/pods/p/volumes/pv3/mount")]
        );
        let idle = mounts_of(&t, &volume(Some("/dev/loop5"), 7, 5, None), None);
        assert!(idle.is_empty(), "{idle:?}");
        let other = Path::new("/srv/host/v4");
        assert!(mounts_of(&t, &volume(None, 0, 0, Some("/srv/host/v4")), Some(other)).is_empty());
    }
}
