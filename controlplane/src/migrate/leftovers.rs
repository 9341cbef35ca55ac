//! Objects a Go Carina install leaves behind once its programs are gone,
//! which `helm install` of this project's chart trips on or which keep
//! calling Go: its webhook Service, its node metrics Service, the
//! CSIDriver, the pod webhook configurations and its configuration
//! ConfigMap. This project's chart labels what it makes
//! `app.kubernetes.io/part-of: carina`; nothing so labelled is listed.

use kube::ResourceExt;
use kube::api::ObjectMeta;

use super::{Cluster, DRIVER, Leftover};

/// The label this project's chart puts on everything it makes.
const PART_OF: (&str, &str) = ("app.kubernetes.io/part-of", "carina");
/// The `app` labels of Go's controller and node pods, which Go's Services
/// select.
const GO_APPS: &[&str] = &[
    "csi-carina-provisioner",
    "csi-carina-controller",
    "csi-carina-node",
];
/// The webhook Go's controller served (pod mutation: scheduler name,
/// migration annotation).
const GO_POD_HOOK: &str = "pod-hook.carina.storage.io";

fn ours(meta: &ObjectMeta) -> bool {
    meta.labels
        .as_ref()
        .and_then(|l| l.get(PART_OF.0))
        .is_some_and(|v| v == PART_OF.1)
}

fn leftover(kind: &str, meta: &ObjectMeta, action: impl Into<String>) -> Leftover {
    Leftover {
        kind: kind.to_string(),
        namespace: meta.namespace.clone(),
        name: meta.name.clone().unwrap_or_default(),
        action: action.into(),
    }
}

/// Every Go leftover in `cluster`, sorted by kind, namespace and name.
pub fn leftovers(cluster: &Cluster) -> Vec<Leftover> {
    let mut out = Vec::new();
    for s in cluster.services.iter().filter(|s| !ours(&s.metadata)) {
        let selects_go = s
            .spec
            .as_ref()
            .and_then(|spec| spec.selector.as_ref())
            .and_then(|sel| sel.get("app"))
            .is_some_and(|app| GO_APPS.contains(&app.as_str()));
        if selects_go {
            out.push(leftover(
                "Service",
                &s.metadata,
                "delete: it selects Go Carina's pods (the chart makes its own Service \
                 carina-controller and refuses to install over this one)",
            ));
        }
    }
    for d in cluster.csi_drivers.iter().filter(|d| !ours(&d.metadata)) {
        if d.name_any() == DRIVER {
            out.push(leftover(
                "CSIDriver",
                &d.metadata,
                "delete before helm install (its spec is immutable; the chart makes its \
                 own); mounted volumes stay mounted",
            ));
        }
    }
    for w in cluster
        .mutating_webhooks
        .iter()
        .filter(|w| !ours(&w.metadata))
    {
        let go = w.webhooks.iter().flatten().any(|h| h.name == GO_POD_HOOK);
        if go {
            out.push(leftover(
                "MutatingWebhookConfiguration",
                &w.metadata,
                "delete: it calls Go's controller (the chart's goCarinaCompat preset \
                 serves the same mutation)",
            ));
        }
    }
    for w in cluster
        .validating_webhooks
        .iter()
        .filter(|w| !ours(&w.metadata))
    {
        let go = w
            .webhooks
            .iter()
            .flatten()
            .any(|h| h.name.ends_with(".carina.storage.io"));
        if go {
            out.push(leftover(
                "ValidatingWebhookConfiguration",
                &w.metadata,
                "delete: it calls Go's controller",
            ));
        }
    }
    for c in cluster.config_maps.iter().filter(|c| !ours(&c.metadata)) {
        let named = c.name_any() == "carina-csi-config" || c.name_any().ends_with("-csi-config");
        let config = c
            .data
            .as_ref()
            .and_then(|d| d.get("config.json"))
            .is_some_and(|j| j.contains("diskSelector"));
        if named && config {
            out.push(leftover(
                "ConfigMap",
                &c.metadata,
                "Go's node configuration: carry its diskSelector into the chart's values, \
                 then delete it (the chart makes its own carina-csi-config)",
            ));
        }
    }
    out.sort_by(|a, b| (&a.kind, &a.namespace, &a.name).cmp(&(&b.kind, &b.namespace, &b.name)));
    out
}
