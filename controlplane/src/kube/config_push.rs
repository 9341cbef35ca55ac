//! Configuration push: the `carina-csi-config` ConfigMap (key
//! `config.json`, Carina's format) evaluated for each Node and sent to
//! the node with `ApplyConfig`. The nodes hold no Kubernetes credentials;
//! this is how they learn their Kubernetes configuration.
//!
//! **Per node** ([`effective_config`]): a `diskSelector` entry with a
//! `nodeLabel` applies only to Nodes that carry that label key, whatever
//! its value (Carina's rule); an entry without one applies to every node.
//! Every other field is kept. The result is compact JSON with sorted
//! keys, so equal configurations are equal text.
//!
//! **When**: a node is sent its configuration when its effective text
//! differs from the last one it accepted (a new ConfigMap, a changed
//! label), and again whenever its capacity stream (re)connects, because a
//! restarted node starts from its own file. Pushes run concurrently, one
//! at a time per node. A node that cannot be reached is retried with
//! backoff (and on reconnection); one that rejects the configuration
//! (`INVALID_ARGUMENT`) is not sent the same text again, and a Warning
//! Event on the ConfigMap says why. A ConfigMap that is not valid JSON is
//! reported the same way and pushes nothing; nodes keep what they have.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use carina_csi::CsiError;
use carina_proto::code_name;
use carina_proto::nodestorage as pb;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Node, ObjectReference};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tonic::Code;

use super::endpoints::{Nodes, node_endpoint, stopped};
use super::retry::Backoff;
use super::status::truncate;
use crate::nodes::pool::NodeClients;

/// Carina's ConfigMap name.
pub const CONFIG_MAP_NAME: &str = "carina-csi-config";

/// The ConfigMap's namespace unless configured otherwise.
pub const DEFAULT_CONFIG_NAMESPACE: &str = "kube-system";

/// The ConfigMap key holding the configuration.
pub const CONFIG_KEY: &str = "config.json";

/// `reportingController` of the config push's Events.
pub const REPORTER: &str = "carina-config-push";

/// Why a configuration cannot be evaluated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("{CONFIG_KEY}: {0}")]
    Json(String),
    #[error("{CONFIG_KEY}: the top level is not an object")]
    NotAnObject,
    #[error("{CONFIG_KEY}: diskSelector is not a list")]
    SelectorsNotAList,
}

/// Parses `config.json` text into the value [`effective_config`] takes.
pub fn parse_config(text: &str) -> Result<Value, ConfigError> {
    let value: Value = serde_json::from_str(text).map_err(|e| ConfigError::Json(e.to_string()))?;
    match value.get("diskSelector") {
        None | Some(Value::Array(_)) | Some(Value::Null) if value.is_object() => Ok(value),
        _ if !value.is_object() => Err(ConfigError::NotAnObject),
        _ => Err(ConfigError::SelectorsNotAList),
    }
}

/// Whether a `diskSelector` entry applies to a node with `labels`: it
/// has no (or an empty) `nodeLabel`, or the node has that label key.
/// A `nodeLabel` that is not a string is left for the node to reject.
pub fn selector_applies(selector: &Value, labels: &BTreeMap<String, String>) -> bool {
    match selector.get("nodeLabel") {
        Some(Value::String(key)) if !key.is_empty() => labels.contains_key(key),
        _ => true,
    }
}

/// The configuration text for a node with `labels`: `config` with only
/// the `diskSelector` entries that apply to it.
pub fn effective_config(config: &Value, labels: &BTreeMap<String, String>) -> String {
    let mut effective = config.clone();
    if let Some(Value::Array(selectors)) = effective.get_mut("diskSelector") {
        selectors.retain(|s| selector_applies(s, labels));
    }
    // A `Value` always serializes.
    effective.to_string()
}

type Digest32 = [u8; 32];

fn digest(text: &str) -> Digest32 {
    Sha256::digest(text.as_bytes()).into()
}

/// A push that failed and waits for its retry.
#[derive(Debug, Clone)]
struct Pending {
    digest: Digest32,
    attempt: u32,
    retry_at: Instant,
}

/// The ConfigMap as last seen.
#[derive(Debug, Clone)]
enum Source {
    /// No ConfigMap: nodes keep their own configuration.
    Absent,
    Valid(Arc<Value>),
    Invalid,
}

type PushResult = (String, Digest32, Result<pb::ApplyConfigResponse, CsiError>);

