//! A Go Carina v0.14.0 cluster taken over in place on a real node, as
//! `docs/migrate-from-go-carina.md` walks a user through it.
//!
//! Go Carina itself (built from its source, `tests/tools/build.sh
//! go-carina`) runs on the node with a RAW group on a loop disk and a HOST
//! group on a directory, and makes the volumes of three claims of its
//! chart's StorageClasses for a pod that writes a token into each. Go's
//! LVM volumes need device-mapper to be made, which this node's kernel
//! lacks; the LVM take-over is tested on volumes made as Go's node makes
//! them (`engine_adopt`, `csi_adopt`, `kube_go_takeover`).
//!
//! Then, with the writer still running, Go Carina is removed (its
//! programs stopped, its CSIDriver deleted), this Carina's chart is
//! installed over the same disks with Go's `config.json` as its `config`
//! and Go's StorageClasses kept, `carinactl migrate plan` lists the three
//! volumes as `take-over` and changes no object, and `carinactl migrate
//! apply` adopts them. After that: a new pod reads the three tokens back
//! while the writer still runs (the kubelet counts the volumes as staged,
//! since Go's node had no stage step, and this node publishes them without
//! a stage call, which its log shows); the writer's volumes, mounted by
//! Go's node, are unmounted by this one when it goes; deleting a claim
//! removes its partition; a claim grows and its filesystem with it; a new
//! claim of Go's StorageClass is provisioned and used.
//!
//! Needs what node_volumes.rs needs, plus `tests/tools/build.sh
//! go-carina csi-provisioner` and `cargo build --workspace --bins` (for
//! `carinactl`).

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use carina_api::{LogicVolume, quantity::quantity_bytes};
use carina_tests::have_root;
use carina_tests::local::LocalCluster;
use carina_tests::local::carina::{
    Carina, Group, Layout, Storage, explained, local_options, partitions,
};
use carina_tests::local::gocarina::{GoCarina, go_storage_class};
use carina_tests::local::workload::{Use, Workload, busybox_image, claim, pod};
use carina_tests::process::workspace_binary;
use carina_tests::{LoopDisk, unique};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

const GIB: u64 = 1 << 30;
/// Go's RAW group; this Carina keeps 10 GiB of a group free by default,
/// so its disk is large enough for the claims beside that (sparse).
const RAW_GROUP: &str = "carina-raw-ssd";
const HOST_GROUP: &str = "carina-host";
/// Bound of a carinactl run and of the waits on the API server.
const WAIT: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_go_carina_cluster_is_taken_over_with_its_data() -> Result<()> {
    if !have_root("a_go_carina_cluster_is_taken_over_with_its_data") {
        return Ok(());
    }
    let mut cluster = LocalCluster::start(local_options()?).await?;
    let result = take_over(&mut cluster).await;
    explained(&cluster, result)
}

