//! Carina's own binaries as processes, set up the way a cluster runs them:
//! one development CA for every node and controller ([`Pki`]),
//! `carina-node` ([`NodeArgs`]) and `carina-controller` in either mode
//! ([`KubeControllerArgs`], [`direct_controller_args`]), each a
//! restartable [`Service`] that is ready once its unix socket accepts
//! connections; and the Kubernetes side of a node: a `Node` object that
//! points at the node's NodeStorage endpoint ([`register_node`]) and the
//! wait for its capacity record ([`await_capacity`]), or for tests without
//! node processes a Ready status ([`ready_node_status`]) and a capacity
//! record written directly ([`publish_node_storage`]).
//!
//! ```ignore
//! let pki = Pki::write(&dir.join("pki"))?;
//! let args = NodeArgs::new("node-a", &pki, &config_json, &dir.join("node-a"), &log)?;
//! let node = Service::start("carina-node", "node-a", args.argv(), &args.csi_socket, &args.log).await?;
//! register_node(&client, "node-a", &args.endpoint()).await?;
//! await_capacity(&client, "node-a", Duration::from_secs(60)).await?;
//! ```
//!
//! A [`Service`] stops (SIGTERM, then SIGKILL) when dropped. Its log
//! level is `CARINA_TEST_RUST_LOG` (a `RUST_LOG` filter; default `info`).

mod args;
mod chart;
mod nodes;
mod pki;
mod service;

pub use args::{KubeControllerArgs, NodeArgs, direct_controller_args};
pub use chart::{
    as_chart_service_account, controller_service_account_kubeconfig, create_chart_ca_objects,
};
pub use nodes::{
    LvmNode, add_topology, await_capacity, await_object, publish_node_storage, ready_node_status,
    register_node,
};
pub use pki::{CertFiles, Pki};
pub use service::{START_TIMEOUT, STOP_GRACE, Service, csi_provisioner};

pub use crate::ports::free_port;
