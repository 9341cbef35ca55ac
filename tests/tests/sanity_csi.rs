//! csi-sanity (the upstream CSI conformance suite) against the real
//! binaries: `carina-controller --mode direct` and one `carina-node` on loop
//! devices, once per volume type; and the LVM mount case again with
//! `carina-controller --mode kube` on a real kube-apiserver (needs etcd
//! and kube-apiserver from `tests/tools/build.sh etcd kube`). Each run's
//! full log (every spec that ran and every spec skipped) is kept under
//! `target/test-logs/`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use carina_tests::cluster::{
    KubeControllerArgs, NodeArgs, Pki, Service, await_capacity, direct_controller_args,
    register_node,
};
use carina_tests::kube::KubeCluster;
use carina_tests::process::{tail, upstream_tool};
use carina_tests::sanity::{Summary, parse_summary};
use carina_tests::{LoopDisk, MountGuard, VgGuard, have_root, run, unique};

const MIB: u64 = 1 << 20;

/// The control plane behind the CSI controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// `--mode direct`: a static node list.
    Direct,
    /// `--mode kube`: `LogicVolume`s on a real kube-apiserver.
    Kube,
}

/// What one csi-sanity run covers.
struct Case {
    label: &'static str,
    policy: &'static str,
    block: bool,
    fs_type: Option<&'static str>,
    mode: Mode,
}

fn log_dir() -> PathBuf {
    carina_tests::test_log_dir()
}

fn write(dir: &Path, name: &str, text: &str) -> Result<PathBuf> {
    let p = dir.join(name);
    std::fs::write(&p, text).with_context(|| format!("write {}", p.display()))?;
    Ok(p)
}

/// Storage for one case: a large sparse loop disk for LVM and RAW; HOST
/// gets its own filesystem on it so capacity is deterministic. Dropped
/// after the node that uses it.
struct Storage {
    /// The node's `config.json`.
    config_json: String,
    group: String,
    _host_mount: Option<MountGuard>,
    _vg: Option<VgGuard>,
    _disk: LoopDisk,
}

