//! `/metrics` in the Prometheus text format: NodeStorage requests by
//! method and status code, the capacity of every device group as of
//! the engine's latest snapshot, whether kubelet has registered the CSI
//! plugin (when the node registers itself), and, for a certificate from
//! the issuer, when it expires and how requests for one went. Served over
//! plain HTTP/1 on its own (by default loopback) address.
//!
//! The page never waits on a volume group: the capacity gauges come from
//! the snapshot the engine already holds, and the one figure that needs
//! the volumes listed (the IO limits in force) is read beside the page
//! ([`super::slow_gauge`]), waited for at most [`IO_LIMITS_WAIT`] and
//! rendered with its age. The same goes for the IO counters of the
//! volumes' block devices, rendered under the names Go Carina exported
//! with its group capacity gauges ([`super::compat_metrics`]); those
//! carry volume names.

use carina_proto::metrics::escape_label;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::future::Future;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::TcpListener;
use tonic::Code;

use super::compat_metrics::{self, VolumeIo};
use super::slow_gauge::{Reading, SlowGauge};
use crate::engine::{CapacitySnapshot, Engine, GroupCapacity};

/// The longest a page waits for the IO limits to be counted before it
/// renders the last count (with its age): half of Prometheus's default
/// scrape timeout, and far more than a count takes unless the listing of
/// the volumes waits on LVM.
pub const IO_LIMITS_WAIT: Duration = Duration::from_secs(5);

/// Request counters, shared by the gRPC service and the auth layer, and
/// the kubelet registration state, set by the registration service.
#[derive(Debug)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(String, &'static str), u64>>,
    /// None: the node does not register itself with kubelet.
    plugin_registered: Mutex<Option<bool>>,
    /// Unix time the issued certificate expires; 0 without one.
    certificate_not_after: AtomicI64,
    certificates_issued: AtomicU64,
    certificate_requests_failed: AtomicU64,
    /// The IO limits in force, counted beside the page.
    io_limits: Arc<SlowGauge>,
    /// The volumes' block device counters, read beside the page.
    volume_io: Arc<SlowGauge<Vec<VolumeIo>>>,
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics {
            requests: Mutex::default(),
            plugin_registered: Mutex::default(),
            certificate_not_after: AtomicI64::default(),
            certificates_issued: AtomicU64::default(),
            certificate_requests_failed: AtomicU64::default(),
            io_limits: Arc::new(SlowGauge::new("metrics.io_limits")),
            volume_io: Arc::new(SlowGauge::new("metrics.volume_io")),
        }
    }
}

impl Metrics {
    /// Counts one finished call of `method` (`CreateLV`, `grpc.health.v1.Health/Check`, ...).
    pub fn observe(&self, method: &str, code: Code) {
        let mut requests = self.requests.lock().unwrap_or_else(|p| p.into_inner());
        *requests
            .entry((method.to_string(), code_name(code)))
            .or_default() += 1;
    }

