//! The controller's gRPC surface under hostile input: a real
//! `carina-controller --mode kube` process (its bridge reaching one real
//! `carina-node` with a HOST group, against a real kube-apiserver and
//! etcd) gets, for every RPC of CSI Identity and Controller on its socket
//! and for `carina.identity.v1.NodeIdentity/IssueCertificate` on its
//! issuer port, messages with random field values (odd volume ids, names,
//! capacity ranges, Carina's StorageClass parameters with random values,
//! capabilities, topologies, tokens and CSRs), valid messages with a few
//! bytes changed, and random bytes. For every call:
//!
//! - an answer comes within [`CALL`] and the controller keeps running;
//! - a refusal carries a code that says what was wrong: never `UNKNOWN`,
//!   `INTERNAL` only for bytes that do not decode as the request;
//! - a refused call changes nothing: the `LogicVolume` objects (spec,
//!   finalizers, deletion), the node's volumes and, for the issuer, the CA
//!   Secret and ConfigMap are the same before and after it.
//!
//! Accepted calls may make volumes and snapshots; all are deleted through
//! CSI at the end, and then no `LogicVolume`, no finalizer and no volume on
//! the node is left. The per-RPC counts are printed as a Markdown table.
//! Seeded: a failure names the seed and case. `CARINA_FUZZ_CASES` sets the
//! calls per RPC (default 1000), `CARINA_FUZZ_SEED` the seed.
//!
//! Needs root (the node), etcd and kube-apiserver from
//! `tests/tools/build.sh etcd kube`, and `cargo build --workspace --bins`.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use carina_api::LogicVolume;
use carina_csi::{TOPOLOGY_KEY, params};
use carina_proto::csi;
use carina_proto::csi::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
use carina_proto::identity::IssueCertificateRequest;
use carina_proto::nodestorage as pb;
use carina_proto::tls::{client_config_without_cert, connect_with_config};
use carina_tests::cluster::{
    KubeControllerArgs, NodeArgs, Pki, await_capacity, free_port, register_node,
};
use carina_tests::csi::{Csi, make, mount_cap};
use carina_tests::fuzz::{self, RawClient, Rng, Tally, text};
use carina_tests::grpc::{Client, host_config};
use carina_tests::identity::{AUDIENCE, NODE_SA, NodePods, csr};
use carina_tests::kube::KubeCluster;
use carina_tests::process::tail;
use carina_tests::{have_root, unique};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, ListParams};
use kube::{Resource, ResourceExt};
use prost::Message;
use rcgen::SanType;

/// Bound of one call: the controller waits at most 30 s for the bridge
/// (`--create-timeout-secs`); a call that takes longer hangs.
const CALL: Duration = Duration::from_secs(60);
/// Bound of every wait for the control plane.
const WAIT: Duration = Duration::from_secs(60);
/// The CA Secret and ConfigMap of the issuer (the defaults).
const CA: &str = "carina-ca";
const MIB: i64 = 1 << 20;

const IDENTITY: &str = "/csi.v1.Identity/";
const CONTROLLER: &str = "/csi.v1.Controller/";
const ISSUER: &str = "/carina.identity.v1.NodeIdentity/";

/// Every RPC fuzzed, with its service, in the order they run: reads
/// first, then creates, what uses the volumes made, and deletes last.
const RPCS: &[(&str, &str)] = &[
    (IDENTITY, "GetPluginInfo"),
    (IDENTITY, "GetPluginCapabilities"),
    (IDENTITY, "Probe"),
    (CONTROLLER, "ControllerGetCapabilities"),
    (CONTROLLER, "CreateVolume"),
    (CONTROLLER, "ListVolumes"),
    (CONTROLLER, "ControllerGetVolume"),
    (CONTROLLER, "ValidateVolumeCapabilities"),
    (CONTROLLER, "GetCapacity"),
    (CONTROLLER, "ControllerExpandVolume"),
    (CONTROLLER, "ControllerPublishVolume"),
    (CONTROLLER, "ControllerUnpublishVolume"),
    (CONTROLLER, "ControllerModifyVolume"),
    (CONTROLLER, "CreateSnapshot"),
    (CONTROLLER, "ListSnapshots"),
    (CONTROLLER, "GetSnapshot"),
    (CONTROLLER, "DeleteSnapshot"),
    (CONTROLLER, "DeleteVolume"),
    (ISSUER, "IssueCertificate"),
];

