//! The workload: which volumes ([`plan`]), their claims ([`make_claims`]),
//! the create phase ([`create_all`]) and the delete phase
//! ([`delete_all`]), as external-provisioner and kube-scheduler drive
//! the controller.
//!
//! A pinned volume goes through the extender first (one pod at a time,
//! as kube-scheduler schedules), its claim gets the chosen node in
//! `volume.kubernetes.io/selected-node` (kube-scheduler's PreBind), and
//! `CreateVolume` names `pvc-<claim uid>` with the claim's metadata and
//! the node as requisite and preferred topology. An `Immediate` volume
//! has no topology: the controller places it. Calls that fail with a code
//! external-provisioner retries (`DEADLINE_EXCEEDED`, `UNAVAILABLE`,
//! `ABORTED`) are repeated with the same arguments after a backoff; any
//! other failure ends the phase.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use carina_csi::TOPOLOGY_KEY;
use carina_proto::csi;
use carina_proto::csi::controller_client::ControllerClient;
use carina_proto::csi::volume_capability::access_mode::Mode;
use carina_proto::csi::volume_capability::{AccessMode, AccessType, MountVolume};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tonic::Code;
use tonic::transport::Channel;

use super::ScaleCluster;
use super::extender::Scheduled;

/// Size of a HOST volume.
pub const HOST_VOLUME_BYTES: u64 = 16 << 20;
/// Size of an LVM volume.
pub const LVM_VOLUME_BYTES: u64 = 8 << 20;
/// The claims' namespace.
pub const NAMESPACE: &str = "default";
/// Label on every claim of the run.
const CLAIM_LABEL: &str = "carina.storage.io/scale-test";
/// Attempts of one CSI call, the first included.
const MAX_ATTEMPTS: u32 = 8;
/// First pause before a retry (doubled each time, at most 10 s), as
/// external-provisioner's `--retry-interval-start`.
const RETRY_START: Duration = Duration::from_secs(1);

type Csi = ControllerClient<Channel>;

/// One volume of the run.
#[derive(Debug, Clone)]
pub struct Planned {
    pub index: usize,
    /// In the LVM group (on an LVM node); else the HOST group.
    pub lvm: bool,
    pub bytes: u64,
    /// Placed by the extender (`WaitForFirstConsumer`); else `Immediate`.
    pub pinned: bool,
    /// The CSI volume name (`pvc-<claim uid>` for pinned volumes).
    pub csi_name: String,
    /// The claim of a pinned volume.
    pub claim: Option<String>,
}

/// Which volumes: every other one pinned; one in ten of each half in the
/// LVM group (so LVM nodes, a tenth of the cluster, see a tenth of the
/// volumes).
pub fn plan(volumes: usize) -> Vec<Planned> {
    (0..volumes)
        .map(|index| {
            let pinned = index % 2 == 0;
            let lvm = (index / 2) % 10 == 0;
            Planned {
                index,
                lvm,
                bytes: if lvm {
                    LVM_VOLUME_BYTES
                } else {
                    HOST_VOLUME_BYTES
                },
                pinned,
                csi_name: format!("pvc-immediate-{index:05}"),
                claim: pinned.then(|| format!("claim-{index:05}")),
            }
        })
        .collect()
}

/// Creates the claims of the pinned volumes (unbound, in their group's
/// `WaitForFirstConsumer` class) and names each pinned volume after its
/// claim's uid, as external-provisioner does.
pub async fn make_claims(cluster: &ScaleCluster, planned: &mut [Planned]) -> Result<()> {
    let api: Api<PersistentVolumeClaim> = Api::namespaced(cluster.client(), NAMESPACE);
    for v in planned.iter_mut() {
        let Some(name) = &v.claim else { continue };
        let claim: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": {CLAIM_LABEL: "true"}},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": cluster.class(v.lvm),
                "resources": {"requests": {"storage": v.bytes.to_string()}},
            },
        }))?;
        let made = api
            .create(&PostParams::default(), &claim)
            .await
            .with_context(|| format!("create claim {name}"))?;
        let uid = made.uid().context("a claim without uid")?;
        v.csi_name = format!("pvc-{uid}");
    }
    Ok(())
}

/// Deletes every claim of the run (the user's part before the volumes
/// are deleted).
pub async fn delete_claims(cluster: &ScaleCluster) -> Result<()> {
    let api: Api<PersistentVolumeClaim> = Api::namespaced(cluster.client(), NAMESPACE);
    api.delete_collection(
        &DeleteParams::default(),
        &ListParams::default().labels(&format!("{CLAIM_LABEL}=true")),
    )
    .await
    .context("delete the claims")?;
    Ok(())
}