    /// The count for one method and code (for tests and logs).
    pub fn count(&self, method: &str, code: Code) -> u64 {
        self.requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(method.to_string(), code_name(code)))
            .copied()
            .unwrap_or(0)
    }

    /// Records kubelet's latest word on the plugin registration (`false`
    /// also before kubelet has said anything); from the first call on,
    /// `carina_node_plugin_registered` is rendered.
    pub fn set_plugin_registered(&self, registered: bool) {
        *self
            .plugin_registered
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(registered);
    }

    /// The registration state (None: not registering with kubelet).
    pub fn plugin_registered(&self) -> Option<bool> {
        *self
            .plugin_registered
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// A certificate from the issuer is in force until `not_after` (Unix
    /// seconds).
    pub fn certificate_issued(&self, not_after: i64) {
        self.certificate_not_after
            .store(not_after, Ordering::Relaxed);
        self.certificates_issued.fetch_add(1, Ordering::Relaxed);
    }

    /// A request to the issuer failed (refused or unreachable).
    pub fn certificate_request_failed(&self) {
        self.certificate_requests_failed
            .fetch_add(1, Ordering::Relaxed);
    }

    /// The exposition text for `node` given the latest capacity snapshot,
    /// the last count of IO limits in force (pod and volume pairs; `None`
    /// while none could be read) and the volumes' IO counters as last read
    /// (`None` likewise).
    pub fn render(
        &self,
        node: &str,
        snapshot: &CapacitySnapshot,
        io_limits: Option<Reading>,
        volume_io: Option<&Reading<Vec<VolumeIo>>>,
    ) -> String {
        let mut out = String::new();
        let node = escape_label(node);
        out.push_str(
            "# HELP carina_node_grpc_requests_total NodeStorage calls by method and status code.\n\
             # TYPE carina_node_grpc_requests_total counter\n",
        );
        for ((method, code), n) in self
            .requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            let _ = writeln!(
                out,
                "carina_node_grpc_requests_total{{node=\"{node}\",method=\"{}\",code=\"{code}\"}} {n}",
                escape_label(method)
            );
        }
        let _ = writeln!(
            out,
            "# HELP carina_node_capacity_generation Generation of the latest capacity snapshot (status.nodeGeneration of the node's record): one more with every capacity change, from 0 at each start.\n\
             # TYPE carina_node_capacity_generation gauge\n\
             carina_node_capacity_generation{{node=\"{node}\"}} {}",
            snapshot.generation
        );
        if let Some(registered) = self.plugin_registered() {
            let _ = writeln!(
                out,
                "# HELP carina_node_plugin_registered 1 when kubelet last reported the CSI plugin registered, 0 before that and after a failure.\n\
                 # TYPE carina_node_plugin_registered gauge\n\
                 carina_node_plugin_registered{{node=\"{node}\"}} {}",
                u8::from(registered)
            );
        }
        let not_after = self.certificate_not_after.load(Ordering::Relaxed);
        if not_after != 0 {
            let _ = writeln!(
                out,
                "# HELP carina_node_certificate_not_after_seconds When the certificate from the issuer expires (Unix time).\n\
                 # TYPE carina_node_certificate_not_after_seconds gauge\n\
                 carina_node_certificate_not_after_seconds{{node=\"{node}\"}} {not_after}\n\
                 # HELP carina_node_certificates_issued_total Certificates received from the issuer.\n\
                 # TYPE carina_node_certificates_issued_total counter\n\
                 carina_node_certificates_issued_total{{node=\"{node}\"}} {}\n\
                 # HELP carina_node_certificate_requests_failed_total Requests to the issuer that brought no certificate.\n\
                 # TYPE carina_node_certificate_requests_failed_total counter\n\
                 carina_node_certificate_requests_failed_total{{node=\"{node}\"}} {}",
                self.certificates_issued.load(Ordering::Relaxed),
                self.certificate_requests_failed.load(Ordering::Relaxed),
            );
        }
        if let Some(Reading { value, age }) = io_limits {
            let _ = writeln!(
                out,
                "# HELP carina_node_io_limits_in_force Pod and volume pairs with an IO limit (throttle) in force.\n\
                 # TYPE carina_node_io_limits_in_force gauge\n\
                 carina_node_io_limits_in_force{{node=\"{node}\"}} {value}\n\
                 # HELP carina_node_io_limits_age_seconds How long ago carina_node_io_limits_in_force was counted (each scrape counts again, but renders the last count when counting waits on LVM).\n\
                 # TYPE carina_node_io_limits_age_seconds gauge\n\
                 carina_node_io_limits_age_seconds{{node=\"{node}\"}} {:.3}",
                age.as_secs_f64()
            );
        }
        let gauges: [(&str, &str, Gauge); 5] = [
            ("volumes", "Volumes in the device group.", |g| {
                u64::from(g.volume_count)
            }),
            ("capacity_total_bytes", "Size of the device group.", |g| {
                g.total_bytes
            }),
            ("capacity_free_bytes", "Unallocated bytes.", |g| {
                g.free_bytes
            }),
            (
                "capacity_reserve_bytes",
                "Bytes kept free, never allocated.",
                |g| g.reserve_bytes,
            ),
            (
                "capacity_allocatable_bytes",
                "Free bytes minus the reserve.",
                |g| g.allocatable_bytes,
            ),
        ];
        for (name, help, value) in gauges {
            let _ = writeln!(
                out,
                "# HELP carina_node_{name} {help}\n# TYPE carina_node_{name} gauge"
            );
            for g in &snapshot.groups {
                let _ = writeln!(
                    out,
                    "carina_node_{name}{{node=\"{node}\",device_group=\"{}\",policy=\"{}\"}} {}",
                    escape_label(&g.group),
                    g.policy,
                    value(g)
                );
            }
        }
        compat_metrics::render_groups(&mut out, &node, snapshot);
        compat_metrics::render_volumes(&mut out, &node, volume_io);
        // The histograms and the trace export counters.
        out.push_str(&crate::latency::latency().encode());
        out
    }
}

/// Reads one gauge's value from a group's capacity.
type Gauge = fn(&GroupCapacity) -> u64;

pub use carina_proto::code_name;

