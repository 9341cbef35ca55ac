//! StorageClass forms written for Go Carina, read as Go Carina read them:
//! the `ssd`/`hdd` shorthand for a device group, and the report of keys
//! that are accepted without effect (an unknown `carina.storage.io/*` key,
//! a known key Go Carina did not read in that combination).
//!
//! **Shorthand.** Go Carina's changelog told users to write
//! `disk-group-name: ssd` (or `hdd`); Go Carina read the value in any case
//! and named the group of that name where one is configured, else
//! `carina-vg-ssd` (`carina-vg-hdd`). [`resolve_group`] is that rule; the
//! CSI controller applies it to `disk-group-name` and to both bcache group
//! keys against the groups the nodes publish
//! ([`crate::Provisioner::group_names`]), and the scheduler against the
//! groups of each node.

use std::collections::BTreeSet;
use std::sync::{Mutex, OnceLock};

use super::{BcacheParams, POD_MIGRATION, Parameters};

/// Go Carina's group shorthands and the groups they stand for.
pub const SHORTHANDS: &[(&str, &str)] = &[("ssd", "carina-vg-ssd"), ("hdd", "carina-vg-hdd")];

/// Why `disk-group-name` beside the bcache keys has no effect.
pub const BESIDE_BCACHE: &str =
    "a bcache volume is made in backend-disk-group-name (as Go Carina did)";
/// Why bcache keys have no effect without a cache ratio.
pub const NO_CACHE_RATIO: &str =
    "cache-disk-ratio is missing, empty or \"0\": no cache, a plain volume (as Go Carina did)";

/// The most distinct keys reported; later ones are not remembered (a
/// bound on memory, not on correctness: a key past it is reported again).
const REMEMBERED: usize = 256;

/// The shorthand `written` is (`ssd` or `hdd`, any case), with its group.
pub fn shorthand(written: &str) -> Option<(&'static str, &'static str)> {
    SHORTHANDS
        .iter()
        .find(|(short, _)| short.eq_ignore_ascii_case(written))
        .copied()
}

/// The group a StorageClass's group name `written` names, `exists` telling
/// which groups there are: a name that is no shorthand is itself; a
/// shorthand is the group of the written name if there is one, else that of
/// its lowercase name, else its `carina-vg-*` group (also when none
/// exists: the error then names the group Go Carina would have used).
pub fn resolve_group(written: &str, exists: impl Fn(&str) -> bool) -> String {
    let Some((short, long)) = shorthand(written) else {
        return written.to_string();
    };
    [written, short]
        .into_iter()
        .find(|name| exists(name))
        .unwrap_or(long)
        .to_string()
}

impl Parameters {
    /// Whether a group name of the request is a shorthand, so that
    /// [`Self::resolve_groups`] needs the groups there are.
    pub fn uses_shorthand(&self) -> bool {
        let bcache = self
            .bcache
            .iter()
            .flat_map(|b| [&b.backend_group, &b.cache_group]);
        self.group
            .iter()
            .chain(bcache)
            .any(|g| shorthand(g).is_some())
    }

    /// Replaces each shorthand group name by the group it names
    /// ([`resolve_group`]); returns what was replaced by what.
    pub fn resolve_groups(&mut self, exists: impl Fn(&str) -> bool) -> Vec<(String, String)> {
        let mut changed = Vec::new();
        let mut resolve = |g: &mut String| {
            let resolved = resolve_group(g, &exists);
            if resolved != *g {
                changed.push((std::mem::replace(g, resolved.clone()), resolved));
            }
        };
        if let Some(g) = self.group.as_mut() {
            resolve(g);
        }
        if let Some(BcacheParams {
            backend_group,
            cache_group,
            ..
        }) = self.bcache.as_mut()
        {
            resolve(backend_group);
            resolve(cache_group);
        }
        changed
    }
}

/// What to tell the owner of a StorageClass about an unknown key.
pub fn unknown_hint(key: &str) -> String {
    // Go Carina's changelog spelled the migration key without "node-";
    // Go Carina itself never read that spelling.
    if key == "carina.storage.io/allow-pod-migration-if-notready" {
        return format!("not read (Go Carina did not read it either); the key is {POD_MIGRATION}");
    }
    "not known to this driver; accepted and ignored".to_string()
}

