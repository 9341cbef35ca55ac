//! Claims made again after a migration, as Go Carina did: a StatefulSet
//! makes its Pod's claims itself, but a Deployment's (any controller's
//! but a StatefulSet's) new Pod would wait for a claim nobody makes. So
//! the migration makes each deleted claim of such a Pod again, once the
//! old one is gone: same name, labels, annotations (less the binding
//! ones the API and the provisioner set) and spec (less `volumeName`), so
//! it binds to a new volume wherever the new Pod goes.
//!
//! The claims waiting to be made again are kept in memory, by namespace
//! and name, with the old claim's UID: a claim of that UID still there
//! (its `kubernetes.io/pvc-protection` finalizer waits for the Pod to
//! go) is tried again on the next sweep; a claim of another UID means
//! someone made it already, and nothing is done. A controller that loses
//! its lease meanwhile forgets the list (docs/reliability.md says so).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, PersistentVolumeClaimSpec, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::PostParams;
use kube::{Api, ResourceExt};

use super::Migrator;

/// The annotation naming the UID of the claim a claim was made again for.
pub const RECREATED_FROM: &str = "carina.storage.io/recreated-from";

/// Annotations of a bound claim that describe its binding, not the user's
/// wish: left off the claim made again.
const BINDING_ANNOTATIONS: &[&str] = &[
    "pv.kubernetes.io/bind-completed",
    "pv.kubernetes.io/bound-by-controller",
    "volume.kubernetes.io/selected-node",
    "volume.kubernetes.io/storage-provisioner",
    "volume.beta.kubernetes.io/storage-provisioner",
];

/// Whether the claims of `pod` are made again after it moves: when a
/// controller owns it and that controller is not a StatefulSet (which
/// makes its claims itself). A Pod nothing owns never comes back, so its
/// claims are not made again either.
pub fn recreates_claims(pod: &Pod) -> bool {
    pod.owner_references()
        .iter()
        .find(|o| o.controller == Some(true))
        .is_some_and(|o| !(o.kind == "StatefulSet" && o.api_version.starts_with("apps/")))
}

/// The claim to make again in place of `old`: its name, namespace,
/// labels and annotations (less [`BINDING_ANNOTATIONS`], plus
/// [`RECREATED_FROM`]), and its spec without `volumeName`.
pub fn successor(old: &PersistentVolumeClaim) -> PersistentVolumeClaim {
    let mut annotations: BTreeMap<String, String> = old
        .annotations()
        .iter()
        .filter(|(k, _)| !BINDING_ANNOTATIONS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if let Some(uid) = old.uid() {
        annotations.insert(RECREATED_FROM.to_string(), uid);
    }
    let spec = old.spec.clone().unwrap_or_default();
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: old.metadata.name.clone(),
            namespace: old.metadata.namespace.clone(),
            labels: old.metadata.labels.clone(),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            volume_name: None,
            ..spec
        }),
        status: None,
    }
}

/// A claim to make again once the one of `old_uid` is gone.
#[derive(Debug)]
pub(super) struct Pending {
    old_uid: Option<String>,
    claim: PersistentVolumeClaim,
    /// Who asked, for the Event: `pod <ns>/<name> moved off node <node>`.
    why: String,
}

impl Pending {
    pub(super) fn new(old: &PersistentVolumeClaim, why: String) -> Self {
        Pending {
            old_uid: old.uid(),
            claim: successor(old),
            why,
        }
    }

    /// `namespace/name`, the key of the list.
    pub(super) fn key(&self) -> String {
        format!(
            "{}/{}",
            self.claim.namespace().unwrap_or_default(),
            self.claim.name_any()
        )
    }
}

impl Migrator {
    /// Makes every pending claim whose old one is gone; true when none
    /// is left waiting.
    pub(super) async fn recreate_claims(&mut self) -> bool {
        let keys: Vec<String> = self.recreate.keys().cloned().collect();
        for key in keys {
            let Some(pending) = self.recreate.get(&key) else {
                continue;
            };
            match self.recreate_one(pending).await {
                Ok(true) => {
                    self.recreate.remove(&key);
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(k8s.pvc.name = %key, error = %e, "making a migrated pod's claim again failed; trying again");
                }
            }
        }
        self.recreate.is_empty()
    }

