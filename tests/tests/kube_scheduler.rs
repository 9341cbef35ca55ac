//! The scheduler extender with a real kube-scheduler: etcd and
//! kube-apiserver from the harness, kube-scheduler configured with the
//! extender entry of `deploy/scheduler/scheduler-config.yaml` (its
//! `urlPrefix` pointed at this process), and `carina-scheduler` running
//! in-process on its informer cache.
//!
//! The test writes what the rest of Carina would: schedulable Nodes
//! (Ready, allocatable, no taints; there are no kubelets) and their
//! `NodeStorageResource`s with different capacities. A small stand-in for
//! external-provisioner + `KubeProvisioner` (no nodes run here) does what
//! they do once kube-scheduler has written `volume.kubernetes.io/selected-node`
//! on a claim: a `LogicVolume` on that node (no status: the bridge never
//! makes it, so it stays in flight, which the records never show), a PV
//! on the node, and the claim bound to it — so kube-scheduler's
//! VolumeBinding PreBind completes and pods get `spec.nodeName`.
//!
//! 1. binpack: a 10 GiB pod lands on the node with the least room (a).
//! 2. A burst of 30 pods (10 GiB each) onto three nodes with room for
//!    3 + 3 + 4: exactly 10 are placed, no node takes more than it holds,
//!    the other 20 stay Pending, with the in-flight volumes in their
//!    reason, and stay so.
//! 3. spreadout (extender and kube-scheduler restarted): a 10 GiB pod
//!    lands on the node with the most room (c); a pod using the claim
//!    bound on a lands on a; a pod without claims is scheduled as usual;
//!    a 400 GiB pod stays Pending and its FailedScheduling event carries
//!    the extender's reasons.
//!
//! A second test runs the `carina-scheduler` binary against a cluster.
//!
//! Needs etcd and the Kubernetes binaries from `tests/tools/build.sh etcd
//! kube`, and `cargo build --workspace --bins` for the binary.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use carina_api::{
    DeviceGroupCapacity, LogicVolume, LogicVolumeSpec, NodeStorageResourceStatus, capacity_key,
};
use carina_csi::strategy::Strategy;
use carina_csi::{DRIVER_NAME, TOPOLOGY_KEY};
use carina_scheduler::cache::Cache;
use carina_scheduler::request::SELECTED_NODE_ANNOTATION;
use carina_scheduler::{Extender, server};
use carina_tests::cluster::{publish_node_storage, ready_node_status};
use carina_tests::kube::{Component, KubeCluster};
use carina_tests::metrics::{scrape, value};
use carina_tests::process::{ChildGuard, tail, workspace_binary};
use carina_tests::workload::{
    WAIT, add_class, add_namespace, failed_scheduling, node_of, pod, pod_with_claim,
    scheduled_node, unschedulable,
};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const GIB: u64 = 1 << 30;
const FIELD_MANAGER: &str = "carina-tests";

/// The extender serving on loopback; stopped on drop.
struct RunningExtender {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl RunningExtender {
    async fn start(client: Client, strategy: Strategy) -> Result<RunningExtender> {
        let cache = Arc::new(Cache::start(client));
        tokio::time::timeout(WAIT, cache.wait_synced())
            .await
            .context("extender caches not synced")?;
        let extender = Arc::new(Extender::new(cache, strategy, Duration::from_secs(2)));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(server::serve(listener, extender, async {
            let _ = stopped.await;
        }));
        Ok(RunningExtender {
            addr,
            stop: Some(stop),
            task,
        })
    }

    /// The extender entry of the checked-in configuration, pointed here.
    fn config(&self) -> Result<Value> {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../deploy/scheduler/scheduler-config.yaml");
        let text =
            std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
        let doc: Value = serde_yaml::from_str(&text)?;
        let mut entry = doc["extenders"][0].clone();
        if entry["nodeCacheCapable"] != true || entry["ignorable"] != false {
            bail!("unexpected extender entry: {entry}");
        }
        entry["urlPrefix"] = format!("http://{}", self.addr).into();
        Ok(entry)
    }
}

impl Drop for RunningExtender {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.task.abort();
    }
}

fn deploy_file(name: &str) -> Result<String> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/scheduler")
        .join(name);
    std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))
}

