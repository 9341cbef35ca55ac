//! The one mapping from engine errors to gRPC status codes.
//!
//! | engine error | code |
//! | --- | --- |
//! | `InvalidArgument`, `InvalidConfig`, `UnknownGroup` | `INVALID_ARGUMENT` |
//! | `VolumeNotFound`, `BcacheNotFound`, `PodNotFound` | `NOT_FOUND` |
//! | `AlreadyExists`, `BcacheConflict` | `ALREADY_EXISTS` |
//! | `ResourceExhausted` | `RESOURCE_EXHAUSTED` |
//! | `FailedPrecondition`, `Unsupported` | `FAILED_PRECONDITION` |
//! | `Busy` | `ABORTED` |
//! | `Command(TimedOut)`, `KernelTimeout` (a bcache change did not show in time) | `DEADLINE_EXCEEDED` |
//! | `Command(Interrupted)` (the lvm shell died or garbled its answer mid-command) | `UNAVAILABLE` |
//! | `Command(Spawn | Failed)`, `Io`, `Parse`, `Sysfs` (the kernel refused a write) | `INTERNAL` |
//! | `Task` cancelled (shutting down) | `UNAVAILABLE` |
//! | `Journal` (the state directory is full or read-only) | `UNAVAILABLE` |
//! | `Task` panicked | `INTERNAL` |
//!
//! The message is the error's `Display`, which names the field, volume or
//! group, and for commands the command line and its stderr.

use carina_sys::command::CommandError;
use tonic::{Code, Status};

use crate::engine::Error;

/// The gRPC code an engine error maps to.
pub fn code(e: &Error) -> Code {
    match e {
        Error::InvalidArgument { .. }
        | Error::InvalidConfig { .. }
        | Error::UnknownGroup { .. } => Code::InvalidArgument,
        Error::VolumeNotFound { .. } | Error::BcacheNotFound { .. } | Error::PodNotFound { .. } => {
            Code::NotFound
        }
        Error::AlreadyExists { .. } | Error::BcacheConflict { .. } | Error::CopyConflict { .. } => {
            Code::AlreadyExists
        }
        Error::Cancelled { .. } => Code::Cancelled,
        Error::ResourceExhausted { .. } => Code::ResourceExhausted,
        Error::FailedPrecondition { .. } | Error::Unsupported { .. } => Code::FailedPrecondition,
        Error::Busy { .. } => Code::Aborted,
        Error::Command(CommandError::TimedOut { .. })
        | Error::KernelTimeout { .. }
        | Error::TimedOut { .. } => Code::DeadlineExceeded,
        // Its outcome is unknown and a retry runs on a fresh shell.
        Error::Command(CommandError::Interrupted { .. }) => Code::Unavailable,
        Error::Command(CommandError::Spawn { .. } | CommandError::Failed { .. })
        | Error::Io(_)
        | Error::Sysfs { .. }
        | Error::Parse { .. } => Code::Internal,
        // Cancelled: the node is shutting down, a retry elsewhere or later
        // works. A panic is a bug.
        Error::Task { source, .. } if source.is_cancelled() => Code::Unavailable,
        Error::Task { .. } => Code::Internal,
        // Nothing was changed, and the change works once the node's state
        // directory takes writes again.
        Error::Journal { .. } => Code::Unavailable,
    }
}

