//! csi-sanity (the upstream CSI conformance suite) against the real
//! binaries: `carina-controller --mode direct` and one `carina-node` on loop
//! devices, once per volume type. Each run's full log (every spec that ran
//! and every spec skipped) is kept under `target/test-logs/`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use carina_proto::devcerts::{DevCa, Validity};
use carina_proto::tls::DEFAULT_TRUST_DOMAIN;
use carina_tests::process::{ChildGuard, tail, upstream_tool, wait_for_path, workspace_binary};
use carina_tests::{LoopDisk, MountGuard, VgGuard, have_root, run, unique};

const MIB: u64 = 1 << 20;

/// What one csi-sanity run covers.
struct Case {
    label: &'static str,
    policy: &'static str,
    block: bool,
    fs_type: Option<&'static str>,
}

/// The counts csi-sanity's (ginkgo's) summary line reports.
#[derive(Debug, Default, PartialEq)]
struct Summary {
    ran: u32,
    total: u32,
    passed: u32,
    failed: u32,
    skipped: u32,
}

/// Parses ginkgo's closing lines: `Ran 62 of 91 Specs in 30.1 seconds` and
/// `SUCCESS! -- 62 Passed | 0 Failed | 0 Pending | 29 Skipped` (or FAIL!).
fn parse_summary(log: &str) -> Option<Summary> {
    let mut s = Summary::default();
    let ran_line = log
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with("Ran "))?;
    let words: Vec<&str> = ran_line.split_whitespace().collect();
    s.ran = words.get(1)?.parse().ok()?;
    s.total = words.get(3)?.parse().ok()?;
    let counts = log.lines().rev().find(|l| l.contains(" Passed | "))?;
    for part in counts.split('|') {
        let mut it = part.split_whitespace().rev();
        let (Some(word), Some(n)) = (it.next(), it.next()) else {
            continue;
        };
        let n: u32 = n.parse().ok()?;
        match word {
            "Passed" => s.passed = n,
            "Failed" => s.failed = n,
            "Skipped" => s.skipped = n,
            _ => {}
        }
    }
    Some(s)
}

fn log_dir() -> PathBuf {
    let dir = std::env::var_os("CARINA_TEST_LOG_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/test-logs"));
    let _ = std::fs::create_dir_all(&dir);
    dir
}

