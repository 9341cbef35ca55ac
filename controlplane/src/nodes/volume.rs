//! The rules both control planes apply to a volume they answer for, written
//! once: whether a volume that already holds a create's name fits the
//! request ([`unfit`]), the file system a new volume's context names
//! ([`fs_type`]), and GetCapacity as the sum of the groups asked about
//! ([`capacity`]). Pure functions over what each plane read.

use carina_csi::params::FsType;
use carina_csi::{CapacityInfo, VolumeRequest, sizes};

use super::spec::NodeSpec;

/// A volume that already holds a create's name, as either plane reads it.
#[derive(Debug, Clone, Copy)]
pub struct Existing<'a> {
    /// Its size in bytes (of a tiered volume, its bcache device's), if
    /// known.
    pub bytes: Option<u64>,
    /// Its device group (of a tiered volume, the backing group).
    pub group: &'a str,
    /// Whether it is a whole raw disk.
    pub exclusive: bool,
    /// Its node.
    pub node: &'a NodeSpec,
}

/// Why `existing` does not satisfy `req`, if it does not, the first reason
/// in this order: size, group, `tiering` (the plane's reason its tiering
/// differs, if it does), exclusivity, `policy` (the plane's reason the
/// group's policy does not suit, if it does not), accessible node.
pub fn unfit(
    req: &VolumeRequest,
    existing: &Existing<'_>,
    tiering: Option<String>,
    policy: Option<String>,
) -> Option<String> {
    if let Some(why) = sizes::unsatisfied(&req.capacity, existing.bytes) {
        return Some(why);
    }
    if let Some(g) = &req.parameters.group
        && g != existing.group
    {
        return Some(format!("the request names group {g:?}"));
    }
    if let Some(why) = tiering {
        return Some(why);
    }
    if req.parameters.exclusive != existing.exclusive {
        return Some(format!(
            "the request asks for exclusively-raw-disk {}",
            req.parameters.exclusive
        ));
    }
    if let Some(why) = policy {
        return Some(why);
    }
    let accessible = req.accessibility.requisite.is_empty()
        || req
            .accessibility
            .requisite
            .iter()
            .any(|t| existing.node.matches(t));
    if !accessible {
        return Some("its node is outside the requested accessible topology".to_string());
    }
    None
}

/// The file system a volume's context names: the request's, unless it
/// asks for a block volume.
pub fn fs_type(req: &VolumeRequest) -> Option<FsType> {
    if req.block {
        None
    } else {
        req.parameters.fs_type
    }
}

/// GetCapacity over `groups`, each its `(allocatable, largest allocatable)`
/// bytes: the allocatable bytes summed, the largest volume the largest of
/// any group.
pub fn capacity(groups: impl IntoIterator<Item = (u64, u64)>) -> CapacityInfo {
    let mut info = CapacityInfo::default();
    for (allocatable, largest) in groups {
        info.available_bytes = info.available_bytes.saturating_add(allocatable);
        info.maximum_volume_size = info.maximum_volume_size.max(largest);
    }
    info
}

#[cfg(test)]
mod tests {
    use super::*;
    use carina_csi::{TOPOLOGY_KEY, Topology};

    fn node(name: &str) -> NodeSpec {
        NodeSpec {
            name: name.to_string(),
            endpoint: String::new(),
            topology: Topology::from([(TOPOLOGY_KEY.to_string(), name.to_string())]),
        }
    }

    fn request(required: u64) -> VolumeRequest {
        VolumeRequest {
            name: "pvc-1".into(),
            local_name: "pvc-1".into(),
            capacity: carina_csi::CapacityRange {
                required_bytes: required,
                limit_bytes: 0,
            },
            parameters: carina_csi::params::Parameters::default(),
            accessibility: carina_csi::Accessibility::default(),
            block: false,
            source: None,
        }
    }

    #[test]
    fn the_first_reason_in_order_is_given() {
        let a = node("a");
        let existing = Existing {
            bytes: Some(10),
            group: "ssd",
            exclusive: false,
            node: &a,
        };
        assert_eq!(unfit(&request(10), &existing, None, None), None);
        assert!(unfit(&request(20), &existing, None, None).is_some());
        let mut named = request(10);
        named.parameters.group = Some("hdd".into());
        let why = unfit(&named, &existing, Some("tiering".into()), None);
        assert!(why.expect("group").contains("hdd"), "group before tiering");
        assert_eq!(
            unfit(
                &request(10),
                &existing,
                Some("tiering".into()),
                Some("policy".into())
            ),
            Some("tiering".into())
        );
        let mut exclusive = request(10);
        exclusive.parameters.exclusive = true;
        let why = unfit(&exclusive, &existing, None, Some("policy".into()));
        assert!(why.expect("exclusive").contains("exclusively"));
        let mut elsewhere = request(10);
        elsewhere.accessibility.requisite = vec![node("b").topology];
        assert!(unfit(&elsewhere, &existing, None, None).is_some());
        elsewhere.accessibility.requisite.push(a.topology.clone());
        assert_eq!(unfit(&elsewhere, &existing, None, None), None);
    }

    #[test]
    fn capacity_sums_room_and_keeps_the_largest() {
        let info = capacity([(10, 4), (u64::MAX, 7), (0, 0)]);
        assert_eq!(info.available_bytes, u64::MAX);
        assert_eq!(info.maximum_volume_size, 7);
        assert_eq!(capacity([]).maximum_volume_size, 0);
    }
}
