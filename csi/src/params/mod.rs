//! StorageClass parameters, Carina-compatible. A known key with a bad
//! value is `INVALID_ARGUMENT` naming the key. An unknown
//! `carina.storage.io/*` key is accepted and reported ([`compat`]): a
//! StorageClass cannot be changed, and refusing it would fail every claim
//! of the class. The `csi.storage.k8s.io/*` keys external-provisioner adds
//! are accepted; any other key is kept and ignored.

use std::collections::{BTreeMap, HashMap};

use crate::error::CsiError;

pub mod compat;

/// The type of [`Parameters::fs_type`], re-exported on purpose: the control
/// planes read it and depend on the CSI crate, not on host IO.
pub use carina_sys::format::FsType;
pub use carina_sys::mkfs::MkfsOptions;

pub const DISK_GROUP: &str = "carina.storage.io/disk-group-name";
pub const EXCLUSIVE: &str = "carina.storage.io/exclusively-raw-disk";
pub const BACKEND_GROUP: &str = "carina.storage.io/backend-disk-group-name";
pub const CACHE_GROUP: &str = "carina.storage.io/cache-disk-group-name";
pub const CACHE_RATIO: &str = "carina.storage.io/cache-disk-ratio";
pub const CACHE_POLICY: &str = "carina.storage.io/cache-policy";
pub const FS_TYPE: &str = "csi.storage.k8s.io/fstype";
/// Options added to mkfs when a volume of the class is first formatted,
/// checked for the class's filesystem ([`carina_sys::mkfs`]).
pub const MKFS_OPTIONS: &str = crate::context::MKFS_OPTIONS;
/// Carina's opt-in to pod migration, which its documentation also shows as
/// a StorageClass parameter (Carina's webhook copies it onto the pods of
/// the class as an annotation of the same name).
pub const POD_MIGRATION: &str = "carina.storage.io/allow-pod-migration-if-node-notready";
/// Older name of [`DISK_GROUP`] that Carina's documentation still shows.
pub const DISK_TYPE_ALIAS: &str = "carina.storage.io/disk-type";
/// Older name of [`EXCLUSIVE`] that Carina's documentation still shows.
pub const EXCLUSIVITY_ALIAS: &str = "carina.storage.io/exclusivity-disk";
/// Older name of [`BACKEND_GROUP`] that Carina's documentation still shows.
pub const BACKEND_TYPE_ALIAS: &str = "carina.storage.io/backend-disk-type";
/// Older name of [`CACHE_GROUP`] that Carina's documentation still shows.
pub const CACHE_TYPE_ALIAS: &str = "carina.storage.io/cache-disk-type";

/// Deprecated keys and the keys that replace them.
pub const ALIASES: &[(&str, &str)] = &[
    (DISK_TYPE_ALIAS, DISK_GROUP),
    (EXCLUSIVITY_ALIAS, EXCLUSIVE),
    (BACKEND_TYPE_ALIAS, BACKEND_GROUP),
    (CACHE_TYPE_ALIAS, CACHE_GROUP),
];

/// The bcache cache modes a StorageClass may ask for (Carina documents
/// the first three; `none` is the kernel's fourth).
pub const CACHE_POLICIES: &[&str] = &["writethrough", "writeback", "writearound", "none"];

const CARINA_PREFIX: &str = "carina.storage.io/";

/// Parses a filesystem name from a request; `field` is named in the error.
pub fn parse_fs_type(field: &str, value: &str) -> Result<FsType, CsiError> {
    FsType::from_name(value).ok_or_else(|| {
        CsiError::invalid(
            field,
            format!(
                "unsupported filesystem {value:?} ({})",
                carina_sys::format::FS_NAMES
            ),
        )
    })
}

/// Checks mkfs options for `fs` (ext4 when none), the one rule of the
/// controller and the node; `field` is named in the error.
pub fn parse_mkfs_options(
    field: &str,
    fs: Option<FsType>,
    text: &str,
) -> Result<MkfsOptions, CsiError> {
    let fs = fs.unwrap_or(FsType::Ext4);
    MkfsOptions::parse(fs, text)
        .map_err(|why| CsiError::invalid(field, format!("{why} (for {})", fs.as_str())))
}

