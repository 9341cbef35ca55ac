//! The node's latency histograms, one set per process ([`latency`]):
//! every gRPC call it answers on NodeStorage and on the CSI socket (by
//! method and code), every engine operation on a group (by operation,
//! policy and result) and every external command (by command and how it
//! ended). `/metrics` renders them after the counters and gauges of
//! [`crate::server::metrics`]. Labels carry no volume, group or node
//! names: commands are named by program (and `lvm` subcommand).

use std::sync::LazyLock;
use std::time::Duration;

use carina_proto::metrics::{GrpcMetrics, encode, latency_family};
use carina_sys::command::Outcome;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Command {
    /// `lvm.lvcreate`, `sgdisk`, `mkfs.ext4`, ...
    command: String,
    /// `ok`, `failed`, `timed_out`, `spawn`, `interrupted`.
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Operation {
    /// `create`, `resize`, `delete`, `rescan`.
    operation: &'static str,
    /// `LVM`, `RAW`, `HOST`.
    policy: &'static str,
    /// `ok` or `error`.
    result: &'static str,
}

/// The node's histograms.
#[derive(Debug)]
pub struct NodeLatency {
    registry: Registry,
    grpc: GrpcMetrics,
    commands: Family<Command, Histogram>,
    operations: Family<Operation, Histogram>,
}

static LATENCY: LazyLock<NodeLatency> = LazyLock::new(NodeLatency::new);

/// The process's histograms.
pub fn latency() -> &'static NodeLatency {
    &LATENCY
}

/// Makes every external command of the process count in
/// `carina_node_command_duration_seconds` (idempotent).
pub fn observe_commands() {
    carina_sys::command::observe_commands(|command, outcome, took| {
        latency().command(command, outcome, took);
    });
}

impl NodeLatency {
    fn new() -> NodeLatency {
        let mut registry = Registry::with_prefix("carina_node");
        let grpc = GrpcMetrics::register(&mut registry);
        let commands = latency_family();
        registry.register_with_unit(
            "command_duration",
            "Time of one external command, by command and how it ended",
            Unit::Seconds,
            commands.clone(),
        );
        let operations = latency_family();
        registry.register_with_unit(
            "engine_operation_duration",
            "Time of one engine operation on a device group (under its lock), by operation, policy and result",
            Unit::Seconds,
            operations.clone(),
        );
        NodeLatency {
            registry,
            grpc,
            commands,
            operations,
        }
    }

    /// Times the gRPC calls of a server.
    pub fn grpc(&self) -> &GrpcMetrics {
        &self.grpc
    }

    /// One command run.
    pub fn command(&self, command: &str, outcome: Outcome, took: Duration) {
        self.commands
            .get_or_create(&Command {
                command: command.to_string(),
                result: outcome.as_str(),
            })
            .observe(took.as_secs_f64());
    }

    /// One engine operation on a group of `policy`.
    pub fn operation(
        &self,
        operation: &'static str,
        policy: &'static str,
        ok: bool,
        took: Duration,
    ) {
        self.operations
            .get_or_create(&Operation {
                operation,
                policy,
                result: if ok { "ok" } else { "error" },
            })
            .observe(took.as_secs_f64());
    }

    /// The exposition text of the histograms, with the trace export
    /// counters ([`carina_proto::metrics::encode`]).
    pub fn encode(&self) -> String {
        encode(&self.registry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_units_and_labels() {
        let m = NodeLatency::new();
        m.command("lvm.lvcreate", Outcome::Ok, Duration::from_millis(20));
        m.command("sgdisk", Outcome::TimedOut, Duration::from_secs(60));
        m.operation("create", "LVM", true, Duration::from_millis(30));
        m.operation("delete", "RAW", false, Duration::from_millis(2));
        let text = m.encode();
        let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
            .expect("parses");
        let count = |metric: &str, labels: &[(&str, &str)]| {
            scrape
                .samples
                .iter()
                .find(|s| {
                    s.metric == metric && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v))
                })
                .map(|s| s.value.clone())
        };
        let sgdisk = count(
            "carina_node_command_duration_seconds_count",
            &[("command", "sgdisk"), ("result", "timed_out")],
        );
        assert!(
            matches!(
                sgdisk,
                Some(
                    prometheus_parse::Value::Untyped(1.0)
                        | prometheus_parse::Value::Counter(1.0)
                        | prometheus_parse::Value::Gauge(1.0)
                )
            ),
            "{sgdisk:?} in {text}"
        );
        assert!(
            count(
                "carina_node_engine_operation_duration_seconds_count",
                &[
                    ("operation", "delete"),
                    ("policy", "RAW"),
                    ("result", "error")
                ]
            )
            .is_some(),
            "{text}"
        );
    }
}
