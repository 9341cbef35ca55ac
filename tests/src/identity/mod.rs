//! Node identity on a real cluster, without kubelets: the objects a node
//! pod stands for (a namespace, ServiceAccounts, the node DaemonSet, Pods
//! whose `spec.nodeName` is set directly and whose controller reference
//! names that DaemonSet, as its controller would have made them), real
//! TokenRequest tokens bound to those Pods, a
//! client of the issuer, CSRs to send it, `carina-controller` serving the
//! issuer ([`start_controller`], [`controller_argv`]), the arguments of
//! `carina-node` asking it, and the constants the identity tests share.
//!
//! One file per job: `pods` (the node pods, their DaemonSet and tokens),
//! `token` (an expired copy of a real token), `issuer` (the issuer's
//! client, CSRs and the controller serving it), `node` (a `carina-node`
//! asking the issuer and the certificate it serves), `ca` (the issuer's CA
//! as published and as kept in its Secret).

mod ca;
mod issuer;
mod node;
mod pods;
mod token;

pub use ca::{controller_tls, issuer_ca, published_ca, published_files, secret_text};
pub use issuer::{ask, controller_argv, csr, issuer_client, start_controller};
pub use node::{IssuedNode, SERVED_WITHIN, served_cert, wait_served};
pub use pods::{NodePods, cluster_with_node_pods, owner};
pub use token::expired_copy;

/// The audience the issuer expects by default.
pub const AUDIENCE: &str = "carina.storage.io/node-identity";

/// The node ServiceAccount's name by default.
pub const NODE_SA: &str = "carina-node";

/// The node DaemonSet's name by default.
pub const NODE_DS: &str = "carina-node";

/// The CA Secret and ConfigMap of the issuer (the defaults).
pub const CA: &str = "carina-ca";

/// The node the identity tests issue for.
pub const NODE: &str = "node-a";

/// Bound of every wait of the identity tests for a process or the control
/// plane.
pub const WAIT: std::time::Duration = std::time::Duration::from_secs(60);