/// bcache tiering parameters: the volume is made in `backend_group`, a
/// cache of `cache_ratio` percent of its size in `cache_group`, and the
/// node assembles them (NodeStorage `CreateBcache`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BcacheParams {
    pub backend_group: String,
    pub cache_group: String,
    /// Percent of the volume size given to the cache, 1..=100.
    pub cache_ratio: u8,
    /// One of [`CACHE_POLICIES`]; `writethrough` when not given.
    pub cache_policy: String,
}

// The bcache geometry lives below this crate, where the node's engine
// reaches it too; control planes keep naming it through this module.
pub use carina_sys::bcache::{BCACHE_DATA_OFFSET, BCACHE_MIN_CACHE, cache_bytes};

impl BcacheParams {
    /// [`cache_bytes`] at this class's ratio.
    pub fn cache_bytes(&self, backing_bytes: u64) -> u64 {
        cache_bytes(backing_bytes, u32::from(self.cache_ratio))
    }
}

/// Validated parameters of a CreateVolume request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Parameters {
    pub group: Option<String>,
    pub exclusive: bool,
    pub fs_type: Option<FsType>,
    /// [`MKFS_OPTIONS`] as given; checked by [`Self::mkfs_options`] once
    /// the filesystem is known (external-provisioner passes the class's
    /// fstype in the capability, not among the parameters).
    pub mkfs_options: Option<String>,
    pub bcache: Option<BcacheParams>,
    /// [`POD_MIGRATION`]: the class's pods allow migration off a NotReady
    /// node. Recorded; it changes nothing about the volume itself (the
    /// controller acts on the same key as a pod annotation).
    pub pod_migration: bool,
    /// Keys we do not interpret (kept for the record).
    pub other: BTreeMap<String, String>,
    /// `carina.storage.io/*` keys this project does not know, accepted and
    /// reported by the caller ([`compat::report`]).
    pub unknown: Vec<String>,
    /// Known keys given but without effect, as Go Carina read them, each
    /// with the reason (reported by the caller like [`Self::unknown`]).
    pub ignored: Vec<(String, &'static str)>,
    /// Deprecated keys the request used (from [`ALIASES`]); the caller
    /// logs a deprecation warning for each.
    pub deprecated: Vec<&'static str>,
}

impl Parameters {
    /// Validates `parameters` of a CreateVolume request.
    pub fn parse(raw: &HashMap<String, String>) -> Result<Parameters, CsiError> {
        let mut p = Parameters::default();
        let field = |k: &str| format!("parameters[{k:?}]");
        let mut keys: Vec<&String> = raw.keys().collect();
        keys.sort();
        for (old, new) in ALIASES {
            if let (Some(a), Some(b)) = (raw.get(*old), raw.get(*new))
                && a != b
            {
                return Err(CsiError::invalid(
                    field(old),
                    format!("{a:?} contradicts {new} {b:?}; give only {new}"),
                ));
            }
        }
        for key in keys {
            let value = raw[key].as_str();
            let written = key.as_str();
            // A deprecated key is read as the key that replaced it.
            let key = match ALIASES.iter().find(|(old, _)| old == key) {
                Some((old, new)) => {
                    p.deprecated.push(old);
                    new
                }
                None => key.as_str(),
            };
            match key {
                DISK_GROUP => {
                    if value.is_empty() {
                        return Err(CsiError::invalid(field(written), "must not be empty"));
                    }
                    p.group = Some(value.to_string());
                }
                EXCLUSIVE => p.exclusive = parse_bool(&field(written), value)?,
                POD_MIGRATION => p.pod_migration = parse_bool(&field(written), value)?,
                FS_TYPE => p.fs_type = Some(parse_fs_type(&field(key), value)?),
                MKFS_OPTIONS => p.mkfs_options = Some(value.to_string()),
                BACKEND_GROUP | CACHE_GROUP | CACHE_RATIO | CACHE_POLICY => {}
                k if k.starts_with(CARINA_PREFIX) => p.unknown.push(k.to_string()),
                k => {
                    p.other.insert(k.to_string(), value.to_string());
                }
            }
        }
        p.bcache = parse_bcache(raw, &mut p.ignored)?;
        if p.bcache.is_some()
            && let Some((written, _)) = lookup(raw, DISK_GROUP)
        {
            // Go Carina makes a tiered volume in the backend group and
            // reads no disk-group-name beside it (its own documented
            // example gives both).
            p.group = None;
            p.ignored.push((written.to_string(), compat::BESIDE_BCACHE));
        }
        Ok(p)
    }

