//! Engine benchmarks: create + delete of LVM volumes through the engine
//! against the bare `lvcreate` / `lvremove` on the same VG, interleaved in
//! one run so both see the same machine state. The engine runs `lvm` in
//! its persistent shell (the default); a second engine on a VG of its own,
//! interleaved too, runs a process per command (`--lvm-shell=false`).

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use carina_node::engine::lvm::LvmOptions;
use carina_node::engine::{CreateRequest, Engine};

use crate::pool::LvmPool;
use crate::report::{Entry, timed};

/// In loop mode the engine's create also attaches the loop device and
/// zeroes 512 KiB at each end; its delete detaches it. The floor is the
/// bare LVM command alone.
const GROUP: &str =
    "Engine: LVM create + delete (8 MiB volumes; engine includes loop exposure and wipe)";
const SIZE: u64 = 8 << 20;

/// One engine create + delete of `name`: the two durations.
async fn engine_cycle(engine: &Engine, vg: &str, name: &str) -> Result<(Duration, Duration)> {
    let t0 = Instant::now();
    engine
        .create_volume(CreateRequest {
            name: name.to_string(),
            group: vg.to_string(),
            size_bytes: SIZE,
            exclusive: false,
        })
        .await
        .context("engine create")?;
    let t1 = Instant::now();
    engine.delete_volume(name).await.context("engine delete")?;
    Ok((t1 - t0, t1.elapsed()))
}

pub async fn lvm_create_delete(iterations: usize) -> Result<Vec<Entry>> {
    let pool = LvmPool::new("bench", 2 << 30).await?;
    let processes = LvmPool::with_lvm(
        "bench-proc",
        2 << 30,
        LvmOptions {
            shell: false,
            ..LvmOptions::default()
        },
    )
    .await?;

    let mut engine_cycle_t = Vec::with_capacity(iterations);
    let mut engine_create = Vec::with_capacity(iterations);
    let mut engine_delete = Vec::with_capacity(iterations);
    let mut process_create = Vec::with_capacity(iterations);
    let mut process_delete = Vec::with_capacity(iterations);
    let mut bare_cycle = Vec::with_capacity(iterations);
    let mut bare_c = Vec::with_capacity(iterations);
    let mut bare_d = Vec::with_capacity(iterations);
    // Warm-up rounds are not recorded.
    for i in 0..(iterations + 5) {
        let record = i >= 5;
        let (create, delete) = engine_cycle(&pool.engine, &pool.vg, &format!("e{i}")).await?;
        let (p_create, p_delete) =
            engine_cycle(&processes.engine, &processes.vg, &format!("p{i}")).await?;

        let name = format!("b{i}");
        let t3 = Instant::now();
        pool.bare_lvcreate(&name, "8m")
            .run()
            .await
            .context("bare lvcreate")?;
        let t4 = Instant::now();
        pool.bare_lvremove(&name)
            .run()
            .await
            .context("bare lvremove")?;
        let t5 = Instant::now();
        if record {
            engine_create.push(create);
            engine_delete.push(delete);
            engine_cycle_t.push(create + delete);
            process_create.push(p_create);
            process_delete.push(p_delete);
            bare_c.push(t4 - t3);
            bare_d.push(t5 - t4);
            bare_cycle.push(t5 - t3);
        }
    }
    Ok(vec![
        timed(
            GROUP,
            "engine.lvm.create_delete",
            "lvcreate + lvremove",
            &engine_cycle_t,
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
        timed(
            GROUP,
            "engine.lvm.create.process",
            "lvcreate",
            &process_create,
            Some(&bare_c),
        ),
        timed(
            GROUP,
            "engine.lvm.delete.process",
            "lvremove",
            &process_delete,
            Some(&bare_d),
        ),
    ])
}
