//! NodeStorage messages as people read them (tables, human sizes) and as
//! scripts read them (JSON with exact byte counts).
//!
//! JSON field names follow the proto3 JSON mapping (lowerCamelCase), but
//! 64-bit sizes are JSON numbers rather than strings, and enums drop their
//! type prefix (`"LVM"`, not `"POLICY_LVM"`).
//!
//! [`json`] holds the JSON views, [`tables`] the tables; this file names
//! enum values and device numbers for both.

mod json;
mod tables;
#[cfg(test)]
mod tests;

use carina_proto::nodestorage::{CacheMode, ChangeReason, Policy, QuotaMode};

pub use json::{
    BcacheView, CapacityView, ConditionView, DiskView, GroupView, PodLimitView, VolumeView,
    bcache_json, capacity_json, disk_json, group_json, pod_limit_json, volume_json,
};
pub use tables::{
    bcache_table, capacity_heading, capacity_table, disks_table, pod_limits_table, volumes_table,
};

/// An enum value's proto name without its type prefix, or `UNKNOWN(n)` for
/// a value newer than this client.
fn enum_name<E>(value: i32, prefix: &str, name: impl Fn(E) -> &'static str) -> String
where
    E: TryFrom<i32>,
{
    match E::try_from(value) {
        Ok(e) => {
            let full = name(e);
            full.strip_prefix(prefix).unwrap_or(full).to_string()
        }
        Err(_) => format!("UNKNOWN({value})"),
    }
}

pub fn policy_name(value: i32) -> String {
    enum_name(value, "POLICY_", |p: Policy| p.as_str_name())
}

pub fn quota_name(value: i32) -> String {
    enum_name(value, "QUOTA_MODE_", |q: QuotaMode| q.as_str_name())
}

pub fn reason_name(value: i32) -> String {
    enum_name(value, "CHANGE_REASON_", |r: ChangeReason| r.as_str_name())
}

pub fn cache_mode_name(value: i32) -> String {
    enum_name(value, "CACHE_MODE_", |m: CacheMode| m.as_str_name())
}

/// `major:minor`, or empty when the thing has no device.
fn devnum(major: u32, minor: u32) -> String {
    if major == 0 && minor == 0 {
        String::new()
    } else {
        format!("{major}:{minor}")
    }
}

/// The quota column, short.
fn quota_short(value: i32) -> String {
    match QuotaMode::try_from(value) {
        Ok(QuotaMode::NotApplicable) => "n/a".to_string(),
        Ok(QuotaMode::ProjectQuota) => "project".to_string(),
        Ok(QuotaMode::AccountingOnly) => "accounting".to_string(),
        Ok(QuotaMode::Unspecified) => String::new(),
        Err(_) => quota_name(value),
    }
}
