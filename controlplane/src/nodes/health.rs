//! The condition of provisioned volumes as their nodes see them now, for
//! CSI `ListVolumes` and `ControllerGetVolume`: one paged `ListLVs` per
//! node involved (the node checks each volume's device, disk or directory
//! as it lists it), asked of all nodes at once.
//!
//! A volume is abnormal, with a message naming its node, when the node
//! calls it so, when the node no longer has it (its disk or group went
//! away), or when the node cannot be reached or asked: the controller then
//! cannot vouch for the volume. A tiered (bcache) volume is the worse of
//! its backing and cache volumes.

use std::collections::BTreeMap;
use std::future::Future;

use carina_api::LogicVolumeSpec;
use carina_csi::legacy::VolumeHandle;
use carina_csi::{ProvisionedVolume, VolumeHealth};
use carina_proto::nodestorage::LogicVolume;
use futures::future::join_all;

use super::pool::{NodeAddress, NodeClients};

/// The condition of each of `volumes`, in their order. `resolve` finds a
/// node's address by name, or says why it cannot.
pub async fn volume_health<A, F, Fut>(
    clients: &NodeClients,
    volumes: &[ProvisionedVolume],
    resolve: F,
) -> Vec<VolumeHealth>
where
    A: NodeAddress,
    F: Fn(String) -> Fut,
    Fut: Future<Output = Result<A, String>>,
{
    let mut by_node: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, v) in volumes.iter().enumerate() {
        by_node.entry(v.node.as_str()).or_default().push(i);
    }
    let listings = join_all(by_node.keys().map(|node| {
        let node = node.to_string();
        let resolved = resolve(node.clone());
        async move {
            let address = resolved.await.map_err(|e| format!("node {node}: {e}"))?;
            clients
                .list_all(&address)
                .await
                .map_err(|e| format!("node {node} cannot be asked: {e}"))
        }
    }))
    .await;
    let mut out = vec![VolumeHealth::default(); volumes.len()];
    for ((node, indices), listing) in by_node.iter().zip(listings) {
        let owned: BTreeMap<&str, &LogicVolume> = match &listing {
            Ok(lvs) => lvs.iter().map(|lv| (lv.name.as_str(), lv)).collect(),
            Err(e) => {
                for &i in indices {
                    out[i] = VolumeHealth::abnormal(e.clone());
                }
                continue;
            }
        };
        for &i in indices {
            out[i] = on_node(node, &volumes[i], &owned);
        }
    }
    out
}

/// The condition of `volume` among the volumes `owned` by `node`.
fn on_node(
    node: &str,
    volume: &ProvisionedVolume,
    owned: &BTreeMap<&str, &LogicVolume>,
) -> VolumeHealth {
    // A Go Carina volume taken over keeps its Go id, its name on the node.
    let name = match VolumeHandle::parse(&volume.volume_id) {
        Ok(id) => id.local_name(),
        Err(e) => return VolumeHealth::abnormal(e.to_string()),
    };
    if let Some(lv) = owned.get(name.as_str()) {
        return reported(node, lv);
    }
    let backing = LogicVolumeSpec::backing_volume(&name);
    let Some(data) = owned.get(backing.as_str()) else {
        return VolumeHealth::abnormal(format!("node {node} no longer has volume {name:?}"));
    };
    let cache = LogicVolumeSpec::cache_volume(&name);
    let data = reported(node, data);
    if data.abnormal {
        return data;
    }
    match owned.get(cache.as_str()) {
        Some(lv) => reported(node, lv),
        None => VolumeHealth::abnormal(format!(
            "node {node} no longer has the cache volume {cache:?} of {name:?}"
        )),
    }
}

/// What `node` says of `lv`.
fn reported(node: &str, lv: &LogicVolume) -> VolumeHealth {
    match &lv.condition {
        Some(c) if c.abnormal => {
            VolumeHealth::abnormal(format!("node {node}, volume {:?}: {}", lv.name, c.message))
        }
        _ => VolumeHealth::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use carina_csi::volume_id::VolumeId;
    use carina_proto::nodestorage::VolumeCondition;

    fn provisioned(name: &str, node: &str) -> ProvisionedVolume {
        ProvisionedVolume {
            volume_id: VolumeId::new(name, node).encode(),
            capacity_bytes: 1,
            node: node.into(),
            group: "g".into(),
            context: Default::default(),
        }
    }

    fn lv(name: &str, problem: Option<&str>) -> LogicVolume {
        LogicVolume {
            name: name.into(),
            condition: Some(VolumeCondition {
                abnormal: problem.is_some(),
                message: problem.unwrap_or_default().into(),
            }),
            ..LogicVolume::default()
        }
    }

    fn health(name: &str, lvs: &[LogicVolume]) -> VolumeHealth {
        let owned = lvs.iter().map(|l| (l.name.as_str(), l)).collect();
        on_node("n1", &provisioned(name, "n1"), &owned)
    }

    #[test]
    fn the_node_s_word_missing_volumes_and_tiered_volumes() {
        assert_eq!(health("a", &[lv("a", None)]), VolumeHealth::default());
        assert_eq!(
            health("a", &[lv("a", Some("device /dev/loop3 is gone"))]),
            VolumeHealth::abnormal("node n1, volume \"a\": device /dev/loop3 is gone")
        );
        assert_eq!(
            health("a", &[lv("b", None)]),
            VolumeHealth::abnormal("node n1 no longer has volume \"a\"")
        );
        // An answer without a condition (an older node) is taken as normal.
        let old = LogicVolume {
            name: "a".into(),
            ..LogicVolume::default()
        };
        assert_eq!(health("a", &[old]), VolumeHealth::default());
        // Tiered: both parts sound, the cache gone, the backing abnormal.
        let both = [lv("t+data", None), lv("t+cache", None)];
        assert_eq!(health("t", &both), VolumeHealth::default());
        assert_eq!(
            health("t", &[lv("t+data", None)]),
            VolumeHealth::abnormal("node n1 no longer has the cache volume \"t+cache\" of \"t\"")
        );
        assert!(
            health(
                "t",
                &[
                    lv("t+data", Some("disk /dev/sdb is gone")),
                    lv("t+cache", None)
                ]
            )
            .abnormal
        );
    }

    /// A node that cannot be resolved makes all its volumes abnormal; no
    /// call is made for it.
    #[tokio::test]
    async fn an_unresolvable_node_makes_its_volumes_abnormal() {
        struct Nowhere;
        impl NodeAddress for Nowhere {
            fn node_name(&self) -> &str {
                "nowhere"
            }
            fn endpoint(&self) -> &str {
                "127.0.0.1:1"
            }
        }
        let tls = carina_proto::tls::ClientTls {
            ca_pem: Vec::new(),
            cert_pem: Vec::new(),
            key_pem: Vec::new(),
            server_name: String::new(),
        };
        let clients = NodeClients::new(tls);
        let volumes = [provisioned("a", "gone"), provisioned("b", "gone")];
        let out = volume_health(&clients, &volumes, |node| async move {
            Err::<Nowhere, _>(format!("no Node {node}"))
        })
        .await;
        assert_eq!(
            out,
            vec![VolumeHealth::abnormal("node gone: no Node gone"); 2]
        );
    }
}
