//! A real `carina-node` killed (SIGKILL) in the middle of CreateLV,
//! DeleteLV and ResizeLV, for each policy, at each step where the volume
//! is half done: the engine's journal is there, the next start settles it
//! (a create rolled back, a delete finished, a resize kept at a whole
//! size), and then nothing is lost or leaked:
//!
//! - another volume's data, written before, is intact;
//! - no LV, partition, loop device, marker, directory or journal record
//!   of the interrupted change is left over;
//! - the retry of the interrupted call succeeds (a DeleteLV retry answers
//!   NOT_FOUND, which is how DeleteLV says the volume is gone), and a
//!   re-created volume never shows what an older volume left on the disk.
//!
//! The kill is exact: `CARINA_TEST_KILL_AT=<point>:<volume>` makes the
//! node SIGKILL itself at that step (`carina_sys::crashpoint`; the node
//! runs as `carina-node-crashpoints`, the build that honours it). A full or
//! read-only state directory is here too: the change is refused with
//! UNAVAILABLE before anything is touched.

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use carina_proto::csi;
use carina_proto::csi::node_client::NodeClient;
use carina_proto::csi::volume_capability::access_mode::Mode;
use carina_proto::csi::volume_capability::{AccessMode, AccessType, MountVolume};
use carina_proto::nodestorage as pb;
use carina_tests::grpc::unix_channel;
use carina_tests::grpc::{create_lv, get_lv};
use carina_tests::killed_node::{
    Policy, Rig, checksum, create, device_size, ends_are_zero, fill, list, smear, walk,
};
use carina_tests::{MountGuard, have_root, mounts_under, run, unique};
use tonic::Code;

const MIB: u64 = 1 << 20;
/// Every volume starts at this size; a resize doubles it.
const SIZE: u64 = 16 * MIB;

/// What one interrupted call is.
#[derive(Debug, Clone, Copy)]
enum Op {
    Create,
    Delete,
    Resize,
}