async fn take_over(cluster: &mut LocalCluster) -> Result<()> {
    // Go Carina's disks and its config.json, its chart's default form.
    let disk = LoopDisk::new(16 * GIB)?;
    let raw_disk = disk.dev();
    let host_dir = cluster.dir().join("go-hostpath");
    std::fs::create_dir_all(&host_dir)?;
    let go_config = json!({
        "diskSelector": [
            // Go matches a pattern against the disk's path.
            {"name": RAW_GROUP, "re": [format!("^{raw_disk}$")], "policy": "RAW",
             "nodeLabel": "kubernetes.io/hostname"},
            {"name": HOST_GROUP, "re": [host_dir], "policy": "HOST",
             "nodeLabel": "kubernetes.io/hostname"},
        ],
        "diskScanInterval": 300,
        "schedulerStrategy": "spreadout",
    });
    cluster.release_after_node(Box::new(disk));

    // Go Carina makes the volumes of three claims; a pod writes into them.
    let mut go = GoCarina::start(cluster, &go_config).await?;
    let classes: Api<StorageClass> = Api::all(cluster.client());
    for (group, fs) in [(RAW_GROUP, "ext4"), (HOST_GROUP, "ext4")] {
        classes
            .create(&PostParams::default(), &go_storage_class(group, fs)?)
            .await?;
    }
    let work = Workload::new(cluster.client(), "default");
    let image = busybox_image()?;
    for (name, class, size) in [
        ("data", RAW_GROUP, "1Gi"),
        ("old", RAW_GROUP, "256Mi"),
        ("files", HOST_GROUP, "1Gi"),
    ] {
        work.create_claim(&claim(name, class, size, false)).await?;
    }
    let token = unique("token");
    let uses = [
        Use::mount("data", "/data"),
        Use::mount("old", "/old"),
        Use::mount("files", "/files"),
    ];
    // The writer keeps running across the switch, as a user's pods do.
    work.create_pod(&pod(
        "go-writer",
        &image,
        &format!(
            "for d in data old files; do echo -n '{token}' > /$d/f || exit 1; done && sync && \
             while true; do sleep 1; done"
        ),
        &uses,
    ))
    .await?;
    work.running("go-writer").await?;
    written(cluster, "go-writer", &format!("{token}{token}{token}")).await?;
    go.check_running()?;
    let go_handles = handles(&work, &["data", "old", "files"]).await?;
    ensure!(
        go_handles["data"].starts_with("volume-") && go_handles["files"].starts_with("host-"),
        "Go's volume ids: {go_handles:?}"
    );
    ensure!(
        partitions(&raw_disk).len() == 2,
        "Go's partitions on {raw_disk}: {:?}",
        partitions(&raw_disk)
    );

    // Go Carina removed; this Carina installed over its disks.
    go.remove(cluster).await?;
    for crd in [
        "crd/logicvolumes.carina.storage.io",
        "crd/nodestorageresources.carina.storage.io",
    ] {
        cluster.kubectl(&[
            "annotate",
            crd,
            "meta.helm.sh/release-name=carina",
            &format!(
                "meta.helm.sh/release-namespace={}",
                carina_tests::local::carina::NAMESPACE
            ),
        ])?;
        cluster.kubectl(&["label", crd, "app.kubernetes.io/managed-by=Helm"])?;
    }
    let layout = Layout {
        groups: [(RAW_GROUP, "RAW"), (HOST_GROUP, "HOST")]
            .iter()
            .map(|(name, policy)| Group {
                name: name.to_string(),
                policy: policy.to_string(),
                disks: Vec::new(),
            })
            .collect(),
        storage_classes: json!([]),
        extender: false,
        carina_keys_only: true,
        capacity_tracking: true,
        snapshots: false,
    };
    let storage = Storage {
        config: go_config,
        host_dirs: vec![(HOST_GROUP.to_string(), host_dir)],
        disks: vec![(RAW_GROUP.to_string(), raw_disk.clone())],
    };
    let carina = Carina::install_on(cluster, &layout, storage).await?;

    // The plan lists Go's three volumes and changes nothing.
    let before = objects(cluster.client()).await?;
    let (code, plan) = carinactl(cluster, &carina, "plan").await?;
    ensure!(code == 0, "migrate plan exited {code}: {plan:#}");
    for name in go_handles.keys() {
        ensure!(
            action(&plan, &go_handles, name) == "take-over",
            "plan for claim {name}: {plan:#}"
        );
    }
    let after = objects(cluster.client()).await?;
    ensure!(before == after, "migrate plan changed objects");

    let (code, applied) = carinactl(cluster, &carina, "apply").await?;
    ensure!(code == 0, "migrate apply exited {code}: {applied:#}");
    let outcomes: Vec<&Value> = applied["volumes"]
        .as_array()
        .context("volumes in apply's report")?
        .iter()
        .map(|v| &v["outcome"])
        .collect();
    ensure!(
        outcomes.len() == 3 && outcomes.iter().all(|o| *o == "adopted"),
        "apply: {applied:#}"
    );

    // The old claims serve their data again, to a pod that starts while
    // Go's writer still runs: the kubelet counts the volumes as staged
    // (Go's node had no stage step), so this node publishes them without a
    // stage call, straight onto the reader's targets.
    let read_back = "cat /data/f /old/f /files/f > /dev/termination-log";
    work.create_pod(&pod("reader", &image, read_back, &uses))
        .await?;
    let read = work.succeeded("reader").await?;
    ensure!(
        read == format!("{token}{token}{token}"),
        "read back {read:?}, wrote {token:?} into each"
    );
    let node_log = cluster.kubectl(&[
        "logs",
        "-n",
        carina_tests::local::carina::NAMESPACE,
        "-l",
        "app.kubernetes.io/name=carina-node",
        "--tail=-1",
    ])?;
    let unstaged = node_log
        .lines()
        .filter(|l| l.contains("published a Go Carina volume the kubelet counts as staged"))
        .count();
    ensure!(
        unstaged == 3,
        "{unstaged} of the reader's 3 volumes published without a stage call:\n{node_log}"
    );
    // This node unmounts what Go's node mounted for the writer.
    work.delete_pod("go-writer").await?;
    work.delete_pod("reader").await?;

    // A deleted claim frees its partition.
    work.delete_claim("old").await?;
    ensure!(
        partitions(&raw_disk).len() == 1,
        "partitions of {raw_disk} after the delete: {:?}",
        partitions(&raw_disk)
    );

    // A claim grows, and its filesystem when a pod next mounts it.
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(cluster.client(), "default");
    claims
        .patch(
            "data",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"resources": {"requests": {"storage": "2Gi"}}}})),
        )
        .await?;
    let volume = go_handles["data"].trim_start_matches("volume-").to_string();
    grown(cluster.client(), &volume, 2 * GIB).await?;
    work.create_pod(&pod(
        "grown",
        &image,
        "cat /data/f > /dev/termination-log && \
         df -k /data | awk 'NR==2 {print \" \" $2}' >> /dev/termination-log",
        &[Use::mount("data", "/data")],
    ))
    .await?;
    let grown_read = work.succeeded("grown").await?;
    let (data, kib) = grown_read.split_once(' ').context("grown's output")?;
    ensure!(data == token, "after the growth: {grown_read:?}");
    let kib: u64 = kib.trim().parse().context("df's size")?;
    ensure!(
        kib * 1024 > 3 * GIB / 2,
        "the filesystem of the grown claim has {kib} KiB"
    );
    work.delete_pod("grown").await?;

    // A new claim of Go's StorageClass.
    work.create_claim(&claim("fresh", RAW_GROUP, "256Mi", false))
        .await?;
    work.create_pod(&pod(
        "fresh-user",
        &image,
        &format!("echo -n '{token}' > /fresh/f && cat /fresh/f > /dev/termination-log"),
        &[Use::mount("fresh", "/fresh")],
    ))
    .await?;
    ensure!(work.succeeded("fresh-user").await? == token, "fresh claim");
    work.delete_pod("fresh-user").await?;
    let fresh = handles(&work, &["fresh"]).await?;
    ensure!(
        !fresh["fresh"].starts_with("volume-"),
        "a new claim got a Go id: {fresh:?}"
    );
    for name in ["data", "files", "fresh"] {
        work.delete_claim(name).await?;
    }
    ensure!(
        partitions(&raw_disk).is_empty(),
        "partitions left on {raw_disk}: {:?}",
        partitions(&raw_disk)
    );
    Ok(())
}