/// `deploy/scheduler/scheduler-config.yaml`.
fn checked_in_config() -> Result<Value> {
    Ok(serde_yaml::from_str(&deploy_file(
        "scheduler-config.yaml",
    )?)?)
}

#[test]
fn the_deployment_embeds_the_checked_in_configuration() -> Result<()> {
    let config = checked_in_config()?;
    assert_eq!(config["kind"], "KubeSchedulerConfiguration");
    assert_eq!(config["apiVersion"], "kubescheduler.config.k8s.io/v1");
    let text = deploy_file("deployment.yaml")?;
    let mut embedded = None;
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let v = Value::deserialize(doc)?;
        if v["kind"] == "ConfigMap" {
            let inner = v["data"]["scheduler-config.yaml"]
                .as_str()
                .context("the ConfigMap holds scheduler-config.yaml")?;
            embedded = Some(serde_yaml::from_str::<Value>(inner)?);
        }
    }
    assert_eq!(embedded.context("a ConfigMap")?, config);
    Ok(())
}

/// An extender and the kube-scheduler that calls it.
struct Scheduling {
    kube_scheduler: Component,
    _extender: RunningExtender,
}

async fn start_scheduling(cluster: &KubeCluster, strategy: Strategy) -> Result<Scheduling> {
    let extender = RunningExtender::start(cluster.client(), strategy).await?;
    let kube_scheduler = cluster.start_scheduler(&[extender.config()?]).await?;
    Ok(Scheduling {
        kube_scheduler,
        _extender: extender,
    })
}

/// A schedulable Node without a kubelet; its topology label is the one
/// Carina's node plugin registers.
async fn add_node(client: &Client, name: &str) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node = Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(BTreeMap::from([
                ("kubernetes.io/hostname".to_string(), name.to_string()),
                (TOPOLOGY_KEY.to_string(), name.to_string()),
            ])),
            ..ObjectMeta::default()
        },
        ..Node::default()
    };
    nodes.create(&PostParams::default(), &node).await?;
    let status = ready_node_status("32", "64Gi");
    nodes
        .patch_status(
            name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "Node", "status": status})),
        )
        .await?;
    Ok(())
}

/// The node's capacity record: one LVM group with `allocatable` bytes.
async fn publish_capacity(
    client: &Client,
    node: &str,
    group: &str,
    allocatable: u64,
) -> Result<()> {
    let status = NodeStorageResourceStatus {
        sync_time: Some(Time(k8s_openapi::jiff::Timestamp::now())),
        capacity: BTreeMap::from([(
            capacity_key(group),
            Quantity((2 * allocatable / GIB).to_string()),
        )]),
        allocatable: BTreeMap::from([(
            capacity_key(group),
            Quantity((allocatable / GIB).to_string()),
        )]),
        groups: vec![DeviceGroupCapacity {
            name: group.into(),
            policy: "LVM".into(),
            total_bytes: 2 * allocatable,
            free_bytes: allocatable,
            reserve_bytes: 0,
            allocatable_bytes: allocatable,
            largest_allocatable_bytes: allocatable,
            allocation_unit_bytes: 4 << 20,
            ..DeviceGroupCapacity::default()
        }],
        ..NodeStorageResourceStatus::default()
    };
    publish_node_storage(client, node, status).await
}

/// Stands in for external-provisioner and KubeProvisioner: a claim of a
/// Carina class with a selected node gets a `LogicVolume` there (left
/// without status), a PV on that node, and is bound to it.
fn provision_selected_claims(client: Client) -> JoinHandle<()> {
    tokio::spawn(async move {
        let claims: Api<PersistentVolumeClaim> = Api::all(client.clone());
        let stream = watcher(claims, watcher::Config::default()).applied_objects();
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            let Ok(pvc) = event else { continue };
            if let Err(e) = provision(&client, &pvc).await {
                eprintln!("stand-in provisioner: {}: {e:#}", pvc.name_any());
            }
        }
    })
}

