//! The pure decisions on a `LogicVolume` as the provisioner sees it: what
//! its status says about a create ([`create_outcome`]), an expand
//! ([`expand_outcome`]) or a delete ([`is_gone`]), and whether a failure
//! is given up (by the one retry rule, [`carina_api::state::Retry`]); whether an existing
//! object fits a request ([`incompatible`]); and the CSI view of a made
//! volume ([`provisioned`]). No API calls here; the verbs (`create`,
//! `expand`, `delete`) do the IO and ask these functions what it means.

use std::collections::BTreeMap;

use carina_api::policy;
use carina_api::quantity::quantity_bytes;
use carina_api::state::Retry;
use carina_api::{EXCLUSIVE_ANNOTATION, LogicVolume, LogicVolumeStatus, PATH_ANNOTATION};
use carina_csi::params::{BCACHE_DATA_OFFSET, FsType};
use carina_csi::{CsiError, ProvisionedVolume, VolumeRequest, context};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::ResourceExt;

use super::error::status_error;
use super::records::node_spec;
use crate::nodes::volume::{Existing, unfit};

/// What the status of a create says.
#[derive(Debug)]
pub(super) enum CreateOutcome {
    Made(LogicVolume),
    /// The create failed. `given_up`: the bridge does not try it again
    /// soon, so the object goes and a retry places the volume anew; else
    /// the object stays to the bridge, still holding its room.
    Failed {
        lv: LogicVolume,
        error: CsiError,
        given_up: bool,
    },
    Gone,
}
use CreateOutcome::{Failed, Gone, Made};

/// The outcome of a create as `obj` shows it, `None` while in progress.
/// `uid` is the object created (or found); a different one means ours is
/// gone.
pub(super) fn create_outcome(
    obj: Option<&LogicVolume>,
    uid: Option<&str>,
) -> Option<CreateOutcome> {
    let Some(lv) = obj.filter(|lv| lv.uid().as_deref() == uid) else {
        return Some(Gone);
    };
    let status = lv.status.as_ref();
    if status.and_then(|s| s.volume_id.as_ref()).is_some() {
        return Some(Made(lv.clone()));
    }
    if lv.metadata.deletion_timestamp.is_some() {
        // On its way out already: nothing to give up.
        return Some(Failed {
            lv: lv.clone(),
            error: CsiError::Aborted(format!(
                "LogicVolume {:?} is being deleted; retry once it is gone",
                lv.name_any()
            )),
            given_up: false,
        });
    }
    let status = status?;
    let failed = failure(status)?;
    Some(Failed {
        lv: lv.clone(),
        error: failed,
        given_up: given_up(status),
    })
}

/// What the status of an expand says.
#[derive(Debug)]
pub(super) enum ExpandOutcome {
    /// `status.currentSize` covers the request: the size.
    Grown(u64),
    /// The bridge reported a failure of this expand; `given_up` as for a
    /// create.
    Failed { error: CsiError, given_up: bool },
    /// The object (that uid) is gone.
    Gone,
}

/// The outcome of an expand to `required` bytes as `obj` shows it, `None`
/// while in progress. `uid` is the object patched, `generation` the
/// `metadata.generation` the patch produced and `before` the status it
/// returned: a failure code counts only when the status describes that
/// generation (`observedGeneration`) or, without one, changed since.
pub(super) fn expand_outcome(
    obj: Option<&LogicVolume>,
    uid: Option<&str>,
    required: u64,
    generation: i64,
    before: &LogicVolumeStatus,
) -> Option<ExpandOutcome> {
    let Some(lv) = obj.filter(|o| o.uid().as_deref() == uid) else {
        return Some(ExpandOutcome::Gone);
    };
    let status = lv.status.clone().unwrap_or_default();
    let size = status.current_size.as_ref().and_then(bytes);
    if let Some(size) = size.filter(|s| *s >= required) {
        return Some(ExpandOutcome::Grown(size));
    }
    let news = match status.observed_generation {
        Some(g) => g >= generation,
        None => status != *before,
    };
    let error = news.then(|| failure(&status)).flatten()?;
    Some(ExpandOutcome::Failed {
        error,
        given_up: given_up(&status),
    })
}

/// Whether the object with `uid` is gone as `obj` shows it (a newer object
/// of the same name counts as gone).
pub(super) fn is_gone(obj: Option<&LogicVolume>, uid: Option<&str>) -> bool {
    !matches!(obj, Some(lv) if lv.uid().as_deref() == uid)
}

/// The error a status reports, if its code is not OK.
pub(super) fn failure(status: &LogicVolumeStatus) -> Option<CsiError> {
    let code = status.code.filter(|c| *c != 0)?;
    let message = status.message.clone().unwrap_or_default();
    Some(status_error(code, message))
}

