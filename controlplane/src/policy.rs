//! The one mapping between the wire's device-group `Policy` and the names
//! Kubernetes objects and the direct mode carry ([`carina_api::policy`]):
//! the capacity publisher writes them, both provisioners read them.

use carina_api::policy;
use carina_proto::nodestorage as pb;

/// The name of a wire policy (`LVM`, `RAW`, `HOST`, `UNSPECIFIED`).
pub fn name(p: pb::Policy) -> &'static str {
    match p {
        pb::Policy::Lvm => policy::LVM,
        pb::Policy::Raw => policy::RAW,
        pb::Policy::Host => policy::HOST,
        pb::Policy::Unspecified => policy::UNSPECIFIED,
    }
}

/// The wire policy of a name; anything unknown is `Unspecified`.
pub fn from_name(name: &str) -> pb::Policy {
    match name {
        policy::LVM => pb::Policy::Lvm,
        policy::RAW => pb::Policy::Raw,
        policy::HOST => pb::Policy::Host,
        _ => pb::Policy::Unspecified,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for p in [
            pb::Policy::Lvm,
            pb::Policy::Raw,
            pb::Policy::Host,
            pb::Policy::Unspecified,
        ] {
            assert_eq!(from_name(name(p)), p);
        }
        assert_eq!(from_name("ZFS"), pb::Policy::Unspecified);
    }
}
