//! Engine benchmarks: create + delete of LVM volumes through the engine
//! against the bare `lvcreate` / `lvremove` on the same VG, interleaved in
//! one run so both see the same machine state.

use std::time::Instant;

use anyhow::{Context, Result};
use carina_node::engine::lvm::lvm_cmd;
use carina_node::engine::{Config, CreateRequest, Engine, EngineOptions};
use carina_tests::{LoopDisk, VgGuard, unique};

use crate::report::{Entry, timed};

/// In loop mode the engine's create also attaches the loop device and
/// zeroes 512 KiB at each end; its delete detaches it. The floor is the
/// bare LVM command alone.
const GROUP: &str =
    "Engine: LVM create + delete (8 MiB volumes; engine includes loop exposure and wipe)";
const SIZE: u64 = 8 << 20;

pub async fn lvm_create_delete(iterations: usize) -> Result<Vec<Entry>> {
    let disk = LoopDisk::new(2 << 30)?;
    let vg = unique("bench");
    let _guard = VgGuard::new(&vg, &[&disk]);
    let state = tempfile::tempdir()?;
    let config = Config::from_json(&carina_tests::disk_group_config(&vg, "LVM", &[&disk], 0))?;
    let engine = Engine::start(
        config,
        EngineOptions {
            state_dir: state.path().into(),
            device_mapper: None,
        },
    )
    .await?;
    let loop_mode = !engine.device_mapper();
    let devices = vec![disk.path.clone()];

    let bare_create = |name: String| {
        let mut cmd = lvm_cmd("lvcreate", &devices).args(["-q", "-an", "-Zn", "-Wn"]);
        if loop_mode {
            cmd = cmd.args(["--driverloaded", "n", "--alloc", "contiguous"]);
        }
        cmd.args(["-L", "8m", "-n"]).arg(name).arg(&vg)
    };
    let bare_remove = |name: String| {
        let mut cmd = lvm_cmd("lvremove", &devices).args(["-q", "-f", "-y"]);
        if loop_mode {
            cmd = cmd.args(["--driverloaded", "n"]);
        }
        cmd.arg(format!("{vg}/{name}"))
    };

    let mut engine_cycle = Vec::with_capacity(iterations);
    let mut engine_create = Vec::with_capacity(iterations);
    let mut engine_delete = Vec::with_capacity(iterations);
    let mut bare_cycle = Vec::with_capacity(iterations);
    let mut bare_c = Vec::with_capacity(iterations);
    let mut bare_d = Vec::with_capacity(iterations);
    // Warm-up rounds are not recorded.
    for i in 0..(iterations + 5) {
        let record = i >= 5;
        let name = format!("e{i}");
        let t0 = Instant::now();
        engine
            .create_volume(CreateRequest {
                name: name.clone(),
                group: vg.clone(),
                size_bytes: SIZE,
                exclusive: false,
            })
            .await
            .context("engine create")?;
        let t1 = Instant::now();
        engine.delete_volume(&name).await.context("engine delete")?;
        let t2 = Instant::now();

        let name = format!("b{i}");
        let t3 = Instant::now();
        bare_create(name.clone())
            .run()
            .await
            .context("bare lvcreate")?;
        let t4 = Instant::now();
        bare_remove(name).run().await.context("bare lvremove")?;
        let t5 = Instant::now();
        if record {
            engine_create.push(t1 - t0);
            engine_delete.push(t2 - t1);
            engine_cycle.push(t2 - t0);
            bare_c.push(t4 - t3);
            bare_d.push(t5 - t4);
            bare_cycle.push(t5 - t3);
        }
    }
    drop(engine);
    Ok(vec![
        timed(
            GROUP,
            "engine.lvm.create_delete",
            "lvcreate + lvremove",
            &engine_cycle,
            Some(&bare_cycle),
        ),
        timed(
            GROUP,
            "engine.lvm.create",
            "lvcreate",
            &engine_create,
            Some(&bare_c),
        ),
        timed(
            GROUP,
            "engine.lvm.delete",
            "lvremove",
            &engine_delete,
            Some(&bare_d),
        ),
    ])
}
