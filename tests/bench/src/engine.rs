//! Engine benchmarks: create + delete of LVM volumes through the engine
//! against the bare `lvcreate` / `lvremove` on the same VG, interleaved in
//! one run so both see the same machine state.

use std::time::Instant;

use anyhow::{Context, Result};

use crate::pool::LvmPool;
use crate::report::{Entry, timed};

/// In loop mode the engine's create also attaches the loop device and
/// zeroes 512 KiB at each end; its delete detaches it. The floor is the
/// bare LVM command alone.
const GROUP: &str =
    "Engine: LVM create + delete (8 MiB volumes; engine includes loop exposure and wipe)";
const SIZE: u64 = 8 << 20;

pub async fn lvm_create_delete(iterations: usize) -> Result<Vec<Entry>> {
    let pool = LvmPool::new("bench", 2 << 30).await?;
    let engine = &pool.engine;

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
            .create_volume(pool.request(&name, SIZE))
            .await
            .context("engine create")?;
        let t1 = Instant::now();
        engine.delete_volume(&name).await.context("engine delete")?;
        let t2 = Instant::now();

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
            engine_create.push(t1 - t0);
            engine_delete.push(t2 - t1);
            engine_cycle.push(t2 - t0);
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
