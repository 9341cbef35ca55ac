//! Carina's replaceable control planes, behind the CSI controller:
//!
//! - [`direct`]: a static node list reached over mTLS, for orchestrators
//!   without Kubernetes.
//! - [`kube`]: the Kubernetes one: `LogicVolume` objects written by the
//!   provisioner and carried out by the bridge, capacity published into
//!   `NodeStorageResource`s, configuration pushed to nodes, Lease leader
//!   election.
//! - [`nodes`]: what both share about nodes: node specs, placement, the
//!   NodeStorage client pool.
//! - [`policy`]: the one mapping between wire policies and their names.
//! - [`serve`]: CSI Identity and Controller on a unix socket.

pub mod direct;
pub mod kube;
pub mod nodes;
pub mod policy;
pub mod serve;
