//! The Carina node daemon library.
//!
//! `engine` turns a node's disks into volumes (LVM logical volumes, GPT
//! partitions, host directories) and reports their capacity; the binaries
//! `carina-node` and `carinactl` are built on top of it (`cli` is the
//! latter's commands).

pub mod cli;
pub mod engine;
pub mod server;
