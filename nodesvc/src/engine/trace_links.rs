//! The trace each volume was created in, kept with the volume on the
//! node, so the later spans of that volume (NodeStage, NodePublish, ... —
//! kubelet sends no trace context, so each starts a trace of its own) can
//! link back to it.
//!
//! One file per volume under the directory, holding the W3C `traceparent`
//! of the span that created it; written once (a repeated, idempotent
//! create keeps the first), removed with the volume. Bookkeeping only: a
//! file that cannot be written or read is logged and the storage
//! operation goes on.

use std::path::{Path, PathBuf};

/// The creation traces of the node's volumes, under `dir`.
#[derive(Debug, Clone)]
pub struct TraceLinks {
    dir: PathBuf,
}

impl TraceLinks {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        TraceLinks { dir: dir.into() }
    }

    fn file(&self, volume: &str) -> PathBuf {
        // Volume names are checked names (no `/`, no leading `.`).
        self.dir.join(volume)
    }

    /// Keeps `traceparent` as `volume`'s creation trace, unless it has one.
    pub fn record(&self, volume: &str, traceparent: &str) {
        let file = self.file(volume);
        if file.exists() {
            return;
        }
        if let Err(e) = write_new(&self.dir, volume, traceparent) {
            tracing::warn!(
                carina.volume.name = %volume,
                path = %file.display(),
                error = %e,
                "could not keep the volume's creation trace; its node spans will not link to it"
            );
        }
    }

    /// `volume`'s creation trace, if one was kept.
    pub fn get(&self, volume: &str) -> Option<String> {
        let text = std::fs::read_to_string(self.file(volume)).ok()?;
        let text = text.trim();
        (!text.is_empty()).then(|| text.to_string())
    }

    /// Forgets `volume`'s creation trace (the volume is gone).
    pub fn forget(&self, volume: &str) {
        let file = self.file(volume);
        match std::fs::remove_file(&file) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(path = %file.display(), error = %e, "could not remove a volume's creation trace")
            }
        }
    }
}

/// Writes `text` as `volume`'s file in `dir` atomically
/// ([`carina_sys::atomic_file`]), so a reader sees the whole line or
/// nothing.
fn write_new(dir: &Path, volume: &str, text: &str) -> std::io::Result<()> {
    carina_sys::atomic_file::write(
        dir,
        std::ffi::OsStr::new(volume),
        format!("{text}\n").as_bytes(),
        0o600,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIRST: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    const SECOND: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    #[test]
    fn kept_once_read_back_and_forgotten() {
        let dir = tempfile::tempdir().expect("tempdir");
        let links = TraceLinks::new(dir.path().join("traces"));
        assert_eq!(links.get("v1"), None);
        links.record("v1", FIRST);
        links.record("v1", SECOND);
        assert_eq!(
            links.get("v1").as_deref(),
            Some(FIRST),
            "the first create's"
        );
        links.forget("v1");
        assert_eq!(links.get("v1"), None);
        links.forget("v1");
    }

    #[test]
    fn an_unwritable_directory_loses_only_the_link() {
        let dir = tempfile::tempdir().expect("tempdir");
        let blocker = dir.path().join("file");
        std::fs::write(&blocker, "").expect("write");
        let links = TraceLinks::new(blocker.join("traces"));
        links.record("v1", FIRST);
        assert_eq!(links.get("v1"), None);
    }

    #[test]
    fn a_link_at_a_temporary_name_is_not_written_through() {
        let dir = tempfile::tempdir().expect("tempdir");
        let traces = dir.path().join("traces");
        std::fs::create_dir(&traces).expect("mkdir");
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "mine").expect("write");
        // The temporary name an earlier version wrote through.
        std::os::unix::fs::symlink(&victim, traces.join("v1.tmp~")).expect("symlink");
        TraceLinks::new(&traces).record("v1", FIRST);
        assert_eq!(std::fs::read_to_string(&victim).expect("read"), "mine");
        assert_eq!(TraceLinks::new(&traces).get("v1").as_deref(), Some(FIRST));
    }
}
