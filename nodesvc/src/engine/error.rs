//! The engine's error type. Every variant carries the context an operator
//! needs (volume, group, command line and stderr); the gRPC layer maps each
//! variant to exactly one status code.

use std::path::PathBuf;

use carina_sys::IoError;
use carina_sys::command::CommandError;
use carina_sys::loopdev::LoopError;

/// Errors returned by the storage engine.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A request field is malformed; `field` names it (`name`, `size_bytes`, ...).
    #[error("{field}: {reason}")]
    InvalidArgument { field: String, reason: String },

    /// The configuration is invalid; `field` is its path (`diskSelector[1].re[0]`).
    #[error("invalid configuration: {field}: {reason}")]
    InvalidConfig { field: String, reason: String },

    /// No device group of that name is configured.
    #[error("device group {group:?} is not configured on this node")]
    UnknownGroup { group: String },

    /// No volume of that name is owned by this node.
    #[error("volume {name:?} not found")]
    VolumeNotFound { name: String },

    /// A pod has no cgroup on this node (not started yet, or gone).
    #[error("pod {pod_uid:?}: {reason}")]
    PodNotFound { pod_uid: String, reason: String },

    /// A volume of that name exists with other parameters.
    #[error(
        "volume {name:?} already exists in group {group:?} with size {existing_bytes} (requested {requested_bytes})"
    )]
    AlreadyExists {
        name: String,
        group: String,
        existing_bytes: u64,
        requested_bytes: u64,
    },

    /// The group cannot hold the request once its reserve is kept free.
    #[error(
        "device group {group:?} has {allocatable_bytes} bytes allocatable after its reserve, {requested_bytes} requested"
    )]
    ResourceExhausted {
        group: String,
        requested_bytes: u64,
        allocatable_bytes: u64,
    },

    /// The operation is valid but impossible in the current state
    /// (a shrink, a grow whose following extents are taken, ...).
    #[error("{operation} on {name:?} is not possible: {reason}")]
    FailedPrecondition {
        operation: &'static str,
        name: String,
        reason: String,
    },

    /// The group's policy does not support this operation.
    #[error("device group {group:?} ({policy}) does not support {operation}")]
    Unsupported {
        group: String,
        policy: &'static str,
        operation: &'static str,
    },

    /// No bcache device of that name is recorded on this node.
    #[error("bcache device {name:?} not found")]
    BcacheNotFound { name: String },

    /// A bcache device of that name exists with other arguments.
    #[error("bcache device {name:?} already exists: {reason}")]
    BcacheConflict { name: String, reason: String },

    /// The kernel did not show a change in time (a register, attach,
    /// flush or mode change); the operation may still complete, and a
    /// retry continues from where it is.
    #[error("timed out after {waited:?} waiting for {what}")]
    KernelTimeout {
        what: String,
        waited: std::time::Duration,
    },

    /// The kernel refused a write to one of its sysfs attributes.
    #[error("writing {value:?} to {}: {source}", path.display())]
    Sysfs {
        path: PathBuf,
        value: String,
        #[source]
        source: std::io::Error,
    },

    /// A copy's target already holds something else: a complete copy of
    /// another source, or a snapshot.
    #[error("volume {target:?} already holds {holds}")]
    CopyConflict { target: String, holds: String },

    /// The caller cancelled the operation before it completed.
    #[error("{what} was cancelled")]
    Cancelled { what: String },

    /// The operation ran into its own time limit and was stopped.
    #[error("{what} stopped after {waited:?}")]
    TimedOut {
        what: String,
        waited: std::time::Duration,
    },

    /// Another operation on the same volume is in progress.
    #[error("an operation on volume {name:?} is already in progress")]
    Busy { name: String },

    /// The journal of changes in progress could not be written (or read):
    /// the change is refused before anything is touched, since the node
    /// could not repair it after a crash.
    #[error(
        "cannot {action} {}: {source}; the node records each change there before making it, so its state directory must be writable",
        path.display()
    )]
    Journal {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// An external command failed or timed out.
    #[error(transparent)]
    Command(#[from] CommandError),

    /// A file-system operation failed.
    #[error(transparent)]
    Io(#[from] IoError),

    /// Output of a command or a marker file could not be understood.
    #[error("cannot parse {what}: {reason}")]
    Parse { what: String, reason: String },

    /// Work the engine ran on the blocking pool ended without a result
    /// (it panicked, or the runtime is shutting down).
    #[error("{what} did not finish: {source}")]
    Task {
        what: String,
        #[source]
        source: tokio::task::JoinError,
    },
}

impl Error {
    pub(crate) fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::InvalidArgument {
            field: field.into(),
            reason: reason.into(),
        }
    }

    pub(crate) fn config(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::InvalidConfig {
            field: field.into(),
            reason: reason.into(),
        }
    }

    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        Error::Io(IoError::new(action, path, source))
    }

    pub(crate) fn task(what: impl Into<String>, source: tokio::task::JoinError) -> Self {
        Error::Task {
            what: what.into(),
            source,
        }
    }

    pub(crate) fn parse(what: impl Into<String>, reason: impl std::fmt::Display) -> Self {
        Error::Parse {
            what: what.into(),
            reason: reason.to_string(),
        }
    }
}

/// Loop device errors keep their messages: a failed ioctl or read is
/// [`Error::Io`] naming it, unreadable `losetup` output (or a lost
/// blocking task) [`Error::Parse`].
impl From<LoopError> for Error {
    fn from(e: LoopError) -> Self {
        match e {
            LoopError::Command(c) => Error::Command(c),
            LoopError::Io(e) => Error::Io(e),
            LoopError::Parse { what, reason } => Error::parse(what, reason),
            LoopError::Task { task, source } => Error::task(task, source),
        }
    }
}

/// Result alias for engine operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;
