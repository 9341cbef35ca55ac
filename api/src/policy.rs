//! The names of device-group policies as Kubernetes objects carry them
//! (`NodeStorageResource.status.groups[].policy`, the Go original's
//! configuration): what the capacity publisher writes and the provisioner
//! and the scheduler read; and the one rule of which policy can hold which
//! volume ([`suits`]), by which the provisioner places volumes and the
//! scheduler extender filters nodes.

/// An LVM volume group; volumes are logical volumes.
pub const LVM: &str = "LVM";
/// Whole disks carved into GPT partitions.
pub const RAW: &str = "RAW";
/// Directories under a host path.
pub const HOST: &str = "HOST";
/// A group whose policy the node did not say.
pub const UNSPECIFIED: &str = "UNSPECIFIED";

/// What a volume needs of the device group it goes into.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Needs {
    /// A whole disk (`exclusively-raw-disk`).
    pub whole_disk: bool,
    /// Raw block access (`volumeMode: Block`).
    pub block: bool,
    /// A part of a bcache device, which is a block device of its own.
    pub bcache: Option<BcachePart>,
}

/// Which volume of a bcache device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BcachePart {
    /// The backing volume (`backend-disk-group-name`).
    Backing,
    /// The cache volume (`cache-disk-group-name`).
    Cache,
}

/// Why a group of some policy cannot hold a volume.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unsuitable {
    /// A policy name Carina does not know, `UNSPECIFIED` included: nothing
    /// can be said of what the group holds, so it holds nothing.
    #[error("policy {0:?} is not one Carina knows (LVM, RAW or HOST)")]
    UnknownPolicy(String),
    #[error("a whole-disk volume (exclusively-raw-disk) needs a RAW group")]
    WholeDisk,
    #[error("a bcache backing volume needs an LVM or RAW group (a block device)")]
    BcacheBacking,
    #[error("a bcache cache volume needs an LVM or RAW group (a block device)")]
    BcacheCache,
    #[error("block access needs an LVM or RAW group (HOST volumes are directories)")]
    Block,
}

/// Whether a group of `policy` (a name as the records carry it) can hold
/// a volume that `needs` what it says: RAW holds anything; LVM anything
/// but a whole disk; HOST (directories) neither a whole disk, nor block
/// access, nor a part of a bcache device; any other name nothing.
///
/// # Errors
/// Why the group cannot hold it.
pub fn suits(policy: &str, needs: Needs) -> Result<(), Unsuitable> {
    match policy {
        RAW => Ok(()),
        LVM if needs.whole_disk => Err(Unsuitable::WholeDisk),
        LVM => Ok(()),
        HOST if needs.whole_disk => Err(Unsuitable::WholeDisk),
        HOST => match (needs.bcache, needs.block) {
            (Some(BcachePart::Backing), _) => Err(Unsuitable::BcacheBacking),
            (Some(BcachePart::Cache), _) => Err(Unsuitable::BcacheCache),
            (None, true) => Err(Unsuitable::Block),
            (None, false) => Ok(()),
        },
        other => Err(Unsuitable::UnknownPolicy(other.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNT: Needs = Needs {
        whole_disk: false,
        block: false,
        bcache: None,
    };

    fn with(f: impl FnOnce(&mut Needs)) -> Needs {
        let mut n = MOUNT;
        f(&mut n);
        n
    }

    #[test]
    fn what_each_policy_holds() {
        let whole = with(|n| n.whole_disk = true);
        let block = with(|n| n.block = true);
        let backing = with(|n| n.bcache = Some(BcachePart::Backing));
        let cache = with(|n| n.bcache = Some(BcachePart::Cache));
        for needs in [MOUNT, whole, block, backing, cache] {
            assert_eq!(suits(RAW, needs), Ok(()), "{needs:?}");
        }
        for needs in [MOUNT, block, backing, cache] {
            assert_eq!(suits(LVM, needs), Ok(()), "{needs:?}");
        }
        assert_eq!(suits(LVM, whole), Err(Unsuitable::WholeDisk));
        assert_eq!(suits(HOST, MOUNT), Ok(()));
        assert_eq!(suits(HOST, whole), Err(Unsuitable::WholeDisk));
        assert_eq!(suits(HOST, block), Err(Unsuitable::Block));
    }

    /// The cases the provisioner's placement and the extender's room used
    /// to answer differently: a HOST group for a bcache volume, and a
    /// policy no one knows, are refused, each with its reason.
    #[test]
    fn host_for_bcache_and_unknown_policies_are_refused() {
        let backing = with(|n| n.bcache = Some(BcachePart::Backing));
        let cache = with(|n| n.bcache = Some(BcachePart::Cache));
        assert_eq!(suits(HOST, backing), Err(Unsuitable::BcacheBacking));
        assert_eq!(suits(HOST, cache), Err(Unsuitable::BcacheCache));
        assert!(
            Unsuitable::BcacheBacking
                .to_string()
                .contains("bcache backing volume needs an LVM or RAW group")
        );
        for name in [UNSPECIFIED, "ZFS", "", "lvm"] {
            let e = suits(name, MOUNT).expect_err(name);
            assert_eq!(e, Unsuitable::UnknownPolicy(name.to_string()));
            assert!(e.to_string().contains(&format!("{name:?}")), "{e}");
        }
    }
}