/// The RPCs that may change volumes or the CA: a refusal of one is
/// checked to have changed nothing.
const MUTATING: &[&str] = &[
    "CreateVolume",
    "ControllerExpandVolume",
    "ControllerPublishVolume",
    "ControllerUnpublishVolume",
    "ControllerModifyVolume",
    "CreateSnapshot",
    "DeleteSnapshot",
    "DeleteVolume",
    "IssueCertificate",
];

/// What the generators draw from: the node, its group, the ids that exist
/// now, and the issuer's good and bad credentials.
struct Pools {
    node: String,
    group: String,
    /// Volume and snapshot ids that exist (refreshed before every RPC).
    ids: Vec<String>,
    /// A token of the node ServiceAccount bound to a pod on `node`.
    token: String,
    /// A token of the same pod for the API server's own audience.
    wrong_audience: String,
    /// CSRs: for `node` (good), for another node, with an IP SAN.
    csrs: [String; 3],
}

fn one_of<T: Clone>(rng: &mut Rng, items: &[T]) -> T {
    rng.pick(items).clone()
}

/// Names of volumes and snapshots: kept, hashed, empty, too long, odd.
fn name(rng: &mut Rng) -> String {
    match rng.below(8) {
        0 | 1 => format!("fuzz-{}", rng.below(6)),
        2 => String::new(),
        3 => "x".repeat(one_of(rng, &[63, 64, 128, 129, 4096])),
        4 => format!("pvc-{:x}", rng.next_u64()),
        5 => one_of(rng, &["../", "PVC-A", "snapshot-1", "csi-0", "a..b", "-a"]).to_string(),
        _ => text(rng, 40),
    }
}

/// Volume and snapshot ids: existing ones, well-formed ones of no volume,
/// and malformed ones.
fn id(rng: &mut Rng, pools: &Pools) -> String {
    let node = &pools.node;
    match rng.below(10) {
        0..=2 if !pools.ids.is_empty() => one_of(rng, &pools.ids),
        3 => format!("fuzz-{}@{node}", rng.below(6)),
        4 => one_of(
            rng,
            &["x@", "@n", "../", "@", "x@n@m", "", "a/b@n", "..@.."],
        )
        .to_string(),
        5 => format!("{}@{node}", "a".repeat(one_of(rng, &[64, 253, 5000]))),
        6 => format!("csi-s{:032x}@{node}", u128::from(rng.next_u64())),
        7 if !pools.ids.is_empty() => {
            let id = one_of(rng, &pools.ids);
            let volume = id.split('@').next().unwrap_or_default().to_string();
            format!(
                "{volume}@{}",
                one_of(rng, &["other", "", "@", node.as_str()])
            )
        }
        8 => format!("{}@{}", text(rng, 20), text(rng, 10)),
        _ => text(rng, 40),
    }
}

fn bytes(rng: &mut Rng) -> i64 {
    let any = rng.next_u64() as i64;
    one_of(
        rng,
        &[
            0,
            1,
            -1,
            4095,
            MIB,
            2 * MIB,
            10 * MIB,
            1 << 30,
            1 << 40,
            i64::MAX,
            i64::MIN,
            any,
        ],
    )
}

