//! The kube-scheduler HTTP extender that places pods where their Carina
//! volumes fit, counting the volumes in flight.
//!
//! - [`extender`]: the extender API v1 wire types (upstream JSON names).
//! - [`request`]: a pod's Carina claims: new volumes per device group,
//!   and the node bound claims pin it to.
//! - [`room`]: a node's room per device group, from its
//!   `NodeStorageResource`, and how volumes are placed in it (RAW disks
//!   first-fit, whole disks).
//! - [`reservations`]: volumes in flight that the records do not show yet.
//! - [`settle`]: waiting for the previous pod's chosen node to show, so a
//!   burst cannot over-commit a node.
//! - [`filter`] and [`score`]: the two verbs as pure functions.
//! - [`handler`]: request body to response body over [`objects::Objects`].
//! - [`cache`]: the informer cache the production answers come from.
//! - [`server`]: HTTP (`/filter`, `/prioritize`, `/healthz`, `/readyz`).

pub mod cache;
pub mod extender;
pub mod filter;
pub mod handler;
pub mod metrics;
pub mod objects;
pub mod request;
pub mod reservations;
pub mod room;
pub mod score;
pub mod server;
pub mod settle;

#[cfg(test)]
mod testing;

pub use handler::Extender;
