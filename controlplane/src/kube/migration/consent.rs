//! Whether a Pod's claims may be given up: the Pod's opt-in, the consent
//! of each claim's StorageClass, no other unfinished Pod using a claim,
//! and which claims are Carina's at all.

use std::collections::BTreeMap;

use carina_csi::DRIVER_NAME;
use carina_csi::params::POD_MIGRATION;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::ListParams;
use kube::{Api, ResourceExt};

use super::Migrator;

/// Whether the Pod opted in.
pub fn allows_migration(pod: &Pod) -> bool {
    pod.annotations().get(POD_MIGRATION).map(String::as_str) == Some("true")
}

/// Whether a StorageClass lets its claims be given up when their Pod asks
/// to move: [`POD_MIGRATION`]` = "true"` as an annotation of the class
/// (where Carina reads it) or as one of its parameters (where Carina's
/// documentation also shows it).
pub fn class_allows_migration(class: &StorageClass) -> bool {
    let yes = |m: Option<&BTreeMap<String, String>>| {
        m.and_then(|m| m.get(POD_MIGRATION)).map(String::as_str) == Some("true")
    };
    yes(class.metadata.annotations.as_ref()) || yes(class.parameters.as_ref())
}

/// Whether a Pod has finished (it holds its volumes no more).
fn finished(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    matches!(phase, Some("Succeeded" | "Failed"))
}

/// The Pods of `pods`, other than `pod` and not finished, that use the
/// claim `claim` (of `pod`'s namespace), by name.
fn other_users(pod: &Pod, claim: &str, pods: &[Pod]) -> Vec<String> {
    pods.iter()
        .filter(|p| p.uid() != pod.uid() && !finished(p))
        .filter(|p| claim_names(p).iter().any(|c| c == claim))
        .map(|p| p.name_any())
        .collect()
}

/// The claims a Pod names (generic ephemeral ones included), in order.
pub(super) fn claim_names(pod: &Pod) -> Vec<String> {
    let volumes = pod.spec.as_ref().and_then(|s| s.volumes.as_ref());
    volumes
        .into_iter()
        .flatten()
        .filter_map(|v| match (&v.persistent_volume_claim, &v.ephemeral) {
            (Some(c), _) => Some(c.claim_name.clone()),
            (None, Some(_)) => Some(format!("{}-{}", pod.name_any(), v.name)),
            _ => None,
        })
        .collect()
}