/// One volume "keep" with data, then the interrupted `op` of volume
/// "victim" killed at `point`, a restart, and the checks of the module
/// header.
/// Returns the time from the restart to the retry's answer.
async fn killed_at(rig: &mut Rig, policy: Policy, op: Op, point: &str) -> Result<Duration> {
    let group = rig.group(policy).to_string();
    let keep = unique("keep");
    let victim = unique("victim");
    let block = policy != Policy::Host;
    let mut c = rig.client().await?;
    let kept = create(&mut c, &keep, &group, SIZE).await?;
    let kept_sum = fill(&kept, 7, 4 * MIB)?;
    let mut victim_sum = None;
    match op {
        Op::Create if block => {
            // What the re-created volume must never show: an older
            // volume's bytes on the same extents.
            let stale = create(&mut c, &victim, &group, SIZE).await?;
            smear(&stale)?;
            c.delete_lv(pb::DeleteLvRequest {
                name: victim.clone(),
            })
            .await?;
        }
        Op::Create => {}
        Op::Delete | Op::Resize => {
            let v = create(&mut c, &victim, &group, SIZE).await?;
            victim_sum = Some(fill(&v, 9, 4 * MIB)?);
        }
    }
    let before = (rig.lvs()?.len(), rig.partitions()?, rig.lvm_loops());

    // The interrupted call: the node dies under it.
    rig.stop().await;
    rig.start(Some(&format!("{point}:{victim}"))).await?;
    let mut c = rig.client().await?;
    let call = match op {
        Op::Create => c
            .create_lv(create_lv(&victim, &group, SIZE))
            .await
            .map(|_| ()),
        Op::Delete => c
            .delete_lv(pb::DeleteLvRequest {
                name: victim.clone(),
            })
            .await
            .map(|_| ()),
        Op::Resize => c
            .resize_lv(pb::ResizeLvRequest {
                name: victim.clone(),
                size_bytes: 2 * SIZE,
            })
            .await
            .map(|_| ()),
    };
    if call.is_ok() {
        bail!("{op:?} of {victim} at {point} was answered although the node was to die there");
    }
    rig.await_kill(point).await?;
    if !rig.journal_record(&victim).exists() {
        bail!("{point}: no journal record of the interrupted {op:?} was left");
    }

    // The next start settles it.
    let restarted = Instant::now();
    rig.start(None).await?;
    let mut c = rig.client().await?;
    if rig.journal_record(&victim).exists() {
        bail!("{point}: the journal record is still there after the start");
    }
    let kept_now = get_lv(&mut c, &keep).await?.context("keep is gone")?;
    if checksum(&kept_now, 4 * MIB)? != kept_sum {
        bail!("{point}: the data of {keep} changed");
    }
    let names = list(&mut c).await?;
    match op {
        Op::Create | Op::Delete => {
            if names.contains(&victim) {
                bail!("{point}: {victim} is still listed after the {op:?} was settled");
            }
            let after = (rig.lvs()?.len(), rig.partitions()?, rig.lvm_loops());
            let expected = match op {
                // The stale volume was deleted before: back to "before".
                Op::Create => before,
                // One LV, partition and loop fewer than before, in the
                // victim's policy.
                _ => match policy {
                    Policy::Lvm => (before.0 - 1, before.1, before.2 - 1),
                    Policy::Raw => (before.0, (before.1.0 - 1, before.1.1 - 1), before.2),
                    Policy::Host => before,
                },
            };
            if after != expected {
                bail!(
                    "{point}: (LVs, (kernel partitions, table partitions), loops) are {after:?}, expected {expected:?}"
                );
            }
            let left = rig.host_leftovers(&victim);
            if !left.is_empty() {
                bail!("{point}: HOST leftovers of {victim}: {left:?}");
            }
        }
        Op::Resize => {
            let v = get_lv(&mut c, &victim)
                .await?
                .with_context(|| format!("{point}: {victim} is gone after a resize"))?;
            if v.size_bytes != SIZE && v.size_bytes != 2 * SIZE {
                bail!("{point}: {victim} has {} bytes", v.size_bytes);
            }
            if block && device_size(&v) != v.size_bytes {
                bail!(
                    "{point}: {victim} reports {} bytes, its device has {}",
                    v.size_bytes,
                    device_size(&v)
                );
            }
            if Some(checksum(&v, 4 * MIB)?) != victim_sum {
                bail!("{point}: the data of {victim} changed");
            }
        }
    }

    // The retry.
    match op {
        Op::Create => {
            let v = create(&mut c, &victim, &group, SIZE)
                .await
                .with_context(|| format!("{point}: the retried create"))?;
            if block && !ends_are_zero(&v)? {
                bail!("{point}: the re-created {victim} shows an older volume's bytes");
            }
        }
        Op::Delete => match c
            .delete_lv(pb::DeleteLvRequest {
                name: victim.clone(),
            })
            .await
        {
            Err(s) if s.code() == Code::NotFound => {}
            other => bail!("{point}: the retried delete answered {other:?}, not NOT_FOUND"),
        },
        Op::Resize => {
            let v = c
                .resize_lv(pb::ResizeLvRequest {
                    name: victim.clone(),
                    size_bytes: 2 * SIZE,
                })
                .await
                .with_context(|| format!("{point}: the retried resize"))?
                .into_inner()
                .volume
                .context("ResizeLV answered no volume")?;
            if v.size_bytes != 2 * SIZE || (block && device_size(&v) != 2 * SIZE) {
                bail!("{point}: the retried resize left {v:?}");
            }
            if Some(checksum(&v, 4 * MIB)?) != victim_sum {
                bail!("{point}: the data of {victim} changed in the resize");
            }
        }
    }

    let recovered = restarted.elapsed();
    // Clean for the next point.
    for name in [&keep, &victim] {
        match c
            .delete_lv(pb::DeleteLvRequest { name: name.clone() })
            .await
        {
            Ok(_) => {}
            Err(s) if s.code() == Code::NotFound => {}
            Err(s) => bail!("cleaning up {name}: {s}"),
        }
    }
    Ok(recovered)
}

