//! The kube-scheduler extender API v1 (`k8s.io/kube-scheduler/extender/v1`)
//! as JSON.
//!
//! The upstream Go types carry no JSON tags, so the wire names are the Go
//! field names: `Pod`, `Nodes`, `NodeNames`, `FailedNodes`,
//! `FailedAndUnresolvableNodes`, `Error`, `Host`, `Score`. Go decodes field
//! names case-insensitively; for callers that spell them in lower case
//! (older extender clients) the lower-case forms are accepted as aliases.
//! We always write the upstream spelling.
//!
//! The pod is read into a slim view ([`Pod`]): the extender needs its
//! identity and its volumes, and skipping the rest keeps a request cheap.
//! `NodeNames` (sent when the extender is `nodeCacheCapable`) is kept as
//! the raw JSON text until needed, so a pod without Carina claims is
//! answered by echoing it back unparsed. `Nodes` (sent otherwise) is a
//! `NodeList` whose items are kept as JSON values and returned as they came.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// Lowest score an extender may give (`MinExtenderPriority`).
pub const MIN_SCORE: i64 = 0;
/// Highest score an extender may give (`MaxExtenderPriority`).
pub const MAX_SCORE: i64 = 10;

/// The body of `/filter` and `/prioritize`.
#[derive(Debug, Deserialize)]
pub struct ExtenderArgs<'a> {
    /// The pod being scheduled.
    #[serde(rename = "Pod", alias = "pod", default)]
    pub pod: Option<Pod>,
    /// Candidate nodes as objects; only when the extender is not
    /// `nodeCacheCapable`.
    #[serde(rename = "Nodes", alias = "nodes", default)]
    pub nodes: Option<NodeList>,
    /// Candidate node names; only when the extender is `nodeCacheCapable`.
    #[serde(rename = "NodeNames", alias = "nodenames", borrow, default)]
    pub node_names: Option<&'a RawValue>,
}

impl ExtenderArgs<'_> {
    /// The candidate node names, from `NodeNames` or else from `Nodes`.
    ///
    /// # Errors
    /// `NodeNames` that is not a list of strings.
    pub fn candidates(&self) -> Result<Vec<Cow<'_, str>>, serde_json::Error> {
        match (self.node_names, &self.nodes) {
            (Some(raw), _) => {
                let names: Option<Vec<Name<'_>>> = serde_json::from_str(raw.get())?;
                Ok(names.unwrap_or_default().into_iter().map(|n| n.0).collect())
            }
            (None, Some(list)) => Ok(list.names().map(Cow::Borrowed).collect()),
            (None, None) => Ok(Vec::new()),
        }
    }
}

/// A node name, borrowed from the request unless it had escapes.
#[derive(Deserialize)]
struct Name<'a>(#[serde(borrow)] Cow<'a, str>);

/// A `v1.NodeList`; items are kept as they came.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
pub struct NodeList {
    #[serde(default)]
    pub items: Vec<serde_json::Value>,
    /// `apiVersion`, `kind`, `metadata`.
    #[serde(flatten)]
    pub rest: serde_json::Map<String, serde_json::Value>,
}

impl NodeList {
    /// The items' `metadata.name`s, in order (an item without one is
    /// skipped).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.items.iter().filter_map(item_name)
    }

    /// The list with only the items whose names `keep` accepts.
    pub fn retain_names(&self, keep: impl Fn(&str) -> bool) -> NodeList {
        NodeList {
            items: self
                .items
                .iter()
                .filter(|i| item_name(i).is_some_and(&keep))
                .cloned()
                .collect(),
            rest: self.rest.clone(),
        }
    }
}

fn item_name(item: &serde_json::Value) -> Option<&str> {
    item.get("metadata")?.get("name")?.as_str()
}

/// The answer to `/filter`.
#[derive(Debug, Default, Serialize)]
pub struct ExtenderFilterResult<'a> {
    /// Nodes that pass, as objects (only when the request sent `Nodes`).
    #[serde(rename = "Nodes", skip_serializing_if = "Option::is_none")]
    pub nodes: Option<NodeList>,
    /// Nodes that pass, by name (when the request sent `NodeNames`).
    #[serde(rename = "NodeNames")]
    pub node_names: Option<NodeNames<'a>>,
    /// Nodes that fail, with why; preemption might help.
    #[serde(rename = "FailedNodes")]
    pub failed_nodes: BTreeMap<String, String>,
    /// Nodes that fail, with why; preemption would not help (evicting
    /// pods frees no local storage).
    #[serde(rename = "FailedAndUnresolvableNodes")]
    pub failed_and_unresolvable_nodes: BTreeMap<String, String>,
    /// Set when the extender could not decide; the scheduler retries the
    /// pod later.
    #[serde(rename = "Error")]
    pub error: String,
}