/// What the config push takes from [`super::bridge_side::BridgeConfig`].
#[derive(Debug, Clone)]
pub(crate) struct PushConfig {
    /// Namespace of the ConfigMap.
    pub namespace: String,
    /// Name of the ConfigMap.
    pub name: String,
    /// Retries of nodes that cannot be reached.
    pub retry: Backoff,
    /// `reportingInstance` of the Events.
    pub instance: Option<String>,
}

/// The config push: its inputs and what it remembers per node. (No
/// `Debug`: the event recorder has none.)
pub(crate) struct ConfigPush {
    state: State,
    connected: mpsc::UnboundedReceiver<String>,
}

struct State {
    configmaps: Api<ConfigMap>,
    config_name: String,
    nodes: Nodes,
    clients: Arc<NodeClients>,
    recorder: Recorder,
    backoff: Backoff,

    source: Source,
    /// The ConfigMap, for Events about it.
    config_ref: Option<ObjectReference>,
    /// Digest of the configuration each node last accepted (or rejected).
    done: HashMap<String, Digest32>,
    pending: HashMap<String, Pending>,
    /// Nodes to send their configuration whatever they had (they
    /// reconnected).
    forced: HashSet<String>,
    /// Nodes with a push under way, and its task.
    in_flight: HashMap<String, tokio::task::Id>,
}

impl ConfigPush {
    /// A push for the ConfigMap `config.namespace/name`;
    /// node names arriving on `connected` are sent their configuration
    /// again.
    pub(crate) fn new(
        client: Client,
        nodes: Nodes,
        clients: Arc<NodeClients>,
        connected: mpsc::UnboundedReceiver<String>,
        config: &PushConfig,
    ) -> Self {
        let reporter = Reporter {
            controller: REPORTER.to_string(),
            instance: config.instance.clone(),
        };
        ConfigPush {
            state: State {
                configmaps: Api::namespaced(client.clone(), &config.namespace),
                config_name: config.name.clone(),
                nodes,
                clients,
                recorder: Recorder::new(client, reporter),
                backoff: config.retry,
                source: Source::Absent,
                config_ref: None,
                done: HashMap::new(),
                pending: HashMap::new(),
                forced: HashSet::new(),
                in_flight: HashMap::new(),
            },
            connected,
        }
    }

    /// Follows the ConfigMap and the Nodes until `stop` turns true.
    pub(crate) async fn run(self, mut stop: watch::Receiver<bool>) {
        let ConfigPush {
            mut state,
            mut connected,
        } = self;
        let mut changes = state.nodes.changes();
        let selector = format!("metadata.name={}", state.config_name);
        let configmaps = watcher(
            state.configmaps.clone(),
            watcher::Config::default().fields(&selector),
        )
        .default_backoff();
        let mut configmaps = std::pin::pin!(configmaps);
        let mut pushes: JoinSet<PushResult> = JoinSet::new();
        // Whether the ConfigMap was listed since the watch (re)started.
        let mut listed = false;
        loop {
            state.start_pushes(&mut pushes);
            let next_retry = state.pending.values().map(|p| p.retry_at).min();
            tokio::select! {
                _ = stopped(&mut stop) => break,
                event = configmaps.next() => match event {
                    Some(Ok(event)) => state.on_configmap(event, &mut listed).await,
                    Some(Err(e)) => tracing::warn!(error = %e, "watching the ConfigMap failed; retrying"),
                    None => break,
                },
                changed = changes.changed() => if changed.is_err() { break },
                Some(node) = connected.recv() => {
                    state.forced.insert(node);
                }
                Some(finished) = pushes.join_next(), if !pushes.is_empty() => state.on_pushed(finished).await,
                _ = tokio::time::sleep_until(next_retry.unwrap_or_else(Instant::now)), if next_retry.is_some() => {}
            }
        }
        // ApplyConfig is idempotent, and every node that (re)connects to
        // the next leader is sent its configuration again.
        pushes.abort_all();
    }
}

impl State {
    async fn on_configmap(&mut self, event: watcher::Event<ConfigMap>, listed: &mut bool) {
        match event {
            watcher::Event::Init => *listed = false,
            watcher::Event::InitApply(cm) | watcher::Event::Apply(cm) => {
                *listed = true;
                self.load(&cm).await;
            }
            watcher::Event::InitDone => {
                if !*listed {
                    self.absent();
                }
            }
            watcher::Event::Delete(_) => self.absent(),
        }
    }

