//! The nodes a control plane places volumes on and talks to, shared by
//! the direct and the Kubernetes control planes:
//!
//! - [`spec`]: a node as placement sees it (name, endpoint, topology) and
//!   the direct plane's static list of them (YAML);
//! - [`placement`]: where a new volume goes (groups, accessibility,
//!   `binpack`/`spreadout`), pure functions over the nodes' capacities;
//! - [`pool`]: one NodeStorage client per node, over mutual TLS;
//! - [`health`]: the condition of provisioned volumes, asked of their
//!   nodes;
//! - [`copy`]: a clone or snapshot made on a node, its progress followed;
//! - [`bcache`]: the node requests and checks of tiered (bcache) volumes;
//! - [`volume`]: the rules both planes apply to a volume they answer for
//!   (an existing volume fitting a create, the context's file system,
//!   capacity summed over groups).

pub mod bcache;
pub mod copy;
pub mod health;
pub mod placement;
pub mod pool;
pub mod spec;
pub mod volume;
