//! The CSI Controller of the direct control plane over two in-process
//! nodes: NodeStorage servers `node-a` and `node-b` with HOST groups on
//! tmpfs mounts of their own (so capacities are exact: [`A_BYTES`] and
//! [`B_BYTES`]), optionally a RAW group on a loop disk, the controller on
//! a unix socket ([`Cluster`]); and the capabilities and ranges of its
//! requests.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use carina_controlplane::direct::DirectProvisioner;
use carina_controlplane::nodes::spec::{NodeList, NodeSpec};
use carina_csi::Topology;
use carina_csi::strategy::Strategy;
use carina_proto::csi;
use carina_proto::csi::volume_capability::AccessType;
use carina_proto::csi::volume_capability::access_mode::Mode;
use carina_proto::devcerts::{DevCa, Validity};
use carina_proto::nodestorage as pb;

use crate::csi::ServedController;
use crate::grpc::{Client as NodeClient, TestNode, server_cert, start_engine};
use crate::{LoopDisk, MountGuard};

const MIB: u64 = 1 << 20;
/// The first node; its HOST group has [`A_BYTES`].
pub const A: &str = "node-a";
/// The second node; its HOST group has [`B_BYTES`].
pub const B: &str = "node-b";
pub const A_BYTES: u64 = 256 * MIB;
pub const B_BYTES: u64 = 512 * MIB;

/// Two nodes, the controller on a unix socket, and clients of all three.
/// Fields drop in order: servers before the file systems they serve.
#[derive(Debug)]
pub struct Cluster {
    pub controller: ServedController,
    pub nodes: Vec<TestNode>,
    pub node_clients: Vec<NodeClient>,
    _disk: Option<LoopDisk>,
    _mounts: Vec<MountGuard>,
    _dirs: Vec<tempfile::TempDir>,
    /// HOST group roots of node-a and node-b.
    pub roots: Vec<PathBuf>,
}

/// The configuration of HOST group `host` at `root`, nothing reserved.
pub fn host_group(root: &Path) -> String {
    format!(
        r#"{{"name":"host","policy":"HOST","root":"{}","reserveBytes":0}}"#,
        root.display()
    )
}

impl Cluster {
    /// node-a: HOST group `host` on 256 MiB; node-b: `host` on 512 MiB and,
    /// with `raw`, a RAW group `raw` on a 64 MiB loop disk (after `host`).
    pub async fn start(strategy: Strategy, raw: bool) -> Result<Cluster> {
        let ca = DevCa::new("carina controller test CA", Validity::days(1))?;
        let mut dirs = Vec::new();
        let mut mounts = Vec::new();
        let mut roots = Vec::new();
        let mut nodes = Vec::new();
        let mut disk = None;
        for (name, bytes) in [(A, A_BYTES), (B, B_BYTES)] {
            let dir = tempfile::Builder::new()
                .prefix("carina-csi-host-")
                .tempdir()?;
            mounts.push(MountGuard::mount(
                "tmpfs",
                dir.path(),
                Some("tmpfs"),
                Some(&format!("size={bytes}")),
            )?);
            let mut groups = vec![host_group(dir.path())];
            if raw && name == B {
                let d = LoopDisk::new(64 * MIB)?;
                groups.push(format!(
                    r#"{{"name":"raw","re":["{}"],"policy":"RAW","reserveBytes":0,"minDiskBytes":1048576}}"#,
                    d.pattern()
                ));
                disk = Some(d);
            }
            let config = format!(
                r#"{{"diskSelector":[{}],"diskScanInterval":"0"}}"#,
                groups.join(",")
            );
            let engine = start_engine(&config).await?;
            let server = server_cert(&ca, name, Validity::days(1))?;
            let same_ca = DevCa::from_pem(ca.cert_pem(), ca.key_pem())?;
            nodes.push(TestNode::start_with(engine, name, same_ca, &server).await?);
            roots.push(dir.path().to_path_buf());
            dirs.push(dir);
        }
        let list = NodeList::new(
            nodes
                .iter()
                .map(|n| NodeSpec {
                    name: n.node_name.clone(),
                    endpoint: n.endpoint(),
                    topology: Topology::new(),
                })
                .collect(),
        )?;
        let provisioner =
            DirectProvisioner::new(list, nodes[0].client_tls("controller")?, strategy);
        let controller = ServedController::start(provisioner, "carina-csi-sock-").await?;
        let mut node_clients = Vec::new();
        for n in &nodes {
            node_clients.push(n.client("reader").await?);
        }
        Ok(Cluster {
            controller,
            nodes,
            node_clients,
            _disk: disk,
            _mounts: mounts,
            _dirs: dirs,
            roots,
        })
    }

    /// Names of the volumes on each node, as the nodes list them.
    pub async fn lvs(&mut self) -> Result<Vec<Vec<pb::LogicVolume>>> {
        let mut out = Vec::new();
        for c in &mut self.node_clients {
            out.push(
                c.list_l_vs(pb::ListLVsRequest::default())
                    .await?
                    .into_inner()
                    .volumes,
            );
        }
        Ok(out)
    }

    /// Allocatable bytes of group `host` on each node.
    pub async fn allocatable(&mut self) -> Result<Vec<u64>> {
        let mut out = Vec::new();
        for c in &mut self.node_clients {
            let groups = c
                .capacity(pb::CapacityRequest {
                    device_group: "host".into(),
                })
                .await?
                .into_inner()
                .groups;
            out.push(groups.first().context("group host")?.allocatable_bytes);
        }
        Ok(out)
    }
}

/// A capability of access mode `mode` and type `access`.
pub fn cap(mode: Mode, access: AccessType) -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_mode: Some(csi::volume_capability::AccessMode { mode: mode as i32 }),
        access_type: Some(access),
    }
}

/// A mount of file system `fs` (empty: the driver's default).
pub fn mount(fs: &str) -> AccessType {
    AccessType::Mount(csi::volume_capability::MountVolume {
        fs_type: fs.into(),
        ..Default::default()
    })
}

/// Block access.
pub fn block() -> AccessType {
    AccessType::Block(csi::volume_capability::BlockVolume {})
}

/// A capacity range.
pub fn range(required: i64, limit: i64) -> Option<csi::CapacityRange> {
    Some(csi::CapacityRange {
        required_bytes: required,
        limit_bytes: limit,
    })
}

/// Request parameters from pairs.
pub fn params(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}