async fn provision(client: &Client, pvc: &PersistentVolumeClaim) -> Result<()> {
    let Some(node) = pvc.annotations().get(SELECTED_NODE_ANNOTATION).cloned() else {
        return Ok(());
    };
    let spec = pvc.spec.clone().unwrap_or_default();
    if spec.volume_name.is_some() {
        return Ok(());
    }
    let ns = pvc.namespace().unwrap_or_default();
    let class = spec.storage_class_name.clone().unwrap_or_default();
    let group = match class.as_str() {
        "carina-ssd" => "ssd",
        "carina-burst" => "burst",
        _ => return Ok(()),
    };
    let size = spec
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .cloned()
        .context("no size")?;
    let uid = pvc.uid().context("no uid")?;
    let volume = format!("pvc-{uid}");
    let lv = LogicVolume::new(
        &volume,
        LogicVolumeSpec {
            source: None,
            node_name: node.clone(),
            size: size.clone(),
            device_group: group.into(),
            pvc: pvc.name_any(),
            name_space: ns.clone(),
            cache: None,
        },
    );
    ignore_exists(
        Api::<LogicVolume>::all(client.clone())
            .create(&PostParams::default(), &lv)
            .await,
    )?;
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": volume},
        "spec": {
            "capacity": {"storage": size},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": class,
            "claimRef": {"namespace": ns, "name": pvc.name_any(), "uid": uid},
            "csi": {"driver": DRIVER_NAME, "volumeHandle": volume,
                    "volumeAttributes": {"carina.storage.io/node": node}},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": TOPOLOGY_KEY, "operator": "In", "values": [node]}]}]}},
        },
    }))?;
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    ignore_exists(pvs.create(&PostParams::default(), &pv).await)?;
    pvs.patch_status(
        &volume,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Bound"}})),
    )
    .await?;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    claims
        .patch(
            &pvc.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({
                "metadata": {"annotations": {
                    "pv.kubernetes.io/bind-completed": "yes",
                    "pv.kubernetes.io/bound-by-controller": "yes"}},
                "spec": {"volumeName": volume},
            })),
        )
        .await?;
    claims
        .patch_status(
            &pvc.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Bound",
                "accessModes": ["ReadWriteOnce"], "capacity": {"storage": size}}})),
        )
        .await?;
    Ok(())
}