/// Whether the failure `status` reports is one the bridge does not try
/// again soon.
fn given_up(status: &LogicVolumeStatus) -> bool {
    status
        .code
        .is_some_and(|c| c != 0 && Retry::of_status(c) != Retry::Soon)
}

/// Why an existing object does not satisfy `req`, if it does not (the
/// shared rule, [`unfit`], with this plane's tiering and policy checks).
pub(super) fn incompatible(
    req: &VolumeRequest,
    lv: &LogicVolume,
    policy: Option<&str>,
) -> Option<String> {
    // The group's policy, when its node published it, must suit the
    // request by the one rule placement and the scheduler read.
    let needs = policy::Needs {
        whole_disk: req.parameters.exclusive,
        block: req.block,
        bcache: req
            .parameters
            .bcache
            .as_ref()
            .map(|_| policy::BcachePart::Backing),
    };
    let unsuited = match policy.map(|p| policy::suits(p, needs)) {
        Some(Err(why)) => Some(format!("its group does not suit the request: {why}")),
        _ => None,
    };
    let node = node_spec(&lv.spec.node_name);
    let existing = Existing {
        bytes: current_bytes(lv),
        group: &lv.spec.device_group,
        exclusive: is_exclusive(lv),
        node: &node,
    };
    unfit(req, &existing, other_cache(req, lv), unsuited)
}

/// Why the tiering of `lv` differs from what `req` asks, if it does.
fn other_cache(req: &VolumeRequest, lv: &LogicVolume) -> Option<String> {
    match (&req.parameters.bcache, &lv.spec.cache) {
        (None, None) => None,
        (None, Some(c)) => Some(format!(
            "it is cached by group {:?} and the request asks for no cache",
            c.device_group
        )),
        (Some(b), None) => Some(format!(
            "it has no cache and the request asks for one in group {:?}",
            b.cache_group
        )),
        (Some(b), Some(c)) => crate::nodes::bcache::tiering_differs(
            b,
            &lv.spec.device_group,
            &c.device_group,
            c.ratio,
            &c.policy,
        ),
    }
}

fn is_exclusive(lv: &LogicVolume) -> bool {
    lv.annotations()
        .get(EXCLUSIVE_ANNOTATION)
        .is_some_and(|v| v == "true")
}

/// The volume's size: as made (`status.currentSize`), else as asked; of
/// a tiered volume, its bcache device's (the backing volume less the data
/// offset).
pub(super) fn current_bytes(lv: &LogicVolume) -> Option<u64> {
    let backing = lv
        .status
        .as_ref()
        .and_then(|s| s.current_size.as_ref())
        .and_then(bytes)
        .or_else(|| bytes(&lv.spec.size))?;
    Some(match lv.spec.cache {
        Some(_) => backing.saturating_sub(BCACHE_DATA_OFFSET),
        None => backing,
    })
}

/// Bytes in a quantity; `None` when it is not a byte count.
pub(super) fn bytes(q: &Quantity) -> Option<u64> {
    quantity_bytes(q).ok()
}

