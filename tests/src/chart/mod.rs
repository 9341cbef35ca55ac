//! The Helm chart as its tests read it: the value sets they render it
//! with ([`ValueSet`], [`render`]), what a rendered workload says of its
//! pods ([`container`], [`args`], [`volume`], [`mount`]), and who may do
//! what ([`rbac_table`], [`controller_rules`], [`bindings_of`]).
//! Rendering itself is [`crate::manifests::Chart`]'s.

mod rbac;
mod values;
mod workload;

pub use rbac::{RBAC_TABLE, bindings_of, controller_rules, rbac_table, role_of, snapshot_rules};
pub use values::{
    DEFAULTS, KUBELET_DIR_NAMESPACE, MANUAL_SCHEDULER_CLASSES, RBAC_SET, SETS, ValueSet, render,
};
pub use workload::{args, container, field_env, has, mount, strings, volume};