/// Capacity ranges: a third of them a few MiB that fit, the others from
/// [`bytes`] (negative, zero, huge, limit below required).
fn range(rng: &mut Rng) -> Option<csi::CapacityRange> {
    match rng.below(6) {
        0 => None,
        1 | 2 => Some(csi::CapacityRange {
            required_bytes: (1 + rng.below(16) as i64) * MIB,
            limit_bytes: 0,
        }),
        _ => Some(csi::CapacityRange {
            required_bytes: bytes(rng),
            limit_bytes: if rng.below(2) == 0 { 0 } else { bytes(rng) },
        }),
    }
}

/// StorageClass parameters: Carina's keys (and old names) with good and
/// bad values, and keys of nobody.
fn parameters(rng: &mut Rng, pools: &Pools) -> HashMap<String, String> {
    let keys = [
        params::DISK_GROUP,
        params::DISK_GROUP,
        params::EXCLUSIVE,
        params::BACKEND_GROUP,
        params::CACHE_GROUP,
        params::CACHE_RATIO,
        params::CACHE_POLICY,
        params::FS_TYPE,
        params::POD_MIGRATION,
        params::DISK_TYPE_ALIAS,
        params::EXCLUSIVITY_ALIAS,
        params::BACKEND_TYPE_ALIAS,
        params::CACHE_TYPE_ALIAS,
        "csi.storage.k8s.io/pvc/name",
        "carina.storage.io/unknown",
    ];
    (0..rng.below(4))
        .map(|_| {
            let key = match rng.below(8) {
                0 => text(rng, 20),
                _ => one_of(rng, &keys).to_string(),
            };
            let value = match rng.below(8) {
                0 | 1 => pools.group.clone(),
                2 => one_of(rng, &["true", "false", "yes", "TRUE"]).to_string(),
                3 => one_of(rng, &["xfs", "ext4", "btrfs", ""]).to_string(),
                4 => one_of(rng, &["writeback", "writethrough", "none", "Writeback"]).to_string(),
                5 => one_of(rng, &["50", "0", "1", "100", "101", "-1", "1e3"]).to_string(),
                _ => text(rng, 30),
            };
            (key, value)
        })
        .collect()
}

fn capability(rng: &mut Rng) -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_mode: (rng.below(8) != 0).then(|| AccessMode {
            mode: rng.below(9) as i32 - 1,
        }),
        access_type: match rng.below(5) {
            0 => None,
            1 => Some(AccessType::Block(BlockVolume {})),
            _ => Some(AccessType::Mount(MountVolume {
                fs_type: one_of(rng, &["", "", "xfs", "ext4", "btrfs", "../"]).to_string(),
                mount_flags: (0..rng.below(3)).map(|_| text(rng, 10)).collect(),
                volume_mount_group: if rng.below(4) == 0 {
                    text(rng, 10)
                } else {
                    String::new()
                },
            })),
        },
    }
}

fn capabilities(rng: &mut Rng) -> Vec<csi::VolumeCapability> {
    (0..rng.below(3)).map(|_| capability(rng)).collect()
}

fn topology(rng: &mut Rng, pools: &Pools) -> csi::Topology {
    let key = match rng.below(5) {
        0 => text(rng, 20),
        _ => TOPOLOGY_KEY.to_string(),
    };
    let node = match rng.below(4) {
        0 | 1 => pools.node.clone(),
        2 => "other".to_string(),
        _ => text(rng, 20),
    };
    csi::Topology {
        segments: HashMap::from([(key, node)]),
    }
}

/// Short maps of random text (secrets, volume contexts, mutable
/// parameters), mostly empty.
fn map(rng: &mut Rng) -> HashMap<String, String> {
    if rng.below(3) != 0 {
        return HashMap::new();
    }
    (0..rng.below(3))
        .map(|_| (text(rng, 10), text(rng, 10)))
        .collect()
}

fn node_id(rng: &mut Rng, pools: &Pools) -> String {
    match rng.below(4) {
        0 | 1 => pools.node.clone(),
        2 => String::new(),
        _ => text(rng, 20),
    }
}