fn ignore_exists<T>(r: kube::Result<T>) -> Result<()> {
    match r {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

#[tokio::test]
async fn kube_scheduler_places_pods_where_carina_volumes_fit() -> Result<()> {
    let cluster = KubeCluster::start().await?;
    cluster.install_crds().await?;
    let client = cluster.client();
    for (node, gib) in [("node-a", 100), ("node-b", 200), ("node-c", 300)] {
        add_node(&client, node).await?;
        publish_capacity(&client, node, "ssd", gib * GIB).await?;
    }
    // Room for 3, 3 and 4 volumes of 10 GiB, in a group only they have.
    let burst_nodes = [("node-d", 35), ("node-e", 35), ("node-f", 45)];
    for (node, gib) in burst_nodes {
        add_node(&client, node).await?;
        publish_capacity(&client, node, "burst", gib * GIB).await?;
    }
    add_class(&client, "carina-ssd", "ssd").await?;
    add_class(&client, "carina-burst", "burst").await?;
    add_namespace(&client, "apps").await?;
    add_namespace(&client, "burst").await?;
    let provisioner = provision_selected_claims(client.clone());

    // 1. binpack: the node with the least room that fits.
    let mut binpack = start_scheduling(&cluster, Strategy::Binpack).await?;
    pod_with_claim(&client, "apps", "packed", "carina-ssd", "10Gi").await?;
    assert_eq!(scheduled_node(&client, "apps", "packed").await?, "node-a");
    let packed = Api::<PersistentVolumeClaim>::namespaced(client.clone(), "apps")
        .get("packed")
        .await?;
    assert_eq!(
        packed
            .annotations()
            .get(SELECTED_NODE_ANNOTATION)
            .map(String::as_str),
        Some("node-a")
    );

    // 2. The burst.
    burst(&client, &burst_nodes).await?;
    binpack.kube_scheduler.check_running()?;
    drop(binpack);

    // 3. spreadout: the node with the most room.
    let mut spread = start_scheduling(&cluster, Strategy::Spreadout).await?;
    pod_with_claim(&client, "apps", "spread", "carina-ssd", "10Gi").await?;
    assert_eq!(scheduled_node(&client, "apps", "spread").await?, "node-c");
    // A second pod of the bound claim goes where its volume is.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "apps");
    pods.create(
        &PostParams::default(),
        &pod("apps", "packed-again", &["packed"]),
    )
    .await?;
    assert_eq!(
        scheduled_node(&client, "apps", "packed-again").await?,
        "node-a"
    );
    // A pod without claims passes the extender untouched.
    pods.create(&PostParams::default(), &pod("apps", "plain", &[]))
        .await?;
    scheduled_node(&client, "apps", "plain").await?;
    // Too large for every node: Pending, with the extender's reasons.
    pod_with_claim(&client, "apps", "huge", "carina-ssd", "400Gi").await?;
    let message = failed_scheduling(&client, "apps", "huge", "needs 400.0 GiB").await?;
    for part in [
        "device group \"ssd\" has 90.0 GiB allocatable after 10.0 GiB in flight, claim apps/huge needs 400.0 GiB",
        "device group \"ssd\" has 200.0 GiB allocatable, claim apps/huge needs 400.0 GiB",
        "the node has no device group \"ssd\"",
    ] {
        assert!(message.contains(part), "{part:?} not in {message:?}");
    }
    assert_eq!(node_of(Some(&pods.get("huge").await?)), None);
    spread.kube_scheduler.check_running()?;
    drop(spread);
    provisioner.abort();
    Ok(())
}

/// 30 pods of 10 GiB each onto nodes with room for `nodes` (GiB each):
/// exactly as many as fit are placed, never more per node, the rest stay
/// Pending.
async fn burst(client: &Client, nodes: &[(&str, u64)]) -> Result<()> {
    const PODS: usize = 30;
    let fit: HashMap<&str, usize> = nodes
        .iter()
        .map(|(n, gib)| (*n, (*gib / 10) as usize))
        .collect();
    let total: usize = fit.values().sum();
    assert_eq!(total, 10);
    let creates = (0..PODS).map(|i| {
        let client = client.clone();
        async move {
            pod_with_claim(
                &client,
                "burst",
                &format!("b{i:02}"),
                "carina-burst",
                "10Gi",
            )
            .await
        }
    });
    futures::future::try_join_all(creates).await?;

    let pods: Api<Pod> = Api::namespaced(client.clone(), "burst");
    let stream = watcher(pods.clone(), watcher::Config::default()).applied_objects();
    let mut stream = std::pin::pin!(stream);
    let mut placed: HashMap<String, String> = HashMap::new();
    let mut pending: HashMap<String, bool> = HashMap::new();
    let settled = tokio::time::timeout(WAIT * 2, async {
        while let Some(p) = stream.try_next().await? {
            let name = p.name_any();
            match node_of(Some(&p)) {
                Some(node) => {
                    pending.remove(&name);
                    placed.insert(name, node);
                }
                None => {
                    pending.insert(name, unschedulable(&p));
                }
            }
            let refused = pending.values().filter(|u| **u).count();
            if placed.len() + refused == PODS {
                return Ok::<_, anyhow::Error>(());
            }
        }
        bail!("pod stream ended")
    })
    .await;
    settled.with_context(|| {
        format!(
            "burst not settled: {} placed, pending {pending:?}",
            placed.len()
        )
    })??;
    // Held for a while: nothing more gets placed (retries are refused).
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(p) = stream.try_next().await? {
            if let Some(node) = node_of(Some(&p)) {
                placed.insert(p.name_any(), node);
            }
        }
        Ok::<_, anyhow::Error>(())
    })
    .await;

    let mut per_node: HashMap<&str, usize> = HashMap::new();
    for node in placed.values() {
        *per_node.entry(node.as_str()).or_default() += 1;
    }
    for (node, count) in &per_node {
        let room = fit.get(node).copied().unwrap_or(0);
        assert!(
            *count <= room,
            "{node} took {count} pods, holds {room}: {per_node:?}"
        );
    }
    assert_eq!(placed.len(), total, "placed: {per_node:?}");
    // The in-flight volumes: never more than a node holds.
    let lvs = Api::<LogicVolume>::all(client.clone())
        .list(&Default::default())
        .await?;
    for (node, room) in &fit {
        let on_node = lvs
            .items
            .iter()
            .filter(|lv| lv.spec.node_name == *node && lv.spec.device_group == "burst")
            .count();
        assert!(
            on_node <= *room,
            "{node}: {on_node} volumes, room for {room}"
        );
    }
    let refused = pods
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .find(|p| node_of(Some(p)).is_none())
        .context("a pending pod")?;
    failed_scheduling(client, "burst", &refused.name_any(), "in flight").await?;
    Ok(())
}

