//! The Kubernetes types Carina's control plane and scheduler share, and
//! nothing that talks to a node: the custom resources, wire-compatible with
//! the Go original, [`LogicVolume`] (`carina.storage.io/v1`) and
//! [`NodeStorageResource`] (`carina.storage.io/v1beta1`), both
//! cluster-scoped, with the status subresource; the names of the finalizer
//! and annotations put on them; the device-group [`policy`] names they
//! carry and which volumes each can hold; what a `LogicVolume`'s status
//! means for a retry and for its node's room ([`state`]); Kubernetes
//! [`quantity`] parsing as byte counts; the schema
//! helpers (quantities, condition lists); and the CRD manifests generated
//! from the types ([`crds_yaml`], checked in as
//! `deploy/crds/carina.storage.io_crds.yaml`). And the one way every
//! Carina binary and test builds its Kubernetes [`client`].
//!
//! It depends on no other Carina crate, and the node side does not depend
//! on it (the nodes hold no Kubernetes credentials).

pub mod client;
pub mod logicvolume;
pub mod nodestorageresource;
pub mod policy;
pub mod quantity;
mod schema;
pub mod state;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

pub use logicvolume::{
    LogicVolume, LogicVolumeCache, LogicVolumeSource, LogicVolumeSpec, LogicVolumeStatus, Owner,
    OwnerError,
};
pub use nodestorageresource::{
    DeviceGroupCapacity, Disk, NodeStorageResource, NodeStorageResourceSpec,
    NodeStorageResourceStatus, PvInfo, VgGroup,
};

/// The API group of both resources.
pub const GROUP: &str = "carina.storage.io";

/// Finalizer on every `LogicVolume` the provisioner creates; the bridge
/// removes it once the node has deleted the volume.
pub const LOGICVOLUME_FINALIZER: &str = "carina.storage.io/logicvolume";

/// Annotation carrying the W3C `traceparent` of the request that created or
/// changed the object, so the bridge continues that trace.
pub const TRACEPARENT_ANNOTATION: &str = "carina.storage.io/traceparent";

/// Annotation on a Node (or a `LogicVolume`) naming the node's `NodeStorage`
/// endpoint (`host:port`), overriding the Node's `InternalIP`.
pub const NODE_ENDPOINT_ANNOTATION: &str = "carina.storage.io/node-endpoint";

/// Annotation on a `LogicVolume` naming where the volume is on its node,
/// for tools that write objects themselves; the bridge reports the same in
/// `status.path`. Either becomes the volume context's `carina.storage.io/path`.
pub const PATH_ANNOTATION: &str = "carina.storage.io/path";

/// Annotation on a `LogicVolume` asking for a whole RAW disk (value
/// `"true"`); the provisioner writes it, the bridge and the scheduler read it.
pub const EXCLUSIVE_ANNOTATION: &str = "carina.storage.io/exclusively-raw-disk";

/// Annotation on a `LogicVolume` Go Carina made, written once the volume
/// was taken over on its node (`carinactl migrate apply`): the object is
/// this project's from then on, and its volume's node-local name is the
/// value (the Go id, `volume-<name>` or `host-<name>`), not the object's
/// name. [`LogicVolume::owner`] reads it.
pub const ADOPTED_ANNOTATION: &str = "carina.storage.io/adopted-volume";

/// Annotation Go Carina put on each `LogicVolume` it made (`lvm`, `raw` or
/// `host`); none of this project's objects carry it.
pub const GO_VOLUME_TYPE_ANNOTATION: &str = "carina.io/volume-manage-type";

/// Pod annotations (Carina's) limiting the pod's block IO on its Carina
/// volumes: bytes per second read and written, operations per second read
/// and written. A value is a Kubernetes quantity (`10485760`, `10Mi`); `0`
/// or no annotation is no limit.
pub const READ_BPS_ANNOTATION: &str = "carina.storage.io/blkio.throttle.read_bps_device";
pub const WRITE_BPS_ANNOTATION: &str = "carina.storage.io/blkio.throttle.write_bps_device";
pub const READ_IOPS_ANNOTATION: &str = "carina.storage.io/blkio.throttle.read_iops_device";
pub const WRITE_IOPS_ANNOTATION: &str = "carina.storage.io/blkio.throttle.write_iops_device";

/// Prefix of the keys of `NodeStorageResource.status.capacity` and
/// `.allocatable`.
pub const CAPACITY_KEY_PREFIX: &str = "carina.storage.io/";

/// The `capacity`/`allocatable` key of a device group:
/// `carina.storage.io/<group>`.
pub fn capacity_key(group: &str) -> String {
    format!("{CAPACITY_KEY_PREFIX}{group}")
}

/// Where the generated manifests are checked in, relative to the repository.
pub const CRDS_FILE: &str = "deploy/crds/carina.storage.io_crds.yaml";

/// Both CRDs, `LogicVolume` first.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![LogicVolume::crd(), NodeStorageResource::crd()]
}

