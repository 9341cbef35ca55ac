//! End to end on Kubernetes with the real processes: a real kube-apiserver
//! and etcd with Carina's CRDs; two `carina-node` processes (`node-a`,
//! `node-b`), each on its own loop disk with an LVM group of the same
//! name (as one StorageClass names one group for every node), serving
//! NodeStorage with a certificate from one development CA on a free
//! loopback port; Node objects that point at those ports through the
//! endpoint annotation; and `carina-controller --mode kube` as a process,
//! driven through its CSI socket.
//!
//! It proves:
//! - create (pinned to a node, as `WaitForFirstConsumer` asks), expand and
//!   delete through CSI; the `LogicVolume` status, the node's own answer
//!   (`GetLV` over mTLS) and `lvs` on the node's disk agree; the other
//!   node has nothing;
//! - a controller killed (SIGKILL) in the middle of a create, while the
//!   node's `lvcreate` is seen waiting (the test holds the VG's lvm lock),
//!   and started again converges to exactly one volume, and the retried
//!   `CreateVolume` returns it;
//! - a create pinned to a node whose process is down fails with a
//!   retryable code, and the same request succeeds once the node is back;
//!   nothing leaks on either node or in the API;
//! - a controller killed (SIGKILL) in the middle of a delete, and in the
//!   middle of an expand, with the node call seen in flight (its `lvremove`
//!   or `lvextend` waits on the held lock): another replica's retry
//!   finishes it, and nothing is left over;
//! - 50 creates in flight while kube-apiserver is killed and restarted,
//!   then etcd (at each kill none has answered and both nodes' `lvcreate`
//!   are seen waiting on the held lock): every create, retried as
//!   external-provisioner retries, ends with exactly one volume, and
//!   deleting them leaves nothing;
//! - two replicas: one holds the Lease and runs the bridge while both
//!   serve CSI; the other takes over when the leader stops (SIGTERM), and
//!   volumes are made and deleted afterwards.
//!
//! Capacity records and configuration push are covered by `kube_bridge`.
//!
//! Needs root and loop devices, etcd and kube-apiserver from
//! `tests/tools/build.sh etcd kube`, and `cargo build --workspace --bins`.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use carina_api::LogicVolume;
use carina_api::quantity::quantity_bytes;
use carina_csi::names::local_name as object_name;
use carina_csi::{TOPOLOGY_KEY, context};
use carina_proto::csi;
use carina_proto::nodestorage as pb;
use carina_tests::cluster::{
    KubeControllerArgs, LvmNode, Pki, Service, await_capacity, await_object,
};
use carina_tests::csi::{Csi, delete, make, mount_cap, on};
use carina_tests::grpc::get_lv;
use carina_tests::kube::KubeCluster;
use carina_tests::lvmlock::{VgLock, a_descendant_waits};
use carina_tests::{have_root, lvm, unique, wait_until};
use k8s_openapi::api::coordination::v1::Lease;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use tonic::Code;

const A: &str = "node-a";
const B: &str = "node-b";
const MIB: u64 = 1 << 20;
const DISK_BYTES: u64 = 2 << 30;
/// Bound of every wait for the control plane.
const WAIT: Duration = Duration::from_secs(60);
/// The Lease of the replicas (namespace `kube-system`).
const LEASE: &str = "carina-controller";

/// The cluster, the nodes and the files of one test. Controllers are the
/// test's own; drop them before this.
struct E2e {
    nodes: Vec<LvmNode>,
    pki: Pki,
    group: String,
    cluster: KubeCluster,
    dir: tempfile::TempDir,
}

impl E2e {
    /// The cluster with CRDs, and nodes `names` running and registered;
    /// `None` (the test skips) without root outside CI.
    async fn start(test: &str, names: &[&str]) -> Result<Option<E2e>> {
        if !have_root(test) {
            return Ok(None);
        }
        let cluster = KubeCluster::start().await?;
        cluster.install_crds().await?;
        let dir = tempfile::Builder::new().prefix("carina-e2e-").tempdir()?;
        let pki = Pki::write(&dir.path().join("pki"))?;
        let group = unique("e2e");
        let mut nodes = Vec::new();
        for name in names {
            nodes.push(LvmNode::start(&cluster, &pki, dir.path(), name, &group, DISK_BYTES).await?);
        }
        Ok(Some(E2e {
            nodes,
            pki,
            group,
            cluster,
            dir,
        }))
    }