/// The `carina-scheduler` binary against the cluster: `/healthz` at once,
/// `/readyz` once its caches have listed, and a `/filter` answered.
#[tokio::test]
async fn the_binary_serves_once_its_caches_are_synced() -> Result<()> {
    let cluster = KubeCluster::start().await?;
    cluster.install_crds().await?;
    let binary = workspace_binary("carina-scheduler")?;
    let [port, metrics_port] = carina_tests::ports::free_ports::<2>()?;
    let log = cluster.log_dir().join("carina-scheduler.log");
    let args = [
        format!("--listen=127.0.0.1:{port}"),
        "--strategy=binpack".to_string(),
        format!("--metrics-listen=127.0.0.1:{metrics_port}"),
    ];
    let kubeconfig = cluster.kubeconfig_path().to_string_lossy().into_owned();
    let mut child = ChildGuard::spawn(
        "carina-scheduler",
        &binary,
        &args,
        &[("KUBECONFIG", kubeconfig.as_str())],
        &log,
    )?;
    // Waiting for a process to start: nothing to watch yet.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        child.check_running()?;
        if let Ok(answer) = http(port, "GET /readyz HTTP/1.0\r\n\r\n").await
            && answer.starts_with("HTTP/1.0 200")
        {
            break;
        }
        if tokio::time::Instant::now() > deadline {
            bail!(
                "carina-scheduler not ready within {WAIT:?}:\n{}",
                tail(&log, 40)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        http(port, "GET /healthz HTTP/1.0\r\n\r\n")
            .await?
            .ends_with("ok")
    );
    let body = r#"{"Pod":{"metadata":{"name":"p","namespace":"default","uid":"u"},"spec":{"volumes":[{"name":"d","persistentVolumeClaim":{"claimName":"missing"}}]}},"NodeNames":["n1"]}"#;
    let answer = http(
        port,
        &format!(
            "POST /filter HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        ),
    )
    .await?;
    assert!(
        answer.contains("claim default/missing is not in the extender's cache yet"),
        "{answer}"
    );
    let metrics = scrape(port).await?;
    let answers = "carina_extender_request_duration_seconds_count";
    assert_eq!(
        value(&metrics, answers, &[("verb", "filter"), ("code", "200")]),
        Some(1.0),
        "{:?}",
        metrics.samples
    );
    assert!(value(&metrics, "carina_extender_reservations_in_flight", &[]).is_some());
    // The same metrics on the separate metrics address.
    let apart = scrape(metrics_port).await?;
    assert_eq!(
        value(&apart, answers, &[("verb", "filter"), ("code", "200")]),
        Some(1.0),
        "{:?}",
        apart.samples
    );
    child.check_running()?;
    Ok(())
}

/// One HTTP/1.0 exchange on loopback; the whole response.
async fn http(port: u16, request: &str) -> Result<String> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    stream.write_all(request.as_bytes()).await?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await?;
    Ok(String::from_utf8_lossy(&response).into_owned())
}

/// The extender and the provisioner's placement read one rule of which
/// `LogicVolume`s hold room on their node: a volume the bridge still
/// retries holds it, whatever the code it retries on. Before, the
/// provisioner counted only volumes without an answer (a second volume
/// went onto a node the first one fills: an over-commit the node finds
/// only when both are made), the extender missed `CANCELLED`, and the
/// provisioner deleted the object of a create the bridge still retried
/// on `CANCELLED` (the claim's volume started over elsewhere while the
/// bridge could still make the first).
#[tokio::test]
async fn extender_and_provisioner_agree_a_retried_volume_holds_room() -> Result<()> {
    use carina_controlplane::kube::provisioner::{KubeProvisioner, KubeProvisionerConfig};
    use carina_tests::csi::{ServedController, create, on};
    use tonic::Code;

    let cluster = KubeCluster::start().await?;
    cluster.install_crds().await?;
    let client = cluster.client();
    add_class(&client, "carina-ssd", "ssd").await?;
    add_namespace(&client, "apps").await?;
    let lvs: Api<LogicVolume> = Api::all(client.clone());
    // Each node has 10 GiB; a 6 GiB volume there is being retried.
    let retried = [
        ("node-u", "held-u", Code::Unavailable),
        ("node-x", "held-x", Code::Cancelled),
    ];
    for (node, held, code) in retried {
        add_node(&client, node).await?;
        publish_capacity(&client, node, "ssd", 10 * GIB).await?;
        let lv = LogicVolume::new(
            held,
            LogicVolumeSpec {
                source: None,
                node_name: node.into(),
                size: Quantity("6Gi".into()),
                device_group: "ssd".into(),
                pvc: String::new(),
                name_space: String::new(),
                cache: None,
            },
        );
        lvs.create(&PostParams::default(), &lv).await?;
        lvs.patch_status(
            held,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"code": code as i32, "status": "Failed",
                "message": "the node did not answer"}})),
        )
        .await?;
    }
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "apps");
    claims
        .create(
            &PostParams::default(),
            &carina_tests::workload::claim("apps", "second", "carina-ssd", "6Gi"),
        )
        .await?;
    let waiting = pod("apps", "second", &["second"]);
    Api::<Pod>::namespaced(client.clone(), "apps")
        .create(&PostParams::default(), &waiting)
        .await?;

    // The extender: neither node has room for a second 6 GiB volume.
    let cache = Arc::new(Cache::start(client.clone()));
    tokio::time::timeout(WAIT, cache.wait_synced())
        .await
        .context("extender caches not synced")?;
    let extender = Extender::new(cache, Strategy::Binpack, Duration::from_secs(2));
    let nodes: Vec<&str> = retried.iter().map(|(n, _, _)| *n).collect();
    let body = json!({"Pod": waiting, "NodeNames": nodes});
    let answer = extender
        .filter(&serde_json::to_vec(&body)?)
        .await
        .map_err(|e| anyhow::anyhow!("filter: {e:?}"))?;
    let answer: Value = serde_json::from_slice(&answer)?;
    assert_eq!(answer["NodeNames"], json!([]), "{answer}");
    for node in &nodes {
        let why = answer["FailedAndUnresolvableNodes"][node]
            .as_str()
            .unwrap_or_default();
        assert!(
            why.contains("after 6.0 GiB in flight"),
            "{node}: {why:?} in {answer}"
        );
    }

    // The provisioner: the same answer, before it writes anything.
    let provisioner = KubeProvisioner::new(
        client.clone(),
        KubeProvisionerConfig {
            strategy: Strategy::Binpack,
            wait_timeout: Duration::from_secs(5),
        },
    );
    let mut served = ServedController::start(provisioner, "carina-room-").await?;
    let request = |name: &str, node: &str| {
        let mut req = create(name, 6 * GIB, "xfs");
        req.parameters.insert(
            carina_csi::params::DISK_GROUP.to_string(),
            "ssd".to_string(),
        );
        req.accessibility_requirements = Some(carina_proto::csi::TopologyRequirement {
            requisite: vec![on(node)],
            preferred: vec![on(node)],
        });
        req
    };
    for (node, held, code) in retried {
        let second = format!("second-{node}");
        let s = served
            .csi
            .create_volume(request(&second, node))
            .await
            .expect_err("no room for a second volume");
        assert_eq!(s.code(), Code::ResourceExhausted, "{node}: {s:?}");
        assert!(
            lvs.get_opt(&second).await?.is_none(),
            "{node}: a LogicVolume was written for the second volume"
        );
        // The retry of the held volume's own create leaves its object to
        // the bridge.
        let s = served
            .csi
            .create_volume(request(held, node))
            .await
            .expect_err("the bridge has not made it");
        assert!(
            lvs.get_opt(held).await?.is_some(),
            "{held} ({code:?}): the object of a create the bridge retries was deleted"
        );
        assert_eq!(s.code(), Code::Unavailable, "{held} ({code:?}): {s:?}");
    }
    Ok(())
}
