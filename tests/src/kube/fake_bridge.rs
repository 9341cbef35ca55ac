//! The kube provisioner's test bench: a fake bridge in the test process
//! that watches `LogicVolume`s and writes their status (success, failures,
//! slow and silent cases, by name prefix) the way the real bridge does,
//! recording when it wrote what; the capacity its nodes publish; and the
//! CSI Controller over a `KubeProvisioner`.
//!
//! ```ignore
//! let record = Record::default();
//! let _bridge = AbortOnDrop(tokio::spawn(fake_bridge(client.clone(), record.clone())));
//! publish(&client, "node-a", GIB).await?;
//! let mut served = controller(client, Strategy::Spreadout, Duration::from_secs(20)).await?;
//! ```

use std::collections::HashMap;
use std::pin::pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use carina_api::{
    DeviceGroupCapacity, LOGICVOLUME_FINALIZER, LogicVolume, NodeStorageResourceStatus,
};
use carina_controlplane::kube::provisioner::{KubeProvisioner, KubeProvisionerConfig};
use carina_csi::strategy::Strategy;
use futures::TryStreamExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio::time::Instant;
use tonic::Code;

use crate::cluster::publish_node_storage;
use crate::csi::ServedController;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// The node that has a HOST group besides its LVM one.
const HOST_NODE: &str = "node-b";

/// How long the fake bridge takes for an ordinary node operation.
pub const BRIDGE_DELAY: Duration = Duration::from_millis(300);
/// How long it takes for volumes named `many-*`.
pub const MANY_DELAY: Duration = Duration::from_secs(1);
/// Annotation that releases a `slow-*` volume to the fake bridge.
pub const GO_ANNOTATION: &str = "test.carina.storage.io/go";

/// When the fake bridge wrote what, by object name.
#[derive(Debug, Clone, Default)]
pub struct Record(Arc<Mutex<HashMap<String, Instant>>>);

impl Record {
    /// Marks `key` with the time now, unless it is marked already.
    pub fn mark(&self, key: String) {
        self.0
            .lock()
            .expect("not poisoned")
            .entry(key)
            .or_insert_with(Instant::now);
    }

    /// Marks `key`; false if it was marked already.
    pub fn claim(&self, key: String) -> bool {
        let mut map = self.0.lock().expect("not poisoned");
        let new = !map.contains_key(&key);
        map.entry(key).or_insert_with(Instant::now);
        new
    }

    /// When `key` was marked.
    pub fn get(&self, key: &str) -> Option<Instant> {
        self.0.lock().expect("not poisoned").get(key).copied()
    }
}

/// The fake bridge: for each `LogicVolume` event, after a delay, what the
/// real bridge would write. By name prefix: `fail-exhausted-`,
/// `fail-unavailable-`, `fail-internal-`, `fail-invalid-` fail the create
/// with that code; `silent-` is never answered; `slow-` waits for
/// [`GO_ANNOTATION`]; `nogrow-` fails expansions; `many-` takes
/// [`MANY_DELAY`]; anything else succeeds. Deleted objects lose the
/// finalizer after the delay. Records the time each status write
/// (`status/<name>`, `grow/<name>`) and finalizer removal (`gone/<name>`)
/// is sent, just before sending it. Watch errors are retried with the
/// same backoff as the real bridge's controller.
pub async fn fake_bridge(client: Client, record: Record) {
    let api: Api<LogicVolume> = Api::all(client);
    let events = watcher(api.clone(), watcher::Config::default())
        .default_backoff()
        .applied_objects();
    let mut events = pin!(events);
    loop {
        match events.try_next().await {
            Ok(Some(lv)) => {
                tokio::spawn(bridge_one(api.clone(), lv, record.clone()));
            }
            Ok(None) => return,
            Err(e) => eprintln!("fake bridge: watch error {e}"),
        }
    }
}

async fn bridge_one(api: Api<LogicVolume>, lv: LogicVolume, record: Record) {
    if let Err(e) = try_bridge_one(&api, &lv, &record).await {
        eprintln!("fake bridge: {}: {e:#}", lv.name_any());
    }
}