    /// The class's mkfs options checked for the filesystem its volumes
    /// get ([`Self::fs_type`], ext4 when none); `None` when not given or
    /// blank. The error names the parameter and the option refused.
    pub fn mkfs_options(&self) -> Result<Option<MkfsOptions>, CsiError> {
        let Some(text) = self.mkfs_options.as_deref() else {
            return Ok(None);
        };
        let options =
            parse_mkfs_options(&format!("parameters[{MKFS_OPTIONS:?}]"), self.fs_type, text)?;
        Ok((!options.is_empty()).then_some(options))
    }
}

/// `"true"`, `"false"` or empty (false), as Carina reads its flags.
fn parse_bool(field: &str, value: &str) -> Result<bool, CsiError> {
    match value {
        "true" => Ok(true),
        "false" | "" => Ok(false),
        other => Err(CsiError::invalid(
            field,
            format!("{other:?} is not \"true\" or \"false\""),
        )),
    }
}

/// The value of `key` or of its deprecated alias, with the key written.
fn lookup<'a>(raw: &'a HashMap<String, String>, key: &'static str) -> Option<(&'a str, &'a str)> {
    if let Some((k, v)) = raw.get_key_value(key) {
        return Some((k, v));
    }
    ALIASES
        .iter()
        .filter(|(_, new)| *new == key)
        .find_map(|(old, _)| raw.get_key_value(*old))
        .map(|(k, v)| (k.as_str(), v.as_str()))
}

fn parse_bcache(
    raw: &HashMap<String, String>,
    ignored: &mut Vec<(String, &'static str)>,
) -> Result<Option<BcacheParams>, CsiError> {
    let given: Vec<&str> = [BACKEND_GROUP, CACHE_GROUP, CACHE_RATIO, CACHE_POLICY]
        .iter()
        .filter_map(|k| lookup(raw, k).map(|(written, _)| written))
        .collect();
    let Some(first) = given.first() else {
        return Ok(None);
    };
    // Go Carina tiers a volume only when the ratio is given and not "0";
    // otherwise it makes a plain volume and reads none of these keys.
    if matches!(lookup(raw, CACHE_RATIO), None | Some((_, "" | "0"))) {
        ignored.extend(
            given
                .iter()
                .map(|k| (k.to_string(), compat::NO_CACHE_RATIO)),
        );
        return Ok(None);
    }
    // A whole raw disk cannot hold a cache: asking for one beside the
    // bcache keys is a mistake.
    if let Some((written, value)) = lookup(raw, EXCLUSIVE)
        && !matches!(value, "false" | "")
    {
        return Err(CsiError::invalid(
            format!("parameters[{written:?}]"),
            format!("cannot be combined with the bcache parameters ({first})"),
        ));
    }
    let need = |k: &'static str| {
        lookup(raw, k)
            .filter(|(_, v)| !v.is_empty())
            .map(|(_, v)| v.to_string())
            .ok_or_else(|| {
                CsiError::invalid(
                    format!("parameters[{k:?}]"),
                    "required with the other bcache parameters",
                )
            })
    };
    let ratio_text = need(CACHE_RATIO)?;
    let cache_ratio: u8 = ratio_text
        .parse()
        .ok()
        .filter(|r| (1..=100).contains(r))
        .ok_or_else(|| {
            CsiError::invalid(
                format!("parameters[{CACHE_RATIO:?}]"),
                format!("{ratio_text:?} is not a percentage from 1 to 100"),
            )
        })?;
    let cache_policy = raw
        .get(CACHE_POLICY)
        .cloned()
        .unwrap_or_else(|| "writethrough".into());
    if !CACHE_POLICIES.contains(&cache_policy.as_str()) {
        return Err(CsiError::invalid(
            format!("parameters[{CACHE_POLICY:?}]"),
            format!("{cache_policy:?} is not writethrough, writeback, writearound or none"),
        ));
    }
    Ok(Some(BcacheParams {
        backend_group: need(BACKEND_GROUP)?,
        cache_group: need(CACHE_GROUP)?,
        cache_ratio,
        cache_policy,
    }))
}

#[cfg(test)]
mod tests;