    fn absent(&mut self) {
        if !matches!(self.source, Source::Absent) {
            tracing::info!(
                config_map = %self.config_name,
                "no configuration ConfigMap: nodes keep the configuration they have"
            );
        }
        self.source = Source::Absent;
    }

    async fn load(&mut self, cm: &ConfigMap) {
        self.config_ref = Some(cm.object_ref(&()));
        let parsed = match cm.data.as_ref().and_then(|d| d.get(CONFIG_KEY)) {
            Some(text) => parse_config(text).map_err(|e| e.to_string()),
            None => Err(format!("the ConfigMap has no key {CONFIG_KEY}")),
        };
        match parsed {
            Ok(value) => {
                tracing::info!(config_map = %cm.name_any(), resource_version = ?cm.resource_version(), "configuration loaded");
                self.source = Source::Valid(Arc::new(value));
            }
            Err(reason) => {
                tracing::warn!(config_map = %cm.name_any(), %reason, "configuration ConfigMap unusable; nothing pushed");
                self.source = Source::Invalid;
                self.warn("InvalidConfig", &reason).await;
            }
        }
    }

    async fn warn(&self, reason: &str, note: &str) {
        let Some(reference) = &self.config_ref else {
            return;
        };
        let event = KubeEvent {
            type_: EventType::Warning,
            reason: reason.to_string(),
            note: Some(truncate(note, 1024)),
            action: "ApplyConfig".to_string(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, reference).await {
            tracing::warn!(error = %e, "publishing an Event failed");
        }
    }

    /// Starts a push for every node whose configuration is due.
    fn start_pushes(&mut self, pushes: &mut JoinSet<PushResult>) {
        let Source::Valid(config) = &self.source else {
            return;
        };
        let config = config.clone();
        let now = Instant::now();
        let nodes: Vec<Arc<Node>> = self.nodes.all();
        let present: HashSet<String> = nodes.iter().map(|n| n.name_any()).collect();
        self.done.retain(|n, _| present.contains(n));
        self.pending.retain(|n, _| present.contains(n));
        self.forced.retain(|n| present.contains(n));
        for node in nodes {
            let name = node.name_any();
            if self.in_flight.contains_key(&name) {
                continue;
            }
            let text = effective_config(&config, node.labels());
            let digest = digest(&text);
            if !self.forced.contains(&name) {
                if self.done.get(&name) == Some(&digest) {
                    self.pending.remove(&name);
                    continue;
                }
                if self
                    .pending
                    .get(&name)
                    .is_some_and(|p| p.digest == digest && p.retry_at > now)
                {
                    continue;
                }
            }
            let endpoint = match node_endpoint(&node, self.nodes.port()) {
                Ok(e) => e,
                Err(e) => {
                    tracing::debug!(k8s.node.name = %name, error = %e, "no endpoint: configuration not pushed");
                    continue;
                }
            };
            self.forced.remove(&name);
            let clients = self.clients.clone();
            let node_name = name.clone();
            let task = pushes.spawn(async move {
                let req = pb::ApplyConfigRequest { config_json: text };
                let result = clients
                    .call(&endpoint, "ApplyConfig", |mut c| async move {
                        c.apply_config(req).await
                    })
                    .await;
                (node_name, digest, result)
            });
            self.in_flight.insert(name, task.id());
        }
    }

    async fn on_pushed(&mut self, finished: Result<PushResult, tokio::task::JoinError>) {
        let (node, digest, result) = match finished {
            Ok(r) => r,
            Err(e) => {
                // Aborted or panicked: let the next round push again.
                self.in_flight.retain(|_, id| *id != e.id());
                return;
            }
        };
        self.in_flight.remove(&node);
        match result {
            Ok(applied) => {
                tracing::info!(k8s.node.name = %node, device_groups = ?applied.device_groups, "configuration pushed");
                self.done.insert(node.clone(), digest);
                self.pending.remove(&node);
            }
            Err(e) if matches!(e.code(), Code::InvalidArgument | Code::FailedPrecondition) => {
                tracing::warn!(k8s.node.name = %node, error = %e, "node rejected the configuration");
                self.done.insert(node.clone(), digest);
                self.pending.remove(&node);
                let note = format!(
                    "node {node} rejected the configuration ({}): {e}",
                    code_name(e.code())
                );
                self.warn("ConfigRejected", &note).await;
            }
            Err(e) => {
                let attempt = self
                    .pending
                    .get(&node)
                    .filter(|p| p.digest == digest)
                    .map_or(0, |p| p.attempt.saturating_add(1));
                let delay = self.backoff.delay(attempt);
                tracing::info!(k8s.node.name = %node, error = %e, retry_in = ?delay, "configuration push failed");
                self.pending.insert(
                    node,
                    Pending {
                        digest,
                        attempt,
                        retry_at: Instant::now() + delay,
                    },
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {

    proptest::proptest! {
        /// Any ConfigMap text parses or is refused with a reason.
        #[test]
        fn config_text_takes_anything(
            text in proptest::prelude::prop_oneof![
                carina_sys::testkit::noisy_text(),
                carina_sys::testkit::mutated_text(r#"{"diskSelector": [{"name": "carina-vg-ssd", "re": ["loop*"], "policy": "LVM", "nodeLabel": "kubernetes.io/hostname"}], "diskScanInterval": "300", "schedulerStrategy": "spreadout"}"#),
            ],
        ) {
            if let Err(e) = super::parse_config(&text) {
                proptest::prop_assert!(!e.to_string().is_empty());
            }
        }
    }
    use super::*;
    use serde_json::json;

    fn labels(keys: &[(&str, &str)]) -> BTreeMap<String, String> {
        keys.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn carina_config() -> Value {
        json!({
            "diskSelector": [
                {"name": "carina-vg-ssd", "re": ["loop2+"], "policy": "LVM", "nodeLabel": "kubernetes.io/hostname"},
                {"name": "carina-raw-hdd", "re": ["vdb+"], "policy": "RAW", "nodeLabel": "carina.storage.io/raw"},
                {"name": "everywhere", "re": ["sd[b-z]"], "policy": "LVM"},
                {"name": "empty-label", "re": ["sdx"], "policy": "LVM", "nodeLabel": ""},
            ],
            "diskScanInterval": "300",
            "schedulerStrategy": "spreadout",
        })
    }

    fn groups(text: &str) -> Vec<String> {
        let v: Value = serde_json::from_str(text).expect("JSON");
        v["diskSelector"]
            .as_array()
            .expect("list")
            .iter()
            .map(|s| s["name"].as_str().expect("name").to_string())
            .collect()
    }

    #[test]
    fn a_label_key_of_any_value_selects() {
        let config = carina_config();
        let plain = effective_config(&config, &labels(&[("other", "x")]));
        assert_eq!(groups(&plain), ["everywhere", "empty-label"]);
        let raw = effective_config(&config, &labels(&[("carina.storage.io/raw", "")]));
        assert_eq!(
            groups(&raw),
            ["carina-raw-hdd", "everywhere", "empty-label"]
        );
        let all = effective_config(
            &config,
            &labels(&[
                ("kubernetes.io/hostname", "node-a"),
                ("carina.storage.io/raw", "yes"),
            ]),
        );
        assert_eq!(groups(&all).len(), 4);
    }

    #[test]
    fn other_fields_are_kept_and_text_is_canonical() {
        let config = carina_config();
        let text = effective_config(&config, &labels(&[]));
        let v: Value = serde_json::from_str(&text).expect("JSON");
        assert_eq!(v["diskScanInterval"], "300");
        assert_eq!(v["schedulerStrategy"], "spreadout");
        assert_eq!(v["diskSelector"][0]["re"], json!(["sd[b-z]"]));
        // The same configuration written differently is the same text.
        let reordered = parse_config(
            r#"{"schedulerStrategy":"spreadout","diskScanInterval":"300","diskSelector":[
                {"policy":"LVM","re":["sd[b-z]"],"name":"everywhere"},
                {"nodeLabel":"","policy":"LVM","re":["sdx"],"name":"empty-label"}]}"#,
        )
        .expect("valid");
        assert_eq!(effective_config(&reordered, &labels(&[])), text);
    }

    #[test]
    fn unusable_configurations() {
        assert!(matches!(parse_config("{"), Err(ConfigError::Json(_))));
        assert_eq!(parse_config("[]"), Err(ConfigError::NotAnObject));
        assert_eq!(
            parse_config(r#"{"diskSelector":{}}"#),
            Err(ConfigError::SelectorsNotAList)
        );
        let empty = parse_config("{}").expect("valid");
        assert_eq!(effective_config(&empty, &labels(&[])), "{}");
    }
}