/// A volume made.
#[derive(Debug, Clone)]
pub struct Created {
    pub index: usize,
    /// In the LVM group; else the HOST group.
    pub lvm: bool,
    pub volume_id: String,
    /// Where it is, from the answer's accessible topology.
    pub node: String,
    /// The call's start (first attempt) and its successful end.
    pub started: Instant,
    pub done: Instant,
    pub attempts: u32,
}

impl Created {
    pub fn latency(&self) -> Duration {
        self.done - self.started
    }
}

/// The create phase.
#[derive(Debug, Clone)]
pub struct CreatePhase {
    /// In plan order.
    pub created: Vec<Created>,
    /// The extender's answers for the pinned volumes, in order.
    pub scheduled: Vec<Scheduled>,
    pub wall: Duration,
}

/// Creates every planned volume: the `Immediate` ones queued at once, the
/// pinned ones as the extender places them, at most `concurrency` calls
/// at a time.
pub async fn create_all(cluster: &ScaleCluster, planned: &[Planned]) -> Result<CreatePhase> {
    let csi = Csi::new(cluster.csi_channel().await?);
    let permits = Arc::new(Semaphore::new(cluster.shape.concurrency));
    let nodes = cluster.node_names();
    let t0 = Instant::now();

    let immediate = async {
        let mut calls = JoinSet::new();
        for v in planned.iter().filter(|v| !v.pinned) {
            let permit = permits.clone().acquire_owned().await?;
            let (csi, v, group) = (csi.clone(), v.clone(), cluster.group(v.lvm).to_string());
            calls.spawn(async move {
                let made = create(csi, &v, &group, None).await;
                drop(permit);
                made
            });
        }
        drain(calls).await
    };

    let pinned = async {
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(cluster.client(), NAMESPACE);
        let mut calls = JoinSet::new();
        let mut scheduled = Vec::new();
        for v in planned.iter().filter(|v| v.pinned) {
            let claim = v
                .claim
                .as_deref()
                .context("a pinned volume without claim")?;
            let pod = format!("pod-{:05}", v.index);
            let s = cluster
                .extender()
                .schedule(&pod, claim, &nodes, v.index)
                .await?;
            claims
                .patch(
                    claim,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"annotations": {
                        "volume.kubernetes.io/selected-node": s.node,
                    }}})),
                )
                .await
                .with_context(|| format!("select node {} for claim {claim}", s.node))?;
            let permit = permits.clone().acquire_owned().await?;
            let (csi, v, group) = (csi.clone(), v.clone(), cluster.group(v.lvm).to_string());
            let node = s.node.clone();
            calls.spawn(async move {
                let made = create(csi, &v, &group, Some(&node)).await;
                drop(permit);
                made
            });
            scheduled.push(s);
        }
        Ok::<_, anyhow::Error>((drain(calls).await?, scheduled))
    };

    let (immediate, pinned) = tokio::join!(immediate, pinned);
    let wall = t0.elapsed();
    let (pinned, scheduled) = pinned?;
    let mut created: Vec<Created> = immediate?.into_iter().chain(pinned).collect();
    created.sort_by_key(|c| c.index);
    Ok(CreatePhase {
        created,
        scheduled,
        wall,
    })
}

/// A volume deleted.
#[derive(Debug, Clone)]
pub struct Deleted {
    pub index: usize,
    /// In the LVM group; else the HOST group.
    pub lvm: bool,
    pub node: String,
    pub started: Instant,
    pub done: Instant,
    pub attempts: u32,
}

impl Deleted {
    pub fn latency(&self) -> Duration {
        self.done - self.started
    }
}

/// The delete phase.
#[derive(Debug, Clone)]
pub struct DeletePhase {
    pub deleted: Vec<Deleted>,
    pub wall: Duration,
}

/// Deletes every created volume, at most `concurrency` calls at a time.
pub async fn delete_all(cluster: &ScaleCluster, created: &[Created]) -> Result<DeletePhase> {
    let csi = Csi::new(cluster.csi_channel().await?);
    let permits = Arc::new(Semaphore::new(cluster.shape.concurrency));
    let t0 = Instant::now();
    let mut calls = JoinSet::new();
    for c in created {
        let permit = permits.clone().acquire_owned().await?;
        let (csi, c) = (csi.clone(), c.clone());
        calls.spawn(async move {
            let started = Instant::now();
            let ((), attempts) = retried(&format!("DeleteVolume {}", c.volume_id), || {
                let mut csi = csi.clone();
                let req = csi::DeleteVolumeRequest {
                    volume_id: c.volume_id.clone(),
                    ..Default::default()
                };
                async move { csi.delete_volume(req).await.map(|_| ()) }
            })
            .await?;
            drop(permit);
            Ok(Deleted {
                index: c.index,
                lvm: c.lvm,
                node: c.node,
                started,
                done: Instant::now(),
                attempts,
            })
        });
    }
    let mut deleted = drain(calls).await?;
    let wall = t0.elapsed();
    deleted.sort_by_key(|d| d.index);
    Ok(DeletePhase { deleted, wall })
}