impl Migrator {
    /// Why the Carina claims `claims` of `pod` may not be given up: a
    /// claim whose StorageClass does not allow it (or is gone), or one that
    /// another Pod, not finished, uses. `None` when every claim may go.
    pub(super) async fn refusal(
        &self,
        pod: &Pod,
        claims: &[PersistentVolumeClaim],
    ) -> Result<Option<String>, kube::Error> {
        if claims.is_empty() {
            return Ok(None);
        }
        let ns = pod.namespace().unwrap_or_default();
        let classes: Api<StorageClass> = Api::all(self.client.clone());
        let mut reasons = Vec::new();
        for claim in claims {
            let name = format!("{ns}/{}", claim.name_any());
            match self.class_of(claim).await? {
                None => reasons.push(format!("claim {name} names no StorageClass")),
                Some(class) => match classes.get_opt(&class).await? {
                    None => reasons.push(format!("the StorageClass {class} of claim {name} is gone")),
                    Some(c) if !class_allows_migration(&c) => reasons.push(format!(
                        "the StorageClass {class} of claim {name} does not allow it ({POD_MIGRATION}: \"true\")"
                    )),
                    Some(_) => {}
                },
            }
        }
        // Listed after the claims were read: a Pod made meanwhile counts.
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &ns);
        let listed = pods.list(&ListParams::default()).await?.items;
        for claim in claims {
            let users = other_users(pod, &claim.name_any(), &listed);
            if !users.is_empty() {
                reasons.push(format!(
                    "claim {ns}/{} is also used by pod {}",
                    claim.name_any(),
                    users.join(", ")
                ));
            }
        }
        Ok((!reasons.is_empty()).then(|| reasons.join("; ")))
    }

    /// The StorageClass a claim names, or, when it names none, its bound
    /// volume's.
    async fn class_of(&self, claim: &PersistentVolumeClaim) -> Result<Option<String>, kube::Error> {
        let spec = claim.spec.clone().unwrap_or_default();
        if let Some(class) = spec.storage_class_name.filter(|c| !c.is_empty()) {
            return Ok(Some(class));
        }
        let Some(pv) = spec.volume_name.filter(|n| !n.is_empty()) else {
            return Ok(None);
        };
        let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
        Ok(pvs
            .get_opt(&pv)
            .await?
            .and_then(|pv| pv.spec)
            .and_then(|s| s.storage_class_name)
            .filter(|c| !c.is_empty()))
    }

    /// Whether the claim's volume is (or will be) this driver's.
    pub(super) async fn is_carina(
        &self,
        claim: &PersistentVolumeClaim,
    ) -> Result<bool, kube::Error> {
        let spec = claim.spec.clone().unwrap_or_default();
        if let Some(pv) = spec.volume_name.filter(|n| !n.is_empty()) {
            let pvs: Api<PersistentVolume> = Api::all(self.client.clone());
            let driver = pvs
                .get_opt(&pv)
                .await?
                .and_then(|pv| pv.spec)
                .and_then(|s| s.csi)
                .map(|c| c.driver);
            return Ok(driver.as_deref() == Some(DRIVER_NAME));
        }
        let Some(class) = spec.storage_class_name.filter(|c| !c.is_empty()) else {
            return Ok(false);
        };
        let classes: Api<StorageClass> = Api::all(self.client.clone());
        Ok(classes
            .get_opt(&class)
            .await?
            .is_some_and(|c| c.provisioner == DRIVER_NAME))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::ObjectMeta;

    #[test]
    fn only_the_exact_opt_in_counts() {
        let pod = |value: Option<&str>| Pod {
            metadata: ObjectMeta {
                annotations: value
                    .map(|v| BTreeMap::from([(POD_MIGRATION.to_string(), v.to_string())])),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        };
        assert!(allows_migration(&pod(Some("true"))));
        for other in [None, Some("false"), Some("TRUE"), Some("yes"), Some("")] {
            assert!(!allows_migration(&pod(other)), "{other:?}");
        }
    }

    #[test]
    fn claims_of_a_pod_include_generic_ephemeral_ones() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "db-0"},
            "spec": {"containers": [], "volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": "data-db-0"}},
                {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}},
                {"name": "cfg", "configMap": {"name": "x"}},
            ]},
        }))
        .expect("a pod");
        assert_eq!(claim_names(&pod), ["data-db-0", "db-0-scratch"]);
    }

    #[test]
    fn a_class_allows_migration_only_with_the_exact_key_and_value() {
        let class = |annotation: Option<&str>, parameter: Option<&str>| StorageClass {
            metadata: ObjectMeta {
                annotations: annotation
                    .map(|v| BTreeMap::from([(POD_MIGRATION.to_string(), v.to_string())])),
                ..ObjectMeta::default()
            },
            parameters: parameter
                .map(|v| BTreeMap::from([(POD_MIGRATION.to_string(), v.to_string())])),
            ..StorageClass::default()
        };
        assert!(class_allows_migration(&class(Some("true"), None)));
        assert!(class_allows_migration(&class(None, Some("true"))));
        for (a, p) in [
            (None, None),
            (Some("false"), None),
            (None, Some("TRUE")),
            (Some("yes"), Some("1")),
        ] {
            assert!(!class_allows_migration(&class(a, p)), "{a:?} {p:?}");
        }
    }

    /// A Go Carina StorageClass and pod, as Go Carina's manifests write
    /// them (the key spelled out, not through our constant): Go's key is
    /// the one read, on the class (annotation, where Go Carina's webhook
    /// read it, or parameter, where its examples put it) and on the pod.
    /// The changelog's spelling without `node-`, which Go Carina never
    /// read, consents to nothing.
    #[test]
    fn go_carina_manifests_opt_in_under_go_name() {
        let go: StorageClass = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "csi-carina-sc", "annotations": {
                "carina.storage.io/allow-pod-migration-if-node-notready": "true"}},
            "provisioner": "carina.storage.io",
            "parameters": {"carina.storage.io/disk-group-name": "hdd"},
        }))
        .expect("a class");
        assert!(class_allows_migration(&go));
        let example: StorageClass = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "csi-carina-sc"},
            "provisioner": "carina.storage.io",
            "parameters": {"carina.storage.io/allow-pod-migration-if-node-notready": "true"},
        }))
        .expect("a class");
        assert!(class_allows_migration(&example));
        let changelog: StorageClass = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "csi-carina-sc", "annotations": {
                "carina.storage.io/allow-pod-migration-if-notready": "true"}},
            "provisioner": "carina.storage.io",
            "parameters": {"carina.storage.io/allow-pod-migration-if-notready": "true"},
        }))
        .expect("a class");
        assert!(!class_allows_migration(&changelog));
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web-0", "annotations": {
                "carina.storage.io/allow-pod-migration-if-node-notready": "true"}},
        }))
        .expect("a pod");
        assert!(allows_migration(&pod));
    }

    #[test]
    fn only_other_unfinished_pods_hold_a_claim() {
        let pod = |name: &str, uid: &str, phase: &str, claim: &str| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "uid": uid},
                "spec": {"containers": [], "volumes": [
                    {"name": "data", "persistentVolumeClaim": {"claimName": claim}},
                ]},
                "status": {"phase": phase},
            }))
            .expect("a pod")
        };
        let moving = pod("db-0", "u0", "Running", "data");
        let pods = [
            moving.clone(),
            pod("reader", "u1", "Running", "data"),
            pod("pending", "u2", "Pending", "data"),
            pod("done", "u3", "Succeeded", "data"),
            pod("failed", "u4", "Failed", "data"),
            pod("elsewhere", "u5", "Running", "other"),
        ];
        assert_eq!(other_users(&moving, "data", &pods), ["reader", "pending"]);
        assert!(other_users(&moving, "other", &pods[..1]).is_empty());
    }
}
