//! Host IO for Carina: what touches the node's kernel and tools, and
//! knows neither CSI nor LVM.
//!
//! - [`command`]: the one runner of external tools (argv only, a timeout on
//!   every run, errors with the command line and stderr, a span per run).
//! - [`coprocess`]: a long-lived helper process fed commands on stdin that
//!   answers on a pipe of its own (one `unsafe` call site: the child-side
//!   `fcntl` that hands it the pipe).
//! - [`crashpoint`]: named points where a test asks the process to die
//!   by SIGKILL (`CARINA_TEST_KILL_AT`), to check recovery at start.
//! - [`mount`]: `/proc/self/mountinfo` parsed and queried, mount, bind
//!   mount and unmount.
//! - [`format`]: what a block device holds (`blkid -p`), a filesystem made
//!   on a blank device only, grown online, and a device's size.
//! - [`fsid`]: a filesystem's UUID read from its device and replaced by a
//!   new one (what a block copy needs to mount beside its source).
//! - [`statvfs`]: block and inode usage of a mounted filesystem.
//! - [`loopdev`]: loop devices attached at an offset and size, listed,
//!   grown in place and detached (the ioctls and `coprocess`'s `fcntl` are
//!   the workspace's only `unsafe` code, allowed at each call site).
//! - [`blockdev`]: whether a block device is mounted or held open.
//! - [`blockstat`]: a block device's IO counters, read by device number.
//! - [`fsctl`]: a mounted filesystem frozen and thawed (an ioctl, its
//!   `unsafe` allowed at the call site), special files made.
//! - [`fdtree`]: directory trees read and written through directory
//!   descriptors, never through a symbolic link (for trees a pod can change
//!   while the node walks them).
//! - [`atomic_file`]: whole files replaced atomically (an unguessable
//!   temporary name opened `O_EXCL | O_NOFOLLOW`, fsync, rename, fsync of
//!   the directory), relative to a directory descriptor or a path.
//! - [`IoError`]: the failed file or device operation all of them report.
//! - [`busy`]: the one per-volume busy lock (a second operation on a busy
//!   name is refused at once), shared by the CSI services and the engine.
//! - [`bcache`]: `make-bcache`'s geometry (data offset, smallest cache) and
//!   the cache volume's size for a backing volume and a ratio.
//!
//! Callers give these modules plain values (paths, sizes, options) and get
//! plain values back; what a result means for a CSI request or a device
//! group is decided in `carina-csi` and `carina-node`.

pub mod atomic_file;
pub mod bcache;
pub mod blockdev;
pub mod blockstat;
pub mod busy;
pub mod command;
pub mod coprocess;
pub mod crashpoint;
pub mod fdtree;
pub mod format;
pub mod fsctl;
pub mod fsid;
mod io_error;
pub mod loopdev;
pub mod mkfs;
pub mod mount;
pub mod mount_options;
#[cfg(test)]
mod proptests;
pub mod statvfs;
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;

pub use io_error::IoError;
