//! The wire of Carina: generated NodeStorage, NodeIdentity, CSI and
//! kubelet plugin registration code (private, re-exported on purpose),
//! mutual-TLS configuration with hot reload, W3C trace-context
//! propagation for tonic clients and servers, and telemetry initialisation.

#[allow(
    clippy::all,
    clippy::pedantic,
    missing_docs,
    missing_debug_implementations,
    rust_2018_idioms,
    unreachable_pub
)]
mod generated {
    pub mod nodestorage {
        tonic::include_proto!("carina.nodestorage.v1");
    }
    pub mod csi {
        tonic::include_proto!("csi.v1");
    }
    pub mod pluginregistration {
        tonic::include_proto!("pluginregistration");
    }
    pub mod identity {
        tonic::include_proto!("carina.identity.v1");
    }
}

pub mod anchors;
pub mod devcerts;
pub mod metrics;
pub mod telemetry;
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;
pub mod tls;
pub mod trace;
pub mod uds;

/// NodeStorage v1: messages, the server trait and the client.
pub mod nodestorage {
    pub use crate::generated::nodestorage::*;
}

/// CSI v1 (spec v1.12.0, package `csi.v1`): messages, the Identity,
/// Controller, GroupController, SnapshotMetadata and Node server traits and
/// their clients, wire-compatible with kubelet and the Kubernetes sidecars.
pub mod csi {
    pub use crate::generated::csi::*;
}

/// kubelet's plugin-registration API (package `pluginregistration`, kubelet's
/// `pluginregistration/v1`): the `Registration` server trait a plugin serves
/// on its registration socket, the client kubelet uses, and the messages.
pub mod pluginregistration {
    pub use crate::generated::pluginregistration::*;
}

/// NodeIdentity v1: the node's certificate request to the control plane,
/// the server trait and the client.
pub mod identity {
    pub use crate::generated::identity::*;
}

/// Encoded `FileDescriptorSet` of every Carina proto, for gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/descriptor.bin"));

/// Encoded `FileDescriptorSet` of NodeStorage alone (and what it imports),
/// for reflection on the node's NodeStorage port, which serves no CSI.
pub const NODESTORAGE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/nodestorage_descriptor.bin"));

