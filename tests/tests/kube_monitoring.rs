//! The monitoring Carina ships: the alert rules
//! (`deploy/helm/carina/files/alerts.yaml`) pass `promtool check rules`
//! and their unit tests (`tests/monitoring/alerts_test.yaml`, each alert
//! firing on the series that should raise it and silent otherwise); every
//! query of the Grafana dashboard (`files/dashboard.json`) is PromQL that
//! promtool accepts; the metrics pages of the node, the controller and
//! the extender pass `promtool check metrics` (format and naming lints);
//! every metric the rules and the dashboard name is on one of those
//! pages; and the chart renders the metrics Services, ServiceMonitors,
//! PrometheusRule and dashboard ConfigMap when asked to.
//!
//! Needs promtool and helm from `tests/tools/build.sh promtool helm`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use carina_node::engine::{CapacitySnapshot, ChangeReason, GroupCapacity, Policy, QuotaMode};
use carina_sys::command::Outcome;
use carina_tests::manifests::{Chart, find, objects, repo_root};
use carina_tests::process::upstream_tool;
use serde_json::Value;

/// `promtool`, from `tests/tools/build.sh promtool` (or `CARINA_PROMTOOL`).
fn promtool() -> Result<PathBuf> {
    upstream_tool("CARINA_PROMTOOL", "promtool-v0.316.0", "promtool")
}

/// Runs promtool with `args` in `dir`, `stdin` as its input; its output
/// when it succeeds.
fn run_promtool(dir: &Path, args: &[&str], stdin: Option<&str>) -> Result<String> {
    let mut child = Command::new(promtool()?)
        .args(args)
        .current_dir(dir)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("start promtool")?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        use std::io::Write as _;
        pipe.write_all(input.as_bytes())?;
    }
    let out = child.wait_with_output()?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() {
        bail!("promtool {args:?} failed ({}):\n{text}", out.status);
    }
    Ok(text)
}

/// The gauges Go Carina named with a `_total` suffix, served under its
/// names so its dashboards keep working.
const GO_GAUGES_NAMED_TOTAL: [&str; 3] = [
    "carina_volume_group_stats_capacity_bytes_total",
    "carina_volume_group_stats_lv_total",
    "carina_volume_group_stats_pv_total",
];

/// `promtool check metrics` of `page`: it passes, or its only objections
/// are the suffix of Go Carina's gauges (each of which the page serves).
fn check_metrics(dir: &Path, page: &str) -> Result<()> {
    let Err(e) = run_promtool(dir, &["check", "metrics"], Some(page)) else {
        return Ok(());
    };
    let text = e.to_string();
    // The first line is run_promtool's; the rest is promtool's answer.
    let problems: Vec<&str> = text
        .lines()
        .skip(1)
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let expected: Vec<String> = GO_GAUGES_NAMED_TOTAL
        .iter()
        .map(|n| format!("{n} non-counter metrics should not have \"_total\" suffix"))
        .collect();
    if problems.is_empty() || !problems.iter().all(|p| expected.iter().any(|x| x == p)) {
        return Err(e);
    }
    Ok(())
}

fn alerts_file() -> PathBuf {
    repo_root().join("deploy/helm/carina/files/alerts.yaml")
}

fn dashboard() -> Result<Value> {
    let path = repo_root().join("deploy/helm/carina/files/dashboard.json");
    serde_json::from_str(&std::fs::read_to_string(&path)?)
        .with_context(|| format!("{} is not JSON", path.display()))
}

/// Every alert's and every dashboard target's expression, with a name.
fn expressions() -> Result<Vec<(String, String)>> {
    let rules: serde_yaml::Value = serde_yaml::from_str(&std::fs::read_to_string(alerts_file())?)?;
    let mut out = Vec::new();
    for group in rules["groups"].as_sequence().context("groups")? {
        for rule in group["rules"].as_sequence().context("rules")? {
            let name = rule["alert"].as_str().context("alert name")?;
            let expr = rule["expr"].as_str().context("expr")?;
            out.push((name.to_string(), expr.to_string()));
        }
    }
    for (panel, target, expr) in dashboard_targets(&dashboard()?)? {
        out.push((format!("panel {panel} target {target}"), expr));
    }
    Ok(out)
}