/// Runs every point of `policy`'s `op` on one rig, and says which failed.
async fn each_point(test: &str, policy: Policy, op: Op, points: &[&str]) {
    if !have_root(test) {
        return;
    }
    let mut rig = Rig::new(test).await.expect("rig");
    let mut failures = Vec::new();
    for point in points {
        match killed_at(&mut rig, policy, op, point).await {
            Ok(recovered) => eprintln!(
                "{test}: killed at {point}: restarted, settled and retried in {recovered:?}"
            ),
            Err(e) => failures.push(format!("{point}: {e:#}")),
        }
        // A failed point leaves its node as it was; the next starts anew.
        if rig.service.is_none() {
            rig.start(None).await.expect("restart");
        }
    }
    let log = carina_tests::process::tail(&rig.args.log, 40);
    rig.stop().await;
    assert!(
        failures.is_empty(),
        "{test}:\n{}\nnode log:\n{log}",
        failures.join("\n")
    );
    let _ = rig.dir.path();
}

#[tokio::test]
async fn lvm_create_killed_midway_is_rolled_back() {
    let points = ["create.begun", "lvm.create.allocated", "create.made"];
    each_point("lvm_create", Policy::Lvm, Op::Create, &points).await;
}

#[tokio::test]
async fn lvm_delete_killed_midway_is_finished() {
    let points = ["delete.begun", "lvm.delete.detached"];
    each_point("lvm_delete", Policy::Lvm, Op::Delete, &points).await;
}

#[tokio::test]
async fn lvm_resize_killed_midway_keeps_a_whole_size() {
    let points = ["resize.begun", "lvm.resize.extended"];
    each_point("lvm_resize", Policy::Lvm, Op::Resize, &points).await;
}

#[tokio::test]
async fn raw_create_killed_midway_is_rolled_back() {
    let points = ["raw.create.partitioned", "create.made"];
    each_point("raw_create", Policy::Raw, Op::Create, &points).await;
}

#[tokio::test]
async fn raw_delete_killed_midway_is_finished() {
    let points = ["delete.begun", "raw.delete.forgotten"];
    each_point("raw_delete", Policy::Raw, Op::Delete, &points).await;
}

#[tokio::test]
async fn raw_resize_killed_midway_keeps_a_whole_size() {
    let points = ["resize.begun", "raw.resize.replaced"];
    each_point("raw_resize", Policy::Raw, Op::Resize, &points).await;
}

#[tokio::test]
async fn host_create_killed_midway_is_rolled_back() {
    let points = ["host.create.marked", "create.made"];
    each_point("host_create", Policy::Host, Op::Create, &points).await;
}

#[tokio::test]
async fn host_delete_killed_midway_is_finished() {
    let points = ["delete.begun", "host.delete.emptied"];
    each_point("host_delete", Policy::Host, Op::Delete, &points).await;
}

#[tokio::test]
async fn host_resize_killed_midway_keeps_a_whole_size() {
    let points = ["resize.begun"];
    each_point("host_resize", Policy::Host, Op::Resize, &points).await;
}

