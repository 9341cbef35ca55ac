//! Carina's replaceable control planes, behind the CSI controller:
//!
//! - [`direct`]: a static node list reached over mTLS, for orchestrators
//!   without Kubernetes.
//! - [`kube`]: the Kubernetes one: `LogicVolume` objects written by the
//!   provisioner and carried out by the bridge, capacity published into
//!   `NodeStorageResource`s, configuration pushed to nodes, Lease leader
//!   election.
//! - [`identity`]: node identity issued by the control plane: the CA in a
//!   Secret, the `NodeIdentity` issuer (CSR + projected ServiceAccount
//!   token, checked with TokenReview), the controller's own certificate.
//! - [`nodes`]: what both share about nodes: node specs, placement, the
//!   NodeStorage client pool.
//! - [`migrate`]: taking over a Go Carina cluster: what
//!   `carinactl migrate plan` reads and classifies.
//! - [`policy`]: the one mapping between wire policies and their names.
//! - [`serve`]: CSI Identity and Controller on a unix socket.

pub mod direct;
pub mod identity;
pub mod kube;
pub mod metrics;
pub mod migrate;
pub mod nodes;
pub mod policy;
#[cfg(test)]
mod proptests;
pub mod serve;