/// The canonical upper-case name of a gRPC code (`NOT_FOUND`), as grpcurl
/// and the other gRPC tools print it.
pub fn code_name(code: tonic::Code) -> &'static str {
    match code {
        tonic::Code::Ok => "OK",
        tonic::Code::Cancelled => "CANCELLED",
        tonic::Code::Unknown => "UNKNOWN",
        tonic::Code::InvalidArgument => "INVALID_ARGUMENT",
        tonic::Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        tonic::Code::NotFound => "NOT_FOUND",
        tonic::Code::AlreadyExists => "ALREADY_EXISTS",
        tonic::Code::PermissionDenied => "PERMISSION_DENIED",
        tonic::Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        tonic::Code::FailedPrecondition => "FAILED_PRECONDITION",
        tonic::Code::Aborted => "ABORTED",
        tonic::Code::OutOfRange => "OUT_OF_RANGE",
        tonic::Code::Unimplemented => "UNIMPLEMENTED",
        tonic::Code::Internal => "INTERNAL",
        tonic::Code::Unavailable => "UNAVAILABLE",
        tonic::Code::DataLoss => "DATA_LOSS",
        tonic::Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

#[cfg(test)]
mod csi_wire_tests {
    //! Wire numbers checked against CSI spec v1.12.0 (csi.proto there), by
    //! encoding messages and reading the field tags back out of the bytes.
    //! The expected numbers below were taken from the spec, not from our
    //! `.proto`.

    use std::collections::HashMap;

    use prost::Message;

    use crate::csi;

    const VARINT: u8 = 0;
    const LEN: u8 = 2;

    fn varint(buf: &[u8], pos: &mut usize) -> u64 {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = buf[*pos];
            *pos += 1;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return v;
            }
        }
        panic!("varint too long");
    }

    /// Top-level (field number, wire type) pairs of an encoded message.
    fn tags(buf: &[u8]) -> Vec<(u64, u8)> {
        let mut out = Vec::new();
        let mut pos = 0;
        while pos < buf.len() {
            let key = varint(buf, &mut pos);
            let (field, wire) = (key >> 3, (key & 7) as u8);
            match wire {
                VARINT => {
                    varint(buf, &mut pos);
                }
                LEN => {
                    let len = usize::try_from(varint(buf, &mut pos)).expect("len");
                    pos += len;
                }
                other => panic!("unexpected wire type {other}"),
            }
            out.push((field, wire));
        }
        out
    }

    /// The single tag of a message with exactly one field set.
    fn only_tag(m: &impl Message) -> (u64, u8) {
        let t = tags(&m.encode_to_vec());
        assert_eq!(t.len(), 1, "expected one field, got {t:?}");
        t[0]
    }

    fn one(k: &str, v: &str) -> HashMap<String, String> {
        HashMap::from([(k.to_string(), v.to_string())])
    }

    fn mount_cap() -> csi::VolumeCapability {
        csi::VolumeCapability {
            access_type: Some(csi::volume_capability::AccessType::Mount(
                csi::volume_capability::MountVolume::default(),
            )),
            access_mode: None,
        }
    }

    /// The single tag of a default message after `set` fills one field.
    fn tag_of<R: Message + Default>(set: impl FnOnce(&mut R)) -> (u64, u8) {
        let mut m = R::default();
        set(&mut m);
        only_tag(&m)
    }

    #[test]
    fn create_volume_request_numbers() {
        type R = csi::CreateVolumeRequest;
        assert_eq!(tag_of(|r: &mut R| r.name = "v".into()), (1, LEN));
        assert_eq!(
            tag_of(|r: &mut R| r.capacity_range = Some(csi::CapacityRange::default())),
            (2, LEN)
        );
        assert_eq!(
            tag_of(|r: &mut R| r.volume_capabilities = vec![mount_cap()]),
            (3, LEN)
        );
        assert_eq!(tag_of(|r: &mut R| r.parameters = one("k", "v")), (4, LEN));
        assert_eq!(tag_of(|r: &mut R| r.secrets = one("k", "v")), (5, LEN));
        assert_eq!(
            tag_of(|r: &mut R| r.volume_content_source = Some(Default::default())),
            (6, LEN)
        );
        assert_eq!(
            tag_of(|r: &mut R| r.accessibility_requirements = Some(Default::default())),
            (7, LEN)
        );
        assert_eq!(
            tag_of(|r: &mut R| r.mutable_parameters = one("k", "v")),
            (8, LEN)
        );
    }

    #[test]
    fn node_publish_volume_request_numbers() {
        type R = csi::NodePublishVolumeRequest;
        assert_eq!(tag_of(|r: &mut R| r.volume_id = "v".into()), (1, LEN));
        assert_eq!(
            tag_of(|r: &mut R| r.publish_context = one("k", "v")),
            (2, LEN)
        );
        assert_eq!(
            tag_of(|r: &mut R| r.staging_target_path = "/s".into()),
            (3, LEN)
        );
        assert_eq!(tag_of(|r: &mut R| r.target_path = "/t".into()), (4, LEN));
        assert_eq!(
            tag_of(|r: &mut R| r.volume_capability = Some(mount_cap())),
            (5, LEN)
        );
        assert_eq!(tag_of(|r: &mut R| r.readonly = true), (6, VARINT));
        assert_eq!(tag_of(|r: &mut R| r.secrets = one("k", "v")), (7, LEN));
        assert_eq!(
            tag_of(|r: &mut R| r.volume_context = one("k", "v")),
            (8, LEN)
        );
    }

    #[test]
    fn volume_capability_numbers_and_access_modes() {
        use csi::volume_capability::{AccessMode, AccessType, BlockVolume, access_mode::Mode};
        let block = csi::VolumeCapability {
            access_type: Some(AccessType::Block(BlockVolume {})),
            access_mode: None,
        };
        assert_eq!(only_tag(&block), (1, LEN));
        assert_eq!(only_tag(&mount_cap()), (2, LEN));
        let mode = csi::VolumeCapability {
            access_type: None,
            access_mode: Some(AccessMode::default()),
        };
        assert_eq!(only_tag(&mode), (3, LEN));

        let spec = [
            (Mode::Unknown, 0),
            (Mode::SingleNodeWriter, 1),
            (Mode::SingleNodeReaderOnly, 2),
            (Mode::MultiNodeReaderOnly, 3),
            (Mode::MultiNodeSingleWriter, 4),
            (Mode::MultiNodeMultiWriter, 5),
            (Mode::SingleNodeSingleWriter, 6),
            (Mode::SingleNodeMultiWriter, 7),
        ];
        for (m, n) in spec {
            assert_eq!(m as i32, n, "{m:?}");
        }
        // AccessMode.mode is field 1, a varint carrying the enum value.
        let bytes = AccessMode {
            mode: Mode::MultiNodeMultiWriter as i32,
        }
        .encode_to_vec();
        assert_eq!(bytes, [0x08, 0x05]);
        assert_eq!(
            Mode::from_str_name("SINGLE_NODE_WRITER"),
            Some(Mode::SingleNodeWriter)
        );
    }

    #[test]
    fn capability_enums_match_spec() {
        use csi::controller_service_capability::rpc::Type as C;
        use csi::node_service_capability::rpc::Type as N;
        use csi::plugin_capability::service::Type as S;
        assert_eq!(S::ControllerService as i32, 1);
        assert_eq!(S::VolumeAccessibilityConstraints as i32, 2);
        assert_eq!(S::GroupControllerService as i32, 3);
        assert_eq!(C::CreateDeleteVolume as i32, 1);
        assert_eq!(C::PublishUnpublishVolume as i32, 2);
        assert_eq!(C::GetCapacity as i32, 4);
        assert_eq!(C::ExpandVolume as i32, 9);
        assert_eq!(C::ModifyVolume as i32, 14);
        assert_eq!(C::GetSnapshot as i32, 15);
        assert_eq!(N::StageUnstageVolume as i32, 1);
        assert_eq!(N::GetVolumeStats as i32, 2);
        assert_eq!(N::ExpandVolume as i32, 3);
        assert_eq!(N::VolumeMountGroup as i32, 6);
    }

    #[test]
    fn other_message_numbers() {
        let r = csi::NodeStageVolumeRequest {
            staging_target_path: "/s".into(),
            ..Default::default()
        };
        assert_eq!(only_tag(&r), (3, LEN));
        let r = csi::NodeGetInfoResponse {
            max_volumes_per_node: 10,
            ..Default::default()
        };
        assert_eq!(only_tag(&r), (2, VARINT));
        let r = csi::NodeGetInfoResponse {
            accessible_topology: Some(csi::Topology::default()),
            ..Default::default()
        };
        assert_eq!(only_tag(&r), (3, LEN));
        // Wrapper types: google.protobuf.Int64Value / BoolValue as messages.
        let r = csi::GetCapacityResponse {
            maximum_volume_size: Some(1),
            ..Default::default()
        };
        assert_eq!(r.encode_to_vec(), [0x12, 0x02, 0x08, 0x01]);
        let r = csi::ProbeResponse { ready: Some(true) };
        assert_eq!(r.encode_to_vec(), [0x0a, 0x02, 0x08, 0x01]);
        let r = csi::Volume {
            volume_id: "v".into(),
            ..Default::default()
        };
        assert_eq!(only_tag(&r), (2, LEN));
        let r = csi::Snapshot {
            creation_time: Some(prost_types::Timestamp::default()),
            ..Default::default()
        };
        assert_eq!(only_tag(&r), (4, LEN));
    }

    #[test]
    fn descriptor_set_holds_both_files() {
        let fds = prost_types::FileDescriptorSet::decode(crate::FILE_DESCRIPTOR_SET)
            .expect("descriptor set");
        let csi = fds
            .file
            .iter()
            .find(|f| f.name() == "csi/v1/csi.proto")
            .expect("csi file");
        assert_eq!(csi.package(), "csi.v1");
        let services: Vec<_> = csi.service.iter().map(|s| s.name()).collect();
        assert_eq!(
            services,
            [
                "Identity",
                "Controller",
                "GroupController",
                "SnapshotMetadata",
                "Node"
            ]
        );
        assert!(
            fds.file
                .iter()
                .any(|f| f.name() == "carina/nodestorage/v1/nodestorage.proto")
        );
        // Reflection clients resolve csi.v1's imports from the same set.
        for wkt in [
            "google/protobuf/timestamp.proto",
            "google/protobuf/wrappers.proto",
        ] {
            assert!(fds.file.iter().any(|f| f.name() == wkt), "{wkt} missing");
        }
    }
}