/// `CreateVolume` of `v` in `group`, on `node` if pinned.
async fn create(csi: Csi, v: &Planned, group: &str, node: Option<&str>) -> Result<Created> {
    let mut parameters = HashMap::from([(
        "carina.storage.io/disk-group-name".to_string(),
        group.to_string(),
    )]);
    if let Some(claim) = &v.claim {
        parameters.extend([
            ("csi.storage.k8s.io/pvc/name".to_string(), claim.clone()),
            (
                "csi.storage.k8s.io/pvc/namespace".to_string(),
                NAMESPACE.to_string(),
            ),
            ("csi.storage.k8s.io/pv/name".to_string(), v.csi_name.clone()),
        ]);
    }
    let accessibility = node.map(|n| {
        let on = csi::Topology {
            segments: HashMap::from([(TOPOLOGY_KEY.to_string(), n.to_string())]),
        };
        csi::TopologyRequirement {
            requisite: vec![on.clone()],
            preferred: vec![on],
        }
    });
    let req = csi::CreateVolumeRequest {
        name: v.csi_name.clone(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: i64::try_from(v.bytes)?,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![csi::VolumeCapability {
            access_mode: Some(AccessMode {
                mode: Mode::SingleNodeWriter as i32,
            }),
            access_type: Some(AccessType::Mount(MountVolume {
                fs_type: if v.lvm { "ext4".into() } else { String::new() },
                ..Default::default()
            })),
        }],
        parameters,
        accessibility_requirements: accessibility,
        ..Default::default()
    };
    let started = Instant::now();
    let (answer, attempts) = retried(&format!("CreateVolume {}", v.csi_name), || {
        let (mut csi, req) = (csi.clone(), req.clone());
        async move { csi.create_volume(req).await.map(|r| r.into_inner()) }
    })
    .await?;
    let done = Instant::now();
    let volume = answer
        .volume
        .with_context(|| format!("CreateVolume {}: no volume", v.csi_name))?;
    let on = volume
        .accessible_topology
        .iter()
        .find_map(|t| t.segments.get(TOPOLOGY_KEY))
        .with_context(|| format!("CreateVolume {}: no node in the answer", v.csi_name))?
        .clone();
    if let Some(n) = node
        && on != n
    {
        bail!(
            "CreateVolume {} pinned to {n} answered node {on}",
            v.csi_name
        );
    }
    Ok(Created {
        index: v.index,
        lvm: v.lvm,
        volume_id: volume.volume_id,
        node: on,
        started,
        done,
        attempts,
    })
}

/// Runs `call` until it succeeds or fails with a code external-provisioner
/// does not retry, at most [`MAX_ATTEMPTS`] times; its answer and the
/// attempts made.
async fn retried<T, F, Fut>(what: &str, mut call: F) -> Result<(T, u32)>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, tonic::Status>>,
{
    let mut pause = RETRY_START;
    for attempt in 1..=MAX_ATTEMPTS {
        match call().await {
            Ok(answer) => return Ok((answer, attempt)),
            Err(s)
                if attempt < MAX_ATTEMPTS
                    && matches!(
                        s.code(),
                        Code::DeadlineExceeded | Code::Unavailable | Code::Aborted
                    ) =>
            {
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(10));
            }
            Err(s) => bail!("{what}: {:?}: {}", s.code(), s.message()),
        }
    }
    bail!("{what}: no answer in {MAX_ATTEMPTS} attempts")
}

/// Every task's result; the first failure fails all.
async fn drain<T: 'static>(mut calls: JoinSet<Result<T>>) -> Result<Vec<T>> {
    let mut out = Vec::with_capacity(calls.len());
    while let Some(done) = calls.join_next().await {
        out.push(done.context("a CSI call task failed")??);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_pinned_a_tenth_lvm_in_each_half() {
        let p = plan(1000);
        assert_eq!(p.iter().filter(|v| v.pinned).count(), 500);
        assert_eq!(p.iter().filter(|v| v.lvm && v.pinned).count(), 50);
        assert_eq!(p.iter().filter(|v| v.lvm && !v.pinned).count(), 50);
        assert!(p.iter().all(|v| v.pinned == v.claim.is_some()));
        assert!(p.iter().all(|v| v.bytes
            == if v.lvm {
                LVM_VOLUME_BYTES
            } else {
                HOST_VOLUME_BYTES
            }));
    }
}