fn max_entries(rng: &mut Rng) -> i32 {
    let any = rng.next_u64() as i32;
    one_of(rng, &[0, 1, 2, -1, i32::MAX, i32::MIN, any])
}

fn starting_token(rng: &mut Rng, pools: &Pools) -> String {
    match rng.below(4) {
        0 | 1 => String::new(),
        2 => carina_csi::controller::encode_token(&id(rng, pools)),
        _ => text(rng, 30),
    }
}

/// The request of `rpc` with random field values.
fn random_message(rng: &mut Rng, rpc: &str, pools: &Pools) -> Vec<u8> {
    match rpc {
        "GetPluginInfo" => csi::GetPluginInfoRequest {}.encode_to_vec(),
        "GetPluginCapabilities" => csi::GetPluginCapabilitiesRequest {}.encode_to_vec(),
        "Probe" => csi::ProbeRequest {}.encode_to_vec(),
        "ControllerGetCapabilities" => csi::ControllerGetCapabilitiesRequest {}.encode_to_vec(),
        "CreateVolume" => {
            use csi::volume_content_source::{SnapshotSource, Type, VolumeSource};
            let source = match rng.below(8) {
                0 => Some(csi::VolumeContentSource {
                    r#type: Some(Type::Snapshot(SnapshotSource {
                        snapshot_id: id(rng, pools),
                    })),
                }),
                1 => Some(csi::VolumeContentSource {
                    r#type: Some(Type::Volume(VolumeSource {
                        volume_id: id(rng, pools),
                    })),
                }),
                2 => Some(csi::VolumeContentSource { r#type: None }),
                _ => None,
            };
            // Each field good half of the time, so that some creates get
            // through to the bridge and the node.
            let capabilities = match rng.below(4) {
                0 | 1 => vec![mount_cap("")],
                _ => capabilities(rng),
            };
            let parameters = match rng.below(2) {
                0 => HashMap::from([(params::DISK_GROUP.to_string(), pools.group.clone())]),
                _ => parameters(rng, pools),
            };
            csi::CreateVolumeRequest {
                name: name(rng),
                capacity_range: range(rng),
                volume_capabilities: capabilities,
                parameters,
                secrets: map(rng),
                volume_content_source: source,
                accessibility_requirements: (rng.below(2) == 0).then(|| csi::TopologyRequirement {
                    requisite: (0..rng.below(3)).map(|_| topology(rng, pools)).collect(),
                    preferred: (0..rng.below(3)).map(|_| topology(rng, pools)).collect(),
                }),
                mutable_parameters: if rng.below(8) == 0 {
                    map(rng)
                } else {
                    HashMap::new()
                },
            }
            .encode_to_vec()
        }
        "DeleteVolume" => csi::DeleteVolumeRequest {
            volume_id: id(rng, pools),
            secrets: map(rng),
        }
        .encode_to_vec(),
        "ControllerPublishVolume" => csi::ControllerPublishVolumeRequest {
            volume_id: id(rng, pools),
            node_id: node_id(rng, pools),
            volume_capability: (rng.below(4) != 0).then(|| capability(rng)),
            readonly: rng.below(2) == 0,
            secrets: map(rng),
            volume_context: map(rng),
        }
        .encode_to_vec(),
        "ControllerUnpublishVolume" => csi::ControllerUnpublishVolumeRequest {
            volume_id: id(rng, pools),
            node_id: node_id(rng, pools),
            secrets: map(rng),
        }
        .encode_to_vec(),
        "ValidateVolumeCapabilities" => csi::ValidateVolumeCapabilitiesRequest {
            volume_id: id(rng, pools),
            volume_context: map(rng),
            volume_capabilities: capabilities(rng),
            parameters: parameters(rng, pools),
            secrets: map(rng),
            mutable_parameters: if rng.below(8) == 0 {
                map(rng)
            } else {
                HashMap::new()
            },
        }
        .encode_to_vec(),
        "ListVolumes" => csi::ListVolumesRequest {
            max_entries: max_entries(rng),
            starting_token: starting_token(rng, pools),
        }
        .encode_to_vec(),
        "GetCapacity" => csi::GetCapacityRequest {
            volume_capabilities: capabilities(rng),
            parameters: parameters(rng, pools),
            accessible_topology: (rng.below(2) == 0).then(|| topology(rng, pools)),
        }
        .encode_to_vec(),
        "CreateSnapshot" => csi::CreateSnapshotRequest {
            source_volume_id: id(rng, pools),
            name: name(rng),
            secrets: map(rng),
            parameters: parameters(rng, pools),
        }
        .encode_to_vec(),
        "DeleteSnapshot" => csi::DeleteSnapshotRequest {
            snapshot_id: id(rng, pools),
            secrets: map(rng),
        }
        .encode_to_vec(),
        "ListSnapshots" => csi::ListSnapshotsRequest {
            max_entries: max_entries(rng),
            starting_token: starting_token(rng, pools),
            source_volume_id: if rng.below(2) == 0 {
                String::new()
            } else {
                id(rng, pools)
            },
            snapshot_id: if rng.below(2) == 0 {
                String::new()
            } else {
                id(rng, pools)
            },
            secrets: map(rng),
        }
        .encode_to_vec(),
        "GetSnapshot" => csi::GetSnapshotRequest {
            snapshot_id: id(rng, pools),
            secrets: map(rng),
        }
        .encode_to_vec(),
        "ControllerExpandVolume" => csi::ControllerExpandVolumeRequest {
            volume_id: id(rng, pools),
            capacity_range: range(rng),
            secrets: map(rng),
            volume_capability: (rng.below(2) == 0).then(|| capability(rng)),
        }
        .encode_to_vec(),
        "ControllerGetVolume" => csi::ControllerGetVolumeRequest {
            volume_id: id(rng, pools),
        }
        .encode_to_vec(),
        "ControllerModifyVolume" => csi::ControllerModifyVolumeRequest {
            volume_id: id(rng, pools),
            secrets: map(rng),
            mutable_parameters: parameters(rng, pools),
        }
        .encode_to_vec(),
        "IssueCertificate" => {
            let good = pools.csrs[0].clone();
            IssueCertificateRequest {
                node_name: match rng.below(6) {
                    0..=2 => pools.node.clone(),
                    3 => String::new(),
                    4 => "x".repeat(one_of(rng, &[64, 254, 5000])),
                    _ => text(rng, 30),
                },
                csr_pem: match rng.below(7) {
                    0..=2 => good,
                    3 => one_of(rng, &pools.csrs[1..]),
                    4 => String::from_utf8_lossy(&rng.mutate(good.into_bytes())).into_owned(),
                    5 => String::new(),
                    _ => text(rng, 200),
                },
                token: match rng.below(7) {
                    0..=2 => pools.token.clone(),
                    3 => pools.wrong_audience.clone(),
                    4 => String::from_utf8_lossy(&rng.mutate(pools.token.clone().into_bytes()))
                        .into_owned(),
                    5 => String::new(),
                    _ => text(rng, 200),
                },
            }
            .encode_to_vec()
        }
        other => panic!("no generator for {other}"),
    }
}

