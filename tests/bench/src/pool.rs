//! The LVM pool every engine-level benchmark stands on: a sparse loop
//! disk, a VG named for the run, an engine over it, and the bare `lvm`
//! commands (the floor) for the same VG with the same options.

use anyhow::Result;
use carina_node::engine::lvm::{LvmOptions, lvm_cmd};
use carina_node::engine::{Config, CreateRequest, Engine, EngineOptions};
use carina_sys::command::Cmd;
use carina_tests::{LoopDisk, VgGuard, unique};

/// Fields drop in order: the engine, the VG (and the loop devices stacked
/// on it), then the disk.
pub struct LvmPool {
    pub engine: Engine,
    pub vg: String,
    _guard: VgGuard,
    pub disk: LoopDisk,
}

impl LvmPool {
    /// A pool of `disk_bytes` with no reserve.
    pub async fn new(prefix: &str, disk_bytes: u64) -> Result<LvmPool> {
        Self::with_lvm(prefix, disk_bytes, LvmOptions::default()).await
    }

    /// [`LvmPool::new`] whose engine runs `lvm` as `lvm` says (the node's
    /// shell or a process per command).
    pub async fn with_lvm(prefix: &str, disk_bytes: u64, lvm: LvmOptions) -> Result<LvmPool> {
        let disk = LoopDisk::new(disk_bytes)?;
        let vg = unique(prefix);
        let guard = VgGuard::new(&vg, &[&disk]);
        let config = Config::from_json(&carina_tests::disk_group_config(&vg, "LVM", &[&disk], 0))?;
        let engine = Engine::start(
            config,
            EngineOptions {
                device_mapper: None,
                lvm,
                ..Default::default()
            },
        )
        .await?;
        Ok(LvmPool {
            engine,
            vg,
            _guard: guard,
            disk,
        })
    }

    /// A shared create request of `size` bytes in the pool's group.
    pub fn request(&self, name: &str, size: u64) -> CreateRequest {
        CreateRequest {
            name: name.into(),
            group: self.vg.clone(),
            size_bytes: size,
            exclusive: false,
        }
    }

    /// Without device-mapper the engine exposes LVs as loop devices.
    pub fn loop_mode(&self) -> bool {
        !self.engine.device_mapper()
    }

    fn lvm(&self, subcommand: &str) -> Cmd {
        let cmd = lvm_cmd(subcommand, std::slice::from_ref(&self.disk.path));
        if self.loop_mode() {
            cmd.args(["--driverloaded", "n"])
        } else {
            cmd
        }
    }

    /// Bare `lvcreate` of `size` (an lvm size like `8m`), inactive and
    /// unzeroed like the engine's, contiguous in loop mode.
    pub fn bare_lvcreate(&self, name: &str, size: &str) -> Cmd {
        let mut cmd = self.lvm("lvcreate").args(["-q", "-an", "-Zn", "-Wn"]);
        if self.loop_mode() {
            cmd = cmd.args(["--alloc", "contiguous"]);
        }
        cmd.args(["-L", size, "-n", name, &self.vg])
    }

    /// Bare `lvremove` of `name`.
    pub fn bare_lvremove(&self, name: &str) -> Cmd {
        self.lvm("lvremove")
            .args(["-q", "-f", "-y"])
            .arg(format!("{}/{name}", self.vg))
    }

    /// Bare `lvs` of one field of `name`.
    pub fn bare_lvs(&self, name: &str, field: &str) -> Cmd {
        self.lvm("lvs")
            .args(["--noheadings", "--units", "b", "--nosuffix", "-o", field])
            .arg(format!("{}/{name}", self.vg))
    }
}
