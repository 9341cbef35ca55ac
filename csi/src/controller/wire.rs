//! The CSI wire forms of the domain's volumes, snapshots and conditions.

use std::collections::HashMap;

use carina_proto::csi;

use crate::TOPOLOGY_KEY;
use crate::types::{ProvisionedSnapshot, ProvisionedVolume, VolumeHealth};

/// The wire form of a snapshot.
pub fn wire_snapshot(s: &ProvisionedSnapshot) -> csi::Snapshot {
    csi::Snapshot {
        size_bytes: wire_bytes(s.size_bytes),
        snapshot_id: s.snapshot_id.clone(),
        source_volume_id: s.source_volume_id.clone(),
        creation_time: Some(prost_types::Timestamp {
            seconds: s.created_unix_nanos.div_euclid(1_000_000_000),
            nanos: s.created_unix_nanos.rem_euclid(1_000_000_000) as i32,
        }),
        ready_to_use: s.ready,
        group_snapshot_id: String::new(),
    }
}

pub(super) fn wire_bytes(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The wire form of a volume; its accessible topology is its node.
pub fn wire_volume(v: &ProvisionedVolume) -> csi::Volume {
    csi::Volume {
        capacity_bytes: wire_bytes(v.capacity_bytes),
        volume_id: v.volume_id.clone(),
        volume_context: v
            .context
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        content_source: None,
        accessible_topology: vec![csi::Topology {
            segments: HashMap::from([(TOPOLOGY_KEY.to_string(), v.node.clone())]),
        }],
    }
}

pub(super) fn wire_condition(h: VolumeHealth) -> csi::VolumeCondition {
    csi::VolumeCondition {
        abnormal: h.abnormal,
        message: h.message,
    }
}
