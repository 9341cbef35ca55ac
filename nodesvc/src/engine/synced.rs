//! Small files the engine keeps across restarts (copy records, the
//! journal of changes in progress), written so that after a crash each is
//! either whole or absent, and removed so that the removal survives one.

use std::io::Write;
use std::path::Path;

/// How the temporary file of a write in progress ends.
pub const TEMP_SUFFIX: &str = ".tmp~";

/// Writes `bytes` to `file` (in `dir`, made if missing) through a synced
/// temporary file renamed over it, then syncs `dir`.
pub fn write(dir: &Path, file: &Path, bytes: &[u8]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut tmp = file.as_os_str().to_owned();
    tmp.push(TEMP_SUFFIX);
    let tmp = std::path::PathBuf::from(tmp);
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, file)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Removes `file` (in `dir`) and syncs `dir`; a missing file is removed.
pub fn remove(dir: &Path, file: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(file) {
        Ok(()) => std::fs::File::open(dir)?.sync_all(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}