impl Storage {
    fn new(case: &Case, dir: &Path) -> Result<Storage> {
        let group = unique(&format!("sanity-{}", case.label));
        let disk = LoopDisk::new(16 << 30)?;
        let vg = (case.policy == "LVM").then(|| VgGuard::new(&group, &[&disk]));
        let host_root = dir.join("host");
        let host_mount = if case.policy == "HOST" {
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
        Ok(Storage {
            config_json: format!(r#"{{"diskSelector":[{selector}],"diskScanInterval":"0"}}"#),
            group,
            _host_mount: host_mount,
            _vg: vg,
            _disk: disk,
        })
    }
}

/// The node's name, in its certificate and (kube mode) its Node object.
const NODE_NAME: &str = "sanity-node";

/// `carina-controller --mode direct` with `node` as its only node.
async fn direct_controller(node: &NodeArgs, pki: &Pki, dir: &Path, log: &Path) -> Result<Service> {
    let nodes = write(
        dir,
        "nodes.yaml",
        &format!(
            "nodes:\n  - name: {}\n    endpoint: {}\n",
            node.name,
            node.endpoint()
        ),
    )?;
    let socket = dir.join("controller.sock");
    let args = direct_controller_args(&nodes, pki, &socket);
    Service::start("carina-controller", "carina-controller", args, &socket, log).await
}

/// A Kubernetes control plane with the CRDs, `node` registered with its
/// endpoint annotation, and `carina-controller --mode kube` leading,
/// once the node's capacity is published (csi-sanity's volumes have no
/// topology, so placement reads the `NodeStorageResource`).
async fn kube_controller(
    node: &NodeArgs,
    pki: &Pki,
    dir: &Path,
    log: &Path,
) -> Result<(KubeCluster, Service)> {
    let cluster = KubeCluster::start().await?;
    cluster.install_crds().await?;
    let client = cluster.client();
    register_node(&client, &node.name, &node.endpoint()).await?;
    let args = KubeControllerArgs::new(
        "carina-controller",
        "carina-controller",
        cluster.kubeconfig_path(),
        pki,
        dir,
        log,
    );
    let controller = args.start().await?;
    await_capacity(&client, &node.name, Duration::from_secs(60)).await?;
    Ok((cluster, controller))
}

async fn run_case(case: &Case) -> Result<Summary> {
    let sanity = upstream_tool("CARINA_CSI_SANITY", "csi-sanity-v5.6.0", "csi-sanity")?;
    let work = tempfile::tempdir()?;
    let dir = work.path();
    let storage = Storage::new(case, dir)?;
    let logs = log_dir();
    let pki = Pki::write(&dir.join("pki"))?;
    let node_args = NodeArgs::new(
        NODE_NAME,
        &pki,
        &storage.config_json,
        &dir.join("node"),
        &logs.join(format!("sanity-{}-node.log", case.label)),
    )?;
    let mut node = node_args.start().await?;
    let ctl_log = logs.join(format!("sanity-{}-controller.log", case.label));
    let _ = std::fs::remove_file(&ctl_log);
    // The cluster (kube mode) outlives the controller.
    let (_cluster, mut controller) = match case.mode {
        Mode::Direct => (
            None,
            direct_controller(&node_args, &pki, dir, &ctl_log).await?,
        ),
        Mode::Kube => {
            let (cluster, controller) = kube_controller(&node_args, &pki, dir, &ctl_log).await?;
            (Some(cluster), controller)
        }
    };

    let mut params = format!("carina.storage.io/disk-group-name: {}\n", storage.group);
    if let Some(fs) = case.fs_type {
        params.push_str(&format!("csi.storage.k8s.io/fstype: {fs}\n"));
    }
    let params_file = write(dir, "parameters.yaml", &params)?;
    let sanity_log = logs.join(format!("sanity-{}.log", case.label));
    let mut args = vec![
        format!("--csi.endpoint={}", node_args.csi_socket.display()),
        format!("--csi.controllerendpoint={}", controller.socket().display()),
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
    let out = tokio::process::Command::new(&sanity)
        .args(&args)
        .output()
        .await
        .with_context(|| format!("run {}", sanity.display()))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(&sanity_log, &text)?;
    node.check_running()?;
    controller.check_running()?;
    controller.stop().await;
    node.stop().await;
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

async fn sanity(case: Case) {
    if !have_root(&format!("csi-sanity {}", case.label)) {
        return;
    }
    let summary = run_case(&case).await.unwrap_or_else(|e| panic!("{e:#}"));
    assert!(summary.passed > 0, "csi-sanity ran no spec");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn csi_sanity_lvm_mount() {
    sanity(Case {
        label: "lvm-mount",
        policy: "LVM",
        block: false,
        fs_type: Some("xfs"),
        mode: Mode::Direct,
    })
    .await;
}

/// The LVM mount case through the Kubernetes control plane: CSI by
/// `KubeProvisioner`, volumes made by the bridge on the node process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn csi_sanity_kube_lvm_mount() {
    sanity(Case {
        label: "kube-lvm-mount",
        policy: "LVM",
        block: false,
        fs_type: Some("xfs"),
        mode: Mode::Kube,
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn csi_sanity_lvm_block() {
    sanity(Case {
        label: "lvm-block",
        policy: "LVM",
        block: true,
        fs_type: None,
        mode: Mode::Direct,
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn csi_sanity_raw_mount() {
    sanity(Case {
        label: "raw-mount",
        policy: "RAW",
        block: false,
        fs_type: Some("xfs"),
        mode: Mode::Direct,
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn csi_sanity_host_mount() {
    sanity(Case {
        label: "host-mount",
        policy: "HOST",
        block: false,
        fs_type: None,
        mode: Mode::Direct,
    })
    .await;
}

/// The other volume types through the Kubernetes control plane, so each
/// type runs every spec (snapshots and clones among them) in both planes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn csi_sanity_kube_lvm_block() {
    sanity(Case {
        label: "kube-lvm-block",
        policy: "LVM",
        block: true,
        fs_type: None,
        mode: Mode::Kube,
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn csi_sanity_kube_raw_mount() {
    sanity(Case {
        label: "kube-raw-mount",
        policy: "RAW",
        block: false,
        fs_type: Some("xfs"),
        mode: Mode::Kube,
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn csi_sanity_kube_host_mount() {
    sanity(Case {
        label: "kube-host-mount",
        policy: "HOST",
        block: false,
        fs_type: None,
        mode: Mode::Kube,
    })
    .await;
}