/// Whether `bytes` decodes as the request message of `rpc`.
fn decodes(rpc: &str, bytes: &[u8]) -> bool {
    match rpc {
        "GetPluginInfo" => csi::GetPluginInfoRequest::decode(bytes).is_ok(),
        "GetPluginCapabilities" => csi::GetPluginCapabilitiesRequest::decode(bytes).is_ok(),
        "Probe" => csi::ProbeRequest::decode(bytes).is_ok(),
        "ControllerGetCapabilities" => csi::ControllerGetCapabilitiesRequest::decode(bytes).is_ok(),
        "CreateVolume" => csi::CreateVolumeRequest::decode(bytes).is_ok(),
        "DeleteVolume" => csi::DeleteVolumeRequest::decode(bytes).is_ok(),
        "ControllerPublishVolume" => csi::ControllerPublishVolumeRequest::decode(bytes).is_ok(),
        "ControllerUnpublishVolume" => csi::ControllerUnpublishVolumeRequest::decode(bytes).is_ok(),
        "ValidateVolumeCapabilities" => {
            csi::ValidateVolumeCapabilitiesRequest::decode(bytes).is_ok()
        }
        "ListVolumes" => csi::ListVolumesRequest::decode(bytes).is_ok(),
        "GetCapacity" => csi::GetCapacityRequest::decode(bytes).is_ok(),
        "CreateSnapshot" => csi::CreateSnapshotRequest::decode(bytes).is_ok(),
        "DeleteSnapshot" => csi::DeleteSnapshotRequest::decode(bytes).is_ok(),
        "ListSnapshots" => csi::ListSnapshotsRequest::decode(bytes).is_ok(),
        "GetSnapshot" => csi::GetSnapshotRequest::decode(bytes).is_ok(),
        "ControllerExpandVolume" => csi::ControllerExpandVolumeRequest::decode(bytes).is_ok(),
        "ControllerGetVolume" => csi::ControllerGetVolumeRequest::decode(bytes).is_ok(),
        "ControllerModifyVolume" => csi::ControllerModifyVolumeRequest::decode(bytes).is_ok(),
        "IssueCertificate" => IssueCertificateRequest::decode(bytes).is_ok(),
        _ => false,
    }
}

