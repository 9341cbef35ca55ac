//! `AdoptLV`: reads the request (a Go Carina volume id, the group as Go
//! wrote it, the policy and the recorded size) into the engine's
//! [`AdoptRequest`], and answers with the adopted volume.

use carina_csi::legacy::{LegacyId, LegacyKind};
use carina_proto::nodestorage as pb;
use tonic::Status;

use super::NodeStorageService;
use crate::engine::{AdoptRequest, Error, Policy};

impl NodeStorageService {
    pub(super) async fn adopt(
        &self,
        req: pb::AdoptLvRequest,
    ) -> Result<pb::AdoptLvResponse, Status> {
        let req = adopt_request(req)?;
        let volume = self.engine.adopt_volume(req).await?;
        Ok(pb::AdoptLvResponse {
            volume: Some(self.wire(&volume).await),
        })
    }
}

fn invalid(field: &str, reason: impl Into<String>) -> Error {
    Error::InvalidArgument {
        field: field.to_string(),
        reason: reason.into(),
    }
}

fn differs(name: &str, reason: String) -> Error {
    Error::FailedPrecondition {
        operation: "adopt",
        name: name.to_string(),
        reason,
    }
}

/// A validated `AdoptLVRequest`: a Go id that is not thin, a policy that
/// fits its kind, a group (and for RAW its disk).
pub(crate) fn adopt_request(req: pb::AdoptLvRequest) -> Result<AdoptRequest, Error> {
    let Some(id) = LegacyId::parse(&req.name) else {
        return Err(invalid(
            "name",
            format!(
                "{:?} is not a Go Carina volume id (volume-<pv>, host-<pv>)",
                req.name
            ),
        ));
    };
    if id.kind == LegacyKind::Thin {
        return Err(invalid(
            "name",
            format!(
                "{:?} is a Go Carina thin-pool volume, which is not taken over",
                req.name
            ),
        ));
    }
    let policy = match pb::Policy::try_from(req.policy) {
        Ok(pb::Policy::Lvm) => Policy::Lvm,
        Ok(pb::Policy::Raw) => Policy::Raw,
        Ok(pb::Policy::Host) => Policy::Host,
        Ok(pb::Policy::Unspecified) => return Err(invalid("policy", "must be set")),
        Err(_) => return Err(invalid("policy", format!("{} is not a policy", req.policy))),
    };
    match (id.kind, policy) {
        (LegacyKind::Block, Policy::Lvm | Policy::Raw) | (LegacyKind::Host, Policy::Host) => {}
        (kind, policy) => {
            return Err(differs(
                &req.name,
                format!(
                    "a Go Carina {:?} id names no {policy} volume",
                    kind.prefix()
                ),
            ));
        }
    }
    if req.device_group.is_empty() {
        return Err(invalid("device_group", "must not be empty"));
    }
    let (group, disk) = if policy == Policy::Raw {
        match req.device_group.split_once('/') {
            Some((group, disk)) if !group.is_empty() && !disk.is_empty() => {
                // Go wrote the disk's name; a path names the same disk.
                let disk = disk.rsplit('/').next().unwrap_or(disk);
                (group.to_string(), Some(disk.to_string()))
            }
            _ => {
                return Err(invalid(
                    "device_group",
                    format!(
                        "{:?}: a RAW volume's group is <group>/<disk>",
                        req.device_group
                    ),
                ));
            }
        }
    } else {
        (req.device_group.clone(), None)
    };
    if disk
        .as_deref()
        .is_some_and(|d| d.is_empty() || d == "." || d == "..")
    {
        return Err(invalid("device_group", "the disk must be a device name"));
    }
    Ok(AdoptRequest {
        name: id.encode(),
        group,
        policy,
        disk,
        partition_label: (policy == Policy::Raw).then(|| id.go_partition_name()),
        size_bytes: req.size_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(name: &str, group: &str, policy: pb::Policy) -> pb::AdoptLvRequest {
        pb::AdoptLvRequest {
            name: name.into(),
            device_group: group.into(),
            policy: policy as i32,
            size_bytes: 1 << 20,
        }
    }

    fn field(e: Error) -> String {
        match e {
            Error::InvalidArgument { field, .. } => field,
            other => panic!("not INVALID_ARGUMENT: {other}"),
        }
    }

    #[test]
    fn reads_each_kind() {
        let r =
            adopt_request(req("volume-pvc-1-ab", "carina-vg-ssd", pb::Policy::Lvm)).expect("valid");
        assert_eq!(
            (r.name.as_str(), r.group.as_str()),
            ("volume-pvc-1-ab", "carina-vg-ssd")
        );
        assert_eq!((r.disk, r.partition_label), (None, None));
        let r = adopt_request(req("volume-pvc-1-ab", "raw/loop7", pb::Policy::Raw)).expect("valid");
        assert_eq!(r.group, "raw");
        assert_eq!(r.disk.as_deref(), Some("loop7"));
        assert_eq!(r.partition_label.as_deref(), Some("carina.io/ab"));
        let r = adopt_request(req("host-pvc-1", "hostgrp", pb::Policy::Host)).expect("valid");
        assert_eq!(r.policy, Policy::Host);
    }

    #[test]
    fn refuses_what_is_not_a_go_volume() {
        assert_eq!(
            field(adopt_request(req("pvc-1@node", "g", pb::Policy::Lvm)).expect_err("refused")),
            "name"
        );
        assert_eq!(
            field(adopt_request(req("thin-pvc-1", "g", pb::Policy::Lvm)).expect_err("refused")),
            "name"
        );
        assert_eq!(
            field(adopt_request(req("volume-pvc-1", "", pb::Policy::Lvm)).expect_err("refused")),
            "device_group"
        );
        assert_eq!(
            field(adopt_request(req("volume-pvc-1", "raw", pb::Policy::Raw)).expect_err("refused")),
            "device_group"
        );
        assert_eq!(
            field(
                adopt_request(req("volume-pvc-1", "g", pb::Policy::Unspecified))
                    .expect_err("refused")
            ),
            "policy"
        );
        assert!(matches!(
            adopt_request(req("host-pvc-1", "g", pb::Policy::Lvm)).expect_err("refused"),
            Error::FailedPrecondition { .. }
        ));
        assert!(matches!(
            adopt_request(req("volume-pvc-1", "g", pb::Policy::Host)).expect_err("refused"),
            Error::FailedPrecondition { .. }
        ));
    }
}
