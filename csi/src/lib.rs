//! CSI semantics for Carina: the Identity, Controller and Node services,
//! request validation, capability tables, idempotency and error codes.
//!
//! It knows neither Kubernetes nor LVM: the controller side is generic over
//! a `Provisioner`, the node side over `LocalVolumes`. The services arrive
//! with the CSI work; this crate is the place they will live.
