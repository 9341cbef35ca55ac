//! Carina's replaceable control planes: the `LogicVolume` and
//! `NodeStorageResource` CRDs, the Kubernetes provisioner and the
//! CRD-to-gRPC bridge, the capacity publisher, configuration push, and the
//! direct (static node list) provisioner. They arrive with the control-plane
//! work; this crate is the place they will live.

pub mod crd;
pub mod direct;
pub mod kube;
pub mod serve;
