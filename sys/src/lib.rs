//! Host IO for Carina: what touches the node's kernel and tools, and
//! knows neither CSI nor LVM.
//!
//! - [`command`]: the one runner of external tools (argv only, a timeout on
//!   every run, errors with the command line and stderr, a span per run).
//! - [`mount`]: `/proc/self/mountinfo` parsed and queried, mount, bind
//!   mount and unmount.
//! - [`format`]: what a block device holds (`blkid -p`), a filesystem made
//!   on a blank device only, grown online, and a device's size.
//! - [`statvfs`]: block and inode usage of a mounted filesystem.
//!
//! Callers give these modules plain values (paths, sizes, options) and get
//! plain values back; what a result means for a CSI request or a device
//! group is decided in `carina-csi` and `carina-node`.

pub mod command;
pub mod format;
pub mod mount;
pub mod statvfs;
