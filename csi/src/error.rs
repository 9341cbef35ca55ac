//! The CSI layer's errors and the one place they become gRPC status codes,
//! including the errors of the host primitives the node service runs
//! (commands, mounts, formatting).

use carina_sys::command::CommandError;
use carina_sys::format::FormatError;
use carina_sys::mount::MountError;
use tonic::{Code, Status};

/// Errors of the CSI services and of the traits behind them.
#[derive(Debug, thiserror::Error)]
pub enum CsiError {
    /// A request field is missing or malformed; `field` is its path
    /// (`capacity_range.required_bytes`, `parameters["x"]`).
    #[error("{field}: {reason}")]
    InvalidArgument { field: String, reason: String },
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    AlreadyExists(String),
    #[error("{0}")]
    ResourceExhausted(String),
    /// A size outside what the volume or group can be.
    #[error("{0}")]
    OutOfRange(String),
    #[error("{0}")]
    FailedPrecondition(String),
    /// Another operation on the same volume is in progress.
    #[error("{0}")]
    Aborted(String),
    #[error("{0}")]
    Unimplemented(String),
    /// A node or dependency cannot be reached now; retrying may succeed.
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    DeadlineExceeded(String),
    #[error("{0}")]
    Internal(String),
    /// A status from a node's NodeStorage service, kept as it is.
    #[error("{context}: {}", .status.message())]
    Node { context: String, status: Status },
}

impl CsiError {
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        CsiError::InvalidArgument {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// Wraps a status answered by (or about) a node.
    pub fn node(context: impl Into<String>, status: Status) -> Self {
        CsiError::Node {
            context: context.into(),
            status,
        }
    }

    /// The gRPC code this error is answered with.
    pub fn code(&self) -> Code {
        match self {
            CsiError::InvalidArgument { .. } => Code::InvalidArgument,
            CsiError::NotFound(_) => Code::NotFound,
            CsiError::AlreadyExists(_) => Code::AlreadyExists,
            CsiError::ResourceExhausted(_) => Code::ResourceExhausted,
            CsiError::OutOfRange(_) => Code::OutOfRange,
            CsiError::FailedPrecondition(_) => Code::FailedPrecondition,
            CsiError::Aborted(_) => Code::Aborted,
            CsiError::Unimplemented(_) => Code::Unimplemented,
            CsiError::Unavailable(_) => Code::Unavailable,
            CsiError::DeadlineExceeded(_) => Code::DeadlineExceeded,
            CsiError::Internal(_) => Code::Internal,
            CsiError::Node { status, .. } => status.code(),
        }
    }
}

impl From<CsiError> for Status {
    fn from(e: CsiError) -> Status {
        Status::new(e.code(), e.to_string())
    }
}

/// A command failure as the CSI layer answers it: a timeout is
/// `DEADLINE_EXCEEDED`, an interrupted command `UNAVAILABLE` (retry),
/// anything else `INTERNAL` (the message keeps the command line and
/// stderr).
fn command_error(e: CommandError) -> CsiError {
    match e {
        CommandError::TimedOut { .. } => CsiError::DeadlineExceeded(e.to_string()),
        CommandError::Interrupted { .. } => CsiError::Unavailable(e.to_string()),
        CommandError::Spawn { .. } | CommandError::Failed { .. } => {
            CsiError::Internal(e.to_string())
        }
    }
}

impl From<MountError> for CsiError {
    fn from(e: MountError) -> CsiError {
        match e {
            MountError::Command(c) => command_error(c),
            other => CsiError::Internal(other.to_string()),
        }
    }
}

/// A device that holds something else, or is too small for the filesystem,
/// is `FAILED_PRECONDITION`: the request cannot succeed until someone
/// changes the device.
impl From<FormatError> for CsiError {
    fn from(e: FormatError) -> CsiError {
        match e {
            FormatError::Command(c) => command_error(c),
            FormatError::Occupied { .. } | FormatError::TooSmall { .. } => {
                CsiError::FailedPrecondition(e.to_string())
            }
            FormatError::Io(_) | FormatError::Unreadable { .. } => {
                CsiError::Internal(e.to_string())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_and_messages() {
        let s: Status = CsiError::invalid("volume_id", "must not be empty").into();
        assert_eq!(s.code(), Code::InvalidArgument);
        assert_eq!(s.message(), "volume_id: must not be empty");
        let s: Status = CsiError::node("node-a", Status::resource_exhausted("full")).into();
        assert_eq!(s.code(), Code::ResourceExhausted);
        assert_eq!(s.message(), "node-a: full");
    }

    #[test]
    fn occupied_is_failed_precondition_naming_both() {
        let e: CsiError = FormatError::Occupied {
            device: "/dev/loop3".into(),
            found: "xfs".into(),
            wanted: "ext4".into(),
        }
        .into();
        assert_eq!(e.code(), tonic::Code::FailedPrecondition);
        let text = e.to_string();
        assert!(text.contains("xfs") && text.contains("ext4"), "{text}");
    }
}
