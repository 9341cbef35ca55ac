//! The controller's Prometheus metrics, one set per process
//! ([`metrics`]), served on `--metrics-listen`: the latency of every CSI
//! call it answered (by method and code), of each `LogicVolume`
//! reconcile (by outcome), of each call to a node (by NodeStorage RPC and
//! code), and whether this replica leads. Labels carry no volume or node
//! names.

use std::sync::LazyLock;
use std::time::Duration;

use carina_proto::metrics::{GrpcMetrics, encode, latency_family};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

/// The NodeStorage RPCs the controller calls; any other name in a call's
/// description counts as `other`.
const NODE_RPCS: &[&str] = &[
    "CreateLV",
    "DeleteLV",
    "ResizeLV",
    "GetLV",
    "ListLVs",
    "Capacity",
    "WatchCapacity",
    "ListDisks",
    "ApplyConfig",
    "CreateBcache",
    "DeleteBcache",
    "GetBcache",
    "SetCacheMode",
    "SetPodIOLimits",
    "ClearPodIOLimits",
    "ListPodIOLimits",
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Outcome {
    /// `OK`, a gRPC code name, or `KUBE_API` for errors of the API server.
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeCall {
    rpc: &'static str,
    code: &'static str,
}

/// The controller's metrics.
#[derive(Debug)]
pub struct ControllerMetrics {
    registry: Registry,
    grpc: GrpcMetrics,
    reconciles: Family<Outcome, Histogram>,
    node_calls: Family<NodeCall, Histogram>,
    leader: Gauge,
}

static METRICS: LazyLock<ControllerMetrics> = LazyLock::new(ControllerMetrics::new);

/// The process's metrics.
pub fn metrics() -> &'static ControllerMetrics {
    &METRICS
}

impl ControllerMetrics {
    fn new() -> ControllerMetrics {
        let mut registry = Registry::with_prefix("carina_controller");
        let grpc = GrpcMetrics::register(&mut registry);
        let reconciles = latency_family();
        registry.register_with_unit(
            "logicvolume_reconcile_duration",
            "Time of one LogicVolume reconcile of the bridge, by result (OK or the failure's code)",
            Unit::Seconds,
            reconciles.clone(),
        );
        let node_calls = latency_family();
        registry.register_with_unit(
            "node_call_duration",
            "Time of one NodeStorage call to a node, by RPC and status code",
            Unit::Seconds,
            node_calls.clone(),
        );
        let leader = Gauge::default();
        registry.register(
            "leader",
            "1 while this replica holds the leader lease (kube mode), else 0",
            leader.clone(),
        );
        ControllerMetrics {
            registry,
            grpc,
            reconciles,
            node_calls,
            leader,
        }
    }

    /// Times the CSI calls of a server.
    pub fn grpc(&self) -> &GrpcMetrics {
        &self.grpc
    }

    /// One reconcile that took `took` and ended with `result` (`OK` or a
    /// code name).
    pub fn reconciled(&self, result: &'static str, took: Duration) {
        self.reconciles
            .get_or_create(&Outcome { result })
            .observe(took.as_secs_f64());
    }

    /// One node call described as `what` (its first word is the RPC).
    pub fn node_call(&self, what: &str, code: tonic::Code, took: Duration) {
        let first = what.split_whitespace().next().unwrap_or_default();
        let rpc = NODE_RPCS
            .iter()
            .find(|r| **r == first)
            .copied()
            .unwrap_or("other");
        self.node_calls
            .get_or_create(&NodeCall {
                rpc,
                code: carina_proto::code_name(code),
            })
            .observe(took.as_secs_f64());
    }

    /// Whether this replica leads.
    pub fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    /// The exposition text.
    pub fn encode(&self) -> String {
        encode(&self.registry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_units_and_bounded_labels() {
        let m = ControllerMetrics::new();
        m.reconciled("OK", Duration::from_millis(3));
        m.reconciled("RESOURCE_EXHAUSTED", Duration::from_millis(5));
        m.node_call("CreateLV pvc-1", tonic::Code::Ok, Duration::from_millis(7));
        m.node_call(
            "pvc-1 something",
            tonic::Code::Unavailable,
            Duration::from_millis(1),
        );
        m.set_leader(true);
        let text = m.encode();
        let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
            .expect("parses");
        let has = |metric: &str, label: &str, value: &str| {
            scrape
                .samples
                .iter()
                .any(|s| s.metric == metric && s.labels.get(label) == Some(value))
        };
        assert!(
            has(
                "carina_controller_logicvolume_reconcile_duration_seconds_count",
                "result",
                "RESOURCE_EXHAUSTED"
            ),
            "{text}"
        );
        assert!(
            has(
                "carina_controller_node_call_duration_seconds_count",
                "rpc",
                "CreateLV"
            ),
            "{text}"
        );
        assert!(
            has(
                "carina_controller_node_call_duration_seconds_count",
                "rpc",
                "other"
            ),
            "{text}"
        );
        assert!(!text.contains("pvc-1"), "no volume names: {text}");
        let leader = scrape
            .samples
            .iter()
            .find(|s| s.metric == "carina_controller_leader")
            .expect("leader");
        assert!(matches!(leader.value, prometheus_parse::Value::Gauge(v) if v == 1.0));
    }
}