/// (panel id, refId, expr) of every query of the dashboard, with
/// Grafana's variables as Prometheus sees them after substitution.
fn dashboard_targets(dashboard: &Value) -> Result<Vec<(u64, String, String)>> {
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().context("panels")? {
        let id = panel["id"].as_u64().context("panel id")?;
        if panel["type"] == "row" {
            continue;
        }
        let targets = panel["targets"].as_array().context("targets")?;
        if targets.is_empty() {
            bail!("panel {id} has no queries");
        }
        for target in targets {
            let expr = target["expr"].as_str().context("expr")?;
            let expr = expr
                .replace("$__rate_interval", "5m")
                .replace("$node", ".+");
            out.push((
                id,
                target["refId"].as_str().unwrap_or("?").to_string(),
                expr,
            ));
        }
    }
    Ok(out)
}

#[test]
fn alert_rules_pass_promtool_check_and_their_unit_tests() -> Result<()> {
    let dir = repo_root();
    let check = run_promtool(
        &dir,
        &["check", "rules", &alerts_file().to_string_lossy()],
        None,
    )?;
    assert!(check.contains("SUCCESS"), "{check}");
    let tests = run_promtool(
        &dir.join("tests/monitoring"),
        &["test", "rules", "alerts_test.yaml"],
        None,
    )?;
    assert!(tests.contains("SUCCESS"), "{tests}");
    // Every alert has a unit test that expects it to fire.
    let test_text = std::fs::read_to_string(dir.join("tests/monitoring/alerts_test.yaml"))?;
    for (name, _) in expressions()?
        .iter()
        .filter(|(name, _)| !name.starts_with("panel "))
    {
        assert!(
            test_text.contains(&format!(
                "alertname: {name}\n        exp_alerts:\n          - "
            )),
            "no test expects {name} to fire"
        );
    }
    Ok(())
}

#[test]
fn dashboard_queries_are_promql_promtool_accepts() -> Result<()> {
    let dashboard = dashboard()?;
    let mut ids = BTreeSet::new();
    for panel in dashboard["panels"].as_array().context("panels")? {
        let id = panel["id"].as_u64().context("panel id")?;
        assert!(ids.insert(id), "panel id {id} twice");
        assert!(
            panel["gridPos"]["w"].as_u64().is_some(),
            "panel {id} has no place"
        );
        if panel["type"] != "row" {
            assert_eq!(
                panel["datasource"]["uid"], "${datasource}",
                "panel {id} uses the data source variable"
            );
        }
    }
    // Each query as a recording rule: promtool parses and checks them.
    let targets = dashboard_targets(&dashboard)?;
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (panel, target, expr) in &targets {
        rules.push_str(&format!(
            "      - record: carina:dashboard:panel_{panel}_{target}\n        expr: {}\n",
            serde_json::to_string(expr)?
        ));
    }
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("dashboard-rules.yaml"), &rules)?;
    let check = run_promtool(
        dir.path(),
        &["check", "rules", "dashboard-rules.yaml"],
        None,
    )
    .with_context(|| format!("the dashboard's queries:\n{rules}"))?;
    assert!(
        check.contains(&format!("SUCCESS: {} rules found", targets.len())),
        "{check}"
    );
    Ok(())
}