impl From<Error> for Status {
    fn from(e: Error) -> Status {
        Status::new(code(&e), e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn every_variant_has_its_code() {
        let cases = [
            (
                Error::InvalidArgument {
                    field: "size_bytes".into(),
                    reason: "must be greater than zero".into(),
                },
                Code::InvalidArgument,
                "size_bytes",
            ),
            (
                Error::InvalidConfig {
                    field: "diskSelector[0].re[0]".into(),
                    reason: "invalid regex".into(),
                },
                Code::InvalidArgument,
                "diskSelector[0].re[0]",
            ),
            (
                Error::UnknownGroup { group: "g".into() },
                Code::InvalidArgument,
                "\"g\"",
            ),
            (
                Error::VolumeNotFound { name: "v".into() },
                Code::NotFound,
                "\"v\"",
            ),
            (
                Error::AlreadyExists {
                    name: "v".into(),
                    group: "g".into(),
                    existing_bytes: 1,
                    requested_bytes: 2,
                },
                Code::AlreadyExists,
                "\"v\"",
            ),
            (
                Error::ResourceExhausted {
                    group: "g".into(),
                    requested_bytes: 2,
                    allocatable_bytes: 1,
                },
                Code::ResourceExhausted,
                "\"g\"",
            ),
            (
                Error::FailedPrecondition {
                    operation: "resize",
                    name: "v".into(),
                    reason: "shrinking".into(),
                },
                Code::FailedPrecondition,
                "shrinking",
            ),
            (
                Error::Unsupported {
                    group: "g".into(),
                    policy: "HOST",
                    operation: "exclusive (whole-disk) volumes",
                },
                Code::FailedPrecondition,
                "HOST",
            ),
            (Error::Busy { name: "v".into() }, Code::Aborted, "\"v\""),
            (
                Error::CopyConflict {
                    target: "t".into(),
                    holds: "a snapshot of \"s\"".into(),
                },
                Code::AlreadyExists,
                "snapshot of \"s\"",
            ),
            (
                Error::Cancelled {
                    what: "the copy of \"s\"".into(),
                },
                Code::Cancelled,
                "copy of \"s\"",
            ),
            (
                Error::TimedOut {
                    what: "the copy of \"s\"".into(),
                    waited: Duration::from_secs(3),
                },
                Code::DeadlineExceeded,
                "3s",
            ),
            (
                Error::BcacheNotFound { name: "b".into() },
                Code::NotFound,
                "bcache device \"b\" not found",
            ),
            (
                Error::PodNotFound {
                    pod_uid: "u-1".into(),
                    reason: "no cgroup".into(),
                },
                Code::NotFound,
                "pod \"u-1\": no cgroup",
            ),
            (
                Error::BcacheConflict {
                    name: "b".into(),
                    reason: "it exists with backing volume \"x\"".into(),
                },
                Code::AlreadyExists,
                "backing volume \"x\"",
            ),
            (
                Error::KernelTimeout {
                    what: "cache set u to register".into(),
                    waited: Duration::from_secs(10),
                },
                Code::DeadlineExceeded,
                "cache set u to register",
            ),
            (
                Error::Sysfs {
                    path: "/sys/fs/bcache/register".into(),
                    value: "/dev/loop3".into(),
                    source: std::io::Error::from_raw_os_error(16),
                },
                Code::Internal,
                "writing \"/dev/loop3\" to /sys/fs/bcache/register",
            ),
            (
                Error::Command(CommandError::TimedOut {
                    command: "lvcreate -n v".into(),
                    timeout: Duration::from_secs(60),
                }),
                Code::DeadlineExceeded,
                "lvcreate -n v",
            ),
            (
                Error::Command(CommandError::Interrupted {
                    command: "lvm lvcreate -n v".into(),
                    reason: "the lvm shell exited (signal: 9) before answering".into(),
                }),
                Code::Unavailable,
                "`lvm lvcreate -n v` was interrupted: the lvm shell exited",
            ),
            (
                Error::Command(CommandError::Failed {
                    command: "lvcreate -n v".into(),
                    status: "exit status: 5".into(),
                    code: Some(5),
                    stderr: "Volume group not found".into(),
                }),
                Code::Internal,
                "`lvcreate -n v` failed (exit status: 5): Volume group not found",
            ),
            (
                Error::io(
                    "create directory",
                    "/x",
                    std::io::Error::from(std::io::ErrorKind::PermissionDenied),
                ),
                Code::Internal,
                "create directory /x",
            ),
            (
                Error::Parse {
                    what: "lvs output".into(),
                    reason: "eof".into(),
                },
                Code::Internal,
                "lvs output",
            ),
        ];
        for (error, want, text) in cases {
            let status = Status::from(error);
            assert_eq!(status.code(), want, "{}", status.message());
            assert!(status.message().contains(text), "{}", status.message());
        }
    }

    #[tokio::test]
    async fn a_task_that_did_not_finish_is_not_a_parse_error() {
        let cancelled = tokio::spawn(std::future::pending::<()>());
        cancelled.abort();
        let e = cancelled.await.expect_err("aborted");
        let status = Status::from(Error::Task {
            what: "reading the name record of /dev/loop3".into(),
            source: e,
        });
        assert_eq!(status.code(), Code::Unavailable);
        assert!(
            status.message().contains("did not finish"),
            "{}",
            status.message()
        );
        let panicked = tokio::spawn(async { panic!("boom") })
            .await
            .expect_err("panicked");
        assert_eq!(code(&Error::task("x", panicked)), Code::Internal);
    }
}
