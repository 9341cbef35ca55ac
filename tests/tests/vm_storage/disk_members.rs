//! In the guest, on device-mapper: an LVM disk the selector drops while it
//! holds a volume. This guest kernel has no `dm-mirror` target, so the
//! `pvmove` that would empty the disk fails: the disk must stay with the
//! failure as its reason, the volume whole on its old extents and nothing
//! of the move left behind. Once the volume is gone the disk leaves the
//! volume group and is no longer a physical volume.

use std::path::Path;
use std::time::Instant;

use carina_node::engine::{Config, CreateRequest, Engine, EngineOptions};
use carina_tests::run;
use carina_tests::vm::pass;

use super::{MIB, read_dev, write_dev};

/// The LVM group over `/dev/vdd` and `/dev/vde`.
const MOVE: &str = "vmmove";

fn config(re: &[&str]) -> Config {
    let json = serde_json::json!({
        "diskSelector": [{
            "name": MOVE, "re": re, "policy": "LVM", "activation": "auto",
            "reserveBytes": 0, "minDiskBytes": MIB,
        }],
        "diskScanInterval": "0",
    });
    Config::from_json(&json.to_string()).expect("config")
}

fn is_pv(dev: &str) -> bool {
    run("blkid", &["-p", "-o", "value", "-s", "TYPE", dev]).is_ok_and(|t| t.trim() == "LVM2_member")
}

pub(super) async fn dropped_disks_leave_without_losing_data() {
    let t = Instant::now();
    let engine = Engine::start(config(&["^vdd$"]), EngineOptions::default())
        .await
        .expect("engine starts");
    assert!(engine.device_mapper());
    let vol = engine
        .create_volume(CreateRequest {
            name: "vol-m".into(),
            group: MOVE.into(),
            size_bytes: 16 * MIB,
            exclusive: false,
        })
        .await
        .expect("create on vdd");
    let dev = vol.device_path.clone().expect("a device");
    write_dev(&dev, b"written before the selector dropped vdd");
    engine
        .apply_config(config(&["^vdd$", "^vde$"]))
        .await
        .expect("vde joins");
    engine
        .apply_config(config(&["^vde$"]))
        .await
        .expect("a selector without vdd: the rescan still succeeds");

    let status = engine
        .disks()
        .into_iter()
        .find(|s| s.disk.path == Path::new("/dev/vdd"))
        .expect("vdd is reported");
    for part in [
        "still a physical volume",
        "4 extents",
        "moving them failed",
        "pvmove",
    ] {
        assert!(
            status.reason.contains(part),
            "{part:?} in {:?}",
            status.reason
        );
    }
    println!("vm: vdd stays: {}", status.reason);
    let lvs = run(
        "lvm",
        &["lvs", "-a", "--noheadings", "-o", "lv_name,devices", MOVE],
    )
    .expect("lvs");
    assert!(
        !lvs.contains("pvmove"),
        "nothing of the move is left: {lvs}"
    );
    let v = engine.get_volume("vol-m").await.expect("the volume");
    assert_eq!(
        v.disk.as_deref(),
        Some("/dev/vdd"),
        "still on its old extents"
    );
    assert_eq!(
        read_dev(&dev, 39),
        b"written before the selector dropped vdd",
        "the data is intact"
    );
    assert!(is_pv("/dev/vdd"));
    pass("lvm-drop-disk-holding-extents", t);

    let t = Instant::now();
    engine.delete_volume("vol-m").await.expect("delete");
    engine.rescan().await.expect("rescan");
    let c = engine
        .capacity(Some(MOVE))
        .await
        .expect("capacity")
        .remove(0);
    assert_eq!(c.disks, ["/dev/vde"], "vdd left the volume group");
    assert!(!is_pv("/dev/vdd"), "vdd is no longer a physical volume");
    pass("lvm-drop-empty-disk", t);
}
