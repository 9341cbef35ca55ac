//! Claims and pods for the real-node tests: PersistentVolumeClaims of a
//! StorageClass, busybox pods that mount or attach them and run one shell
//! command, and waits (by watch) for what the kubelet reports.
//!
//! A pod's result comes back through its termination message (the command
//! writes to `/dev/termination-log`), so nothing needs `kubectl exec` or
//! the kubelet's log endpoint to read it.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::{
    Container, PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    PersistentVolumeClaimVolumeSource, Pod, PodSpec, Volume, VolumeDevice, VolumeMount,
    VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::Client;
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};

use super::carina::test_images;
use crate::cluster::await_object;

/// How long a pod may take to reach the phase asked for (provisioning,
/// staging and publishing included).
pub const POD_TIMEOUT: Duration = Duration::from_secs(180);

/// How long a deleted object may take to go.
pub const DELETE_TIMEOUT: Duration = Duration::from_secs(120);

/// The busybox image of the test images.
pub fn busybox_image() -> Result<String> {
    test_images()?
        .into_iter()
        .map(|(reference, _)| reference)
        .find(|r| r.contains("busybox"))
        .context("the test images have no busybox")
}

/// A claim a pod uses: mounted at `path`, or attached as a block device
/// at `path` when the claim is of volume mode Block.
#[derive(Debug, Clone)]
pub struct Use {
    pub claim: String,
    pub path: String,
    pub block: bool,
    pub read_only: bool,
}

impl Use {
    pub fn mount(claim: &str, path: &str) -> Use {
        Use {
            claim: claim.to_string(),
            path: path.to_string(),
            block: false,
            read_only: false,
        }
    }

    pub fn device(claim: &str, path: &str) -> Use {
        Use {
            block: true,
            ..Use::mount(claim, path)
        }
    }

    pub fn read_only(self) -> Use {
        Use {
            read_only: true,
            ..self
        }
    }
}

/// A claim of `class` for `size` (e.g. `256Mi`), volume mode Block when
/// `block`.
pub fn claim(name: &str, class: &str, size: &str, block: bool) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".to_string()]),
            storage_class_name: Some(class.to_string()),
            volume_mode: Some(if block { "Block" } else { "Filesystem" }.to_string()),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_string(),
                    Quantity(size.to_string()),
                )])),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A busybox pod that runs `sh -c script` once with `uses` and is not
