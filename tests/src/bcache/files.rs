//! The stand-in's reading and writing: sysfs value and trigger files, the
//! driver's formats (sizes, the cache-mode line), and the superblock and
//! device number of a device being registered.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::run;

pub(super) const MODES: [&str; 4] = ["writethrough", "writeback", "writearound", "none"];

/// Replaces a value file in one step, so a reader never sees it empty.
pub(super) fn put(path: &Path, value: &str) {
    let tmp = path.with_extension("standin-tmp");
    std::fs::write(&tmp, format!("{value}\n")).expect("write attribute");
    std::fs::rename(&tmp, path).expect("replace attribute");
}

/// The text written to a trigger file since it was last emptied.
pub(super) fn take(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let text = text.trim().to_string();
    if text.is_empty() {
        return None;
    }
    std::fs::write(path, "").ok()?;
    Some(text)
}

pub(super) fn human(bytes: u64) -> String {
    if bytes < 1024 {
        return format!("{bytes}");
    }
    let units = ['k', 'M', 'G', 'T'];
    let mut v = bytes as f64 / 1024.0;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1}{}", units[u])
}

pub(super) fn mode_line(mode: &str) -> String {
    MODES
        .iter()
        .map(|m| {
            if *m == mode {
                format!("[{m}]")
            } else {
                m.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The superblock fields the stand-in needs, read its own way from the
/// real `bcache-super-show` (not with the engine's parser).
pub(super) fn superblock(path: &str) -> Option<(bool, String, String, String)> {
    let out = run("bcache-super-show", &[path]).ok()?;
    let field = |k: &str| {
        out.lines()
            .find(|l| l.split_whitespace().next() == Some(k))
            .map(|l| l[k.len()..].trim().to_string())
    };
    let backing = field("sb.version")?.contains("backing");
    let mode = field("dev.data.cache_mode")
        .and_then(|m| {
            MODES
                .iter()
                .find(|x| m.contains(&format!("[{x}]")))
                .copied()
        })
        .unwrap_or("writethrough");
    Some((
        backing,
        field("dev.uuid")?,
        field("cset.uuid")?,
        mode.to_string(),
    ))
}

pub(super) fn devnum_of(path: &str) -> Option<String> {
    let rdev = std::fs::metadata(path).ok()?.rdev();
    let major = ((rdev >> 8) & 0xfff) | ((rdev >> 32) & !0xfff);
    let minor = (rdev & 0xff) | ((rdev >> 12) & !0xff);
    Some(format!("{major}:{minor}"))
}
