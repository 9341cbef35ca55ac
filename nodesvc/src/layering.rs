//! The check that keeps the engine below the CSI layer: no source file
//! under `src/engine` names the CSI crate (`carina_csi`) or a module of
//! this crate whose name starts with `csi` (`csi_local`, the CSI Node
//! adapter above the engine). The crate depends on `carina-csi` for its
//! CSI server, so such an import would compile; this test refuses it. What
//! the engine shares with the CSI services (the busy lock, bcache sizes)
//! lives in `carina-sys`, below both.

use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`, recursively, with its text.
fn sources(dir: &Path) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let entries = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("read directory {}: {e}", dir.display()));
        for entry in entries {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path)
                    .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
                out.push((path, text));
            }
        }
    }
    out
}

/// The places in `text` that reach CSI code: the token `carina_csi`
/// anywhere (code, `extern crate`, an intra-doc link), or a path segment
/// starting with `csi`, one with `::` before or after it
/// (`crate::csi_local::...`, `use super::super::csi_local as x;`). Prose
/// such as "the CSI node" is not a path and is not reported. Returns
/// (line number, line).
fn csi_references(text: &str) -> Vec<(usize, String)> {
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut found = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let mut rest = line;
        let mut hit = false;
        while let Some(start) = rest.find(|c: char| is_ident(c)) {
            let before = &rest[..start];
            let tail = &rest[start..];
            let end = tail.find(|c: char| !is_ident(c)).unwrap_or(tail.len());
            let token = &tail[..end];
            let after = &tail[end..];
            let segment = before.ends_with("::") || after.starts_with("::");
            if token == "carina_csi" || (token.starts_with("csi") && segment) {
                hit = true;
                break;
            }
            rest = after;
        }
        if hit {
            found.push((n + 1, line.to_string()));
        }
    }
    found
}

#[test]
fn the_engine_names_no_csi_module() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/engine");
    let files = sources(&root);
    // The walk must have seen the engine, or the check proves nothing.
    for expected in ["mod.rs", "locks.rs", "bcache/mod.rs", "bcache/create.rs"] {
        assert!(
            files.iter().any(|(p, _)| p.ends_with(expected)),
            "the walk of {} missed {expected}",
            root.display()
        );
    }
    assert!(files.len() >= 40, "only {} engine files read", files.len());
    let offending: Vec<String> = files
        .iter()
        .flat_map(|(path, text)| {
            let shown = path.strip_prefix(&root).unwrap_or(path).display();
            csi_references(text)
                .into_iter()
                .map(move |(n, line)| format!("engine/{shown}:{n}: {}", line.trim()))
        })
        .collect();
    assert!(
        offending.is_empty(),
        "the engine must not depend on CSI code; move what it shares with the CSI \
         services below both (carina-sys):\n{}",
        offending.join("\n")
    );
}

#[test]
fn csi_references_finds_imports_and_leaves_prose() {
    for line in [
        "use carina_csi::busy::{BusyNames, Held};",
        "    carina_csi::params::cache_bytes(size, ratio_percent)",
        "extern crate carina_csi;",
        "//! ([`carina_csi::busy`]), a refusal",
        "use crate::csi_local::LocalEngine;",
        "use super::super::csi_local as adapter;",
        "    let x = ::carina_csi::DRIVER_NAME;",
    ] {
        assert_eq!(csi_references(line).len(), 1, "not found in {line:?}");
    }
    for line in [
        "/// the cheap, quiet question the CSI node asks of every volume",
        "let csi = 3;",
        "fn csi_volume_name(name: &str) -> String {",
        "use carina_sys::busy::{BusyNames, Held};",
        "carina_csi_like::x",
    ] {
        assert!(csi_references(line).is_empty(), "reported in {line:?}");
    }
}