/// The `/metrics` page of node `node_name` now: [`Metrics::render`] of
/// the engine's latest capacity snapshot, the IO limits in force as last
/// counted and the volumes' IO counters as last read. It waits on no lock
/// of a volume group and runs no command: the count and the read wait at
/// most [`IO_LIMITS_WAIT`], side by side.
pub async fn page(metrics: &Metrics, engine: &Engine, node_name: &str) -> String {
    // Without a block IO controller no limit can be in force: the count
    // fails, and the gauge is left out rather than reported as 0.
    let count = {
        let engine = engine.clone();
        async move { engine.pod_io_limits(None).await.ok().map(|l| l.len()) }
    };
    let io = {
        let engine = engine.clone();
        async move { compat_metrics::read_volume_io(&engine).await }
    };
    // Both list the volumes, which may wait on LVM: side by side, a page
    // waits the bound once.
    let (limits, io) = tokio::join!(
        metrics.io_limits.get(count, IO_LIMITS_WAIT),
        metrics.volume_io.get(io, IO_LIMITS_WAIT)
    );
    let snapshot = engine.subscribe().borrow().clone();
    metrics.render(node_name, &snapshot, limits, io.as_ref())
}

/// Serves `GET /metrics` on `listener` until `shutdown` completes.
pub async fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    engine: Engine,
    node_name: String,
    shutdown: impl Future<Output = ()>,
) {
    let render: carina_proto::metrics::Render = Arc::new(move || {
        let (metrics, engine, node_name) = (metrics.clone(), engine.clone(), node_name.clone());
        Box::pin(async move { page(&metrics, &engine, &node_name).await })
    });
    carina_proto::metrics::serve(
        listener,
        carina_proto::metrics::CONTENT_TYPE,
        render,
        shutdown,
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{ChangeReason, Policy, QuotaMode};

    #[test]
    fn renders_counters_and_gauges() {
        let m = Metrics::default();
        m.observe("CreateLV", Code::Ok);
        m.observe("CreateLV", Code::Ok);
        m.observe("CreateLV", Code::ResourceExhausted);
        assert_eq!(m.count("CreateLV", Code::Ok), 2);
        let snap = CapacitySnapshot {
            incarnation: "i".into(),
            generation: 7,
            reason: ChangeReason::Create,
            groups: vec![GroupCapacity {
                group: "g".into(),
                policy: Policy::Host,
                total_bytes: 100,
                free_bytes: 60,
                reserve_bytes: 10,
                allocatable_bytes: 50,
                largest_allocatable_bytes: 50,
                allocation_unit: 1,
                volume_count: 3,
                quota: QuotaMode::AccountingOnly,
                disks: vec![],
                no_disks: None,
            }],
        };
        let text = m.render("node-a", &snap, None, None);
        assert!(
            !text.contains("carina_node_plugin_registered"),
            "not registering, no gauge:\n{text}"
        );
        m.set_plugin_registered(true);
        let text = m.render("node-a", &snap, None, None);
        assert!(!text.contains("certificate"), "no issued certificate yet");
        m.certificate_request_failed();
        m.certificate_issued(1_900_000_000);
        let io = Reading {
            value: 2,
            age: Duration::from_millis(1500),
        };
        let text = m.render("node-a", &snap, Some(io), None);
        for line in [
            r#"carina_node_plugin_registered{node="node-a"} 1"#,
            r#"carina_node_certificate_not_after_seconds{node="node-a"} 1900000000"#,
            r#"carina_node_certificates_issued_total{node="node-a"} 1"#,
            r#"carina_node_certificate_requests_failed_total{node="node-a"} 1"#,
            r#"carina_node_grpc_requests_total{node="node-a",method="CreateLV",code="OK"} 2"#,
            r#"carina_node_grpc_requests_total{node="node-a",method="CreateLV",code="RESOURCE_EXHAUSTED"} 1"#,
            r#"carina_node_capacity_generation{node="node-a"} 7"#,
            r#"carina_node_io_limits_in_force{node="node-a"} 2"#,
            r#"carina_node_io_limits_age_seconds{node="node-a"} 1.500"#,
            r#"carina_node_volumes{node="node-a",device_group="g",policy="HOST"} 3"#,
            r#"carina_node_capacity_allocatable_bytes{node="node-a",device_group="g",policy="HOST"} 50"#,
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
        }
        // The whole page, histograms included, is one valid exposition.
        crate::latency::latency().operation("create", "HOST", true, std::time::Duration::ZERO);
        let text = m.render("node-a", &snap, None, None);
        let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
            .expect("the page parses");
        for family in [
            "carina_node_grpc_requests_total",
            "carina_node_capacity_free_bytes",
            "carina_node_engine_operation_duration_seconds_count",
        ] {
            assert!(
                scrape.samples.iter().any(|s| s.metric == family),
                "{family} in\n{text}"
            );
        }
    }
}
