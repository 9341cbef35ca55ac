//! What the pod webhook changes in a Pod being created, decided from the
//! Pod and the StorageClasses of its claims alone (no API calls here):
//!
//! - a Pod with a claim of a Carina StorageClass goes to the scheduler
//!   that runs the Carina extender, unless it names a scheduler of its own
//!   (anything but `default-scheduler`) or carries
//!   [`CUSTOM_SCHEDULER`] (Go Carina's way to opt out);
//! - such a Pod without the pod-migration annotation gets it (`"true"`)
//!   when one of those classes allows migration, as Go Carina's webhook
//!   copied it from the class.
//!
//! Claims that do not exist yet, or name no class or a missing one, count
//! as not Carina's: the Pod is created as it is.

use json_patch::{AddOperation, PatchOperation, ReplaceOperation};
use jsonptr::PointerBuf;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::ResourceExt;

use carina_csi::DRIVER_NAME;
use carina_csi::params::POD_MIGRATION;

use crate::kube::migration::class_allows_migration;

/// The Pod annotation that keeps a Pod's scheduler as it is (Go Carina's).
pub const CUSTOM_SCHEDULER: &str = "carina.storage.io/custom-scheduler-plugin";

/// The scheduler a Pod that names none is given by the API server.
pub const DEFAULT_SCHEDULER: &str = "default-scheduler";

/// The changes to a Pod, as JSON patch operations, and what the person
/// creating it should know.
#[derive(Debug, Default, PartialEq)]
pub struct Mutation {
    pub patch: Vec<PatchOperation>,
    pub warnings: Vec<String>,
}

/// What to change in `pod`, whose claims' StorageClasses are `classes`
/// (`None`: the claim or its class does not exist), so that it is placed
/// by `scheduler`.
pub fn mutation(pod: &Pod, classes: &[Option<StorageClass>], scheduler: &str) -> Mutation {
    let mut out = Mutation::default();
    if pod.annotations().contains_key(CUSTOM_SCHEDULER) {
        return out;
    }
    let carina: Vec<&StorageClass> = classes
        .iter()
        .flatten()
        .filter(|c| c.provisioner == DRIVER_NAME)
        .collect();
    if carina.is_empty() {
        return out;
    }
    let named = pod.spec.as_ref().and_then(|s| s.scheduler_name.as_deref());
    match named {
        None | Some("") => out.patch.push(add(&["spec", "schedulerName"], scheduler)),
        Some(DEFAULT_SCHEDULER) => out.patch.push(PatchOperation::Replace(ReplaceOperation {
            path: pointer(&["spec", "schedulerName"]),
            value: scheduler.into(),
        })),
        Some(name) if name == scheduler => {}
        Some(name) => out.warnings.push(format!(
            "Carina: the pod names scheduler {name}; its Carina claims are placed without \
             the Carina extender ({scheduler})"
        )),
    }
    if !pod.annotations().contains_key(POD_MIGRATION)
        && carina.iter().any(|c| class_allows_migration(c))
    {
        if pod.metadata.annotations.is_none() {
            out.patch.push(add(
                &["metadata", "annotations"],
                serde_json::json!({ POD_MIGRATION: "true" }),
            ));
        } else {
            out.patch
                .push(add(&["metadata", "annotations", POD_MIGRATION], "true"));
        }
    }
    out
}

/// The JSON pointer of `tokens` (each escaped as RFC 6901 asks).
fn pointer(tokens: &[&str]) -> PointerBuf {
    PointerBuf::from_tokens(tokens.iter().copied())
}

