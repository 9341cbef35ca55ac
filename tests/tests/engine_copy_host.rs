//! Engine tests of file-tree copies ([`Engine::copy_volume`](carina_node::engine::Engine::copy_volume)) between
//! HOST volumes, each group on a small ext4 of its own on a loop device.
//! The node and the copies are [`carina_tests::copy`]'s.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use carina_node::engine::copy::Progress;
use carina_tests::copy::data::{dir, sha256_bytes, write_file};
use carina_tests::copy::{MIB, Node, copy};

// ---------------------------------------------------------------------------
// 2. HOST: a tree replaces the target's stale content.
// ---------------------------------------------------------------------------

/// What a tree holds, by relative path: the kind, the mode, and the
/// content's hash, the link's target, or nothing for a directory.
fn tree(root: &Path) -> BTreeMap<PathBuf, (String, u32, String)> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, (String, u32, String)>) {
        for entry in std::fs::read_dir(dir).expect("list") {
            let path = entry.expect("entry").path();
            let meta = std::fs::symlink_metadata(&path).expect("stat");
            let rel = path
                .strip_prefix(root)
                .expect("under the root")
                .to_path_buf();
            let mode = meta.mode() & 0o7777;
            let kind = meta.file_type();
            let entry = if kind.is_symlink() {
                let link = std::fs::read_link(&path).expect("readlink");
                ("link".into(), 0, link.to_string_lossy().into_owned())
            } else if kind.is_dir() {
                walk(root, &path, out);
                ("dir".into(), mode, String::new())
            } else if kind.is_file() {
                let data = std::fs::read(&path).expect("read");
                let mtime = meta.mtime();
                (
                    "file".into(),
                    mode,
                    format!("{} {mtime}", sha256_bytes(&data)),
                )
            } else {
                ("other".into(), mode, meta.rdev().to_string())
            };
            out.insert(rel, entry);
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    let mode = std::fs::metadata(root).expect("stat the root").mode() & 0o7777;
    out.insert(PathBuf::new(), ("dir".into(), mode, String::new()));
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_tree_copy_replaces_stale_content() {
    let test = "host_tree_copy_replaces_stale_content";
    let Some(n) = Node::new(test, None, Some(128 * MIB), None).await else {
        return;
    };
    let e = &n.engine;
    let src = n.host("hsrc", 32 * MIB).await;
    let tgt = n.host("htgt", 32 * MIB).await;
    let (s, t) = (dir(&src), dir(&tgt));

    // Nested directories, a big file (several chunks), small files, an
    // empty one, a link, modes of all kinds.
    std::fs::create_dir_all(s.join("a/b/c")).expect("mkdir");
    std::fs::create_dir(s.join("empty-dir")).expect("mkdir");
    std::fs::create_dir(s.join("sticky")).expect("mkdir");
    let big = 9 * MIB as usize + 123;
    write_file(&s.join("a/b/c/big.bin"), 10, big);
    write_file(&s.join("a/small.txt"), 11, 100);
    write_file(&s.join("a/b/mid.bin"), 12, 70_000);
    write_file(&s.join("top"), 13, 1);
    File::create_new(s.join("a/b/empty")).expect("create");
    std::os::unix::fs::symlink("a/b/c/big.bin", s.join("link")).expect("symlink");
    std::os::unix::fs::symlink("../nowhere", s.join("a/dangling")).expect("symlink");
    for (path, mode) in [
        ("top", 0o640),
        ("a/small.txt", 0o600),
        ("a/b/mid.bin", 0o755),
        ("a/b/empty", 0o4711),
        ("a/b", 0o750),
        ("a/b/c", 0o700),
        ("sticky", 0o1777),
        ("empty-dir", 0o2775),
        ("", 0o711),
    ] {
        std::fs::set_permissions(s.join(path), std::fs::Permissions::from_mode(mode))
            .expect("chmod");
    }
    // Stale content in the target, some of it under names the source
    // uses too.
    std::fs::create_dir_all(t.join("stale-dir/deeper")).expect("mkdir");
    std::fs::write(t.join("stale-dir/deeper/old"), b"old").expect("write");
    std::fs::write(t.join("top"), b"stale top, longer than the new one").expect("write");
    std::fs::create_dir(t.join("link")).expect("mkdir");
    std::fs::write(t.join("a"), b"a file where the source has a directory").expect("write");

    let want = tree(s);
    assert_ne!(tree(t), want);
    let (copied, seen) = copy(e, "hsrc", "htgt", false).await.copied();
    assert!(copied.copied);
    assert_eq!(copied.volume.host_path.as_deref(), Some(t));
    let files = (big + 100 + 70_000 + 1) as u64;
    assert_eq!(
        seen.last,
        Progress {
            copied_bytes: files,
            total_bytes: files,
            frozen: false,
        },
        "progress counts the files' bytes"
    );
    let got = tree(t);
    assert_eq!(got, want, "the target's tree is the source's");
    assert!(!t.join("stale-dir").exists(), "stale content gone");
    assert_eq!(
        std::fs::read_link(t.join("link")).expect("a link"),
        Path::new("a/b/c/big.bin")
    );
    assert_eq!(
        std::fs::read_link(t.join("a/dangling")).expect("a link"),
        Path::new("../nowhere")
    );
    assert_eq!(
        std::fs::metadata(t.join("a/b/c/big.bin"))
            .expect("stat")
            .len(),
        big as u64
    );
    let record = e.copy_record("htgt").expect("a record");
    assert!(record.complete && record.source == "hsrc", "{record:?}");
    assert_eq!(record.source_size_bytes, 32 * MIB);
    // The source is untouched.
    assert_eq!(tree(s), want);

    // A repeat is a no-op: a file added to the target since stays.
    std::fs::write(t.join("added-later"), b"mine").expect("write");
    let (again, _) = copy(e, "hsrc", "htgt", false).await.copied();
    assert!(!again.copied);
    assert!(t.join("added-later").exists());
}