/// A state directory that takes no writes (full, or read-only) refuses
/// every change with UNAVAILABLE naming the journal, before anything is
/// touched; reads go on; once it takes writes again the same calls work.
#[tokio::test]
async fn a_full_or_read_only_state_directory_refuses_changes_and_changes_nothing() {
    if !have_root("state_directory") {
        return;
    }
    let mut rig = Rig::new("statedir").await.expect("rig");
    let mut c = rig.client().await.expect("client");
    let intents = rig.args.state_dir.join("intents");
    std::fs::create_dir_all(&intents).expect("mkdir");
    let mut existing = Vec::new();
    for policy in [Policy::Lvm, Policy::Raw, Policy::Host] {
        let name = unique("there");
        let v = create(&mut c, &name, rig.group(policy), SIZE)
            .await
            .expect("create");
        let sum = fill(&v, 3, MIB).expect("fill");
        existing.push((policy, name, sum));
    }
    let snapshot = |rig: &Rig| {
        (
            rig.lvs().expect("lvs"),
            rig.partitions().expect("partitions"),
            rig.lvm_loops(),
            walk(&rig.host_root),
        )
    };
    let before = snapshot(&rig);
    for how in ["full", "read-only"] {
        let guard = match how {
            // A tmpfs of one page, filled: every new file fails ENOSPC.
            "full" => {
                let g = MountGuard::mount("tmpfs", &intents, Some("tmpfs"), Some("size=4k"))
                    .expect("mount tmpfs");
                let _ = std::fs::write(intents.join("filler"), vec![1u8; 64 * 1024]);
                g
            }
            _ => {
                let g =
                    MountGuard::mount(&intents.display().to_string(), &intents, None, Some("bind"))
                        .expect("bind");
                run(
                    "mount",
                    &["-o", "remount,ro,bind", &intents.display().to_string()],
                )
                .expect("remount read-only");
                g
            }
        };
        for (policy, name, _) in &existing {
            let group = rig.group(*policy).to_string();
            let refused = [
                c.create_lv(create_lv(&unique("new"), &group, SIZE))
                    .await
                    .map(|_| ()),
                c.resize_lv(pb::ResizeLvRequest {
                    name: name.clone(),
                    size_bytes: 2 * SIZE,
                })
                .await
                .map(|_| ()),
                c.delete_lv(pb::DeleteLvRequest { name: name.clone() })
                    .await
                    .map(|_| ()),
            ];
            for (i, r) in refused.into_iter().enumerate() {
                let s = r.expect_err(&format!("{how} {policy:?} call {i} was accepted"));
                assert_eq!(
                    s.code(),
                    Code::Unavailable,
                    "{how} {policy:?} call {i}: {s:?}"
                );
                assert!(
                    s.message().contains("intents/") && s.message().contains("state directory"),
                    "{how} {policy:?} call {i}: {}",
                    s.message()
                );
            }
        }
        // Reads go on, and nothing changed.
        let names = list(&mut c).await.expect("ListLV works");
        for (_, name, _) in &existing {
            assert!(names.contains(name), "{how}: {name} is gone");
        }
        assert_eq!(
            snapshot(&rig),
            before,
            "{how}: a refused change changed something"
        );
        drop(guard);
    }
    // Writable again: the same calls work.
    for (policy, name, sum) in &existing {
        let v = c
            .resize_lv(pb::ResizeLvRequest {
                name: name.clone(),
                size_bytes: 2 * SIZE,
            })
            .await
            .unwrap_or_else(|s| panic!("{policy:?} resize after: {s}"))
            .into_inner()
            .volume
            .expect("volume");
        assert!(
            &checksum(&v, MIB).expect("read") == sum,
            "{policy:?} data changed"
        );
        c.delete_lv(pb::DeleteLvRequest { name: name.clone() })
            .await
            .unwrap_or_else(|s| panic!("{policy:?} delete after: {s}"));
    }
    assert_eq!(
        std::fs::read_dir(&intents).expect("ls").count(),
        0,
        "journal records are left"
    );
    rig.stop().await;
}