/// A `LogicVolume` as a refused call must leave it: name, spec,
/// finalizers, and whether it is being deleted.
type ObjectState = (String, String, Vec<String>, bool);

/// A volume on the node: name, group, size.
type VolumeState = (String, String, u64);

/// What a refused call must not change: the `LogicVolume` objects, the
/// node's volumes, and the resource versions of the CA Secret and
/// ConfigMap.
#[derive(Debug, PartialEq)]
struct State {
    objects: Vec<ObjectState>,
    volumes: Vec<VolumeState>,
    ca: (Option<String>, Option<String>),
}

/// Reads [`State`]: the API for the objects and the CA, the node's own
/// answer (`ListLVs` over mTLS) for its volumes.
struct Observer {
    lvs: Api<LogicVolume>,
    secrets: Api<Secret>,
    configmaps: Api<ConfigMap>,
    node: Client,
}

impl Observer {
    async fn state(&mut self) -> Result<State> {
        let mut objects: Vec<ObjectState> = self
            .lvs
            .list(&ListParams::default())
            .await
            .context("list LogicVolumes")?
            .items
            .into_iter()
            .map(|lv| {
                let spec = serde_json::to_string(&lv.spec).unwrap_or_default();
                let deleting = lv.meta().deletion_timestamp.is_some();
                (lv.name_any(), spec, lv.finalizers().to_vec(), deleting)
            })
            .collect();
        objects.sort();
        let mut volumes: Vec<VolumeState> = self
            .node
            .list_l_vs(pb::ListLVsRequest::default())
            .await
            .context("ListLVs on the node")?
            .into_inner()
            .volumes
            .into_iter()
            .map(|v| (v.name, v.device_group, v.size_bytes))
            .collect();
        volumes.sort();
        let secret = self.secrets.get(CA).await.context("get the CA Secret")?;
        let configmap = self
            .configmaps
            .get(CA)
            .await
            .context("get the CA ConfigMap")?;
        Ok(State {
            objects,
            volumes,
            ca: (secret.resource_version(), configmap.resource_version()),
        })
    }
}