/// Both CRDs as one multi-document YAML, ready for `kubectl apply -f -`.
/// The output depends only on the types (maps in the schema are ordered),
/// so it is byte-for-byte stable.
pub fn crds_yaml() -> String {
    let mut out = String::from(
        "# Carina's CustomResourceDefinitions, generated from the types in\n\
         # api/src/. Do not edit: regenerate with\n\
         # CARINA_UPDATE_CRDS=1 cargo test -p carina-api --lib\n",
    );
    for crd in crds() {
        out.push_str("---\n");
        // A CRD is plain data (strings, numbers, maps with string keys):
        // serializing it cannot fail.
        out.push_str(&serde_yaml::to_string(&crd).expect("a CRD serializes to YAML"));
    }
    out
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinitionVersion;
    use serde::Deserialize;

    fn only_version(crd: &CustomResourceDefinition) -> &CustomResourceDefinitionVersion {
        assert_eq!(crd.spec.versions.len(), 1);
        &crd.spec.versions[0]
    }

    fn columns(v: &CustomResourceDefinitionVersion) -> Vec<(&str, &str)> {
        v.additional_printer_columns
            .iter()
            .flatten()
            .map(|c| (c.name.as_str(), c.json_path.as_str()))
            .collect()
    }

    #[test]
    fn logicvolume_crd_is_carinas() {
        let crd = LogicVolume::crd();
        assert_eq!(
            crd.metadata.name.as_deref(),
            Some("logicvolumes.carina.storage.io")
        );
        assert_eq!(crd.spec.group, GROUP);
        assert_eq!(crd.spec.scope, "Cluster");
        assert_eq!(crd.spec.names.kind, "LogicVolume");
        assert_eq!(crd.spec.names.plural, "logicvolumes");
        assert_eq!(crd.spec.names.short_names, Some(vec!["lv".to_string()]));
        let v = only_version(&crd);
        assert_eq!(v.name, "v1");
        assert!(
            v.subresources
                .as_ref()
                .and_then(|s| s.status.as_ref())
                .is_some()
        );
        let cols = columns(v);
        for want in [
            ("Size", ".spec.size"),
            ("Group", ".spec.deviceGroup"),
            ("Node", ".spec.nodeName"),
            ("Status", ".status.status"),
            ("Age", ".metadata.creationTimestamp"),
        ] {
            assert!(cols.contains(&want), "{want:?} missing from {cols:?}");
        }
    }

    #[test]
    fn nodestorageresource_crd_is_carinas() {
        let crd = NodeStorageResource::crd();
        assert_eq!(
            crd.metadata.name.as_deref(),
            Some("nodestorageresources.carina.storage.io")
        );
        assert_eq!(crd.spec.scope, "Cluster");
        assert_eq!(crd.spec.names.short_names, Some(vec!["nsr".to_string()]));
        let v = only_version(&crd);
        assert_eq!(v.name, "v1beta1");
        assert!(
            v.subresources
                .as_ref()
                .and_then(|s| s.status.as_ref())
                .is_some()
        );
        assert!(columns(v).contains(&("Node", ".spec.nodeName")));
    }

    #[test]
    fn quantities_are_int_or_string() {
        let crd = serde_json::to_value(LogicVolume::crd()).expect("serializes");
        let props = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"];
        for q in [
            &props["spec"]["properties"]["size"],
            &props["status"]["properties"]["currentSize"],
        ] {
            assert_eq!(q["x-kubernetes-int-or-string"], true, "{q}");
        }
        let crd = serde_json::to_value(NodeStorageResource::crd()).expect("serializes");
        let status = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
            ["properties"];
        assert_eq!(
            status["capacity"]["additionalProperties"]["x-kubernetes-int-or-string"],
            true
        );
        assert_eq!(status["conditions"]["x-kubernetes-list-type"], "map");
    }

    #[test]
    fn integers_use_kubernetes_formats() {
        let yaml = crds_yaml();
        assert!(!yaml.contains("format: uint"), "{yaml}");
        let crd = serde_json::to_value(LogicVolume::crd()).expect("serializes");
        let major = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
            ["properties"]["deviceMajor"];
        assert_eq!(major["format"], "int64");
        // JSONSchemaProps holds `minimum` as a float.
        assert_eq!(major["minimum"].as_f64(), Some(0.0));
    }

    #[test]
    fn yaml_parses_back_to_both_crds() {
        let yaml = crds_yaml();
        assert_eq!(yaml, crds_yaml());
        let docs: Vec<CustomResourceDefinition> = serde_yaml::Deserializer::from_str(&yaml)
            .map(|d| CustomResourceDefinition::deserialize(d).expect("parses back"))
            .collect();
        assert_eq!(docs, crds());
    }

    /// The checked-in manifests are what the types generate. With
    /// `CARINA_UPDATE_CRDS=1` the test rewrites the file instead.
    #[test]
    fn checked_in_crds_are_current() {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(CRDS_FILE);
        let want = crds_yaml();
        if std::env::var_os("CARINA_UPDATE_CRDS").is_some() {
            std::fs::create_dir_all(path.parent().expect("file has a directory"))
                .expect("create deploy/crds");
            std::fs::write(&path, &want).expect("write CRDs");
            return;
        }
        // Compiled in, so the comparison does not depend on where the
        // test binary was built (a target directory shared by checkouts).
        let have = include_str!("../../deploy/crds/carina.storage.io_crds.yaml");
        let first_diff = have
            .lines()
            .zip(want.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(have.lines().count().min(want.lines().count()));
        assert!(
            have == want,
            "{CRDS_FILE} is out of date with the CRD types (first difference at line {}). \
             Regenerate it with:\n    CARINA_UPDATE_CRDS=1 cargo test -p carina-api --lib",
            first_diff + 1
        );
    }
}