    /// True once the claim exists again (made here or by someone else).
    async fn recreate_one(&self, pending: &Pending) -> Result<bool, kube::Error> {
        let ns = pending.claim.namespace().unwrap_or_default();
        let name = pending.claim.name_any();
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), &ns);
        if let Some(current) = claims.get_opt(&name).await? {
            // Still going (the Pod's deletion lets it), or made already.
            return Ok(current.uid() != pending.old_uid);
        }
        match claims.create(&PostParams::default(), &pending.claim).await {
            Ok(made) => {
                let note = format!(
                    "{}: claim {ns}/{name} made again (it was deleted with the pod) so the pod's controller can start it elsewhere; the new claim gets a new, empty volume",
                    pending.why
                );
                tracing::info!(%note, "claim made again");
                self.event(&made, "VolumeClaimRecreated", &note).await;
                Ok(true)
            }
            // Made meanwhile, or the old one is still there after all.
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    fn owned_by(kind: &str, api_version: &str, controller: bool) -> Pod {
        Pod {
            metadata: ObjectMeta {
                owner_references: Some(vec![OwnerReference {
                    api_version: api_version.into(),
                    kind: kind.into(),
                    name: "owner".into(),
                    uid: "u".into(),
                    controller: Some(controller),
                    ..OwnerReference::default()
                }]),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        }
    }

    #[test]
    fn only_pods_of_controllers_other_than_statefulsets_get_their_claims_back() {
        assert!(recreates_claims(&owned_by("ReplicaSet", "apps/v1", true)));
        assert!(recreates_claims(&owned_by("Job", "batch/v1", true)));
        assert!(!recreates_claims(&owned_by("StatefulSet", "apps/v1", true)));
        // Owned but not controlled, or not owned: nothing brings it back.
        assert!(!recreates_claims(&owned_by("ReplicaSet", "apps/v1", false)));
        assert!(!recreates_claims(&Pod::default()));
    }

    #[test]
    fn the_successor_keeps_the_users_wish_and_drops_the_binding() {
        let old: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "data", "namespace": "ns", "uid": "old-uid",
                "resourceVersion": "7",
                "labels": {"app": "db"},
                "annotations": {
                    "team": "a",
                    "pv.kubernetes.io/bind-completed": "yes",
                    "pv.kubernetes.io/bound-by-controller": "yes",
                    "volume.kubernetes.io/selected-node": "node-a",
                    "volume.kubernetes.io/storage-provisioner": "carina.storage.io",
                    "volume.beta.kubernetes.io/storage-provisioner": "carina.storage.io"
                },
                "finalizers": ["kubernetes.io/pvc-protection"]
            },
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "fast",
                "volumeMode": "Filesystem",
                "volumeName": "pvc-1",
                "resources": {"requests": {"storage": "1Gi"}}
            },
            "status": {"phase": "Bound"}
        }))
        .expect("a claim");
        let new = successor(&old);
        assert_eq!(new.name_any(), "data");
        assert_eq!(new.namespace().as_deref(), Some("ns"));
        assert_eq!(new.labels().get("app").map(String::as_str), Some("db"));
        let a = new.annotations();
        assert_eq!(a.get("team").map(String::as_str), Some("a"));
        assert_eq!(a.get(RECREATED_FROM).map(String::as_str), Some("old-uid"));
        assert_eq!(a.len(), 2, "{a:?}");
        assert!(new.uid().is_none() && new.resource_version().is_none());
        assert!(new.finalizers().is_empty() && new.status.is_none());
        let spec = new.spec.expect("a spec");
        assert_eq!(spec.volume_name, None);
        assert_eq!(spec.storage_class_name.as_deref(), Some("fast"));
        assert_eq!(spec.volume_mode.as_deref(), Some("Filesystem"));
        assert_eq!(
            spec.access_modes.as_deref(),
            Some(&["ReadWriteOnce".to_string()][..])
        );
        assert_eq!(
            spec.resources.and_then(|r| r.requests).expect("requests")["storage"].0,
            "1Gi"
        );
    }
}