/// The ids of the volumes and snapshots that exist, through CSI.
async fn existing_ids(csi: &mut Csi) -> Result<(Vec<String>, Vec<String>)> {
    let volumes = csi
        .list_volumes(csi::ListVolumesRequest::default())
        .await
        .context("ListVolumes")?
        .into_inner()
        .entries
        .into_iter()
        .filter_map(|e| e.volume.map(|v| v.volume_id))
        .collect();
    let snapshots = csi
        .list_snapshots(csi::ListSnapshotsRequest::default())
        .await
        .context("ListSnapshots")?
        .into_inner()
        .entries
        .into_iter()
        .filter_map(|e| e.snapshot.map(|s| s.snapshot_id))
        .collect();
    Ok((volumes, snapshots))
}

#[tokio::test]
async fn the_controller_answers_every_message_with_a_typed_code_and_refusals_change_nothing()
-> Result<()> {
    if !have_root("fuzz_controller") {
        return Ok(());
    }
    let (seed, cases) = fuzz::settings(0x0C0_47E0, 1000);
    let cluster = KubeCluster::start().await?;
    cluster.install_crds().await?;
    let client = cluster.client();
    let dir = tempfile::Builder::new()
        .prefix("carina-fuzz-controller-")
        .tempdir()?;
    let pki = Pki::write(&dir.path().join("pki"))?;

    // One node with a HOST group, registered with its endpoint.
    let root = dir.path().join("host");
    std::fs::create_dir_all(&root)?;
    let group = unique("fuzz");
    let node_name = unique("fuzz-node");
    let node_args = NodeArgs::new(
        &node_name,
        &pki,
        &host_config(&group, &root, 0),
        &dir.path().join(&node_name),
        &cluster.log_dir().join(format!("{node_name}.log")),
    )?;
    let mut node = node_args.start().await?;
    register_node(&client, &node_name, &node_args.endpoint()).await?;

    // The controller, also serving the issuer, its CA in a namespace of
    // node pods; one pod on the node, so good tokens exist.
    let pods = NodePods::create(&client, &unique("fuzz-identity")).await?;
    let pod = pods.pod("carina-node-fuzz", NODE_SA, &node_name).await?;
    let issuer_port = free_port()?;
    let mut controller_args = KubeControllerArgs::new(
        "fuzz-controller",
        "carina-controller",
        cluster.kubeconfig_path(),
        &pki,
        dir.path(),
        &cluster.log_dir().join("fuzz-controller.log"),
    );
    controller_args.extra = vec![
        format!("--namespace={}", pods.namespace),
        format!("--identity-listen=127.0.0.1:{issuer_port}"),
        "--identity-server-names=localhost".to_string(),
    ];
    let mut controller = controller_args.start().await?;
    await_capacity(&client, &node_name, WAIT).await?;
    let ca_pem = carina_tests::identity::published_ca(&client, &pods.namespace, CA, WAIT).await?;

    let channel = controller.channel().await?;
    let mut csi = Csi::new(channel.clone());
    let mut csi_raw: RawClient = tonic::client::Grpc::new(channel);
    let issuer_channel = connect_with_config(
        &format!("https://localhost:{issuer_port}"),
        "localhost",
        client_config_without_cert(ca_pem.as_bytes())?,
    )
    .await
    .context("connect to the issuer")?;
    let mut issuer_raw: RawClient = tonic::client::Grpc::new(issuer_channel);
    let mut observer = Observer {
        lvs: Api::all(client.clone()),
        secrets: Api::namespaced(client.clone(), &pods.namespace),
        configmaps: Api::namespaced(client.clone(), &pods.namespace),
        node: pki.node_client(&node_name, &node_args.endpoint()).await?,
    };

    // Volumes the ids mostly name, so calls get past the ids.
    for i in 0..3 {
        make(
            &mut csi,
            carina_tests::csi::create(&format!("fuzz-{i}"), (i + 1) * (1 << 20), ""),
        )
        .await?;
    }
    let mut pools = Pools {
        node: node_name.clone(),
        group: group.clone(),
        ids: Vec::new(),
        token: pods.token(NODE_SA, &[AUDIENCE], Some(&pod)).await?,
        wrong_audience: pods.token(NODE_SA, &[], Some(&pod)).await?,
        csrs: [
            csr(&node_name, |_| {})?,
            csr("other-node", |_| {})?,
            csr(&node_name, |p| {
                p.subject_alt_names
                    .push(SanType::IpAddress([127, 0, 0, 1].into()))
            })?,
        ],
    };

    let mut rng = Rng::new(seed);
    let mut tallies: Vec<(&str, Tally)> = Vec::new();
    for &(service, rpc) in RPCS {
        let path: http::uri::PathAndQuery = format!("{service}{rpc}").parse()?;
        let (volumes, snapshots) = existing_ids(&mut csi).await?;
        pools.ids = volumes.into_iter().chain(snapshots).collect();
        let raw = if service == ISSUER {
            &mut issuer_raw
        } else {
            &mut csi_raw
        };
        let mut tally = Tally::default();
        // The state after a refusal, checked equal to the state before
        // it, is the state before the next call: nothing but these calls
        // changes it, and an accepted call drops it (read again).
        let mut known: Option<State> = None;
        for case in 0..cases {
            let body = match case % 3 {
                0 => random_message(&mut rng, rpc, &pools),
                1 => {
                    let valid = random_message(&mut rng, rpc, &pools);
                    rng.mutate(valid)
                }
                _ => rng.bytes(64),
            };
            let mutating = MUTATING.contains(&rpc);
            let before = match (mutating, known.take()) {
                (false, _) => None,
                (true, Some(state)) => Some(state),
                (true, None) => Some(observer.state().await?),
            };
            let at = || format!("{rpc} case {case} (seed {seed:#x}), body {body:02x?}");
            let answer = tokio::time::timeout(CALL, fuzz::unary(raw, &path, &body))
                .await
                .with_context(|| format!("{}: no answer within {CALL:?}", at()))?;
            controller.check_running().with_context(at)?;
            match answer {
                Ok(_) => tally.accept(),
                Err(status) => {
                    tally.refuse(status.code());
                    if let Some(fault) = fuzz::refusal_fault(&status, decodes(rpc, &body)) {
                        bail!(
                            "{}: {fault}: {status:?}\ncontroller log:\n{}",
                            at(),
                            tail(controller.log(), 30)
                        );
                    }
                    if let Some(before) = before {
                        let after = observer.state().await?;
                        ensure!(
                            before == after,
                            "{}: refused ({status:?}) but changed {before:#?} -> {after:#?}",
                            at()
                        );
                        known = Some(after);
                    }
                }
            }
        }
        tallies.push((rpc, tally));
    }
    node.check_running()?;

    // Still serving; what the accepted calls made goes away through CSI,
    // snapshots first.
    let (volumes, snapshots) = existing_ids(&mut csi).await?;
    for snapshot_id in snapshots {
        csi.delete_snapshot(csi::DeleteSnapshotRequest {
            snapshot_id: snapshot_id.clone(),
            ..Default::default()
        })
        .await
        .with_context(|| format!("DeleteSnapshot {snapshot_id}"))?;
    }
    for volume_id in volumes {
        carina_tests::csi::delete(&mut csi, &volume_id).await?;
    }
    let left = observer.state().await?;
    ensure!(
        left.objects.is_empty() && left.volumes.is_empty(),
        "left after deleting everything: {left:#?}"
    );
    // The group's own bookkeeping (`.carina`) stays; no volume directory.
    let files: Vec<_> = std::fs::read_dir(&root)?
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| n != ".carina")
        .collect();
    ensure!(files.is_empty(), "left in the HOST root: {files:?}");
    controller.check_running()?;
    println!(
        "seed {seed:#x}, {cases} calls per RPC:\n{}",
        fuzz::table(&tallies)
    );
    controller.stop().await;
    node.stop().await;
    Ok(())
}