    fn client(&self) -> kube::Client {
        self.cluster.client()
    }

    fn node(&self, name: &str) -> &LvmNode {
        self.nodes
            .iter()
            .find(|n| n.args.name == name)
            .expect("a node of this test")
    }

    fn node_mut(&mut self, name: &str) -> &mut LvmNode {
        self.nodes
            .iter_mut()
            .find(|n| n.args.name == name)
            .expect("a node of this test")
    }

    /// The arguments of replica `identity`.
    fn controller(&self, identity: &str) -> KubeControllerArgs {
        KubeControllerArgs::new(
            identity,
            LEASE,
            self.cluster.kubeconfig_path(),
            &self.pki,
            self.dir.path(),
            &self.cluster.log_dir().join(format!("{identity}.log")),
        )
    }

    /// Starts replica `identity` and waits until every node's capacity is
    /// published through it.
    async fn serving_controller(&self, identity: &str) -> Result<Service> {
        let controller = self.controller(identity).start().await?;
        self.await_all_capacity().await?;
        Ok(controller)
    }

    /// Waits until every node's capacity is published (the bridge side
    /// runs and reaches the nodes).
    async fn await_all_capacity(&self) -> Result<()> {
        for n in &self.nodes {
            await_capacity(&self.client(), &n.args.name, WAIT).await?;
        }
        Ok(())
    }

    /// The volumes on `node` as `lvs` on its disk shows them: (name, bytes).
    fn lvs(&self, node: &str) -> Result<Vec<(String, u64)>> {
        let disk = self.node(node).disk.dev();
        let out = lvm(
            &[&disk],
            &[
                "lvs",
                "--noheadings",
                "--units",
                "b",
                "--nosuffix",
                "-o",
                "lv_name,lv_size",
                &self.group,
            ],
        )?;
        out.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                let mut f = l.split_whitespace();
                let name = f.next().context("lv_name")?.to_string();
                let size = f.next().context("lv_size")?.parse()?;
                Ok((name, size))
            })
            .collect()
    }

    /// The volumes `node` reports (`ListLVs` over mTLS as the controller).
    async fn listed(&self, node: &str) -> Result<Vec<pb::LogicVolume>> {
        let n = self.node(node);
        let mut client = self.pki.node_client(node, &n.args.endpoint()).await?;
        let listed = client
            .list_l_vs(pb::ListLVsRequest {
                device_group: self.group.clone(),
                ..Default::default()
            })
            .await
            .with_context(|| format!("ListLVs on {node}"))?
            .into_inner();
        Ok(listed.volumes)
    }

    /// The volume `name` as `node` reports it (`GetLV`), `None` if absent.
    async fn get_lv(&self, node: &str, name: &str) -> Result<Option<pb::LogicVolume>> {
        let n = self.node(node);
        let mut client = self.pki.node_client(node, &n.args.endpoint()).await?;
        get_lv(&mut client, name)
            .await
            .with_context(|| format!("on {node}"))
    }

    /// Asserts that exactly `expected` (object names) are on `node`, in
    /// the node's own answer and on its disk.
    async fn assert_volumes(&self, node: &str, expected: &[&str]) -> Result<()> {
        let mut on_disk: Vec<String> = self.lvs(node)?.into_iter().map(|(n, _)| n).collect();
        let mut listed: Vec<String> = self
            .listed(node)
            .await?
            .into_iter()
            .map(|v| v.name)
            .collect();
        let mut expected: Vec<String> = expected.iter().map(|s| s.to_string()).collect();
        on_disk.sort();
        listed.sort();
        expected.sort();
        assert_eq!(on_disk, expected, "lvs on {node}");
        assert_eq!(listed, expected, "ListLVs on {node}");
        Ok(())
    }

    /// How many `method` calls `node` has answered (any code), from its
    /// `/metrics`.
    async fn calls(&self, node: &str, method: &str) -> Result<u64> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let port = self.node(node).args.metrics_port;
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        stream
            .write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .await?;
        let mut text = String::new();
        stream.read_to_string(&mut text).await?;
        let series =
            format!("carina_node_grpc_requests_total{{node=\"{node}\",method=\"{method}\",");
        text.lines()
            .filter(|l| l.starts_with(&series))
            .map(|l| {
                l.rsplit(' ')
                    .next()
                    .and_then(|n| n.parse::<u64>().ok())
                    .with_context(|| format!("a sample without a count: {l}"))
            })
            .sum()
    }

    /// Asserts that `object` is the only `LogicVolume`, and the only volume
    /// on node B in its answer and on its disk, and node A has none.
    async fn assert_only_on_b(&self, object: &str) -> Result<()> {
        assert_eq!(self.logic_volumes().await?, [object]);
        self.assert_volumes(B, &[object]).await?;
        self.assert_volumes(A, &[]).await
    }

    /// The names of all `LogicVolume`s.
    async fn logic_volumes(&self) -> Result<Vec<String>> {
        let api: Api<LogicVolume> = Api::all(self.client());
        let mut names: Vec<String> = api
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .map(|lv| lv.name_any())
            .collect();
        names.sort();
        Ok(names)
    }
}

