//! A node as placement and the client pool see it ([`NodeSpec`]: name,
//! endpoint, topology; the Kubernetes provisioner builds them from its
//! records), and the static node list of the direct control plane, read
//! from YAML:
//!
//! ```yaml
//! nodes:
//!   - name: node-a                 # the node's name, as its certificate's DNS SAN
//!     endpoint: 10.0.0.11:7443     # its NodeStorage address (host:port or https://host:port)
//!     topology:                    # optional; matched against CSI accessibility requirements
//!       topology.carina.storage.io/node: node-a
//!       topology.kubernetes.io/zone: zone-1
//! ```
//!
//! Every node's topology holds `topology.carina.storage.io/node: <name>`
//! (added when missing; any other value is an error), so a volume pinned
//! to a node by that key is always placeable.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use carina_csi::{TOPOLOGY_KEY, Topology};
use serde::Deserialize;

/// Errors reading or validating a node list.
#[derive(Debug, thiserror::Error)]
pub enum NodesError {
    #[error("read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("parse node list: {0}")]
    Parse(#[from] serde_yaml::Error),
    /// `field` is the path of the offending value (`nodes[1].endpoint`).
    #[error("{field}: {reason}")]
    Invalid { field: String, reason: String },
}

fn invalid(field: impl Into<String>, reason: impl Into<String>) -> NodesError {
    NodesError::Invalid {
        field: field.into(),
        reason: reason.into(),
    }
}

/// One node the control plane provisions on.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeSpec {
    /// The node name: the DNS SAN its server certificate carries, and the
    /// node part of volume ids.
    pub name: String,
    /// `host:port` or `https://host:port` of its NodeStorage service.
    pub endpoint: String,
    #[serde(default)]
    pub topology: Topology,
}

impl NodeSpec {
    /// True if every segment of `t` is one of this node's.
    pub fn matches(&self, t: &Topology) -> bool {
        t.iter()
            .all(|(k, v)| self.topology.get(k).is_some_and(|ours| ours == v))
    }
}

/// The validated node list, in file order.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeList {
    pub nodes: Vec<NodeSpec>,
}

impl NodeList {
    /// Reads and validates the YAML file at `path`.
    pub fn load(path: &Path) -> Result<NodeList, NodesError> {
        let text = std::fs::read_to_string(path).map_err(|source| NodesError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_yaml(&text)
    }

    /// Parses and validates node-list YAML.
    pub fn from_yaml(text: &str) -> Result<NodeList, NodesError> {
        let list: NodeList = serde_yaml::from_str(text)?;
        list.validated()
    }

    /// A list of the given nodes, validated.
    pub fn new(nodes: Vec<NodeSpec>) -> Result<NodeList, NodesError> {
        NodeList { nodes }.validated()
    }

    fn validated(mut self) -> Result<NodeList, NodesError> {
        if self.nodes.is_empty() {
            return Err(invalid("nodes", "at least one node is required"));
        }
        let mut seen = HashSet::new();
        for (i, node) in self.nodes.iter_mut().enumerate() {
            let field = |f: &str| format!("nodes[{i}].{f}");
            check_name(&node.name).map_err(|reason| invalid(field("name"), reason))?;
            if !seen.insert(node.name.clone()) {
                return Err(invalid(
                    field("name"),
                    format!("{:?} is listed twice", node.name),
                ));
            }
            check_endpoint(&node.endpoint).map_err(|reason| invalid(field("endpoint"), reason))?;
            match node.topology.get(TOPOLOGY_KEY) {
                None => {
                    node.topology
                        .insert(TOPOLOGY_KEY.to_string(), node.name.clone());
                }
                Some(v) if *v == node.name => {}
                Some(v) => {
                    return Err(invalid(
                        field(&format!("topology[{TOPOLOGY_KEY:?}]")),
                        format!("{v:?} must be the node's name {:?}", node.name),
                    ));
                }
            }
        }
        Ok(self)
    }

    /// The node named `name`.
    pub fn get(&self, name: &str) -> Option<&NodeSpec> {
        self.nodes.iter().find(|n| n.name == name)
    }
}

/// A DNS subdomain: what Kubernetes node names and certificate DNS SANs
/// are, and free of the `@` volume ids use as a separator.
fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 253 {
        return Err("must be 1 to 253 characters".into());
    }
    if carina_csi::names::is_node_name(name) {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a DNS name (lower-case letters, digits, '-' and '.')"
        ))
    }
}

fn check_endpoint(endpoint: &str) -> Result<(), String> {
    let rest = endpoint.strip_prefix("https://").unwrap_or(endpoint);
    let rest = rest.trim_end_matches('/');
    let port_ok = rest
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0));
    if port_ok && !rest.contains('/') && !rest.contains("://") {
        Ok(())
    } else {
        Err(format!(
            "{endpoint:?} is not host:port or https://host:port"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_fills_the_node_topology() {
        let list = NodeList::from_yaml(
            r#"
nodes:
  - name: node-a
    endpoint: 10.0.0.11:7443
  - name: node-b.example
    endpoint: https://node-b.example:7443
    topology:
      topology.kubernetes.io/zone: z1
"#,
        )
        .expect("valid");
        assert_eq!(list.nodes.len(), 2);
        assert_eq!(list.nodes[0].topology[TOPOLOGY_KEY], "node-a");
        let b = list.get("node-b.example").expect("b");
        assert_eq!(b.topology.len(), 2);
        assert!(b.matches(&Topology::from([(
            "topology.kubernetes.io/zone".to_string(),
            "z1".to_string()
        )])));
        assert!(!b.matches(&Topology::from([(
            TOPOLOGY_KEY.to_string(),
            "node-a".to_string()
        )])));
        assert!(
            b.matches(&Topology::new()),
            "an empty segment set matches all"
        );
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            ("nodes: []", "nodes: at least one node"),
            ("nodes: [{name: A, endpoint: 'a:1'}]", "nodes[0].name"),
            ("nodes: [{name: a@b, endpoint: 'a:1'}]", "nodes[0].name"),
            (
                "nodes: [{name: a, endpoint: 'a:1'}, {name: a, endpoint: 'b:1'}]",
                "nodes[1].name: \"a\" is listed twice",
            ),
            ("nodes: [{name: a, endpoint: 'a'}]", "nodes[0].endpoint"),
            (
                "nodes: [{name: a, endpoint: 'http://a:1'}]",
                "nodes[0].endpoint",
            ),
            (
                "nodes: [{name: a, endpoint: 'a:99999'}]",
                "nodes[0].endpoint",
            ),
            (
                "nodes: [{name: a, endpoint: 'a:1', topology: {topology.carina.storage.io/node: b}}]",
                "must be the node's name",
            ),
            (
                "nodes: [{name: a, endpoint: 'a:1', zone: z}]",
                "unknown field",
            ),
        ];
        for (yaml, want) in cases {
            let err = NodeList::from_yaml(yaml).expect_err(yaml).to_string();
            assert!(err.contains(want), "{yaml}: {err}");
        }
    }
}
