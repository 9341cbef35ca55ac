//! `carinactl migrate apply` against a real kube-apiserver and an
//! in-process NodeStorage server (a HOST group on a temporary directory)
//! reached through its Node's endpoint annotation over mutual TLS, as the
//! bridge reaches it, with a controller certificate of the test CA.
//!
//! The node holds a HOST volume as Go Carina v0.14.0 made it (directory
//! `host-<pv>`, mode 0777, a file in it, no marker), and the cluster its
//! Go-shaped LogicVolume and PersistentVolume, plus an orphan LogicVolume
//! (no PV). It proves: apply refuses while Go's controller Deployment
//! exists, touching nothing; once it is gone, apply adopts the volume on
//! the node (GetLV finds it under its Go id, the file is intact), writes
//! the adopted-volume annotation and keeps the finalizer, and leaves the
//! orphan alone; a volume an interrupted run adopted on the node but did
//! not annotate is finished (AdoptLV of an adopted volume returns it); a
//! second run skips the volumes as already adopted and changes no object.
//!
//! Needs etcd and kube-apiserver from `tests/tools/build.sh etcd kube`,
//! and `cargo build --workspace --bins` for `carinactl`.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use carina_api::{LOGICVOLUME_FINALIZER, LogicVolume};
use carina_proto::devcerts::Validity;
use carina_proto::nodestorage as pb;
use carina_tests::cluster::register_node;
use carina_tests::grpc::{TestNode, get_lv, host_engine};
use carina_tests::kube::KubeCluster;
use carina_tests::process::workspace_binary;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

const ADOPTED: &str = "carina.storage.io/adopted-volume";
const RUN_TIMEOUT: Duration = Duration::from_secs(60);
const NODE: &str = "node-a";
const GROUP: &str = "carina-host";

async fn create<K>(api: &Api<K>, object: Value) -> Result<K>
where
    K: Resource + Clone + std::fmt::Debug + DeserializeOwned + serde::Serialize,
{
    let typed: K = serde_json::from_value(object).context("object of the test")?;
    api.create(&PostParams::default(), &typed)
        .await
        .with_context(|| format!("create {}", typed.name_any()))
}

/// A Go-shaped HOST LogicVolume `name` on [`NODE`], with its status.
async fn go_host_lv(lvs: &Api<LogicVolume>, name: &str) -> Result<()> {
    create(
        lvs,
        json!({
            "apiVersion": "carina.storage.io/v1", "kind": "LogicVolume",
            "metadata": {"name": name, "finalizers": [LOGICVOLUME_FINALIZER],
                "annotations": {"carina.io/volume-manage-type": "host"}},
            "spec": {"nodeName": NODE, "size": "1Mi", "deviceGroup": GROUP,
                "pvc": format!("claim-{name}"), "nameSpace": "app"}
        }),
    )
    .await?;
    let status = json!({"status": {"volumeID": format!("host-{name}"), "status": "Success",
        "currentSize": "1Mi", "code": 0, "message": ""}});
    lvs.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .with_context(|| format!("status of {name}"))?;
    Ok(())
}

/// Runs `carinactl migrate apply -o json` with the controller's
/// credentials; (exit status, standard output, standard error).
async fn apply(cluster: &KubeCluster, certs: &Path) -> Result<(i32, String, String)> {
    let mut cmd = tokio::process::Command::new(workspace_binary("carinactl")?);
    cmd.args(["migrate", "apply", "-o", "json", "--kubeconfig"])
        .arg(cluster.kubeconfig_path())
        .arg("--ca")
        .arg(certs.join("ca.pem"))
        .arg("--cert")
        .arg(certs.join("controller.pem"))
        .arg("--key")
        .arg(certs.join("controller-key.pem"))
        .env_remove("KUBECONFIG")
        .kill_on_drop(true);
    let out = tokio::time::timeout(RUN_TIMEOUT, cmd.output())
        .await
        .context("carinactl migrate apply did not finish")??;
    let code = out.status.code().context("carinactl killed by a signal")?;
    Ok((
        code,
        String::from_utf8(out.stdout)?,
        String::from_utf8(out.stderr)?,
    ))
}

fn outcome<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["volumes"]
        .as_array()
        .and_then(|v| v.iter().find(|e| e["name"] == name))
        .map(|e| &e["outcome"])
        .unwrap_or_else(|| panic!("volume {name} in the report: {report:#}"))
}

