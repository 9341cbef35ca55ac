//! The one error of a failed file, device or ioctl operation: what was
//! done, to which path, and the kernel's answer. Every module here wraps
//! it, and so do the node engine and the CSI socket, so the message reads
//! the same wherever the operation failed.

use std::path::PathBuf;

/// An operation on `path` that failed: `action` names it (`read`,
/// `LOOP_CONFIGURE`, `create directory`).
#[derive(Debug, thiserror::Error)]
#[error("{action} {}: {source}", path.display())]
pub struct IoError {
    pub action: &'static str,
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

impl IoError {
    pub fn new(action: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        IoError {
            action,
            path: path.into(),
            source,
        }
    }

    /// [`IoError::new`] for `map_err`: `.map_err(IoError::map("read", &path))`.
    pub fn map(
        action: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| IoError {
            action,
            path,
            source,
        }
    }
}
