//! The LVM policy: a device group is a volume group named after it, a
//! volume is a logical volume tagged [`OWNER_TAG`].
//!
//! Every `lvm` command sees only the group's own disks (a `devices/filter`
//! in `--config`), reports as JSON in bytes, and runs with a timeout
//! through the node's [`LvmRunner`]: in one persistent `lvm` shell per node
//! (lvm's own shell mode, commands on its stdin, each answered with its log
//! report), or as a process per command when that is off. One report (`pvs
//! --segments`) gives the whole picture of a VG — sizes, extents, every
//! segment and its LV — and is parsed by the pure [`parse_pvsegs`] into a
//! [`VgSnapshot`].
//!
//! Activation: with device-mapper, LVs are activated normally and exposed
//! as `/dev/<vg>/<lv>`. Without it (`activation: loop`), LVs are allocated
//! contiguously on one PV and exposed as a loop device
//! ([`carina_sys::loopdev`]) over the PV at
//! `pe_start + first_pe × extent_size`, limited to the LV's size. The
//! engine picks the extents itself (best fit) and names them on the
//! `lvcreate` command line, so it knows the offset without asking LVM
//! again; the mapping is re-established from LVM metadata at every rescan.
//!
//! The files: `cli` builds the commands, `runner` runs them (the shell or
//! a process each), `shell` is the shell's protocol (what is written, how
//! answers are cut and read), `report` parses their JSON, `extents` does
//! the placement arithmetic, `cache` keeps the VG's picture beside reads
//! and changes, `device` exposes and checks LV devices (a new one is wiped
//! by `engine::wipe`), and `group` is the [`LvmGroup`] backend that runs
//! them (`group/create` its create path). This file only re-exports the
//! public paths.

mod cache;
mod cli;
mod device;
mod extents;
mod group;
mod report;
mod runner;
mod shell;

pub use cli::{OWNER_TAG, lvm_cmd, lvm_config};
pub use group::{LvmGroup, pv_vg_names};
pub use report::{Lv, Pv, Segment, VgSnapshot, parse_pv_vgs, parse_pvsegs};
pub use runner::{LvmOptions, LvmRunner};
