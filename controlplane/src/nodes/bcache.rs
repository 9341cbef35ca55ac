//! Tiered (bcache) volumes as both control planes ask a node for them:
//! the one `CreateBcache` request that makes the backing volume, the
//! cache volume and the device together ([`create_request`]), whether an
//! existing device is tiered as a request asks ([`tiering_differs`]), the
//! refusal to grow one ([`cannot_grow`]), and the one reading of a cache
//! policy ([`cache_mode`], [`cache_policy_name`]). The volume names come from
//! [`LogicVolumeSpec::backing_volume`] and
//! [`LogicVolumeSpec::cache_volume`], so a volume made by either plane is
//! the same on its node.

use carina_api::LogicVolumeSpec;
use carina_csi::CsiError;
use carina_csi::params::BcacheParams;
use carina_proto::nodestorage as pb;

/// The node's cache mode of a cache policy (empty: writethrough); `None`
/// for a name not in [`carina_csi::params::CACHE_POLICIES`].
pub fn cache_mode(policy: &str) -> Option<pb::CacheMode> {
    Some(match policy {
        "" | "writethrough" => pb::CacheMode::Writethrough,
        "writeback" => pb::CacheMode::Writeback,
        "writearound" => pb::CacheMode::Writearound,
        "none" => pb::CacheMode::None,
        _ => return None,
    })
}

/// The policy name of a node's cache mode (unspecified: writethrough, as
/// the node reads it).
pub fn cache_policy_name(mode: pb::CacheMode) -> &'static str {
    match mode {
        pb::CacheMode::Unspecified | pb::CacheMode::Writethrough => "writethrough",
        pb::CacheMode::Writeback => "writeback",
        pb::CacheMode::Writearound => "writearound",
        pb::CacheMode::None => "none",
    }
}

/// `CreateBcache` of the tiered volume `name`: a backing volume of
/// `size_bytes` in `backend_group`, a cache of `ratio` percent of it in
/// `cache_group`, in the mode of `policy` (writethrough when it names
/// none the node knows; the callers checked it).
pub fn create_request(
    name: &str,
    backend_group: &str,
    size_bytes: u64,
    cache_group: &str,
    ratio: u32,
    policy: &str,
) -> pb::CreateBcacheRequest {
    let mode = cache_mode(policy).unwrap_or(pb::CacheMode::Writethrough);
    pb::CreateBcacheRequest {
        name: name.to_string(),
        backing_volume: LogicVolumeSpec::backing_volume(name),
        cache_volume: LogicVolumeSpec::cache_volume(name),
        cache_mode: mode.into(),
        backing_device_group: backend_group.to_string(),
        size_bytes,
        cache_device_group: cache_group.to_string(),
        cache_ratio_percent: ratio,
    }
}

/// Why a device tiered as (`backend_group`, `cache_group`, `ratio`,
/// `policy`) is not what `want` asks for, if it is not.
pub fn tiering_differs(
    want: &BcacheParams,
    backend_group: &str,
    cache_group: &str,
    ratio: u32,
    policy: &str,
) -> Option<String> {
    let same = want.backend_group == backend_group
        && want.cache_group == cache_group
        && u32::from(want.cache_ratio) == ratio
        && cache_mode(&want.cache_policy) == cache_mode(policy);
    (!same).then(|| {
        format!(
            "it is cached by group {cache_group:?} ({ratio}%, {policy}) and the request asks for group {:?} behind {:?} ({}%, {})",
            want.cache_group, want.backend_group, want.cache_ratio, want.cache_policy
        )
    })
}

/// `FAILED_PRECONDITION` for growing the bcache volume `volume_id` (of
/// `current` bytes, cached by `cache_group`): a bcache device keeps the
/// size it was made with.
pub fn cannot_grow(volume_id: &str, cache_group: &str, current: u64) -> CsiError {
    CsiError::FailedPrecondition(format!(
        "volume {volume_id:?} is a bcache device (cached by group {cache_group:?}) of {current} bytes; bcache volumes cannot grow"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn want() -> BcacheParams {
        BcacheParams {
            backend_group: "hdd".into(),
            cache_group: "ssd".into(),
            cache_ratio: 20,
            cache_policy: "writeback".into(),
        }
    }

    #[test]
    fn cache_modes_and_their_names() {
        for policy in carina_csi::params::CACHE_POLICIES {
            let mode = cache_mode(policy).expect("a known policy");
            assert_eq!(cache_policy_name(mode), *policy);
        }
        assert_eq!(cache_mode(""), Some(pb::CacheMode::Writethrough));
        assert_eq!(cache_mode("Writeback"), None);
    }

    #[test]
    fn one_request_makes_both_volumes() {
        let r = create_request("pvc-1", "hdd", 8 << 20, "ssd", 20, "writeback");
        assert_eq!(r.backing_volume, "pvc-1+data");
        assert_eq!(r.cache_volume, "pvc-1+cache");
        assert_eq!(r.cache_mode(), pb::CacheMode::Writeback);
        assert_eq!(
            (r.backing_device_group.as_str(), r.size_bytes),
            ("hdd", 8 << 20)
        );
        assert_eq!(
            (r.cache_device_group.as_str(), r.cache_ratio_percent),
            ("ssd", 20)
        );
        let r = create_request("v", "hdd", 1, "ssd", 1, "");
        assert_eq!(r.cache_mode(), pb::CacheMode::Writethrough);
    }

    #[test]
    fn tiering_must_match_every_parameter() {
        let w = want();
        assert_eq!(tiering_differs(&w, "hdd", "ssd", 20, "writeback"), None);
        for (backend, cache, ratio, policy) in [
            ("other", "ssd", 20, "writeback"),
            ("hdd", "other", 20, "writeback"),
            ("hdd", "ssd", 21, "writeback"),
            ("hdd", "ssd", 20, "writethrough"),
        ] {
            let why = tiering_differs(&w, backend, cache, ratio, policy).expect("differs");
            assert!(why.contains("the request asks for group \"ssd\""), "{why}");
        }
        let through = BcacheParams {
            cache_policy: "writethrough".into(),
            ..want()
        };
        assert_eq!(tiering_differs(&through, "hdd", "ssd", 20, ""), None);
    }

    #[test]
    fn growth_is_refused_naming_the_volume() {
        let e = cannot_grow("v@n", "ssd", 42);
        assert_eq!(e.code(), tonic::Code::FailedPrecondition);
        assert!(e.to_string().contains("\"v@n\""), "{e}");
        assert!(e.to_string().contains("cannot grow"), "{e}");
    }
}
