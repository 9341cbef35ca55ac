//! The names of device-group policies as Kubernetes objects carry them
//! (`NodeStorageResource.status.groups[].policy`, the Go original's
//! configuration): what the capacity publisher writes and the provisioner
//! and the scheduler read.

/// An LVM volume group; volumes are logical volumes.
pub const LVM: &str = "LVM";
/// Whole disks carved into GPT partitions.
pub const RAW: &str = "RAW";
/// Directories under a host path.
pub const HOST: &str = "HOST";
/// A group whose policy the node did not say.
pub const UNSPECIFIED: &str = "UNSPECIFIED";