/// The node's page as `/metrics` renders it: one group of each policy,
/// a certificate from the issuer, the plugin registered, the IO limits,
/// one volume's IO counters, and one observation in each histogram.
fn node_page() -> String {
    let metrics = carina_node::server::metrics::Metrics::default();
    metrics.observe("CreateLV", tonic::Code::Ok);
    metrics.set_plugin_registered(true);
    metrics.certificate_issued(1_900_000_000);
    let group = |name: &str, policy| GroupCapacity {
        group: name.into(),
        policy,
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
    };
    let snapshot = CapacitySnapshot {
        incarnation: "i".into(),
        generation: 7,
        reason: ChangeReason::Create,
        groups: vec![
            group("lvm", Policy::Lvm),
            group("raw", Policy::Raw),
            group("host", Policy::Host),
        ],
    };
    let latency = carina_node::latency::latency();
    latency.command("lvm.lvcreate", Outcome::Ok, Duration::from_millis(20));
    latency.operation("create", "LVM", true, Duration::from_millis(30));
    latency.grpc().observe(
        "/carina.nodestorage.v1.NodeStorage/SetPodIOLimits",
        tonic::Code::Ok,
        0.01,
    );
    let io_limits = carina_node::server::slow_gauge::Reading {
        value: 1,
        age: Duration::from_millis(20),
    };
    let volume_io = carina_node::server::slow_gauge::Reading {
        value: vec![carina_node::server::compat_metrics::VolumeIo {
            volume: "pvc-1".into(),
            group: "lvm".into(),
            stat: carina_sys::blockstat::BlockStat {
                writes_completed: 2,
                sectors_written: 16,
                ..Default::default()
            },
        }],
        age: Duration::from_millis(20),
    };
    metrics.render("node-a", &snapshot, Some(io_limits), Some(&volume_io))
}

fn controller_page() -> String {
    let metrics = carina_controlplane::metrics::metrics();
    metrics.reconciled("OK", Duration::from_millis(3));
    metrics.node_call("CreateLV pvc-1", tonic::Code::Ok, Duration::from_millis(7));
    metrics.set_leader(true);
    metrics
        .grpc()
        .observe("/csi.v1.Controller/CreateVolume", tonic::Code::Ok, 0.05);
    metrics.encode()
}

fn extender_page() -> String {
    let metrics = carina_scheduler::metrics::ExtenderMetrics::default();
    metrics.observe("filter", 200, 0.002);
    metrics.set_in_flight(2);
    metrics.encode()
}

/// Sample names a page can carry: each `# TYPE` family and, by type, its
/// `_bucket`/`_sum`/`_count`, `_total` and `_created` series.
fn sample_names(page: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in page.lines() {
        let mut words = line.split_whitespace();
        if (words.next(), words.next()) != (Some("#"), Some("TYPE")) {
            continue;
        }
        let (Some(name), Some(kind)) = (words.next(), words.next()) else {
            continue;
        };
        names.insert(name.to_string());
        let suffixes: &[&str] = match kind {
            "histogram" => &["_bucket", "_sum", "_count", "_created"],
            "counter" => &["_total", "_created"],
            _ => &[],
        };
        for suffix in suffixes {
            names.insert(format!("{name}{suffix}"));
        }
    }
    names
}

