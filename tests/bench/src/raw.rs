//! RAW engine benchmarks: create + delete of GPT partition volumes through
//! the engine against the bare table write plus `partx` on a loop disk of
//! the same kind, interleaved in one run so both see the same machine.
//!
//! Two shapes. *Shared*: the disk already holds a volume, so a create adds
//! an entry to a table that stays (the usual case). *Blank*: the disk holds
//! nothing, so the engine's create writes the GPT with the volume and its
//! delete removes the table again (csi-sanity's one-volume-at-a-time
//! pattern); the floor there is a new table with one entry, and deleting
//! that entry. A third table compares the two GPT writers themselves,
//! `sgdisk` against `sfdisk`, command alone against command alone.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use carina_node::engine::gpt;
use carina_node::engine::raw::{partition_name, volume_guid};
use carina_sys::command::Cmd;
use carina_tests::LoopDisk;
use carina_tests::engine::EngineFixture;

use crate::report::{Entry, timed};

const SHARED: &str = "Engine: RAW create + delete (8 MiB partitions on a disk that holds a volume; engine includes reading the table, wiping the new partition and the capacity update)";
const BLANK: &str = "Engine: RAW create + delete on a blank disk (the engine writes the GPT with the first volume and removes it with the last)";
const TOOLS: &str = "GPT writers: sgdisk against sfdisk (8 MiB partition, the command alone)";
const SIZE: u64 = 8 << 20;
const DISK: u64 = 2 << 30;
const WARMUP: usize = 5;
/// `sgdisk` sleeps a second per write: a few rounds say enough.
const SGDISK_ROUNDS: usize = 10;

/// The bare commands on a disk of our own: an entry written by `sfdisk`
/// (as the engine does: no re-read, no kernel update, no wipe) and the
/// kernel told by `partx`. The disk is held open, as the engine holds its
/// disks, so the commands read a warm page cache in both.
struct Floor {
    /// Closed before the disk is detached (fields drop in order).
    _held: std::fs::File,
    disk: LoopDisk,
    sector: u64,
}

impl Floor {
    fn new() -> Result<Floor> {
        let disk = LoopDisk::new(DISK)?;
        let sector =
            std::fs::read_to_string(format!("/sys/block/{}/queue/logical_block_size", disk.name))
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(512);
        let held = std::fs::File::open(&disk.path)?;
        Ok(Floor {
            _held: held,
            disk,
            sector,
        })
    }

    fn path(&self) -> &Path {
        &self.disk.path
    }

    /// Entry `number` of `SIZE` bytes at `start_bytes`, as an sfdisk line.
    fn entry(&self, number: u32, start_bytes: u64, name: &str) -> String {
        format!(
            "{}p{number} : start={}, size={}, type={}, uuid={}, name=\"{}\"\n",
            self.disk.dev(),
            start_bytes / self.sector,
            SIZE / self.sector,
            gpt::LINUX_DATA_TYPE,
            volume_guid(name),
            partition_name(name)
        )
    }

    /// sfdisk with the options the engine writes tables with.
    fn sfdisk(&self) -> Cmd {
        gpt::sfdisk_write()
    }

    /// A new GPT (the engine's bounds) holding only entry 1.
    fn new_table(&self, name: &str) -> Cmd {
        let (first, last) =
            gpt::new_table_bounds(DISK / self.sector, self.sector).unwrap_or((34, 0));
        let script = format!(
            "label: gpt\nfirst-lba: {first}\nlast-lba: {last}\ntable-length: {}\n{}",
            gpt::TABLE_ENTRIES,
            self.entry(1, 1 << 20, name)
        );
        self.sfdisk().arg(self.path()).stdin(script)
    }

    fn append(&self, number: u32, start_bytes: u64, name: &str) -> Cmd {
        self.sfdisk()
            .arg("--append")
            .arg(self.path())
            .stdin(self.entry(number, start_bytes, name))
    }

    fn delete(&self, number: u32) -> Cmd {
        self.sfdisk()
            .arg("--delete")
            .arg(self.path())
            .arg(number.to_string())
    }

    /// The same entry written by `sgdisk` (which syncs, sleeps a second
    /// and asks the kernel to re-read the table by itself).
    fn sgdisk_add(&self, number: u32, start_bytes: u64, name: &str) -> Cmd {
        let (start, len) = (start_bytes / self.sector, SIZE / self.sector);
        Cmd::new("sgdisk")
            .args([
                "-n".to_string(),
                format!("{number}:{start}:{}", start + len - 1),
                "-c".to_string(),
                format!("{number}:{}", partition_name(name)),
                "-u".to_string(),
                format!("{number}:{}", volume_guid(name)),
                "-t".to_string(),
                format!("{number}:{}", gpt::LINUX_DATA_TYPE),
            ])
            .arg(self.path())
    }

    fn sgdisk_delete(&self, number: u32) -> Cmd {
        Cmd::new("sgdisk")
            .args(["-d".to_string(), number.to_string()])
            .arg(self.path())
    }

    /// The table write, then `partx -u` for that entry.
    async fn create(&self, write: Cmd, number: u32) -> Result<()> {
        write.run().await.context("floor: table write")?;
        gpt::partx_update(self.path(), Some(number))
            .run()
            .await
            .context("floor: partx -u")?;
        Ok(())
    }

