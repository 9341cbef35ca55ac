//! Volume ids of either kind to `LogicVolume`s ([`KubeProvisioner::find`]),
//! and the CSI id of an object ([`csi_volume_id`]).
//!
//! An id of ours, `<volume>@<node>`, names the object `<volume>` on that
//! node, if that object is ours ([`carina_api::LogicVolume::owner`]). A
//! Go Carina id (`volume-<pv>`, `host-<pv>`; [`carina_csi::legacy`])
//! names the object `<pv>`, which gives the node and group: taken over
//! (its adopted-volume annotation is this id), it is served like ours,
//! its volume being the Go id on its node; still Go's, every call is
//! `FAILED_PRECONDITION` saying `carinactl migrate apply` must take it
//! over first, so a delete never answers success while leaving the volume
//! behind. A thin id (Go Carina up to v0.10) is `FAILED_PRECONDITION`.
//! No object of the name: `None` (DeleteVolume is then done, the others
//! `NOT_FOUND`).

use carina_api::{LogicVolume, Owner};
use carina_csi::CsiError;
use carina_csi::legacy::{LegacyId, VolumeHandle};
use carina_csi::names;
use carina_csi::volume_id::VolumeId;
use kube::ResourceExt;

use super::KubeProvisioner;

impl KubeProvisioner {
    /// The object of a volume id: `None` when no such volume can exist;
    /// `FAILED_PRECONDITION` for a Go Carina volume not taken over (or a
    /// thin one).
    pub(super) async fn find(&self, volume_id: &str) -> Result<Option<LogicVolume>, CsiError> {
        let handle = match VolumeHandle::parse(volume_id) {
            Ok(handle) => handle,
            Err(CsiError::NotFound(_)) => return Ok(None),
            Err(e) => return Err(e),
        };
        let (object, node) = match &handle {
            VolumeHandle::Ours(id) if !names::is_local_name(&id.volume) => return Ok(None),
            VolumeHandle::Ours(id) => (id.volume.as_str(), Some(id.node.as_str())),
            VolumeHandle::Go(id) => {
                id.refuse_thin()?;
                (id.object.as_str(), None)
            }
        };
        let lv = self.reads.lv(object).await?;
        let Some(lv) = lv else { return Ok(None) };
        let owner = lv
            .owner()
            .map_err(|e| CsiError::FailedPrecondition(e.to_string()))?;
        Ok(match (&handle, owner) {
            (VolumeHandle::Ours(_), Owner::Ours { .. }) => {
                Some(lv).filter(|lv| Some(lv.spec.node_name.as_str()) == node)
            }
            // An id of ours never names a Go Carina volume.
            (VolumeHandle::Ours(_), _) => None,
            (VolumeHandle::Go(id), Owner::TakenOver { local }) => {
                (local == id.encode()).then_some(lv)
            }
            (VolumeHandle::Go(id), Owner::Go { go_id }) => {
                if go_id.is_some_and(|g| g != id.encode()) {
                    None
                } else {
                    return Err(not_taken_over(id, &lv));
                }
            }
            // An object of ours that happens to have the Go volume's name.
            (VolumeHandle::Go(_), Owner::Ours { .. }) => None,
        })
    }
}

/// `FAILED_PRECONDITION` for the Go Carina volume `id` of `lv`, which is
/// not taken over yet.
pub(super) fn not_taken_over(id: &LegacyId, lv: &LogicVolume) -> CsiError {
    CsiError::FailedPrecondition(format!(
        "volume {:?} is Go Carina's (LogicVolume {:?} on node {}, group {:?}) and is not taken over yet: \
         run `carinactl migrate apply` to take it over first",
        id.encode(),
        lv.name_any(),
        lv.spec.node_name,
        lv.spec.device_group
    ))
}

/// `FAILED_PRECONDITION` when `lv`, found under the name of a volume to
/// create, is Go Carina's and not taken over: answering with it would
/// hand out an id no node serves.
pub(super) fn refuse_go_object(lv: &LogicVolume) -> Result<(), CsiError> {
    let go_id = match lv.owner() {
        Ok(Owner::Go { go_id }) => go_id,
        Ok(_) => return Ok(()),
        Err(e) => return Err(CsiError::FailedPrecondition(e.to_string())),
    };
    Err(CsiError::FailedPrecondition(format!(
        "LogicVolume {:?} on node {} is Go Carina's ({}) and not taken over: run \
         `carinactl migrate apply` to take it over, or delete the LogicVolume if Go \
         Carina never made its volume",
        lv.name_any(),
        lv.spec.node_name,
        go_id.as_deref().unwrap_or("no volume recorded")
    )))
}

/// Whether this provisioner serves the volume of `lv`: ours, or Go
/// Carina's taken over.
pub(super) fn serves(lv: &LogicVolume) -> bool {
    lv.owner().is_ok_and(|o| o.local_name().is_some())
}

/// The CSI volume id of `lv`: `<object>@<node>` for ours, the Go id (its
/// PersistentVolume's immutable handle) for a Go Carina volume taken over.
pub(super) fn csi_volume_id(lv: &LogicVolume) -> String {
    match lv.owner() {
        Ok(Owner::TakenOver { local }) => local,
        _ => VolumeId::new(lv.name_any(), lv.spec.node_name.clone()).encode(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube::provisioner::fixtures::{MIB, lv};
    use carina_api::{ADOPTED_ANNOTATION, LogicVolumeStatus};
    use carina_csi::legacy::LegacyKind;
    use std::collections::BTreeMap;

    #[test]
    fn go_id_prefixes_are_the_csi_crates() {
        let kinds = [LegacyKind::Block, LegacyKind::Host, LegacyKind::Thin];
        assert_eq!(
            kinds.map(LegacyKind::prefix),
            carina_api::logicvolume::GO_ID_PREFIXES
        );
    }

    #[test]
    fn ids_of_taken_over_volumes_are_their_go_ids() {
        let mut v = lv("node-a", "g", 8 * MIB);
        let name = v.name_any();
        assert_eq!(csi_volume_id(&v), format!("{name}@node-a"));
        assert!(serves(&v));
        refuse_go_object(&v).expect("ours");
        let go_id = format!("volume-{name}");
        v.status = Some(LogicVolumeStatus {
            volume_id: Some(go_id.clone()),
            ..LogicVolumeStatus::default()
        });
        assert!(!serves(&v), "Go's, not taken over");
        let e = refuse_go_object(&v).expect_err("Go's");
        assert_eq!(e.code(), tonic::Code::FailedPrecondition);
        assert!(e.to_string().contains(&go_id), "{e}");
        let id = LegacyId::parse(&go_id).expect("a Go id");
        let e = not_taken_over(&id, &v);
        assert_eq!(e.code(), tonic::Code::FailedPrecondition);
        assert!(e.to_string().contains("carinactl migrate apply"), "{e}");
        v.metadata.annotations = Some(BTreeMap::from([(
            ADOPTED_ANNOTATION.to_string(),
            go_id.clone(),
        )]));
        assert!(serves(&v));
        refuse_go_object(&v).expect("taken over");
        assert_eq!(csi_volume_id(&v), go_id);
    }
}