fn add(tokens: &[&str], value: impl Into<serde_json::Value>) -> PatchOperation {
    PatchOperation::Add(AddOperation {
        path: pointer(tokens),
        value: value.into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const SCHEDULER: &str = "carina-scheduler";

    fn pod(value: serde_json::Value) -> Pod {
        serde_json::from_value(value).expect("a pod")
    }

    fn class(provisioner: &str, migration: bool) -> Option<StorageClass> {
        let mut c = json!({"metadata": {"name": "c"}, "provisioner": provisioner});
        if migration {
            c["parameters"] = json!({ POD_MIGRATION: "true" });
        }
        Some(serde_json::from_value(c).expect("a class"))
    }

    /// `pod` with the patch applied, as the API server would.
    fn patched(pod: &Pod, m: &Mutation) -> Pod {
        let mut value = serde_json::to_value(pod).expect("json");
        json_patch::patch(&mut value, &m.patch).expect("the patch applies");
        serde_json::from_value(value).expect("still a pod")
    }

    fn scheduler_of(pod: &Pod) -> Option<&str> {
        pod.spec.as_ref().and_then(|s| s.scheduler_name.as_deref())
    }

    #[test]
    fn a_carina_claim_sends_the_pod_to_the_extender_and_copies_the_consent() {
        let p = pod(json!({"metadata": {"name": "p"},
            "spec": {"containers": [], "schedulerName": DEFAULT_SCHEDULER}}));
        let m = mutation(
            &p,
            &[class("other", false), class(DRIVER_NAME, true)],
            SCHEDULER,
        );
        let after = patched(&p, &m);
        assert_eq!(scheduler_of(&after), Some(SCHEDULER));
        assert_eq!(
            after.annotations().get(POD_MIGRATION).map(String::as_str),
            Some("true")
        );
        assert!(m.warnings.is_empty());

        // Annotations already there: the key is added among them, escaped.
        let p = pod(json!({"metadata": {"name": "p", "annotations": {"a": "b"}},
            "spec": {"containers": []}}));
        let after = patched(&p, &mutation(&p, &[class(DRIVER_NAME, true)], SCHEDULER));
        assert_eq!(scheduler_of(&after), Some(SCHEDULER));
        assert_eq!(after.annotations().len(), 2);
        assert_eq!(after.annotations()[POD_MIGRATION], "true");
    }

    #[test]
    fn what_is_left_as_it_is() {
        let plain = pod(json!({"metadata": {"name": "p"}, "spec": {"containers": []}}));
        // No Carina claim, or claims that do not exist yet.
        assert_eq!(mutation(&plain, &[], SCHEDULER), Mutation::default());
        assert_eq!(
            mutation(&plain, &[None, class("other", true)], SCHEDULER),
            Mutation::default()
        );
        // Go Carina's opt-out.
        let opted_out = pod(json!({"metadata": {"name": "p",
            "annotations": { CUSTOM_SCHEDULER: "" }}, "spec": {"containers": []}}));
        assert_eq!(
            mutation(&opted_out, &[class(DRIVER_NAME, true)], SCHEDULER),
            Mutation::default()
        );
        // The pod's own consent, whatever it says, is kept.
        let own = pod(json!({"metadata": {"name": "p",
            "annotations": { POD_MIGRATION: "false" }}, "spec": {"containers": []}}));
        let after = patched(
            &own,
            &mutation(&own, &[class(DRIVER_NAME, true)], SCHEDULER),
        );
        assert_eq!(after.annotations()[POD_MIGRATION], "false");
        // A class without consent adds none.
        let m = mutation(&plain, &[class(DRIVER_NAME, false)], SCHEDULER);
        assert!(patched(&plain, &m).annotations().is_empty());
        // Already on the scheduler: nothing to do.
        let there = pod(json!({"metadata": {"name": "p"},
            "spec": {"containers": [], "schedulerName": SCHEDULER}}));
        assert_eq!(
            mutation(&there, &[class(DRIVER_NAME, false)], SCHEDULER),
            Mutation::default()
        );
    }

    #[test]
    fn a_scheduler_of_its_own_is_kept_with_a_warning() {
        let p = pod(json!({"metadata": {"name": "p"},
            "spec": {"containers": [], "schedulerName": "my-scheduler"}}));
        let m = mutation(&p, &[class(DRIVER_NAME, false)], SCHEDULER);
        assert!(m.patch.is_empty());
        assert_eq!(m.warnings.len(), 1);
        assert!(m.warnings[0].contains("my-scheduler"), "{:?}", m.warnings);
    }
}