/// The control plane's view of a made volume.
pub(super) fn provisioned(
    lv: &LogicVolume,
    fs_type: Option<FsType>,
    policy: Option<&str>,
) -> ProvisionedVolume {
    let node = lv.spec.node_name.clone();
    let status = lv.status.clone().unwrap_or_default();
    let mut ctx = BTreeMap::new();
    // The bridge reports the path in the status; an annotation is honoured
    // for objects written by other tools.
    if let Some(path) = status
        .path
        .clone()
        .or_else(|| lv.annotations().get(PATH_ANNOTATION).cloned())
    {
        ctx.insert(context::PATH.to_string(), path);
    }
    ctx.insert(context::NODE.to_string(), node.clone());
    if let (Some(major), Some(minor)) = (status.device_major, status.device_minor)
        && policy != Some("HOST")
    {
        ctx.insert(context::MAJOR.to_string(), major.to_string());
        ctx.insert(context::MINOR.to_string(), minor.to_string());
    }
    ctx.insert(context::GROUP.to_string(), lv.spec.device_group.clone());
    if let Some(p) = policy {
        ctx.insert(context::POLICY.to_string(), p.to_string());
    }
    if let Some(fs) = fs_type {
        ctx.insert(context::FS_TYPE.to_string(), fs.as_str().to_string());
    }
    ProvisionedVolume {
        volume_id: super::legacy::csi_volume_id(lv),
        capacity_bytes: current_bytes(lv).unwrap_or(0),
        node,
        group: lv.spec.device_group.clone(),
        context: ctx,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube::provisioner::fixtures::{MIB, lv, on, request};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use tonic::Code;

    #[test]
    fn outcomes_of_a_create() {
        let mut v = lv("a", "g", 8 * MIB);
        assert!(
            create_outcome(Some(&v), Some("u1")).is_none(),
            "in progress"
        );
        assert!(matches!(create_outcome(None, Some("u1")), Some(Gone)));
        assert!(matches!(
            create_outcome(Some(&v), Some("other")),
            Some(Gone)
        ));
        v.status = Some(LogicVolumeStatus {
            code: Some(0),
            ..LogicVolumeStatus::default()
        });
        assert!(
            create_outcome(Some(&v), Some("u1")).is_none(),
            "code 0 alone is no outcome"
        );
        v.status = Some(LogicVolumeStatus {
            code: Some(Code::ResourceExhausted as i32),
            message: Some("full".into()),
            ..LogicVolumeStatus::default()
        });
        match create_outcome(Some(&v), Some("u1")) {
            Some(Failed {
                error, given_up, ..
            }) => {
                assert_eq!(error.code(), Code::ResourceExhausted);
                assert!(given_up);
            }
            other => panic!("{other:?}"),
        }
        // Every answer the bridge retries soon leaves the object to it,
        // CANCELLED too (its CSI answer was INTERNAL, and the object went).
        for code in [
            Code::Unavailable,
            Code::DeadlineExceeded,
            Code::Aborted,
            Code::Cancelled,
        ] {
            v.status = Some(LogicVolumeStatus {
                code: Some(code as i32),
                ..LogicVolumeStatus::default()
            });
            match create_outcome(Some(&v), Some("u1")) {
                Some(Failed {
                    error, given_up, ..
                }) => {
                    assert!(!given_up, "{code:?}");
                    assert!(
                        matches!(error.code(), Code::Unavailable | Code::Aborted),
                        "{code:?}: {error:?}"
                    );
                }
                other => panic!("{code:?}: {other:?}"),
            }
        }
        v.status = Some(LogicVolumeStatus {
            volume_id: Some("pvc-1".into()),
            code: Some(0),
            ..LogicVolumeStatus::default()
        });
        assert!(matches!(
            create_outcome(Some(&v), Some("u1")),
            Some(Made(_))
        ));
        let mut deleting = lv("a", "g", 8 * MIB);
        deleting.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
        match create_outcome(Some(&deleting), Some("u1")) {
            Some(Failed {
                error, given_up, ..
            }) => {
                assert_eq!(error.code(), Code::Aborted);
                assert!(!given_up);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn context_of_a_made_volume() {
        let mut v = lv("node-a", "ssd", 12 * MIB);
        v.metadata.annotations = Some(BTreeMap::from([(
            PATH_ANNOTATION.to_string(),
            "/dev/carina/pvc-1".to_string(),
        )]));
        v.status = Some(LogicVolumeStatus {
            volume_id: Some("pvc-1".into()),
            current_size: Some(Quantity("16Mi".into())),
            device_major: Some(253),
            device_minor: Some(4),
            ..LogicVolumeStatus::default()
        });
        let p = provisioned(&v, Some(FsType::Xfs), Some("LVM"));
        assert_eq!(p.volume_id, "pvc-1@node-a");
        assert_eq!(
            p.capacity_bytes,
            16 * MIB,
            "currentSize wins over spec.size"
        );
        assert_eq!(p.context[context::PATH], "/dev/carina/pvc-1");
        assert_eq!(p.context[context::NODE], "node-a");
        assert_eq!(p.context[context::MAJOR], "253");
        assert_eq!(p.context[context::MINOR], "4");
        assert_eq!(p.context[context::GROUP], "ssd");
        assert_eq!(p.context[context::POLICY], "LVM");
        assert_eq!(p.context[context::FS_TYPE], "xfs");
        let p = provisioned(&v, None, Some("HOST"));
        assert!(!p.context.contains_key(context::MAJOR));
        assert!(!p.context.contains_key(context::FS_TYPE));
    }

    #[test]
    fn compatibility_of_an_existing_object() {
        let v = lv("a", "ssd", 12 * MIB);
        assert_eq!(incompatible(&request(10 * MIB), &v, None), None);
        assert!(incompatible(&request(20 * MIB), &v, None).is_some());
        let mut named = request(10 * MIB);
        named.parameters.group = Some("hdd".into());
        assert!(
            incompatible(&named, &v, None)
                .expect("group")
                .contains("hdd")
        );
        let mut exclusive = request(10 * MIB);
        exclusive.parameters.exclusive = true;
        assert!(incompatible(&exclusive, &v, None).is_some());
        let mut block = request(10 * MIB);
        block.block = true;
        assert!(incompatible(&block, &v, Some("HOST")).is_some());
        assert_eq!(incompatible(&block, &v, Some("LVM")), None);
        let mut elsewhere = request(10 * MIB);
        elsewhere.accessibility.requisite = vec![on("b")];
        assert!(incompatible(&elsewhere, &v, None).is_some());
        elsewhere.accessibility.requisite.push(on("a"));
        assert_eq!(incompatible(&elsewhere, &v, None), None);
    }

    #[test]
    fn tiered_objects_fit_only_the_same_tiering() {
        let bcache = carina_csi::params::BcacheParams {
            backend_group: "hdd".into(),
            cache_group: "ssd".into(),
            cache_ratio: 10,
            cache_policy: "writeback".into(),
        };
        let mut v = lv("a", "hdd", 12 * MIB + BCACHE_DATA_OFFSET);
        let mut tiered = request(12 * MIB);
        tiered.parameters.bcache = Some(bcache);
        assert!(
            incompatible(&tiered, &v, None)
                .expect("plain")
                .contains("has no cache")
        );
        v.spec.cache = Some(carina_api::LogicVolumeCache {
            device_group: "ssd".into(),
            ratio: 10,
            policy: "writeback".into(),
        });
        assert_eq!(incompatible(&tiered, &v, None), None);
        assert_eq!(
            current_bytes(&v),
            Some(12 * MIB),
            "the bcache device's size, not the backing volume's"
        );
        assert!(
            incompatible(&request(12 * MIB), &v, None)
                .expect("cached")
                .contains("asks for no cache")
        );
        if let Some(c) = v.spec.cache.as_mut() {
            c.ratio = 20;
        }
        assert!(
            incompatible(&tiered, &v, None)
                .expect("ratio")
                .contains("20%")
        );
    }

    #[test]
    fn outcomes_of_an_expand() {
        let patched = LogicVolumeStatus {
            volume_id: Some("pvc-1".into()),
            current_size: Some(Quantity((8 * MIB).to_string())),
            observed_generation: Some(1),
            ..LogicVolumeStatus::default()
        };
        let mut v = lv("a", "g", 16 * MIB);
        v.status = Some(patched.clone());
        let judge = |v: Option<&LogicVolume>, uid| expand_outcome(v, uid, 16 * MIB, 2, &patched);
        assert!(judge(Some(&v), Some("u1")).is_none(), "in progress");
        assert!(matches!(judge(None, Some("u1")), Some(ExpandOutcome::Gone)));
        assert!(matches!(
            judge(Some(&v), Some("other")),
            Some(ExpandOutcome::Gone)
        ));
        // A failure of the previous generation is old news.
        v.status = Some(LogicVolumeStatus {
            code: Some(Code::ResourceExhausted as i32),
            message: Some("full".into()),
            ..patched.clone()
        });
        assert!(judge(Some(&v), Some("u1")).is_none(), "old news");
        v.status.as_mut().expect("status").observed_generation = Some(2);
        match judge(Some(&v), Some("u1")) {
            Some(ExpandOutcome::Failed { error, given_up }) => {
                assert_eq!(error.code(), Code::ResourceExhausted);
                assert!(given_up);
            }
            other => panic!("{other:?}"),
        }
        // Without observedGeneration, a changed status is news.
        v.status.as_mut().expect("status").observed_generation = None;
        let before = LogicVolumeStatus {
            observed_generation: None,
            ..patched.clone()
        };
        assert!(matches!(
            expand_outcome(Some(&v), Some("u1"), 16 * MIB, 2, &before),
            Some(ExpandOutcome::Failed { .. })
        ));
        assert!(
            expand_outcome(
                Some(&v),
                Some("u1"),
                16 * MIB,
                2,
                v.status.as_ref().expect("status")
            )
            .is_none(),
            "an unchanged status is no news"
        );
        v.status = Some(LogicVolumeStatus {
            current_size: Some(Quantity("16Mi".into())),
            ..patched.clone()
        });
        assert!(matches!(
            judge(Some(&v), Some("u1")),
            Some(ExpandOutcome::Grown(s)) if s == 16 * MIB
        ));
    }

    #[test]
    fn gone_means_absent_or_replaced() {
        let v = lv("a", "g", MIB);
        assert!(is_gone(None, Some("u1")));
        assert!(is_gone(Some(&v), Some("other")));
        assert!(!is_gone(Some(&v), Some("u1")));
    }
}
