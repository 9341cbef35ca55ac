//! What an unreadable record means to the engine, end to end: a journal
//! record and a copy record cut short on disk are never taken for absent
//! ones (see [`super::records`], [`super::intents`] and
//! [`super::copy::record`]). HOST groups in temporary directories.

use std::path::Path;
use std::sync::Arc;

use tokio::sync::watch;

use super::copy::{CopyRequest, Progress, Stop};
use super::{Config, CreateRequest, Engine, EngineOptions};

const GROUP: &str = "g";

/// An engine over one HOST group in `dir`, its journal and copy records
/// there too.
async fn engine(dir: &Path) -> Engine {
    let root = dir.join("root");
    std::fs::create_dir_all(&root).expect("group root");
    let json = serde_json::json!({
        "diskSelector": [{"name": GROUP, "policy": "HOST", "root": root}],
        "diskScanInterval": "0",
    })
    .to_string();
    Engine::start(
        Config::from_json(&json).expect("config"),
        EngineOptions {
            device_mapper: Some(false),
            intent_dir: Some(dir.join("intents")),
            copy_dir: Some(dir.join("copies")),
            ..Default::default()
        },
    )
    .await
    .expect("engine starts")
}

async fn create(engine: &Engine, name: &str) {
    engine
        .create_volume(CreateRequest {
            name: name.to_string(),
            group: GROUP.to_string(),
            size_bytes: 1 << 20,
            exclusive: false,
        })
        .await
        .expect("created");
}

/// A record of `name` cut short in `dir`, as a torn write would leave it.
fn cut_short(dir: &Path, name: &str, whole: &str) -> std::path::PathBuf {
    std::fs::create_dir_all(dir).expect("records dir");
    let path = dir.join(format!("{name}.json"));
    std::fs::write(&path, &whole[..whole.len() / 2]).expect("written");
    path
}

/// A journal record cut short names a change of unknown kind: the start
/// does not settle it by guess (the volume stays) and the volume's next
/// change is refused naming the file, until the record is removed.
#[tokio::test]
async fn an_unreadable_journal_record_keeps_the_volume_and_refuses_its_changes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let first = engine(dir.path()).await;
    create(&first, "v").await;
    drop(first);
    let record = cut_short(
        &dir.path().join("intents"),
        "v",
        r#"{"operation":"create","group":"g","sizeBytes":1048576}"#,
    );

    let engine = engine(dir.path()).await;
    engine
        .get_volume("v")
        .await
        .expect("not rolled back by guess");
    let err = engine.delete_volume("v").await.expect_err("refused");
    assert!(err.to_string().contains("v.json"), "{err}");
    let err = engine
        .resize_volume("v", 2 << 20)
        .await
        .expect_err("refused");
    assert!(err.to_string().contains("v.json"), "{err}");
    engine.get_volume("v").await.expect("still there");

    std::fs::remove_file(&record).expect("the operator removes it");
    engine.delete_volume("v").await.expect("deleted");
}

/// A copy record cut short refuses what it decides (a repeated copy into
/// the volume, a copy from it, its growth) and shows no copy origin.
#[tokio::test]
async fn an_unreadable_copy_record_refuses_the_copy_and_shows_no_origin() {
    let dir = tempfile::tempdir().expect("tempdir");
    let engine = engine(dir.path()).await;
    for name in ["src", "snap", "other"] {
        create(&engine, name).await;
    }
    cut_short(
        &dir.path().join("copies"),
        "snap",
        r#"{"source":"src","snapshot":true,"complete":true,"completedUnixNanos":7,"sourceSizeBytes":1048576}"#,
    );
    assert_eq!(engine.copy_record("snap"), None);

    let copy = |source: &str, target: &str| {
        engine.copy_volume(
            CopyRequest {
                source: source.to_string(),
                target: target.to_string(),
                snapshot: false,
            },
            Arc::new(watch::channel(Progress::default()).0),
            Stop::default(),
        )
    };
    let err = copy("src", "snap").await.expect_err("into it: refused");
    assert!(err.to_string().contains("snap.json"), "{err}");
    let err = copy("snap", "other").await.expect_err("from it: refused");
    assert!(err.to_string().contains("snap.json"), "{err}");
    let err = engine
        .resize_volume("snap", 2 << 20)
        .await
        .expect_err("growth refused");
    assert!(err.to_string().contains("snap.json"), "{err}");
    assert_eq!(engine.copy_record("other"), None, "nothing was copied");
}
