//! The Kubernetes control plane.
//!
//! - [`provisioner`]: `KubeProvisioner`, the CSI controller's back end in
//!   `--mode kube`: writes a `LogicVolume` and watches that one object.
//! - [`bridge`]: the `LogicVolume` reconciler that carries each object out
//!   on its node through `NodeStorage` over mTLS.
//! - [`capacity`]: `WatchCapacity` streams into `NodeStorageResource`s.
//! - [`config_push`]: the `carina-csi-config` ConfigMap, evaluated per node,
//!   pushed with `ApplyConfig`.
//! - [`iolimits`]: Pods' IO-limit annotations sent to their nodes with
//!   `SetPodIOLimits`.
//! - [`migration`]: opted-in Pods moved off a node that stays NotReady
//!   past a grace period (their Carina claims deleted, the data given up).
//! - [`podhook`]: the optional pod webhook (Go Carina's): Pods with Carina
//!   claims sent to the extender's scheduler, served by every replica.
//! - [`bridge_side`]: what the elected leader runs: the bridge, the
//!   capacity publisher, the config push, the IO limits and the pod
//!   migration, started and stopped together.
//! - [`leader`]: Lease-based leader election for the bridge side.
//! - [`endpoints`]: where each node's `NodeStorage` is (the shared Node
//!   watch); [`retry`] and `status`: the helpers the bridge side shares.
//!
//! Conventions every part relies on:
//! - The `LogicVolume` object's name is the node-local volume name
//!   ([`carina_csi::names::local_name`] of the CSI name); the volume id is
//!   `carina_csi::volume_id::VolumeId { volume: <object name>, node }`.
//! - `status.code` is the numeric gRPC code of the last node operation
//!   (`tonic::Code as i32`; 0 = OK), `status.message` its message.
//! - Whole-disk RAW volumes carry the annotation
//!   [`carina_api::EXCLUSIVE_ANNOTATION`] = `"true"`.

pub mod bridge;
pub mod bridge_side;
pub mod capacity;
pub mod config_push;
pub mod endpoints;
pub mod iolimits;
pub mod leader;
pub mod migration;
pub mod podhook;
pub mod provisioner;
pub mod retry;
mod status;