/// `CreateVolume` as external-provisioner sends it for a claim of
/// `bytes` in `group`; pinned to `node` (requisite and preferred) as for a
/// `WaitForFirstConsumer` claim the scheduler placed there, or free
/// (`Immediate`) when `None`.
fn create(name: &str, bytes: u64, group: &str, node: Option<&str>) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        parameters: HashMap::from([(
            "carina.storage.io/disk-group-name".to_string(),
            group.to_string(),
        )]),
        accessibility_requirements: node.map(|n| csi::TopologyRequirement {
            requisite: vec![on(n)],
            preferred: vec![on(n)],
        }),
        ..carina_tests::csi::create(name, bytes, "ext4")
    }
}

/// `request` made twice: both times the same volume, on node B.
async fn make_twice_on_b(csi: &mut Csi, request: &csi::CreateVolumeRequest) -> Result<csi::Volume> {
    let v = make(csi, request.clone()).await?;
    assert_eq!(node_of(&v), Some(B), "{v:?}");
    let again = make(csi, request.clone()).await?;
    assert_eq!(
        again.volume_id, v.volume_id,
        "the repeat finds the same volume"
    );
    Ok(v)
}

/// The node of the volume's accessible topology.
fn node_of(v: &csi::Volume) -> Option<&str> {
    match v.accessible_topology.as_slice() {
        [t] => t.segments.get(TOPOLOGY_KEY).map(String::as_str),
        _ => None,
    }
}

/// Waits, by watch, until `LogicVolume` `name` satisfies `done`.
async fn await_lv(
    e2e: &E2e,
    name: &str,
    what: &str,
    done: impl Fn(Option<&LogicVolume>) -> bool,
) -> Result<Option<LogicVolume>> {
    let api: Api<LogicVolume> = Api::all(e2e.client());
    await_object(&api, name, what, WAIT, done).await
}

fn made(lv: Option<&LogicVolume>) -> bool {
    lv.and_then(|lv| lv.status.as_ref())
        .is_some_and(|s| s.volume_id.is_some())
}

/// Waits until `node`'s process has an `lvm` command waiting on a file
/// lock (the test holds the VG's lock): the node is inside the call.
async fn await_lvm_waiting(e2e: &E2e, node: &str, what: &str) -> Result<()> {
    let pid = e2e.node(node).service.pid().context("the node runs")?;
    wait_until(
        &format!("{node}'s {what} waits on the VG lock"),
        WAIT,
        || a_descendant_waits(pid),
    )
    .await
}

/// The Lease's holder.
async fn holder(e2e: &E2e) -> Result<Option<String>> {
    let leases: Api<Lease> = Api::namespaced(e2e.client(), "kube-system");
    Ok(leases
        .get_opt(LEASE)
        .await?
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity))
}

