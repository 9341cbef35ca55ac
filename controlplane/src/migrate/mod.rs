//! Taking over a Go Carina v0.14.0 cluster: what `carinactl migrate plan`
//! reads and says. [`Cluster::read`] lists every object that matters (it
//! writes nothing); [`plan`] classifies them into a [`Plan`]: the Go
//! programs still running (blockers), every `LogicVolume` with what will
//! happen to it, the PersistentVolumes of the driver and their claims, the
//! StorageClasses of the provisioner as the CSI parameter parser judges
//! them, and the leftovers of a Go install the chart trips on.
//!
//! [`apply::apply`] carries the plan out (`carinactl migrate apply`).
//!
//! The plan's JSON field names are stable (snake_case); the human table is
//! rendered by `carinactl`.

pub mod apply;
mod classify;
mod leftovers;
#[cfg(test)]
mod tests;

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolume, Pod, Service};
use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass};
use kube::api::{Api, ListParams};
use kube::{Client, Resource};
use serde::Serialize;

use carina_api::LogicVolume;

pub use classify::plan;

/// The CSI driver (and provisioner) name Go Carina and this project share.
pub const DRIVER: &str = "carina.storage.io";
/// The annotation Go Carina put on each `LogicVolume`: `lvm`, `raw` or
/// `host`.
pub const GO_MANAGE_TYPE_ANNOTATION: &str = "carina.io/volume-manage-type";
/// Written by `carinactl migrate apply` once the node took the volume
/// over; its value is the volume's node-local name.
pub const ADOPTED_ANNOTATION: &str = "carina.storage.io/adopted-volume";
/// The commands of Go Carina's containers (this project's chart sets no
/// command on its containers).
pub const GO_PROGRAMS: &[&str] = &["carina-controller", "carina-node", "carina-scheduler"];

/// Why the cluster could not be read.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    /// Listing a kind of object failed (permissions, API server down, a
    /// missing CRD).
    #[error("list {kind}: {source}")]
    List {
        kind: &'static str,
        #[source]
        source: kube::Error,
    },
}

/// Every object the plan looks at, as listed from the API server.
#[derive(Debug, Clone, Default)]
pub struct Cluster {
    pub logic_volumes: Vec<LogicVolume>,
    pub persistent_volumes: Vec<PersistentVolume>,
    pub storage_classes: Vec<StorageClass>,
    pub deployments: Vec<Deployment>,
    pub daemon_sets: Vec<DaemonSet>,
    pub stateful_sets: Vec<StatefulSet>,
    pub pods: Vec<Pod>,
    pub services: Vec<Service>,
    pub config_maps: Vec<ConfigMap>,
    pub csi_drivers: Vec<CSIDriver>,
    pub mutating_webhooks: Vec<MutatingWebhookConfiguration>,
    pub validating_webhooks: Vec<ValidatingWebhookConfiguration>,
}

impl Cluster {
    /// Lists everything the plan needs, in every namespace. Reads only.
    #[tracing::instrument(skip(client), err)]
    pub async fn read(client: &Client) -> Result<Cluster, MigrateError> {
        Ok(Cluster {
            logic_volumes: list(client, "logicvolumes").await?,
            persistent_volumes: list(client, "persistentvolumes").await?,
            storage_classes: list(client, "storageclasses").await?,
            deployments: list(client, "deployments").await?,
            daemon_sets: list(client, "daemonsets").await?,
            stateful_sets: list(client, "statefulsets").await?,
            pods: list(client, "pods").await?,
            services: list(client, "services").await?,
            config_maps: list(client, "configmaps").await?,
            csi_drivers: list(client, "csidrivers").await?,
            mutating_webhooks: list(client, "mutatingwebhookconfigurations").await?,
            validating_webhooks: list(client, "validatingwebhookconfigurations").await?,
        })
    }
}

/// Every object of kind `K` in the cluster (all namespaces), following
/// the pages.
async fn list<K>(client: &Client, kind: &'static str) -> Result<Vec<K>, MigrateError>
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
    K::DynamicType: Default,
{
    let api: Api<K> = Api::all(client.clone());
    let mut items = Vec::new();
    let mut params = ListParams::default().limit(500);
    loop {
        let page = api
            .list(&params)
            .await
            .map_err(|source| MigrateError::List { kind, source })?;
        items.extend(page.items);
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => return Ok(items),
        }
    }
}

/// What `migrate plan` found. `blocking` is true while a Go program runs:
/// `migrate apply` refuses then.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Plan {
    pub blocking: bool,
    pub blockers: Vec<Blocker>,
    pub volumes: Vec<VolumeEntry>,
    pub persistent_volumes: Vec<PvEntry>,
    pub storage_classes: Vec<ClassEntry>,
    pub leftovers: Vec<Leftover>,
}

/// A Go Carina program that still runs, or will run again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Blocker {
    /// `Deployment`, `DaemonSet`, `StatefulSet` or `Pod`.
    pub kind: String,
    pub namespace: String,
    pub name: String,
    pub container: String,
    /// `carina-controller`, `carina-node` or `carina-scheduler`.
    pub program: String,
    pub reason: String,
}

/// What will happen to one `LogicVolume`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum VolumeAction {
    /// Made by this project: nothing to do.
    Ours,
    /// A Go volume already taken over (the adopted-volume annotation).
    Adopted,
    /// A Go volume `migrate apply` takes over on its node.
    TakeOver,
    /// A Go thin-pool volume (Go Carina v0.10 or older): refused.
    RefusedThin,
    /// A Go volume whose objects disagree (policy, id, PV): refused.
    Refused,
    /// A Go volume with no PersistentVolume of its name: nothing done.
    Orphan,
    /// A Go volume whose creation failed: nothing on disk, nothing done.
    Failed,
}

/// One `LogicVolume` and its fate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VolumeEntry {
    pub name: String,
    pub action: VolumeAction,
    /// `lvm`, `raw` or `host` for a Go volume (its manage-type annotation,
    /// or what its id and group say).
    pub policy: Option<String>,
    pub node: String,
    /// `spec.deviceGroup` as written (`<group>/<disk>` for Go RAW).
    pub group: String,
    /// `status.currentSize`, else `spec.size`, in bytes.
    pub size_bytes: Option<u64>,
    pub volume_id: Option<String>,
    /// The PersistentVolume of the same name, if it exists.
    pub persistent_volume: Option<String>,
    /// `<namespace>/<name>` of the claim.
    pub claim: Option<String>,
    pub reason: String,
}

/// Who made a PersistentVolume's volume, by its `volumeHandle`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum HandleKind {
    Ours,
    Go,
    GoThin,
    /// Neither parser reads it.
    Unknown,
}

/// One PersistentVolume of the driver.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PvEntry {
    pub name: String,
    pub volume_handle: String,
    pub handle: HandleKind,
    pub claim: Option<String>,
    pub storage_class: Option<String>,
    /// The `LogicVolume` of the same name exists.
    pub logic_volume: bool,
    pub reason: String,
}

/// One StorageClass of the provisioner, as the CSI parameter parser
/// judges its parameters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ClassEntry {
    pub name: String,
    pub accepted: bool,
    /// The parser's error when refused; notes otherwise.
    pub reason: String,
    /// Deprecated keys the class uses (accepted, with a warning).
    pub deprecated: Vec<String>,
}

/// A Go object that stays after Go's programs are gone, and what to do
/// with it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Leftover {
    pub kind: String,
    pub namespace: Option<String>,
    pub name: String,
    pub action: String,
}
