//! Building the `LogicVolume` object for a new volume from a request and
//! its placement: spec (node, size, group, the claim's name and namespace
//! from `--extra-create-metadata`, the cache of a tiered volume), the finalizer, the exclusivity
//! annotation, and the caller's W3C `traceparent` as an annotation. Pure
//! apart from reading the current tracing span; no API calls here.

use std::collections::BTreeMap;

use carina_api::{
    EXCLUSIVE_ANNOTATION, LOGICVOLUME_FINALIZER, LogicVolume, LogicVolumeCache, LogicVolumeSpec,
    TRACEPARENT_ANNOTATION,
};
use carina_csi::VolumeRequest;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::ObjectMeta;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use super::placement::Target;

/// `csi.storage.k8s.io/pvc/name`, which external-provisioner adds with
/// `--extra-create-metadata`.
pub const PVC_NAME_PARAMETER: &str = "csi.storage.k8s.io/pvc/name";
/// `csi.storage.k8s.io/pvc/namespace`, likewise.
pub const PVC_NAMESPACE_PARAMETER: &str = "csi.storage.k8s.io/pvc/namespace";

/// The current span's W3C `traceparent`, if it belongs to a trace.
pub(super) fn traceparent() -> Option<String> {
    let mut headers = http::HeaderMap::new();
    carina_proto::trace::inject(&tracing::Span::current().context(), &mut headers);
    headers
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// The object for a new volume.
pub(super) fn new_object(name: &str, req: &VolumeRequest, target: &Target) -> LogicVolume {
    let mut annotations = BTreeMap::new();
    if let Some(tp) = traceparent() {
        annotations.insert(TRACEPARENT_ANNOTATION.to_string(), tp);
    }
    if req.parameters.exclusive {
        annotations.insert(EXCLUSIVE_ANNOTATION.to_string(), "true".to_string());
    }
    let other = &req.parameters.other;
    let mut lv = LogicVolume::new(
        name,
        LogicVolumeSpec {
            source: None,
            node_name: target.node.clone(),
            size: Quantity(target.size_bytes.to_string()),
            device_group: target.group.clone(),
            pvc: other.get(PVC_NAME_PARAMETER).cloned().unwrap_or_default(),
            name_space: other
                .get(PVC_NAMESPACE_PARAMETER)
                .cloned()
                .unwrap_or_default(),
            cache: req.parameters.bcache.as_ref().map(|b| LogicVolumeCache {
                device_group: b.cache_group.clone(),
                ratio: u32::from(b.cache_ratio),
                policy: b.cache_policy.clone(),
            }),
        },
    );
    lv.metadata = ObjectMeta {
        name: Some(name.to_string()),
        finalizers: Some(vec![LOGICVOLUME_FINALIZER.to_string()]),
        annotations: (!annotations.is_empty()).then_some(annotations),
        ..ObjectMeta::default()
    };
    lv
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube::provisioner::fixtures::{MIB, request};
    use kube::ResourceExt;

    #[test]
    fn new_objects_carry_claim_finalizer_and_exclusivity() {
        let mut r = request(10 * MIB);
        r.parameters.exclusive = true;
        r.parameters
            .other
            .insert(PVC_NAME_PARAMETER.into(), "data".into());
        r.parameters
            .other
            .insert(PVC_NAMESPACE_PARAMETER.into(), "apps".into());
        let t = Target {
            node: "a".into(),
            group: "raw".into(),
            size_bytes: 12 * MIB,
            policy: Some("RAW".into()),
        };
        let o = new_object("pvc-1", &r, &t);
        assert_eq!(o.spec.size.0, (12 * MIB).to_string());
        assert_eq!(
            (o.spec.pvc.as_str(), o.spec.name_space.as_str()),
            ("data", "apps")
        );
        assert_eq!(o.finalizers(), [LOGICVOLUME_FINALIZER.to_string()]);
        assert_eq!(o.annotations()[EXCLUSIVE_ANNOTATION], "true");
        assert_eq!(o.spec.cache, None);
        // No OpenTelemetry layer here: no trace to carry.
        assert!(!o.annotations().contains_key(TRACEPARENT_ANNOTATION));
    }

    #[test]
    fn tiered_volumes_carry_their_cache() {
        let mut r = request(10 * MIB);
        r.parameters.bcache = Some(carina_csi::params::BcacheParams {
            backend_group: "hdd".into(),
            cache_group: "ssd".into(),
            cache_ratio: 20,
            cache_policy: "writeback".into(),
        });
        let t = Target {
            node: "a".into(),
            group: "hdd".into(),
            size_bytes: 12 * MIB,
            policy: Some("LVM".into()),
        };
        let o = new_object("pvc-2", &r, &t);
        assert_eq!(o.spec.device_group, "hdd");
        assert_eq!(
            o.spec.cache,
            Some(LogicVolumeCache {
                device_group: "ssd".into(),
                ratio: 20,
                policy: "writeback".into(),
            })
        );
    }
}
