//! Mutations that meet a configuration apply: the orders the engine's
//! locks allow, driven one by one through its group locks. HOST groups in
//! temporary directories: no disk, no root.

use std::sync::Arc;
use std::time::Duration;

use super::{Config, CreateRequest, Engine, EngineOptions, GroupSlot};

/// A HOST group named `group` in a fresh directory, and its configuration.
async fn host_engine(group: &str) -> (Engine, Config, tempfile::TempDir) {
    host_engine_of(&[group]).await
}

/// HOST groups, each in its own subdirectory of one fresh directory.
async fn host_engine_of(groups: &[&str]) -> (Engine, Config, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let selectors: Vec<_> = groups
        .iter()
        .map(|group| {
            let root = dir.path().join(group);
            std::fs::create_dir(&root).expect("group root");
            serde_json::json!({"name": group, "policy": "HOST", "root": root})
        })
        .collect();
    let json = serde_json::json!({
        "diskSelector": selectors,
        "diskScanInterval": "0",
    })
    .to_string();
    let config = Config::from_json(&json).expect("config");
    let engine = Engine::start(
        config.clone(),
        EngineOptions {
            device_mapper: Some(false),
            ..Default::default()
        },
    )
    .await
    .expect("engine starts");
    (engine, config, dir)
}

fn request(name: &str, group: &str) -> CreateRequest {
    CreateRequest {
        name: name.to_string(),
        group: group.to_string(),
        size_bytes: 1 << 20,
        exclusive: false,
    }
}

/// Yields until `done` holds; a deadlock shows as the panic, not a hang.
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..10_000 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("{what} never happened");
}

async fn slot(engine: &Engine, group: &str) -> GroupSlot {
    engine.slot(group).await.expect("group slot")
}

/// A create waiting for its group's lock when an apply comes in: the apply
/// waits for the lock behind it, and the create must finish without the
/// engine's state, which the apply holds meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_queued_before_an_apply_finishes_and_so_does_the_apply() {
    let (engine, config, _dir) = host_engine("race-a").await;
    let old = slot(&engine, "race-a").await;
    let held = old.mutate.clone().lock_owned().await;
    let idle = Arc::strong_count(&old.mutate);

    let create = tokio::spawn({
        let engine = engine.clone();
        async move { engine.create_volume(request("queued", "race-a")).await }
    });
    // Waiting for the lock, the create holds its slot and the lock's own
    // clone of the mutex.
    until("the create waiting for the group lock", || {
        Arc::strong_count(&old.mutate) >= idle + 2
    })
    .await;
    let apply = tokio::spawn({
        let engine = engine.clone();
        async move { engine.apply_config(config).await }
    });
    until("the apply holding the engine's state", || {
        engine.inner.state.try_read().is_err()
    })
    .await;
    drop(held);

    let both = async { (create.await, apply.await) };
    let (created, applied) = tokio::time::timeout(Duration::from_secs(60), both)
        .await
        .expect("create and apply finish (no deadlock)");
    let volume = created.expect("create task").expect("create");
    applied.expect("apply task").expect("apply");
    assert!(old.is_retired(), "the apply retired the replaced slot");
    let listed = engine.list_volumes(Some("race-a")).await.expect("list");
    assert_eq!(listed, vec![volume]);
}

/// A slot taken before an apply and locked after it: the lock is given up
/// and taken on the slot now in place, so the change lands where the new
/// group (whose rescan has run) holds it.
#[tokio::test]
async fn a_lock_on_a_replaced_slot_moves_to_the_current_one() {
    let (engine, config, _dir) = host_engine("race-b").await;
    let old = slot(&engine, "race-b").await;
    engine.apply_config(config).await.expect("apply");
    let current = slot(&engine, "race-b").await;
    assert!(
        !Arc::ptr_eq(&old.mutate, &current.mutate),
        "apply replaced it"
    );
    assert!(old.is_retired() && !current.is_retired());

    let (locked, _lock) = engine.lock_current(old).await.expect("lock");
    assert!(Arc::ptr_eq(&locked.mutate, &current.mutate));
    assert!(
        current.mutate.try_lock().is_err(),
        "the current slot's lock is the one held"
    );
}

/// The group left the configuration while the call waited: the call
/// answers for an unknown group instead of changing the old one.
#[tokio::test]
async fn a_lock_on_a_group_the_apply_removed_is_unknown_group() {
    let (engine, _config, _dir) = host_engine("race-c").await;
    let old = slot(&engine, "race-c").await;
    let other = tempfile::tempdir().expect("tempdir");
    let json = serde_json::json!({
        "diskSelector": [{"name": "race-c2", "policy": "HOST", "root": other.path()}],
        "diskScanInterval": "0",
    })
    .to_string();
    engine
        .apply_config(Config::from_json(&json).expect("config"))
        .await
        .expect("apply");
    let err = engine.lock_current(old).await.expect_err("refused");
    assert!(
        matches!(err, super::Error::UnknownGroup { ref group } if group == "race-c"),
        "{err:?}"
    );
}

/// A create that finishes in one group while a rescan is still on another:
/// the rescan must not rebuild the index from its earlier listing and so
/// lose the new volume (which the node would then answer NotFound for).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_during_a_rescan_of_another_group_stays_findable() {
    let (engine, _config, _dir) = host_engine_of(&["idx-a", "idx-b"]).await;
    let b = slot(&engine, "idx-b").await;
    let held = b.mutate.clone().lock_owned().await;
    let idle = Arc::strong_count(&b.mutate);

    let rescan = tokio::spawn({
        let engine = engine.clone();
        async move { engine.rescan().await }
    });
    // The rescan has taken its copy of the slots; groups go in name order,
    // so it lists idx-a and then waits for idx-b's lock, which is held.
    until("the rescan copying the slots", || {
        Arc::strong_count(&b.mutate) > idle
    })
    .await;
    // Gives the rescan time to finish idx-a first. Were it slower, the
    // create would simply be in its listing: the test could then miss the
    // fault, never report one that is not there.
    tokio::time::sleep(Duration::from_millis(200)).await;
    engine
        .create_volume(request("made-meanwhile", "idx-a"))
        .await
        .expect("create in idx-a");
    drop(held);
    rescan.await.expect("rescan task").expect("rescan");

    let found = engine.get_volume("made-meanwhile").await.expect("found");
    assert_eq!(found.group, "idx-a");
}
