//! Creating and removing mount targets: the staging directory, the publish
//! directory or file, and cleaning up what a failed call created so it
//! leaves nothing behind.

use std::path::Path;

use carina_sys::mount;

use crate::error::CsiError;

use super::observe::stat;

/// What a bind mount lands on: a directory, or a file for a device node.
#[derive(Debug, Clone, Copy)]
pub(super) enum TargetKind {
    Dir,
    File,
}

/// Bind-mounts `source` onto `target` with `options`; with `create` the
/// target (of `kind`) is made first, and removed again if the mount fails.
pub(super) async fn bind_onto(
    source: &Path,
    target: &Path,
    kind: TargetKind,
    options: &[String],
    create: bool,
) -> Result<(), CsiError> {
    let created = create
        && match kind {
            TargetKind::Dir => create_dir(target).await?,
            TargetKind::File => create_file(target).await?,
        };
    let result = mount::bind_mount(source, target, options)
        .await
        .map_err(CsiError::from);
    undo_create_on_error(result, target, created).await
}

/// Creates a directory (its parent must exist); `true` if this call made it.
pub(super) async fn create_dir(path: &Path) -> Result<bool, CsiError> {
    match tokio::fs::create_dir(path).await {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(CsiError::FailedPrecondition(format!(
                "cannot create {}: its parent directory does not exist",
                path.display()
            )))
        }
        Err(e) => Err(CsiError::Internal(format!(
            "create directory {}: {e}",
            path.display()
        ))),
    }
}

/// Creates an empty file to bind a device node onto; `true` if made here.
pub(super) async fn create_file(path: &Path) -> Result<bool, CsiError> {
    match tokio::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .await
    {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(CsiError::Internal(format!(
            "create file {}: {e}",
            path.display()
        ))),
    }
}

/// Removes what was created for a mount that then failed, so a failed
/// call leaves nothing behind.
pub(super) async fn undo_create_on_error(
    result: Result<(), CsiError>,
    path: &Path,
    created: bool,
) -> Result<(), CsiError> {
    if result.is_err() && created {
        let removed = match stat(path).await {
            Ok(Some(m)) if m.is_dir() => tokio::fs::remove_dir(path).await,
            Ok(Some(_)) => tokio::fs::remove_file(path).await,
            _ => Ok(()),
        };
        if let Err(e) = removed {
            tracing::warn!(path = %path.display(), error = %e, "cannot remove what a failed call created");
        }
    }
    result
}

/// Removes an unmounted publish target (the directory or file the service
/// created); a directory that is not empty is left and reported.
pub(super) async fn remove_target(target: &Path) -> Result<(), CsiError> {
    let Some(meta) = tokio::fs::symlink_metadata(target).await.ok() else {
        return Ok(());
    };
    let removed = if meta.is_dir() {
        tokio::fs::remove_dir(target).await
    } else {
        tokio::fs::remove_file(target).await
    };
    match removed {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(CsiError::Internal(format!(
            "remove {} after unmounting it: {e}",
            target.display()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn created_targets_are_undone_only_on_failure() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path().join("d");
        assert!(create_dir(&d).await.expect("created"));
        assert!(!create_dir(&d).await.expect("exists"));
        let f = dir.path().join("f");
        assert!(create_file(&f).await.expect("created"));
        assert!(!create_file(&f).await.expect("exists"));
        let err = create_dir(&dir.path().join("no/parent"))
            .await
            .expect_err("no parent");
        assert!(matches!(err, CsiError::FailedPrecondition(_)), "{err:?}");

        undo_create_on_error(Ok(()), &d, true).await.expect("ok");
        assert!(d.is_dir());
        let failed = || Err(CsiError::Internal("mount failed".into()));
        undo_create_on_error(failed(), &d, false)
            .await
            .expect_err("still failed");
        assert!(d.is_dir(), "not created by this call: kept");
        undo_create_on_error(failed(), &d, true)
            .await
            .expect_err("still failed");
        assert!(!d.exists());
        undo_create_on_error(failed(), &f, true)
            .await
            .expect_err("still failed");
        assert!(!f.exists());
    }

    #[tokio::test]
    async fn removing_a_target_that_is_gone_is_fine() {
        let dir = tempfile::tempdir().expect("tempdir");
        let t = dir.path().join("t");
        remove_target(&t).await.expect("nothing there");
        std::fs::create_dir(&t).expect("mkdir");
        std::fs::write(t.join("x"), b"").expect("write");
        let err = remove_target(&t).await.expect_err("not empty");
        assert!(matches!(err, CsiError::Internal(_)), "{err:?}");
        std::fs::remove_file(t.join("x")).expect("rm");
        remove_target(&t).await.expect("removed");
        assert!(!t.exists());
    }
}