    /// `sfdisk --delete`, then `partx -d` for that entry.
    async fn remove(&self, number: u32) -> Result<()> {
        self.delete(number)
            .run()
            .await
            .context("floor: sfdisk --delete")?;
        gpt::partx_delete(self.path(), number)
            .run()
            .await
            .context("floor: partx -d")?;
        Ok(())
    }
}

/// Samples of one create + delete shape.
#[derive(Default)]
struct Samples {
    create: Vec<Duration>,
    delete: Vec<Duration>,
    cycle: Vec<Duration>,
}

impl Samples {
    fn push(&mut self, t0: Instant, t1: Instant, t2: Instant) {
        self.create.push(t1 - t0);
        self.delete.push(t2 - t1);
        self.cycle.push(t2 - t0);
    }
}

/// Engine create then delete of `name`; the three instants around them.
async fn engine_cycle(f: &EngineFixture, name: &str) -> Result<(Instant, Instant, Instant)> {
    let t0 = Instant::now();
    f.engine
        .create_volume(f.req(name, SIZE))
        .await
        .context("engine create")?;
    let t1 = Instant::now();
    f.engine
        .delete_volume(name)
        .await
        .context("engine delete")?;
    Ok((t0, t1, Instant::now()))
}

pub async fn create_delete(iterations: usize) -> Result<Vec<Entry>> {
    let shared = EngineFixture::new("bench raw", "RAW", &[DISK], 0)
        .await
        .context("needs root")?;
    let blank = EngineFixture::new("bench raw blank", "RAW", &[DISK], 0)
        .await
        .context("needs root")?;
    let shared_floor = Floor::new()?;
    let blank_floor = Floor::new()?;
    // The volume that keeps the shared disks' tables: entry 1 at 1 MiB.
    // New volumes are entry 2 right after it.
    shared
        .engine
        .create_volume(shared.req("anchor", SIZE))
        .await
        .context("engine create anchor")?;
    shared_floor
        .create(shared_floor.new_table("anchor"), 1)
        .await?;
    let next = (1 << 20) + SIZE;

    let (mut engine, mut floor) = (Samples::default(), Samples::default());
    let (mut engine_blank, mut floor_blank) = (Samples::default(), Samples::default());
    let (mut sgdisk, mut sfdisk) = (Samples::default(), Samples::default());
    for i in 0..(iterations + WARMUP) {
        let record = i >= WARMUP;
        let (t0, t1, t2) = engine_cycle(&shared, &format!("e{i}")).await?;
        if record {
            engine.push(t0, t1, t2);
        }

        let t0 = Instant::now();
        shared_floor
            .create(shared_floor.append(2, next, &format!("f{i}")), 2)
            .await?;
        let t1 = Instant::now();
        shared_floor.remove(2).await?;
        if record {
            floor.push(t0, t1, Instant::now());
        }

        let (t0, t1, t2) = engine_cycle(&blank, &format!("b{i}")).await?;
        if record {
            engine_blank.push(t0, t1, t2);
        }

        let t0 = Instant::now();
        blank_floor
            .create(blank_floor.new_table(&format!("g{i}")), 1)
            .await?;
        let t1 = Instant::now();
        blank_floor.remove(1).await?;
        if record {
            floor_blank.push(t0, t1, Instant::now());
        }

        if record && sgdisk.cycle.len() < SGDISK_ROUNDS.min(iterations) {
            let d = &shared_floor;
            let t0 = Instant::now();
            d.sgdisk_add(2, next, &format!("s{i}"))
                .run()
                .await
                .context("sgdisk -n")?;
            let t1 = Instant::now();
            d.sgdisk_delete(2).run().await.context("sgdisk -d")?;
            sgdisk.push(t0, t1, Instant::now());

            let t0 = Instant::now();
            d.append(2, next, &format!("t{i}"))
                .run()
                .await
                .context("sfdisk --append")?;
            let t1 = Instant::now();
            d.delete(2).run().await.context("sfdisk --delete")?;
            sfdisk.push(t0, t1, Instant::now());
        }
    }
    const ADD: &str = "sfdisk --append + partx -u";
    const DEL: &str = "sfdisk --delete + partx -d";
    const NEW: &str = "sfdisk (new GPT, one entry) + partx -u";
    Ok(vec![
        timed(
            SHARED,
            "engine.raw.create_delete",
            &format!("{ADD}, {DEL}"),
            &engine.cycle,
            Some(&floor.cycle),
        ),
        timed(
            SHARED,
            "engine.raw.create",
            ADD,
            &engine.create,
            Some(&floor.create),
        ),
        timed(
            SHARED,
            "engine.raw.delete",
            DEL,
            &engine.delete,
            Some(&floor.delete),
        ),
        timed(
            BLANK,
            "engine.raw.blank.create_delete",
            &format!("{NEW}, {DEL}"),
            &engine_blank.cycle,
            Some(&floor_blank.cycle),
        ),
        timed(
            BLANK,
            "engine.raw.blank.create",
            NEW,
            &engine_blank.create,
            Some(&floor_blank.create),
        ),
        timed(
            BLANK,
            "engine.raw.blank.delete",
            DEL,
            &engine_blank.delete,
            Some(&floor_blank.delete),
        ),
        timed(
            TOOLS,
            "gpt.sgdisk.add",
            "sfdisk --append",
            &sgdisk.create,
            Some(&sfdisk.create),
        ),
        timed(
            TOOLS,
            "gpt.sgdisk.delete",
            "sfdisk --delete",
            &sgdisk.delete,
            Some(&sfdisk.delete),
        ),
    ])
}