/// The volume handle of each claim's PersistentVolume.
async fn handles(work: &Workload, claims: &[&str]) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for name in claims {
        let pv = work.volume_of(name).await?;
        let handle = pv
            .spec
            .and_then(|s| s.csi)
            .map(|c| c.volume_handle)
            .with_context(|| format!("no CSI handle for claim {name}"))?;
        out.insert(name.to_string(), handle);
    }
    Ok(out)
}

/// The plan's action for the LogicVolume behind claim `name`.
fn action<'a>(plan: &'a Value, handles: &BTreeMap<String, String>, name: &str) -> &'a str {
    plan["volumes"]
        .as_array()
        .and_then(|v| v.iter().find(|e| e["volume_id"] == handles[name].as_str()))
        .and_then(|e| e["action"].as_str())
        .unwrap_or("missing")
}

/// Every LogicVolume, PersistentVolume and StorageClass, by kind and
/// name, with its resourceVersion: equal before and after only if nothing
/// was written.
async fn objects(client: Client) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    let all = ListParams::default();
    for lv in Api::<LogicVolume>::all(client.clone()).list(&all).await? {
        out.insert(
            format!("lv/{}", lv.name_any()),
            lv.resource_version().unwrap_or_default(),
        );
    }
    for pv in Api::<PersistentVolume>::all(client.clone())
        .list(&all)
        .await?
    {
        out.insert(
            format!("pv/{}", pv.name_any()),
            pv.resource_version().unwrap_or_default(),
        );
    }
    for sc in Api::<StorageClass>::all(client).list(&all).await? {
        out.insert(
            format!("sc/{}", sc.name_any()),
            sc.resource_version().unwrap_or_default(),
        );
    }
    Ok(out)
}

/// `carinactl migrate VERB -o json` against the cluster, with the
/// controller's certificate for `apply`; (exit code, its JSON).
async fn carinactl(cluster: &LocalCluster, carina: &Carina, verb: &str) -> Result<(i32, Value)> {
    let pki = cluster.dir().join("carina-pki");
    let mut cmd = tokio::process::Command::new(workspace_binary("carinactl")?);
    cmd.args(["migrate", verb, "-o", "json", "--kubeconfig"])
        .arg(cluster.kube().kubeconfig_path())
        .env_remove("KUBECONFIG")
        .kill_on_drop(true);
    if verb == "apply" {
        let port = carina.values()["node"]["port"].to_string();
        cmd.arg("--ca")
            .arg(pki.join("ca.pem"))
            .arg("--cert")
            .arg(pki.join("controller.pem"))
            .arg("--key")
            .arg(pki.join("controller-key.pem"))
            .args(["--node-port", &port]);
    }
    let out = tokio::time::timeout(WAIT, cmd.output())
        .await
        .with_context(|| format!("carinactl migrate {verb} did not finish"))??;
    let code = out.status.code().context("carinactl killed by a signal")?;
    let report = serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "carinactl migrate {verb} exited {code}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    Ok((code, report))
}

/// Waits until `cat` of the three files in `pod` prints `expected`.
async fn written(cluster: &LocalCluster, pod: &str, expected: &str) -> Result<()> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let out = cluster.kubectl(&[
            "exec", "-n", "default", pod, "--", "cat", "/data/f", "/old/f", "/files/f",
        ]);
        if out.as_deref().map(str::trim).ok() == Some(expected) {
            return Ok(());
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "{pod} has not written {expected:?} within {WAIT:?}: {out:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Waits until LogicVolume `name` records `bytes` as its size.
async fn grown(client: Client, name: &str, bytes: u64) -> Result<()> {
    let lvs: Api<LogicVolume> = Api::all(client);
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let lv = lvs.get(name).await?;
        let current = lv
            .status
            .as_ref()
            .and_then(|s| s.current_size.as_ref())
            .and_then(|q| quantity_bytes(q).ok());
        if current.is_some_and(|c| c >= bytes) {
            return Ok(());
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "LogicVolume {name} did not grow to {bytes} within {WAIT:?}: {:?}",
            lv.status
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