/// `NodeNames` of a filter result: the request's own text echoed, or a
/// list (owned or borrowed).
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum NodeNames<'a> {
    Echo(&'a RawValue),
    List(Vec<String>),
    Borrowed(Vec<&'a str>),
}

/// One node's score (`HostPriority`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostPriority {
    #[serde(rename = "Host", alias = "host")]
    pub host: String,
    /// From [`MIN_SCORE`] to [`MAX_SCORE`].
    #[serde(rename = "Score", alias = "score")]
    pub score: i64,
}

/// The answer to `/prioritize` (`HostPriorityList`).
pub type HostPriorityList = Vec<HostPriority>;

/// The parts of a `v1.Pod` the extender reads.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Pod {
    #[serde(default)]
    pub metadata: PodMeta,
    #[serde(default)]
    pub spec: PodSpec,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct PodMeta {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub uid: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSpec {
    #[serde(default)]
    pub volumes: Vec<PodVolume>,
    #[serde(default)]
    pub node_name: Option<String>,
}

/// A pod volume; only claims matter here.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodVolume {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub persistent_volume_claim: Option<ClaimSource>,
    /// A generic ephemeral volume: its claim is `<pod>-<volume>`.
    #[serde(default)]
    pub ephemeral: Option<serde::de::IgnoredAny>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimSource {
    pub claim_name: String,
}

impl Pod {
    /// Names of the claims the pod's volumes use, in volume order.
    pub fn claim_names(&self) -> impl Iterator<Item = Cow<'_, str>> {
        self.spec.volumes.iter().filter_map(|v| {
            if let Some(c) = &v.persistent_volume_claim {
                Some(Cow::Borrowed(c.claim_name.as_str()))
            } else {
                v.ephemeral
                    .as_ref()
                    .map(|_| Cow::Owned(format!("{}-{}", self.metadata.name, v.name)))
            }
        })
    }

    /// `namespace/name`, for logs and reasons.
    pub fn key(&self) -> String {
        format!("{}/{}", self.metadata.namespace, self.metadata.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_what_kube_scheduler_sends() {
        // The shape HTTPExtender marshals with nodeCacheCapable: true.
        let body = json!({
            "Pod": {
                "metadata": {"name": "app", "namespace": "ns", "uid": "u1",
                             "labels": {"a": "b"}},
                "spec": {
                    "containers": [{"name": "c", "image": "i"}],
                    "volumes": [
                        {"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
                        {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}},
                        {"name": "cfg", "configMap": {"name": "x"}}
                    ]
                },
                "status": {"phase": "Pending"}
            },
            "Nodes": null,
            "NodeNames": ["node-a", "node-b"]
        })
        .to_string();
        let args: ExtenderArgs<'_> = serde_json::from_str(&body).expect("parses");
        let pod = args.pod.as_ref().expect("pod");
        assert_eq!(pod.key(), "ns/app");
        let claims: Vec<_> = pod.claim_names().collect();
        assert_eq!(claims, ["data", "app-scratch"]);
        assert_eq!(args.candidates().expect("names"), ["node-a", "node-b"]);
    }

    #[test]
    fn reads_node_objects_and_lower_case_names() {
        let body = json!({
            "pod": {"metadata": {"name": "p"}},
            "nodes": {"kind": "NodeList", "items": [
                {"metadata": {"name": "n1"}}, {"metadata": {"name": "n2"}}
            ]}
        })
        .to_string();
        let args: ExtenderArgs<'_> = serde_json::from_str(&body).expect("parses");
        assert_eq!(args.candidates().expect("names"), ["n1", "n2"]);
        let kept = args
            .nodes
            .as_ref()
            .expect("nodes")
            .retain_names(|n| n == "n2");
        let v = serde_json::to_value(&kept).expect("serializes");
        assert_eq!(
            v,
            json!({"kind": "NodeList", "items": [{"metadata": {"name": "n2"}}]})
        );
    }

    #[test]
    fn writes_upstream_field_names() {
        let raw = RawValue::from_string(r#"["a","b"]"#.into()).expect("raw");
        let result = ExtenderFilterResult {
            node_names: Some(NodeNames::Echo(&raw)),
            failed_nodes: BTreeMap::from([("c".into(), "why".into())]),
            ..ExtenderFilterResult::default()
        };
        assert_eq!(
            serde_json::to_value(&result).expect("serializes"),
            json!({"NodeNames": ["a", "b"], "FailedNodes": {"c": "why"},
                   "FailedAndUnresolvableNodes": {}, "Error": ""})
        );
        let list: HostPriorityList = vec![HostPriority {
            host: "a".into(),
            score: MAX_SCORE,
        }];
        assert_eq!(
            serde_json::to_value(&list).expect("serializes"),
            json!([{"Host": "a", "Score": 10}])
        );
    }
}
