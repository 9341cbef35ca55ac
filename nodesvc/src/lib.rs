//! The Carina node daemon library.
//!
//! `engine` turns a node's disks into volumes (LVM logical volumes, GPT
//! partitions, host directories) and reports their capacity; `server`
//! serves it as NodeStorage over mutual TLS, `csi_local` as CSI Identity
//! and Node on the kubelet plugin socket; `identity` gets and renews the
//! node's server certificate from the control plane's issuer. The binaries `carina-node` and
//! `carinactl` are built on top of it (`cli` is the latter's commands).

pub mod cli;
pub mod csi_local;
pub mod engine;
pub mod identity;
pub mod latency;
#[cfg(test)]
mod layering;
#[cfg(test)]
mod proptests;
pub mod server;