/// Waits, by watch, until the Lease is held by `who`.
async fn await_holder(e2e: &E2e, who: &str, within: Duration) -> Result<()> {
    let leases: Api<Lease> = Api::namespaced(e2e.client(), "kube-system");
    let what = format!("held by {who}");
    await_object(&leases, LEASE, &what, within, |l: Option<&Lease>| {
        l.and_then(|l| l.spec.as_ref())
            .and_then(|s| s.holder_identity.as_deref())
            == Some(who)
    })
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_expand_delete_on_the_chosen_node() -> Result<()> {
    let Some(e2e) = E2e::start("create_expand_delete_on_the_chosen_node", &[A, B]).await? else {
        return Ok(());
    };
    let mut ctl = e2e.serving_controller("ctl-1").await?;
    let mut csi = Csi::new(ctl.channel().await?);
    let lvs: Api<LogicVolume> = Api::all(e2e.client());

    // Create, pinned to B; the same request again gives the same volume.
    let name = "pvc-e2e-a";
    let v = make_twice_on_b(&mut csi, &create(name, 64 * MIB, &e2e.group, Some(B))).await?;
    let object = object_name(name);
    let lv = lvs.get(&object).await?;
    let status = lv
        .status
        .clone()
        .context("a made LogicVolume has a status")?;
    assert_eq!(lv.spec.node_name, B);
    assert_eq!(status.volume_id.as_deref(), Some(v.volume_id.as_str()));
    assert_eq!(status.code, Some(0));
    let current = status.current_size.as_ref().context("currentSize")?;
    assert_eq!(quantity_bytes(current)?, v.capacity_bytes as u64);
    let on_b = e2e.get_lv(B, &object).await?.context("the LV on node B")?;
    assert_eq!(on_b.size_bytes, v.capacity_bytes as u64);
    assert_eq!(on_b.device_group, e2e.group);
    assert!(on_b.size_bytes >= 64 * MIB);
    assert_eq!(
        v.volume_context.get(context::PATH),
        Some(&on_b.device_path),
        "the volume's path is the device on node B"
    );
    assert_eq!(e2e.lvs(B)?, [(object.clone(), on_b.size_bytes)]);
    e2e.assert_only_on_b(&object).await?;

    // Expand.
    let expanded = csi
        .controller_expand_volume(csi::ControllerExpandVolumeRequest {
            volume_id: v.volume_id.clone(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: (128 * MIB) as i64,
                limit_bytes: 0,
            }),
            volume_capability: Some(mount_cap("ext4")),
            ..Default::default()
        })
        .await
        .context("ControllerExpandVolume")?
        .into_inner();
    let grown = expanded.capacity_bytes as u64;
    assert!(grown >= 128 * MIB, "{expanded:?}");
    let lv = lvs.get(&object).await?;
    let current = lv
        .status
        .and_then(|s| s.current_size)
        .context("currentSize")?;
    assert_eq!(quantity_bytes(&current)?, grown);
    let on_b = e2e.get_lv(B, &object).await?.context("the LV on node B")?;
    assert_eq!(on_b.size_bytes, grown);
    assert_eq!(e2e.lvs(B)?, [(object.clone(), grown)]);
    e2e.assert_volumes(A, &[]).await?;

    // Delete: the call returns once the object is gone, and by then the
    // node has deleted the volume.
    delete(&mut csi, &v.volume_id).await?;
    assert!(lvs.get_opt(&object).await?.is_none(), "the object is gone");
    assert!(e2e.get_lv(B, &object).await?.is_none(), "the LV is gone");
    e2e.assert_volumes(B, &[]).await?;
    e2e.assert_volumes(A, &[]).await?;
    // Deleting again is fine.
    delete(&mut csi, &v.volume_id).await?;

    ctl.check_running()?;
    ctl.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_killed_mid_create_converges_to_one_volume() -> Result<()> {
    let Some(e2e) = E2e::start(
        "a_controller_killed_mid_create_converges_to_one_volume",
        &[A, B],
    )
    .await?
    else {
        return Ok(());
    };
    let mut first = e2e.serving_controller("ctl-1").await?;
    let name = "pvc-e2e-crash";
    let object = object_name(name);
    let request = create(name, 64 * MIB, &e2e.group, Some(B));

    // The VG's lock is held, so the create cannot finish: the object is
    // written, the bridge's CreateLV reaches node B, whose lvcreate waits.
    // The kill lands while that node call is seen in flight (a kill
    // before it is the easier case: nothing reached the node).
    // (The node's /metrics waits for LVM too: read before.)
    let calls_before = e2e.calls(B, "CreateLV").await?;
    let lock = VgLock::shared(&e2e.group);
    let mut csi = Csi::new(first.channel().await?);
    let req = request.clone();
    let pending = tokio::spawn(async move { csi.create_volume(req).await });
    await_lvm_waiting(&e2e, B, "lvcreate").await?;
    first.kill();
    let answer = tokio::time::timeout(WAIT, pending).await??;
    assert!(
        answer.is_err(),
        "CreateVolume answered although its controller was killed: {answer:?}"
    );
    // The node goes on; the call that reached it now runs, its caller gone.
    drop(lock);
    let lv = Api::<LogicVolume>::all(e2e.client()).get(&object).await?;
    assert!(!made(Some(&lv)), "made before the restart: {:?}", lv.status);

    // Another replica (the first's lease runs out) retries the same
    // request and gets the volume.
    let mut second = e2e.controller("ctl-2").start().await?;
    let mut csi = Csi::new(second.channel().await?);
    let started = Instant::now();
    let v = make_twice_on_b(&mut csi, &request).await?;
    eprintln!(
        "the retried CreateVolume returned {:?} after the restart",
        started.elapsed()
    );
    e2e.assert_only_on_b(&object).await?;
    assert_eq!(
        e2e.lvs(B)?,
        [(object.clone(), v.capacity_bytes as u64)],
        "one LV of the returned size"
    );
    assert_eq!(holder(&e2e).await?.as_deref(), Some("ctl-2"));
    // The retry's CreateLV reached the node (the killed one's was seen
    // waiting in its lvcreate above).
    let calls = e2e.calls(B, "CreateLV").await?;
    assert!(
        calls > calls_before,
        "node B answered {calls} CreateLV calls, {calls_before} before the create"
    );
    second.check_running()?;
    second.stop().await;
    Ok(())
}

/// `call` until it succeeds, as external-provisioner and the resizer retry
/// (every second, at most [`WAIT`]); the answer and the failures seen.
async fn until_ok<T, F, Fut>(mut call: F) -> Result<(T, Vec<Code>)>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, tonic::Status>>,
{
    let deadline = Instant::now() + WAIT;
    let mut failures = Vec::new();
    loop {
        match call().await {
            Ok(v) => return Ok((v, failures)),
            Err(s) if Instant::now() < deadline => {
                failures.push(s.code());
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(s) => bail!("still failing after {WAIT:?}: {s:?} (before: {failures:?})"),
        }
    }
}

/// DeleteVolume of `id` until it succeeds ([`until_ok`]); the failures
/// seen before.
async fn delete_until_ok(csi: &Csi, id: &str) -> Result<Vec<Code>> {
    let (_, failures) = until_ok(|| {
        let mut csi = csi.clone();
        let id = id.to_string();
        async move {
            csi.delete_volume(csi::DeleteVolumeRequest {
                volume_id: id,
                ..Default::default()
            })
            .await
        }
    })
    .await?;
    Ok(failures)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_killed_mid_delete_or_mid_expand_is_finished_by_the_next() -> Result<()> {
    let Some(e2e) = E2e::start(
        "a_controller_killed_mid_delete_or_mid_expand_is_finished_by_the_next",
        &[A, B],
    )
    .await?
    else {
        return Ok(());
    };
    let lvs: Api<LogicVolume> = Api::all(e2e.client());

    // Expand: the object's spec is grown, the bridge's ResizeLV waits on
    // the paused node, and the controller dies.
    let mut first = e2e.serving_controller("ctl-1").await?;
    let mut csi = Csi::new(first.channel().await?);
    let request = create("pvc-e2e-kill-expand", 64 * MIB, &e2e.group, Some(B));
    let object = object_name(&request.name);
    let v = make(&mut csi, request).await?;
    let expand = csi::ControllerExpandVolumeRequest {
        volume_id: v.volume_id.clone(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: (128 * MIB) as i64,
            limit_bytes: 0,
        }),
        volume_capability: Some(mount_cap("ext4")),
        ..Default::default()
    };
    let lock = VgLock::shared(&e2e.group);
    let req = expand.clone();
    let pending = tokio::spawn(async move { csi.controller_expand_volume(req).await });
    await_lv(&e2e, &object, "grown in its spec", |lv| {
        lv.is_some_and(|lv| quantity_bytes(&lv.spec.size).is_ok_and(|b| b >= 128 * MIB))
    })
    .await?;
    await_lvm_waiting(&e2e, B, "lvextend").await?;
    first.kill();
    let answer = tokio::time::timeout(WAIT, pending).await??;
    assert!(
        answer.is_err(),
        "answered by a killed controller: {answer:?}"
    );
    drop(lock);
    let mut second = e2e.controller("ctl-2").start().await?;
    let csi = Csi::new(second.channel().await?);
    let started = Instant::now();
    let (grown, failures) = until_ok(|| {
        let mut csi = csi.clone();
        let req = expand.clone();
        async move { csi.controller_expand_volume(req).await }
    })
    .await?;
    let grown = grown.into_inner().capacity_bytes as u64;
    eprintln!(
        "the retried expand answered {grown} bytes after {:?} (failures before: {failures:?})",
        started.elapsed()
    );
    assert!(grown >= 128 * MIB);
    assert_eq!(
        e2e.lvs(B)?,
        [(object.clone(), grown)],
        "the LV has the size answered"
    );
    let lv = lvs.get(&object).await?;
    let current = lv
        .status
        .and_then(|s| s.current_size)
        .context("currentSize")?;
    assert_eq!(quantity_bytes(&current)?, grown);

    // Delete: the object is marked deleted, the bridge's DeleteLV reaches
    // node B, whose lvremove waits on the held lock, and the controller
    // dies.
    let lock = VgLock::shared(&e2e.group);
    let mut csi2 = csi.clone();
    let id = v.volume_id.clone();
    let pending = tokio::spawn(async move { delete(&mut csi2, &id).await });
    await_lv(&e2e, &object, "marked deleted", |lv| {
        lv.is_some_and(|lv| lv.metadata.deletion_timestamp.is_some())
    })
    .await?;
    await_lvm_waiting(&e2e, B, "lvremove").await?;
    second.kill();
    let answer = tokio::time::timeout(WAIT, pending).await??;
    assert!(
        answer.is_err(),
        "answered by a killed controller: {answer:?}"
    );
    drop(lock);
    let mut third = e2e.controller("ctl-3").start().await?;
    let mut csi = Csi::new(third.channel().await?);
    let started = Instant::now();
    let failures = delete_until_ok(&csi, &v.volume_id).await?;
    eprintln!(
        "the retried delete answered after {:?} (failures before: {failures:?})",
        started.elapsed()
    );
    assert!(
        lvs.get_opt(&object).await?.is_none(),
        "the object (and its finalizer) is gone"
    );
    e2e.assert_volumes(B, &[]).await?;
    e2e.assert_volumes(A, &[]).await?;
    // And the node serves the next create.
    let again = make(
        &mut csi,
        create("pvc-e2e-after", 64 * MIB, &e2e.group, Some(B)),
    )
    .await?;
    delete(&mut csi, &again.volume_id).await?;
    third.check_running()?;
    third.stop().await;
    Ok(())
}

/// Asserts, just before `stage`, that no create has answered and that both
/// nodes are inside a create (an `lvcreate` waits on the held VG lock).
fn assert_in_flight(e2e: &E2e, answered: &AtomicUsize, stage: &str) -> Result<()> {
    let answered = answered.load(Ordering::SeqCst);
    assert_eq!(answered, 0, "{answered} creates answered before {stage}");
    for node in [A, B] {
        let pid = e2e.node(node).service.pid().context("the node runs")?;
        assert!(
            a_descendant_waits(pid),
            "no lvcreate of {node} waits at {stage}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_creates_survive_an_apiserver_and_an_etcd_restart() -> Result<()> {
    let Some(mut e2e) = E2e::start(
        "fifty_creates_survive_an_apiserver_and_an_etcd_restart",
        &[A, B],
    )
    .await?
    else {
        return Ok(());
    };
    let mut ctl = e2e.serving_controller("ctl-1").await?;
    let csi = Csi::new(ctl.channel().await?);
    const N: usize = 50;
    // The VG's lock is held until both restarts are over, so no create can
    // finish before: every one is in flight when the apiserver dies and
    // when etcd dies.
    let lock = VgLock::shared(&e2e.group);
    let answered = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut creates = tokio::task::JoinSet::new();
    for i in 0..N {
        let answered = answered.clone();
        let csi = csi.clone();
        let request = create(
            &format!("pvc-e2e-storm-{i:02}"),
            16 * MIB,
            &e2e.group,
            Some(if i % 2 == 0 { A } else { B }),
        );
        creates.spawn(async move {
            let (v, failures) = until_ok(|| {
                let mut csi = csi.clone();
                let req = request.clone();
                async move { csi.create_volume(req).await }
            })
            .await?;
            answered.fetch_add(1, Ordering::SeqCst);
            let v = v.into_inner().volume.context("no volume")?;
            anyhow::Ok((request.name, v.volume_id, failures, Instant::now()))
        });
    }
    // The creates are in flight, some of them inside the nodes: the
    // apiserver dies and comes back, then etcd.
    await_lvm_waiting(&e2e, A, "lvcreate").await?;
    await_lvm_waiting(&e2e, B, "lvcreate").await?;
    assert_in_flight(&e2e, &answered, "the apiserver's kill")?;
    let objects = e2e.logic_volumes().await?.len();
    e2e.cluster
        .restart_apiserver(Duration::from_secs(2))
        .await?;
    let apiserver_back = Instant::now();
    assert_in_flight(&e2e, &answered, "etcd's kill")?;
    e2e.cluster.restart_etcd(Duration::from_secs(2)).await?;
    let etcd_back = Instant::now();
    drop(lock);
    let mut made = Vec::new();
    let mut retried = 0;
    let mut last = started;
    while let Some(done) = creates.join_next().await {
        let (name, id, failures, at) = done??;
        retried += usize::from(!failures.is_empty());
        last = last.max(at);
        made.push((name, id));
    }
    eprintln!(
        "{N} creates, {objects} objects written when the apiserver died: {retried} needed retries; apiserver back after {:?}, etcd back after {:?}, the last create answered {:?} after etcd was back",
        apiserver_back - started,
        etcd_back - started,
        last.saturating_duration_since(etcd_back)
    );
    // Exactly one volume per claim: one object, one LV, on the node asked.
    let mut expected: Vec<String> = made.iter().map(|(n, _)| object_name(n)).collect();
    expected.sort();
    assert_eq!(
        e2e.logic_volumes().await?,
        expected,
        "one LogicVolume per claim"
    );
    let on_a: Vec<String> = e2e.lvs(A)?.into_iter().map(|(n, _)| n).collect();
    let on_b: Vec<String> = e2e.lvs(B)?.into_iter().map(|(n, _)| n).collect();
    let mut all: Vec<String> = on_a.iter().chain(&on_b).cloned().collect();
    all.sort();
    assert_eq!(all, expected, "one LV per claim, on the two nodes together");
    assert_eq!(on_a.len(), N / 2, "node A has its half");

    // Deleting them leaves nothing: no object (so no finalizer), no LV.
    let mut deletes = tokio::task::JoinSet::new();
    for (_, id) in made {
        let csi = csi.clone();
        deletes.spawn(async move { delete_until_ok(&csi, &id).await });
    }
    while let Some(done) = deletes.join_next().await {
        done??;
    }
    assert!(
        e2e.logic_volumes().await?.is_empty(),
        "LogicVolumes are left"
    );
    e2e.assert_volumes(A, &[]).await?;
    e2e.assert_volumes(B, &[]).await?;
    ctl.check_running()?;
    ctl.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_on_a_down_node_is_retryable_and_succeeds_after_restart() -> Result<()> {
    let Some(mut e2e) = E2e::start(
        "a_create_on_a_down_node_is_retryable_and_succeeds_after_restart",
        &[A, B],
    )
    .await?
    else {
        return Ok(());
    };
    let mut ctl = e2e.serving_controller("ctl-1").await?;
    let mut csi = Csi::new(ctl.channel().await?);
    let name = "pvc-e2e-down";
    let object = object_name(name);
    let request = create(name, 64 * MIB, &e2e.group, Some(B));

    e2e.node_mut(B).service.stop().await;
    let status = match csi.create_volume(request.clone()).await {
        Ok(v) => bail!("CreateVolume on a stopped node succeeded: {v:?}"),
        Err(s) => s,
    };
    assert!(
        matches!(status.code(), Code::Unavailable | Code::DeadlineExceeded),
        "not a retryable code: {status:?}"
    );
    eprintln!("CreateVolume on the stopped node: {status:?}");
    e2e.assert_volumes(A, &[]).await?;

    // The node comes back on the same port with the same disk.
    e2e.node_mut(B).service.restart().await?;
    // If the failed create left its object, the bridge retries it; else
    // the node's capacity must be back before the retry places it.
    if Api::<LogicVolume>::all(e2e.client())
        .get_opt(&object)
        .await?
        .is_some()
    {
        await_lv(&e2e, &object, "made", made).await?;
    } else {
        await_capacity(&e2e.client(), B, WAIT).await?;
    }
    make_twice_on_b(&mut csi, &request).await?;
    e2e.assert_only_on_b(&object).await?;
    ctl.check_running()?;
    ctl.stop().await;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_one_leads_the_other_takes_over() -> Result<()> {
    let Some(e2e) = E2e::start("two_replicas_one_leads_the_other_takes_over", &[A, B]).await?
    else {
        return Ok(());
    };
    let first_args = e2e.controller("ctl-1");
    let mut first = first_args.start().await?;
    await_holder(&e2e, "ctl-1", WAIT).await?;
    let mut second = e2e.controller("ctl-2").start().await?;
    e2e.await_all_capacity().await?;
    assert_eq!(holder(&e2e).await?.as_deref(), Some("ctl-1"));

    // The standby serves CSI; the leader's bridge makes the volume.
    let mut csi = Csi::new(second.channel().await?);
    let v1 = make(&mut csi, create("pvc-e2e-1", 64 * MIB, &e2e.group, Some(A))).await?;
    assert_eq!(node_of(&v1), Some(A));
    e2e.assert_volumes(A, &["pvc-e2e-1"]).await?;

    // The leader stops; the standby takes the lease (released, so well
    // within its duration) and runs the bridge.
    let stopped = Instant::now();
    first.stop().await;
    let lease = Duration::from_secs(first_args.lease_duration_secs);
    await_holder(&e2e, "ctl-2", lease + Duration::from_secs(5)).await?;
    eprintln!("lease taken over {:?} after SIGTERM", stopped.elapsed());

    // New volumes are made and old ones deleted by the new leader. Without
    // a pin, spreadout places the volume on B, the emptier node.
    let v2 = make(&mut csi, create("pvc-e2e-2", 64 * MIB, &e2e.group, None)).await?;
    assert_eq!(node_of(&v2), Some(B), "{v2:?}");
    e2e.assert_volumes(B, &["pvc-e2e-2"]).await?;
    delete(&mut csi, &v1.volume_id).await?;
    e2e.assert_volumes(A, &[]).await?;
    assert_eq!(e2e.logic_volumes().await?, ["pvc-e2e-2"]);

    second.check_running()?;
    second.stop().await;
    assert_eq!(holder(&e2e).await?, None, "released on shutdown");
    Ok(())
}