fn write(dir: &Path, name: &str, text: &str) -> Result<PathBuf> {
    let p = dir.join(name);
    std::fs::write(&p, text).with_context(|| format!("write {}", p.display()))?;
    Ok(p)
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn run_case(case: &Case) -> Result<Summary> {
    let sanity = upstream_tool("CARINA_CSI_SANITY", "csi-sanity-v5.6.0", "csi-sanity")?;
    let node_bin = workspace_binary("carina-node")?;
    let controller_bin = workspace_binary("carina-controller")?;
    let work = tempfile::tempdir()?;
    let dir = work.path();

    // Storage: a large sparse disk for LVM and RAW; HOST gets its own
    // filesystem so capacity is deterministic.
    let group = unique(&format!("sanity-{}", case.label));
    let disk = LoopDisk::new(16 << 30)?;
    let _vg = (case.policy == "LVM").then(|| VgGuard::new(&group, &[&disk]));
    let host_root = dir.join("host");
    let _host_mount = if case.policy == "HOST" {
        run("mkfs.ext4", &["-q", "-F", &disk.dev()])?;
        Some(MountGuard::mount(
            &disk.dev(),
            &host_root,
            Some("ext4"),
            None,
        )?)
    } else {
        None
    };
    let selector = match case.policy {
        "HOST" => format!(
            r#"{{"name":"{group}","policy":"HOST","root":"{}","reserveBytes":0}}"#,
            host_root.join("volumes").display()
        ),
        policy => format!(
            r#"{{"name":"{group}","re":["{}"],"policy":"{policy}","reserveBytes":0,"minDiskBytes":1048576}}"#,
            disk.pattern()
        ),
    };
    let config = write(
        dir,
        "config.json",
        &format!(r#"{{"diskSelector":[{selector}],"diskScanInterval":"0"}}"#),
    )?;

    // Certificates: the node serves NodeStorage as `sanity-node`; the
    // controller is a `controller` client.
    let node_name = "sanity-node";
    let ca = DevCa::new("carina sanity CA", Validity::days(1))?;
    let server = ca.issue_server(node_name, &["localhost".into()], &[], Validity::days(1))?;
    let client = ca.issue_client(DEFAULT_TRUST_DOMAIN, "controller", Validity::days(1))?;
    let ca_pem = write(dir, "ca.pem", ca.cert_pem())?;
    let node_cert = write(dir, "node.pem", &server.cert_pem)?;
    let node_key = write(dir, "node-key.pem", &server.key_pem)?;
    let ctl_cert = write(dir, "controller.pem", &client.cert_pem)?;
    let ctl_key = write(dir, "controller-key.pem", &client.key_pem)?;

    let logs = log_dir();
    let port = free_port()?;
    let node_csi = dir.join("node.sock");
    let node_log = logs.join(format!("sanity-{}-node.log", case.label));
    let _ = std::fs::remove_file(&node_log);
    let s = |p: &Path| p.display().to_string();
    let mut node = ChildGuard::spawn(
        "carina-node",
        &node_bin,
        &[
            "--config".into(),
            s(&config),
            "--node-name".into(),
            node_name.into(),
            "--listen".into(),
            format!("127.0.0.1:{port}"),
            "--metrics-listen".into(),
            format!("127.0.0.1:{}", free_port()?),
            "--tls-cert".into(),
            s(&node_cert),
            "--tls-key".into(),
            s(&node_key),
            "--tls-ca".into(),
            s(&ca_pem),
            "--csi-endpoint".into(),
            s(&node_csi),
            "--state-dir".into(),
            s(&dir.join("state")),
        ],
        &[("RUST_LOG", "info")],
        &node_log,
    )?;
    wait_for_path(&node_csi, &mut node, Duration::from_secs(60))?;

    let nodes = write(
        dir,
        "nodes.yaml",
        &format!("nodes:\n  - name: {node_name}\n    endpoint: 127.0.0.1:{port}\n"),
    )?;
    let ctl_csi = dir.join("controller.sock");
    let ctl_log = logs.join(format!("sanity-{}-controller.log", case.label));
    let _ = std::fs::remove_file(&ctl_log);
    let mut controller = ChildGuard::spawn(
        "carina-controller",
        &controller_bin,
        &[
            "--mode".into(),
            "direct".into(),
            "--nodes".into(),
            s(&nodes),
            "--csi-endpoint".into(),
            s(&ctl_csi),
            "--tls-ca".into(),
            s(&ca_pem),
            "--tls-cert".into(),
            s(&ctl_cert),
            "--tls-key".into(),
            s(&ctl_key),
        ],
        &[("RUST_LOG", "info")],
        &ctl_log,
    )?;
    wait_for_path(&ctl_csi, &mut controller, Duration::from_secs(60))?;

    let mut params = format!("carina.storage.io/disk-group-name: {group}\n");
    if let Some(fs) = case.fs_type {
        params.push_str(&format!("csi.storage.k8s.io/fstype: {fs}\n"));
    }
    let params_file = write(dir, "parameters.yaml", &params)?;
    let sanity_log = logs.join(format!("sanity-{}.log", case.label));
    let mut args = vec![
        format!("--csi.endpoint={}", node_csi.display()),
        format!("--csi.controllerendpoint={}", ctl_csi.display()),
        format!("--csi.mountdir={}", dir.join("mnt").display()),
        format!("--csi.stagingdir={}", dir.join("staging").display()),
        format!("--csi.testvolumesize={}", 400 * MIB),
        format!("--csi.testvolumeexpandsize={}", 800 * MIB),
        format!("--csi.testvolumeparameters={}", params_file.display()),
        format!(
            "--csi.junitfile={}",
            logs.join(format!("sanity-{}.xml", case.label)).display()
        ),
        "--ginkgo.v".into(),
        "--ginkgo.no-color".into(),
        "--ginkgo.timeout=20m".into(),
    ];
    if case.block {
        args.push("--csi.testvolumeaccesstype=block".into());
    }
    let out = std::process::Command::new(&sanity)
        .args(&args)
        .output()
        .with_context(|| format!("run {}", sanity.display()))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(&sanity_log, &text)?;
    node.check_running()?;
    controller.check_running()?;
    drop(controller);
    drop(node);
    let summary = parse_summary(&text).with_context(|| {
        format!(
            "no ginkgo summary in {}:\n{}",
            sanity_log.display(),
            tail(&sanity_log, 60)
        )
    })?;
    println!(
        "csi-sanity {}: ran {} of {} specs: {} passed, {} failed, {} skipped (log: {})",
        case.label,
        summary.ran,
        summary.total,
        summary.passed,
        summary.failed,
        summary.skipped,
        sanity_log.display()
    );
    if !out.status.success() || summary.failed > 0 {
        let failures: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("[FAIL]") || l.contains("[FAILED]"))
            .collect();
        bail!(
            "csi-sanity {} failed ({}): {} failed specs\n{}\nlog: {}",
            case.label,
            out.status,
            summary.failed,
            failures.join("\n"),
            sanity_log.display()
        );
    }
    Ok(summary)
}

fn sanity(case: Case) {
    if !have_root(&format!("csi-sanity {}", case.label)) {
        return;
    }
    let summary = run_case(&case).unwrap_or_else(|e| panic!("{e:#}"));
    assert!(summary.passed > 0, "csi-sanity ran no spec");
}

#[test]
fn csi_sanity_lvm_mount() {
    sanity(Case {
        label: "lvm-mount",
        policy: "LVM",
        block: false,
        fs_type: Some("xfs"),
    });
}

#[test]
fn csi_sanity_lvm_block() {
    sanity(Case {
        label: "lvm-block",
        policy: "LVM",
        block: true,
        fs_type: None,
    });
}

#[test]
fn csi_sanity_raw_mount() {
    sanity(Case {
        label: "raw-mount",
        policy: "RAW",
        block: false,
        fs_type: Some("xfs"),
    });
}

#[test]
fn csi_sanity_host_mount() {
    sanity(Case {
        label: "host-mount",
        policy: "HOST",
        block: false,
        fs_type: None,
    });
}

#[test]
fn ginkgo_summary_parses() {
    let log = "...\nRan 62 of 91 Specs in 30.120 seconds\nSUCCESS! -- 62 Passed | 0 Failed | 0 Pending | 29 Skipped\nPASS\n";
    assert_eq!(
        parse_summary(log),
        Some(Summary {
            ran: 62,
            total: 91,
            passed: 62,
            failed: 0,
            skipped: 29
        })
    );
    let log =
        "Ran 3 of 10 Specs in 1.0 seconds\nFAIL! -- 2 Passed | 1 Failed | 0 Pending | 7 Skipped\n";
    assert_eq!(parse_summary(log).map(|s| s.failed), Some(1));
    assert_eq!(parse_summary("no summary here"), None);
}
