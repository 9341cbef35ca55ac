//! Go Carina's volume ids in the direct plane: none is served here.

use carina_csi::CsiError;
use carina_csi::legacy::LegacyId;

/// `NOT_FOUND` for a Go Carina volume id: this plane has no
/// `LogicVolume`s to say where such a volume is, and Go Carina's volumes
/// are taken over through the Kubernetes plane.
pub(super) fn refuse_go_id(volume_id: &str) -> Result<(), CsiError> {
    match LegacyId::parse(volume_id) {
        Some(id) => Err(CsiError::NotFound(format!(
            "volume {:?} is a Go Carina volume id; Go Carina's volumes are taken over and \
             served through the Kubernetes control plane (`carinactl migrate apply`), \
             not the direct one",
            id.encode()
        ))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    #[test]
    fn go_ids_are_not_found_here() {
        for id in ["volume-pvc-1", "host-pvc-1", "thin-pvc-1"] {
            let e = refuse_go_id(id).expect_err(id);
            assert_eq!(e.code(), Code::NotFound);
            assert!(e.to_string().contains("Kubernetes control plane"), "{e}");
        }
        refuse_go_id("pvc-1@node-a").expect("ours");
        refuse_go_id("volume-pvc-1@node-a").expect("ours, named like Go's");
    }
}