/// A node killed (SIGKILL) while volumes of every policy are staged and
/// published, and started again: the mounts are still there and hold the
/// data written before, each volume is healthy, kubelet's repeated stage
/// and publish (it repeats them after a plugin restart) change nothing,
/// and unpublish, unstage and delete then leave no mount, LV, partition,
/// loop device or journal record.
#[tokio::test]
async fn a_node_killed_with_published_volumes_keeps_them_and_serves_them() {
    if !have_root("published") {
        return;
    }
    let mut rig = Rig::new("published").await.expect("rig");
    let mut c = rig.client().await.expect("client");
    let mut node = NodeClient::new(
        unix_channel(rig.args.csi_socket.clone())
            .await
            .expect("csi"),
    );
    let cap = |fs: &str| csi::VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: fs.into(),
            ..Default::default()
        })),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    };
    let mut published = Vec::new();
    for policy in [Policy::Lvm, Policy::Raw, Policy::Host] {
        let name = unique("published");
        create(&mut c, &name, rig.group(policy), 2 * SIZE)
            .await
            .expect("create");
        let id = carina_csi::volume_id::VolumeId::new(&name, &rig.args.name).to_string();
        let fs = if policy == Policy::Host { "" } else { "ext4" };
        let staging = rig.dir.path().join(format!("{name}-staging"));
        let target = rig.dir.path().join(format!("{name}-target"));
        node.node_stage_volume(csi::NodeStageVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.display().to_string(),
            volume_capability: Some(cap(fs)),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|s| panic!("{policy:?} stage: {s}"));
        node.node_publish_volume(csi::NodePublishVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.display().to_string(),
            target_path: target.display().to_string(),
            volume_capability: Some(cap(fs)),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|s| panic!("{policy:?} publish: {s}"));
        let bytes: Vec<u8> = (0..MIB).map(|i| (i % 251) as u8).collect();
        let file = target.join("data");
        let mut f = std::fs::File::create(&file).expect("create data");
        f.write_all(&bytes).expect("write");
        f.sync_all().expect("sync");
        published.push((policy, name, id, staging, target, bytes));
    }
    let mounts_before = mounts_under(rig.dir.path()).len();

    // The crash, and the start after it.
    if let Some(mut s) = rig.service.take() {
        s.kill();
    }
    let started = Instant::now();
    rig.start(None).await.expect("restart");
    let mut node = NodeClient::new(
        unix_channel(rig.args.csi_socket.clone())
            .await
            .expect("csi"),
    );
    let mut c = rig.client().await.expect("client");
    eprintln!(
        "the node served again {:?} after the kill",
        started.elapsed()
    );
    for (policy, _, id, staging, target, bytes) in &published {
        let read = std::fs::read(target.join("data")).expect("read after the restart");
        assert!(&read == bytes, "{policy:?}: the data changed");
        let stats = node
            .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
                volume_id: id.clone(),
                volume_path: target.display().to_string(),
                staging_target_path: String::new(),
            })
            .await
            .unwrap_or_else(|s| panic!("{policy:?} stats: {s}"))
            .into_inner();
        assert!(
            stats.volume_condition.as_ref().is_none_or(|c| !c.abnormal),
            "{policy:?}: {stats:?}"
        );
        // kubelet repeats both after a plugin restart.
        node.node_stage_volume(csi::NodeStageVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.display().to_string(),
            volume_capability: Some(cap(if *policy == Policy::Host { "" } else { "ext4" })),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|s| panic!("{policy:?} repeated stage: {s}"));
        node.node_publish_volume(csi::NodePublishVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.display().to_string(),
            target_path: target.display().to_string(),
            volume_capability: Some(cap(if *policy == Policy::Host { "" } else { "ext4" })),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|s| panic!("{policy:?} repeated publish: {s}"));
    }
    assert_eq!(
        mounts_under(rig.dir.path()).len(),
        mounts_before,
        "the restart or the repeats changed the mounts"
    );
    for (policy, name, id, staging, target, _) in &published {
        node.node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
            volume_id: id.clone(),
            target_path: target.display().to_string(),
        })
        .await
        .unwrap_or_else(|s| panic!("{policy:?} unpublish: {s}"));
        node.node_unstage_volume(csi::NodeUnstageVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: staging.display().to_string(),
        })
        .await
        .unwrap_or_else(|s| panic!("{policy:?} unstage: {s}"));
        c.delete_lv(pb::DeleteLvRequest { name: name.clone() })
            .await
            .unwrap_or_else(|s| panic!("{policy:?} delete: {s}"));
    }
    assert_eq!(
        mounts_under(rig.dir.path()),
        Vec::<PathBuf>::new(),
        "mounts left"
    );
    assert_eq!(rig.lvs().expect("lvs"), Vec::<String>::new(), "LVs left");
    assert_eq!(
        rig.partitions().expect("partitions"),
        (0, 0),
        "partitions left"
    );
    assert_eq!(rig.lvm_loops(), 0, "loop devices left");
    let intents = rig.args.state_dir.join("intents");
    assert_eq!(
        std::fs::read_dir(&intents).map(|d| d.count()).unwrap_or(0),
        0,
        "journal records left"
    );
    rig.stop().await;
}
