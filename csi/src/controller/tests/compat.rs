//! The controller's answers to what Go Carina made or accepted: its
//! volume ids and its group shorthand, through the fake provisioner of
//! the parent module.

use super::*;

/// A Go Carina id reaches the provisioner in every call that reads an id
/// (before, DeleteVolume answered success without asking it, and the
/// others NOT_FOUND), and takes the in-flight key of its object.
#[tokio::test]
async fn go_ids_reach_the_provisioner() {
    let fake = Arc::new(Fake::default());
    let svc = ControllerService::new(fake.clone());
    let go_id = "volume-pvc-0b6f3c2e";
    let mut go = fake_volume("unused", GIB as u64);
    go.volume_id = go_id.into();
    fake.volumes
        .lock()
        .expect("not poisoned")
        .insert(go_id.into(), go);
    let validated = svc
        .validate(csi::ValidateVolumeCapabilitiesRequest {
            volume_id: go_id.into(),
            volume_capabilities: vec![cap(Mode::SingleNodeWriter, mount(""))],
            ..Default::default()
        })
        .await
        .expect("validated");
    assert!(validated.confirmed.is_some());
    let got = svc
        .get(csi::ControllerGetVolumeRequest {
            volume_id: go_id.into(),
        })
        .await
        .expect("got");
    assert_eq!(got.volume.map(|v| v.volume_id).as_deref(), Some(go_id));
    let grown = svc
        .expand(csi::ControllerExpandVolumeRequest {
            volume_id: go_id.into(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: 2 * GIB,
                limit_bytes: 0,
            }),
            ..Default::default()
        })
        .await
        .expect("grown");
    assert_eq!(grown.capacity_bytes, 2 * GIB);
    // A create of the object's name holds the key a Go id's delete takes.
    let held = svc.claim("pvc-0b6f3c2e").expect("free");
    let busy = svc
        .delete(csi::DeleteVolumeRequest {
            volume_id: go_id.into(),
            ..Default::default()
        })
        .await
        .expect_err("busy");
    assert_eq!(busy.code(), Code::Aborted);
    drop(held);
    svc.delete(csi::DeleteVolumeRequest {
        volume_id: go_id.into(),
        ..Default::default()
    })
    .await
    .expect("deleted");
    assert!(
        fake.volumes.lock().expect("not poisoned").is_empty(),
        "the provisioner was asked to delete it"
    );
}

/// Go Carina's `disk-group-name: ssd` reaches the control plane as the
/// group Go Carina read it as: a published group of the written name, else
/// `carina-vg-ssd`; in CreateVolume and GetCapacity alike.
#[tokio::test]
async fn group_shorthand_is_read_against_published_groups() {
    let shorthand = |name: &str, group: &str| {
        let mut r = create_req(name);
        r.parameters = HashMap::from([(crate::params::DISK_GROUP.to_string(), group.to_string())]);
        r
    };
    let capacity = |group: &str| csi::GetCapacityRequest {
        parameters: HashMap::from([(crate::params::DISK_GROUP.to_string(), group.to_string())]),
        ..Default::default()
    };
    for (published, want) in [
        (&["carina-vg-ssd", "carina-vg-hdd"][..], "carina-vg-ssd"),
        (&["ssd", "carina-vg-ssd"][..], "ssd"),
        (&[][..], "carina-vg-ssd"),
    ] {
        let fake = Arc::new(Fake {
            group_names: published.iter().map(|g| g.to_string()).collect(),
            ..Default::default()
        });
        let svc = ControllerService::new(fake.clone());
        svc.create(shorthand("pvc-1", "SSD"))
            .await
            .expect("created");
        svc.capacity(capacity("ssd")).await.expect("capacity");
        svc.create(shorthand("pvc-2", "nvme"))
            .await
            .expect("created");
        let asked = fake.groups_asked.lock().expect("not poisoned").clone();
        assert_eq!(
            asked,
            [
                Some(want.to_string()),
                Some(want.to_string()),
                Some("nvme".to_string())
            ],
            "{published:?}"
        );
    }
}