/// restarted.
pub fn pod(name: &str, image: &str, script: &str, uses: &[Use]) -> Pod {
    let volumes = uses
        .iter()
        .enumerate()
        .map(|(i, u)| Volume {
            name: format!("v{i}"),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: u.claim.clone(),
                read_only: Some(u.read_only),
            }),
            ..Default::default()
        })
        .collect();
    let mounts: Vec<VolumeMount> = uses
        .iter()
        .enumerate()
        .filter(|(_, u)| !u.block)
        .map(|(i, u)| VolumeMount {
            name: format!("v{i}"),
            mount_path: u.path.clone(),
            read_only: Some(u.read_only),
            ..Default::default()
        })
        .collect();
    let devices: Vec<VolumeDevice> = uses
        .iter()
        .enumerate()
        .filter(|(_, u)| u.block)
        .map(|(i, u)| VolumeDevice {
            name: format!("v{i}"),
            device_path: u.path.clone(),
        })
        .collect();
    Pod {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            restart_policy: Some("Never".to_string()),
            termination_grace_period_seconds: Some(1),
            containers: vec![Container {
                name: "main".to_string(),
                image: Some(image.to_string()),
                image_pull_policy: Some("Never".to_string()),
                command: Some(vec!["sh".into(), "-c".into(), script.to_string()]),
                volume_mounts: (!mounts.is_empty()).then_some(mounts),
                volume_devices: (!devices.is_empty()).then_some(devices),
                ..Default::default()
            }],
            volumes: Some(volumes),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A namespace's claims and pods.
#[derive(Clone, Debug)]
pub struct Workload {
    pub pods: Api<Pod>,
    pub claims: Api<PersistentVolumeClaim>,
    pub volumes: Api<PersistentVolume>,
}

impl Workload {
    pub fn new(client: Client, namespace: &str) -> Workload {
        Workload {
            pods: Api::namespaced(client.clone(), namespace),
            claims: Api::namespaced(client.clone(), namespace),
            volumes: Api::all(client),
        }
    }

    pub async fn create_claim(&self, claim: &PersistentVolumeClaim) -> Result<()> {
        self.claims.create(&PostParams::default(), claim).await?;
        Ok(())
    }

    pub async fn create_pod(&self, pod: &Pod) -> Result<()> {
        self.pods.create(&PostParams::default(), pod).await?;
        Ok(())
    }

    /// Waits until the pod has `Succeeded` and returns its termination
    /// message; fails at once if it `Failed`.
    pub async fn succeeded(&self, name: &str) -> Result<String> {
        let pod = await_object(
            &self.pods,
            name,
            "finished",
            POD_TIMEOUT,
            |p: Option<&Pod>| matches!(phase(p), Some("Succeeded" | "Failed")),
        )
        .await?
        .context("pod gone")?;
        let message = termination_message(&pod);
        if phase(Some(&pod)) != Some("Succeeded") {
            bail!("pod {name} failed: {message:?}; {:#?}", pod.status);
        }
        Ok(message.unwrap_or_default())
    }

    /// Waits until the pod is `Running`.
    pub async fn running(&self, name: &str) -> Result<Pod> {
        await_object(
            &self.pods,
            name,
            "running",
            POD_TIMEOUT,
            |p: Option<&Pod>| phase(p) == Some("Running"),
        )
        .await?
        .context("pod gone")
    }

    /// Deletes the pod and waits until it is gone (its volumes unpublished
    /// by the kubelet).
    pub async fn delete_pod(&self, name: &str) -> Result<()> {
        self.pods.delete(name, &DeleteParams::default()).await?;
        await_object(
            &self.pods,
            name,
            "deleted",
            DELETE_TIMEOUT,
            |p: Option<&Pod>| p.is_none(),
        )
        .await?;
        Ok(())
    }

    /// Waits until the claim is `Bound` (provisioned and bound to its
    /// PersistentVolume).
    pub async fn bound(&self, claim: &str) -> Result<PersistentVolumeClaim> {
        await_object(
            &self.claims,
            claim,
            "Bound",
            POD_TIMEOUT,
            |c: Option<&PersistentVolumeClaim>| {
                c.and_then(|c| c.status.as_ref())
                    .and_then(|s| s.phase.as_deref())
                    == Some("Bound")
            },
        )
        .await?
        .context("claim gone")
    }

    /// The PersistentVolume bound to the claim.
    pub async fn volume_of(&self, claim: &str) -> Result<PersistentVolume> {
        let bound = self.claims.get(claim).await?;
        let name = bound
            .spec
            .and_then(|s| s.volume_name)
            .with_context(|| format!("claim {claim} is not bound"))?;
        Ok(self.volumes.get(&name).await?)
    }

    /// Deletes the claim and waits until its PersistentVolume is gone too
    /// (reclaim policy Delete: the driver deleted the volume).
    pub async fn delete_claim(&self, claim: &str) -> Result<()> {
        let volume = self.volume_of(claim).await.ok();
        self.claims.delete(claim, &DeleteParams::default()).await?;
        await_object(&self.claims, claim, "deleted", DELETE_TIMEOUT, |c| {
            c.is_none()
        })
        .await?;
        if let Some(name) = volume.and_then(|v| v.metadata.name) {
            await_object(&self.volumes, &name, "deleted", DELETE_TIMEOUT, |v| {
                v.is_none()
            })
            .await?;
        }
        Ok(())
    }
}

/// The pod's phase.
pub fn phase(pod: Option<&Pod>) -> Option<&str> {
    pod?.status.as_ref()?.phase.as_deref()
}

/// The first container's termination message.
pub fn termination_message(pod: &Pod) -> Option<String> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .first()?
        .state
        .as_ref()?
        .terminated
        .as_ref()?
        .message
        .clone()
}