/// Logs, once per key for the life of the process, each key of `p` that
/// has no effect: unknown `carina.storage.io/*` keys and known keys Go
/// Carina did not read in their combination. Returns the keys logged now.
pub fn report(p: &Parameters, volume: &str) -> Vec<String> {
    static SEEN: OnceLock<Mutex<BTreeSet<String>>> = OnceLock::new();
    let seen = SEEN.get_or_init(Mutex::default);
    let first_time = |key: &str| {
        // A poisoned lock only means another thread panicked while
        // inserting; the set is still a set.
        let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
        if seen.contains(key) {
            return false;
        }
        if seen.len() < REMEMBERED {
            seen.insert(key.to_string());
        }
        true
    };
    let mut logged = Vec::new();
    for key in &p.unknown {
        if first_time(key) {
            let hint = unknown_hint(key);
            tracing::warn!(carina.volume.name = %volume, parameter = %key, "unknown StorageClass parameter {key}: {hint}");
            logged.push(key.clone());
        }
    }
    for (key, why) in &p.ignored {
        if first_time(&format!("{key}\u{0}{why}")) {
            tracing::warn!(carina.volume.name = %volume, parameter = %key, "StorageClass parameter {key} has no effect: {why}");
            logged.push(key.clone());
        }
    }
    logged
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::super::{BACKEND_GROUP, CACHE_GROUP, CACHE_RATIO, DISK_GROUP};
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn shorthand_reads_as_go_carina_read_it() {
        let none = |_: &str| false;
        assert_eq!(resolve_group("ssd", none), "carina-vg-ssd");
        assert_eq!(resolve_group("hdd", none), "carina-vg-hdd");
        // Go Carina lowercased the value first.
        assert_eq!(resolve_group("SSD", none), "carina-vg-ssd");
        assert_eq!(resolve_group("Hdd", none), "carina-vg-hdd");
        // A group of the written name wins, as a configured group did.
        assert_eq!(resolve_group("ssd", |g| g == "ssd"), "ssd");
        assert_eq!(resolve_group("SSD", |g| g == "ssd"), "ssd");
        assert_eq!(resolve_group("SSD", |g| g == "SSD" || g == "ssd"), "SSD");
        // Nothing else is a shorthand, and nothing else changes.
        for other in ["nvme", "carina-vg-ssd", "ssd2", " ssd", "", "carina-lvm"] {
            assert_eq!(resolve_group(other, none), other);
            assert!(shorthand(other).is_none(), "{other:?}");
        }
    }

    /// The CHANGELOG's form `disk-group-name: hdd` provisions in
    /// `carina-vg-hdd`, and Go's bcache example (`hdd` behind an `ssd`
    /// cache) in the `carina-vg-*` groups.
    #[test]
    fn parameters_resolve_their_shorthands() {
        let mut p = Parameters::parse(&map(&[(DISK_GROUP, "hdd")])).expect("valid");
        assert!(p.uses_shorthand());
        let changed = p.resolve_groups(|g| g.starts_with("carina-vg-"));
        assert_eq!(p.group.as_deref(), Some("carina-vg-hdd"));
        assert_eq!(changed, [("hdd".to_string(), "carina-vg-hdd".to_string())]);
        let mut p = Parameters::parse(&map(&[
            (BACKEND_GROUP, "hdd"),
            (CACHE_GROUP, "SSD"),
            (CACHE_RATIO, "50"),
        ]))
        .expect("valid");
        assert!(p.uses_shorthand());
        p.resolve_groups(|_| false);
        let b = p.bcache.expect("tiered");
        assert_eq!(
            (b.backend_group.as_str(), b.cache_group.as_str()),
            ("carina-vg-hdd", "carina-vg-ssd")
        );
        let p = Parameters::parse(&map(&[(DISK_GROUP, "carina-lvm")])).expect("valid");
        assert!(!p.uses_shorthand());
    }

    #[test]
    fn each_key_without_effect_is_reported_once() {
        let key = "carina.storage.io/report-once-test";
        let p = Parameters::parse(&map(&[(key, "x"), (DISK_GROUP, "g")])).expect("accepted");
        assert_eq!(p.unknown, [key]);
        assert_eq!(report(&p, "pvc-1"), [key]);
        assert!(report(&p, "pvc-2").is_empty(), "reported twice");
        let typo = "carina.storage.io/allow-pod-migration-if-notready";
        assert!(unknown_hint(typo).contains(POD_MIGRATION));
    }
}