#[tokio::test]
async fn migrate_apply_takes_a_go_host_volume_over() -> Result<()> {
    let cluster = KubeCluster::start().await?;
    cluster.install_crds().await?;
    let client = cluster.client();

    // The node, holding Go's directory with data in it.
    let (engine, dirs) = host_engine(GROUP, None).await?;
    let go_dir = dirs.root.join("host-pvc-h1");
    for dir in [&go_dir, &dirs.root.join("host-pvc-h2")] {
        std::fs::create_dir(dir)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777))?;
        std::fs::write(dir.join("data.txt"), "written by a pod under Go Carina")?;
    }
    let node = TestNode::start(engine, NODE).await?;
    register_node(&client, NODE, &node.endpoint()).await?;
    let certs = tempfile::tempdir()?;
    std::fs::write(certs.path().join("ca.pem"), node.ca.cert_pem())?;
    let controller = node.issue_client("controller", Validity::days(1))?;
    std::fs::write(certs.path().join("controller.pem"), &controller.cert_pem)?;
    std::fs::write(certs.path().join("controller-key.pem"), &controller.key_pem)?;

    let lvs: Api<LogicVolume> = Api::all(client.clone());
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    for name in ["pvc-h1", "pvc-h2"] {
        go_host_lv(&lvs, name).await?;
        create(
            &pvs,
            json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
                "spec": {"capacity": {"storage": "1Mi"}, "accessModes": ["ReadWriteOnce"],
                    "claimRef": {"namespace": "app", "name": format!("claim-{name}")},
                    "csi": {"driver": "carina.storage.io",
                        "volumeHandle": format!("host-{name}")}}}),
        )
        .await?;
    }
    go_host_lv(&lvs, "pvc-orphan").await?;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "kube-system");
    create(
        &deployments,
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "csi-carina-provisioner", "namespace": "kube-system"},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "go"}},
                "template": {"metadata": {"labels": {"app": "go"}}, "spec": {"containers": [
                    {"name": "csi-carina-controller", "image": "carina:v0.14.0",
                     "command": ["carina-controller"]}]}}}}),
    )
    .await?;

    // Refused while Go's controller exists: nothing touched.
    let (code, _, stderr) = apply(&cluster, certs.path()).await?;
    assert_eq!(code, 2, "refused while Go runs: {stderr}");
    assert!(
        stderr.contains("Go Carina still runs") && stderr.contains("csi-carina-provisioner"),
        "{stderr}"
    );
    let lv = lvs.get("pvc-h1").await?;
    assert!(!lv.annotations().contains_key(ADOPTED), "{lv:?}");
    let mut reader = node.client("reader").await?;
    assert!(get_lv(&mut reader, "host-pvc-h1").await?.is_none());

    // An earlier run that stopped after the node adopted pvc-h2 and
    // before its object was annotated.
    let mut controller_client = node.client("controller").await?;
    controller_client
        .adopt_lv(pb::AdoptLvRequest {
            name: "host-pvc-h2".into(),
            device_group: GROUP.into(),
            policy: pb::Policy::Host as i32,
            size_bytes: 1 << 20,
        })
        .await
        .context("AdoptLV host-pvc-h2 as an interrupted run did")?;

    // Go gone: the volumes are taken over.
    deployments
        .delete("csi-carina-provisioner", &DeleteParams::default())
        .await?;
    let (code, stdout, stderr) = apply(&cluster, certs.path()).await?;
    ensure!(code == 0, "apply exited {code}: {stderr}\n{stdout}");
    let report: Value = serde_json::from_str(&stdout).context("apply JSON")?;
    assert_eq!(outcome(&report, "pvc-h1"), "adopted", "{report:#}");
    assert_eq!(outcome(&report, "pvc-h2"), "adopted", "{report:#}");
    assert_eq!(outcome(&report, "pvc-orphan"), "skipped", "{report:#}");
    assert_eq!(report["errors"], 0);
    let lv = lvs.get("pvc-h1").await?;
    assert_eq!(
        lv.annotations().get(ADOPTED).map(String::as_str),
        Some("host-pvc-h1")
    );
    assert!(lv.finalizers().iter().any(|f| f == LOGICVOLUME_FINALIZER));
    let h2 = lvs.get("pvc-h2").await?;
    assert_eq!(
        h2.annotations().get(ADOPTED).map(String::as_str),
        Some("host-pvc-h2"),
        "the interrupted run is finished"
    );
    let orphan = lvs.get("pvc-orphan").await?;
    assert!(!orphan.annotations().contains_key(ADOPTED));
    let served = get_lv(&mut reader, "host-pvc-h1")
        .await?
        .context("the node serves the adopted volume")?;
    assert_eq!(served.device_group, GROUP);
    assert_eq!(
        std::fs::read_to_string(go_dir.join("data.txt"))?,
        "written by a pod under Go Carina"
    );

    // A second run: already adopted, no object changed.
    let before = (
        lvs.get("pvc-h1").await?.resource_version(),
        lvs.get("pvc-orphan").await?.resource_version(),
    );
    let (code, stdout, stderr) = apply(&cluster, certs.path()).await?;
    ensure!(code == 0, "second apply exited {code}: {stderr}");
    let report: Value = serde_json::from_str(&stdout)?;
    assert_eq!(outcome(&report, "pvc-h1"), "already-adopted", "{report:#}");
    assert_eq!(outcome(&report, "pvc-h2"), "already-adopted", "{report:#}");
    let after = (
        lvs.get("pvc-h1").await?.resource_version(),
        lvs.get("pvc-orphan").await?.resource_version(),
    );
    assert_eq!(before, after, "the second run changed an object");
    node.stop().await?;
    Ok(())
}