#[cfg(test)]
mod pluginregistration_wire_tests {
    //! The bytes kubelet sends and expects: field numbers, the package and
    //! the method names, checked against kubelet's pluginregistration v1
    //! (its `api.proto`), not against our `.proto`.

    use prost::Message;

    use crate::pluginregistration as reg;

    #[test]
    fn plugin_info_field_numbers() {
        let one = |info: reg::PluginInfo| info.encode_to_vec();
        // Key byte = field number << 3 | 2 (length-delimited).
        let t = reg::PluginInfo {
            r#type: "t".into(),
            ..Default::default()
        };
        assert_eq!(one(t), [0x0a, 1, b't']);
        let n = reg::PluginInfo {
            name: "n".into(),
            ..Default::default()
        };
        assert_eq!(one(n), [0x12, 1, b'n']);
        let e = reg::PluginInfo {
            endpoint: "e".into(),
            ..Default::default()
        };
        assert_eq!(one(e), [0x1a, 1, b'e']);
        let v = reg::PluginInfo {
            supported_versions: vec!["1".into(), "2".into()],
            ..Default::default()
        };
        assert_eq!(one(v), [0x22, 1, b'1', 0x22, 1, b'2']);
    }

    #[test]
    fn registration_status_field_numbers() {
        let ok = reg::RegistrationStatus {
            plugin_registered: true,
            error: String::new(),
        };
        assert_eq!(ok.encode_to_vec(), [0x08, 1]);
        let failed = reg::RegistrationStatus {
            plugin_registered: false,
            error: "x".into(),
        };
        assert_eq!(failed.encode_to_vec(), [0x12, 1, b'x']);
        assert!(reg::InfoRequest {}.encode_to_vec().is_empty());
        assert!(
            reg::RegistrationStatusResponse {}
                .encode_to_vec()
                .is_empty()
        );
    }

    #[test]
    fn service_and_method_names() {
        let fds = prost_types::FileDescriptorSet::decode(crate::FILE_DESCRIPTOR_SET)
            .expect("descriptor set");
        let file = fds
            .file
            .iter()
            .find(|f| f.package() == "pluginregistration")
            .expect("package pluginregistration, no version suffix");
        let [service] = file.service.as_slice() else {
            panic!("one service, got {:?}", file.service);
        };
        assert_eq!(service.name(), "Registration");
        let methods: Vec<(&str, &str, &str)> = service
            .method
            .iter()
            .map(|m| (m.name(), m.input_type(), m.output_type()))
            .collect();
        assert_eq!(
            methods,
            [
                (
                    "GetInfo",
                    ".pluginregistration.InfoRequest",
                    ".pluginregistration.PluginInfo"
                ),
                (
                    "NotifyRegistrationStatus",
                    ".pluginregistration.RegistrationStatus",
                    ".pluginregistration.RegistrationStatusResponse"
                ),
            ]
        );
    }
}