async fn try_bridge_one(api: &Api<LogicVolume>, lv: &LogicVolume, record: &Record) -> Result<()> {
    let name = lv.name_any();
    let delay = if name.starts_with("many-") {
        MANY_DELAY
    } else {
        BRIDGE_DELAY
    };
    let generation = lv.metadata.generation.unwrap_or(0);
    if lv.metadata.deletion_timestamp.is_some() {
        if lv.finalizers().iter().any(|f| f == LOGICVOLUME_FINALIZER)
            && record.claim(format!("deleting/{name}/{}", lv.uid().unwrap_or_default()))
        {
            tokio::time::sleep(delay).await;
            // Marked before the write: the provisioner's watch can see the
            // write, and CreateVolume return, before this task sees the
            // PATCH's response.
            record.mark(format!("gone/{name}"));
            api.patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": null}})),
            )
            .await?;
        }
        return Ok(());
    }
    if name.starts_with("silent-")
        || (name.starts_with("slow-") && !lv.annotations().contains_key(GO_ANNOTATION))
    {
        return Ok(());
    }
    let status = lv.status.clone().unwrap_or_default();
    let made = status.volume_id.is_some();
    let failed = status.code.unwrap_or(0) != 0;
    let size = lv
        .spec
        .size
        .0
        .parse::<u64>()
        .context("spec.size in bytes")?;
    let current = status
        .current_size
        .as_ref()
        .and_then(|q| q.0.parse::<u64>().ok())
        .unwrap_or(0);
    let new_status = if !made && !failed {
        let fail = |code: Code, message: &str| {
            json!({"code": code as i32, "message": message, "status": "Failed",
                   "observedGeneration": generation})
        };
        if name.starts_with("fail-exhausted-") {
            fail(Code::ResourceExhausted, "group ssd has 0 bytes free")
        } else if name.starts_with("fail-unavailable-") {
            fail(Code::Unavailable, "node-a cannot be reached")
        } else if name.starts_with("fail-internal-") {
            fail(Code::Internal, "lvcreate failed: boom")
        } else if name.starts_with("fail-invalid-") {
            fail(Code::InvalidArgument, "no group named ssd")
        } else {
            json!({"volumeID": name, "code": 0, "status": "Success",
                   "currentSize": size.to_string(), "deviceMajor": 253, "deviceMinor": 7,
                   "observedGeneration": generation})
        }
    } else if made && size > current && status.observed_generation.unwrap_or(0) < generation {
        if name.starts_with("nogrow-") {
            json!({"code": Code::ResourceExhausted as i32, "message": "no room to grow",
                   "observedGeneration": generation})
        } else {
            json!({"code": 0, "message": null, "currentSize": size.to_string(),
                   "observedGeneration": generation})
        }
    } else {
        return Ok(());
    };
    // One answer per generation, however many events arrive meanwhile.
    let uid = lv.uid().unwrap_or_default();
    if !record.claim(format!("acting/{name}/{uid}/{generation}")) {
        return Ok(());
    }
    tokio::time::sleep(delay).await;
    let mut new_status = new_status;
    if !made && !failed && new_status["code"] == 0 {
        // The real bridge reports where the device is.
        new_status["path"] = json!(format!("/dev/carina/{name}"));
    }
    // Marked before the write, like the finalizer's removal.
    let what = if made { "grow" } else { "status" };
    record.mark(format!("{what}/{name}"));
    api.patch_status(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": new_status })),
    )
    .await?;
    Ok(())
}

/// A spawned task that is stopped when this is dropped, so a test that
/// fails stops its fake bridge before its cluster goes away.
#[derive(Debug)]
pub struct AbortOnDrop(pub tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Publishes a node's capacity: one LVM group `ssd` with `free` bytes
/// (4 MiB unit) and, on node-b, an HOST group `host` after it.
pub async fn publish(client: &Client, node: &str, free: u64) -> Result<()> {
    let group = |name: &str, policy: &str, free: u64, unit: u64| DeviceGroupCapacity {
        name: name.into(),
        policy: policy.into(),
        total_bytes: free,
        free_bytes: free,
        reserve_bytes: 0,
        allocatable_bytes: free,
        largest_allocatable_bytes: free,
        allocation_unit_bytes: unit,
        ..DeviceGroupCapacity::default()
    };
    let mut groups = vec![group("ssd", "LVM", free, 4 * MIB)];
    if node == HOST_NODE {
        groups.push(group("host", "HOST", 8 * GIB, 4096));
    }
    let status = NodeStorageResourceStatus {
        groups,
        ..NodeStorageResourceStatus::default()
    };
    publish_node_storage(client, node, status).await
}

/// The CSI Controller over a `KubeProvisioner`, on its own socket.
pub async fn controller(
    client: Client,
    strategy: Strategy,
    wait: Duration,
) -> Result<ServedController> {
    let provisioner = KubeProvisioner::new(
        client,
        KubeProvisionerConfig {
            strategy,
            wait_timeout: wait,
        },
    );
    ServedController::start(provisioner, "carina-kube-csi-").await
}