#[test]
fn metrics_pages_pass_promtool_and_carry_every_name_the_rules_use() -> Result<()> {
    let pages = [
        ("carina-node", node_page()),
        ("carina-controller", controller_page()),
        ("carina-scheduler", extender_page()),
    ];
    let dir = repo_root();
    let mut known = BTreeSet::new();
    for (program, page) in &pages {
        check_metrics(&dir, page).with_context(|| format!("the {program} page:\n{page}"))?;
        known.extend(sample_names(page));
    }
    let name = regex::Regex::new(r"\bcarina_[a-z0-9_]+")?;
    let mut unknown = Vec::new();
    for (what, expr) in expressions()? {
        for m in name.find_iter(&expr) {
            if !known.contains(m.as_str()) {
                unknown.push(format!("{what}: {}", m.as_str()));
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "metrics no program serves:\n{}\nserved: {known:?}",
        unknown.join("\n")
    );
    Ok(())
}

/// The chart's monitoring objects: the metrics Services by default; the
/// ServiceMonitors and the PrometheusRule (the rule file's groups as they
/// are) where the Prometheus Operator's API is served; the dashboard
/// ConfigMap when enabled; nothing of it with metrics off.
#[test]
fn the_chart_renders_monitoring_objects_when_asked() -> Result<()> {
    let chart = Chart::new()?;
    let dir = chart.dir().to_string_lossy().into_owned();
    let render = |extra: &[&str], values: Option<&str>| -> Result<Vec<Value>> {
        let mut args = vec!["template", "carina", &dir, "--namespace", "kube-system"];
        args.extend_from_slice(extra);
        let out = chart.run(&args, values)?;
        if !out.success {
            bail!("helm template refused: {}{}", out.stderr, out.stdout);
        }
        objects(&out.stdout)
    };

    let plain = render(&[], None)?;
    for name in ["carina-node-metrics", "carina-controller-metrics"] {
        let service = find(&plain, "Service", name)?;
        assert_eq!(service["spec"]["clusterIP"], "None", "{name}");
    }
    assert!(
        !plain
            .iter()
            .any(|o| o["kind"] == "ServiceMonitor" || o["kind"] == "PrometheusRule"),
        "no Prometheus Operator API: no ServiceMonitor or PrometheusRule"
    );
    let node = find(&plain, "DaemonSet", "carina-node")?;
    let args = node["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    assert!(args.contains("--metrics-listen=0.0.0.0:9765"), "{args}");
    // The controller's NetworkPolicy lets Prometheus reach /metrics.
    let policy = find(&plain, "NetworkPolicy", "carina-controller")?;
    assert!(
        policy["spec"]["ingress"]
            .as_array()
            .context("ingress")?
            .iter()
            .any(|rule| rule["ports"][0]["port"] == 9766),
        "{policy}"
    );

    let operator = render(
        &["--api-versions", "monitoring.coreos.com/v1"],
        Some("scheduler: {enabled: true}\nmetrics: {dashboard: {enabled: true}}\n"),
    )?;
    for name in ["carina-node", "carina-controller", "carina-scheduler"] {
        let monitor = find(&operator, "ServiceMonitor", name)?;
        assert_eq!(monitor["spec"]["jobLabel"], "app.kubernetes.io/name");
        assert_eq!(
            monitor["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"],
            name
        );
        find(&operator, "Service", &format!("{name}-metrics"))?;
    }
    let node_monitor = find(&operator, "ServiceMonitor", "carina-node")?;
    assert_eq!(
        node_monitor["spec"]["endpoints"][0]["relabelings"][0]["targetLabel"],
        "node"
    );
    let rule = find(&operator, "PrometheusRule", "carina")?;
    let file: Value = serde_yaml::from_str(&std::fs::read_to_string(alerts_file())?)?;
    assert_eq!(
        rule["spec"]["groups"], file["groups"],
        "the rule file as it is"
    );
    let board = find(&operator, "ConfigMap", "carina-dashboard")?;
    let shipped: Value =
        serde_json::from_str(board["data"]["carina.json"].as_str().context("json")?)?;
    assert_eq!(shipped, dashboard()?);
    assert_eq!(board["metadata"]["labels"]["grafana_dashboard"], "1");

    let off = render(
        &["--api-versions", "monitoring.coreos.com/v1"],
        Some("metrics: {enabled: false}\n"),
    )?;
    assert!(
        !off.iter().any(|o| {
            o["kind"] == "ServiceMonitor"
                || o["kind"] == "PrometheusRule"
                || o["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n.ends_with("-metrics"))
        }),
        "metrics off: no monitoring objects"
    );
    let node = find(&off, "DaemonSet", "carina-node")?;
    assert!(
        !node["spec"]["template"]["spec"]["containers"][0]["args"]
            .to_string()
            .contains("--metrics-listen"),
        "metrics off: the node keeps its loopback default"
    );
    Ok(())
}
