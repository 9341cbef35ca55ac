//! Carina on a real node beyond the round trip: online expansion through
//! external-resizer and the kubelet, a pod with claims from two device
//! groups, read-only claims, the node plugin killed under a running pod,
//! and kubelet's volume statistics.
//!
//! Each test runs its own LocalCluster with Carina installed by the Helm
//! chart (see node_volumes.rs for what that needs).

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use carina_tests::cluster::await_object;
use carina_tests::have_root;
use carina_tests::local::LocalCluster;
use carina_tests::local::carina::{
    Carina, Layout, NAMESPACE, SCHEDULER_NAME, describe, explained, local_options,
};
use carina_tests::local::workload::{Use, Workload, busybox_image, claim, pod};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Event, PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};

/// A pod that keeps running (until deleted) with `uses`.
fn sleeper(name: &str, image: &str, setup: &str, uses: &[Use]) -> Pod {
    let script = format!("{setup} && while true; do sleep 1; done");
    pod(name, image, &script, uses)
}

async fn cluster_with_carina() -> Result<(LocalCluster, Carina)> {
    let mut cluster = LocalCluster::start(local_options()?).await?;
    let carina = Carina::install(&mut cluster, &Layout::standard()).await?;
    Ok((cluster, carina))
}

/// Runs `sh -c script` in the pod's container; its stdout.
fn exec(cluster: &LocalCluster, pod: &str, script: &str) -> Result<String> {
    cluster.kubectl(&["exec", "-n", "default", pod, "--", "sh", "-c", script])
}

/// The size in KiB `df` reports for the file system at `path` in the pod.
fn df_kib(cluster: &LocalCluster, pod: &str, path: &str) -> Result<u64> {
    let out = exec(cluster, pod, &format!("df -k {path} | tail -n 1"))?;
    out.split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("df output {out:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn online_expansion_reaches_the_pod() -> Result<()> {
    if !have_root("online_expansion_reaches_the_pod") {
        return Ok(());
    }
    let (cluster, _carina) = cluster_with_carina().await?;
    let result = async {
        let work = Workload::new(cluster.client(), "default");
        let image = busybox_image()?;
        // xfs grows online; ext4's online resize needs CAP_SYS_RESOURCE.
        work.create_claim(&claim("data", "csi-carina-lvm", "512Mi", false))
            .await?;
        work.create_pod(&sleeper(
            "app",
            &image,
            "true",
            &[Use::mount("data", "/data")],
        ))
        .await?;
        work.running("app").await?;
        let before = df_kib(&cluster, "app", "/data")?;

        let patch = serde_json::json!({"spec": {"resources": {"requests": {"storage": "1Gi"}}}});
        work.claims
            .patch("data", &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        // external-resizer → ControllerExpandVolume; kubelet →
        // NodeExpandVolume; the claim's capacity is the new size only once
        // the file system has grown.
        let grown = await_object(
            &work.claims,
            "data",
            "resized",
            Duration::from_secs(180),
            |c: Option<&PersistentVolumeClaim>| {
                c.and_then(|c| c.status.as_ref())
                    .and_then(|s| s.capacity.as_ref())
                    .and_then(|c| c.get("storage"))
                    .is_some_and(|q| q.0 == "1Gi")
            },
        )
        .await;
        if let Err(e) = grown {
            anyhow::bail!("{e:#}\n{}", describe(&cluster));
        }
        let after = df_kib(&cluster, "app", "/data")?;
        ensure!(
            after > before + 400 * 1024,
            "df in the pod: {before} KiB before, {after} KiB after growing 512Mi → 1Gi"
        );
        work.delete_pod("app").await?;
        work.delete_claim("data").await?;
        Ok::<(), anyhow::Error>(())
    }
    .await;
    explained(&cluster, result)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_pod_two_groups() -> Result<()> {
    if !have_root("one_pod_two_groups") {
        return Ok(());
    }
    let (cluster, carina) = cluster_with_carina().await?;
    let result = async {
        let work = Workload::new(cluster.client(), "default");
        let image = busybox_image()?;
        work.create_claim(&claim("fast", "csi-carina-lvm-ext4", "128Mi", false))
            .await?;
        work.create_claim(&claim("slow", "csi-carina-hdd", "128Mi", false))
            .await?;
        let uses = [Use::mount("fast", "/fast"), Use::mount("slow", "/slow")];
        work.create_pod(&pod(
            "both",
            &image,
            "echo a > /fast/a && echo b > /slow/b && cat /fast/a /slow/b | tr -d '\\n' > /dev/termination-log",
            &uses,
        ))
        .await?;
        let out = work.succeeded("both").await?;
        ensure!(out == "ab", "pod wrote {out:?}");
        // Each claim's volume is in its own group's volume group.
        for (claim_name, group) in [("fast", "carina-vg-ssd"), ("slow", "carina-vg-hdd")] {
            let pv = work.volume_of(claim_name).await?;
            let handle = pv
                .spec
                .and_then(|s| s.csi)
                .map(|c| c.volume_handle)
                .context("not a CSI volume")?;
            let lvs = carina.logical_volumes(group)?;
            ensure!(
                lvs.iter().any(|lv| handle.contains(lv.as_str()) || lv.contains(handle.as_str())),
                "volume {handle} of claim {claim_name} is not in {group}: {lvs:?}"
            );
        }
        work.delete_pod("both").await?;
        work.delete_claim("fast").await?;
        work.delete_claim("slow").await?;
        Ok::<(), anyhow::Error>(())
    }
    .await;
    explained(&cluster, result)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_only_claims_are_read_only_in_the_pod() -> Result<()> {
    if !have_root("read_only_claims_are_read_only_in_the_pod") {
        return Ok(());
    }
    let (cluster, _carina) = cluster_with_carina().await?;
    let result = async {
        let work = Workload::new(cluster.client(), "default");
        let image = busybox_image()?;
        work.create_claim(&claim("data", "csi-carina-lvm-ext4", "128Mi", false))
            .await?;
        work.create_pod(&pod(
            "writer",
            &image,
            "echo kept > /data/f && sync",
            &[Use::mount("data", "/data")],
        ))
        .await?;
        work.succeeded("writer").await?;
        work.delete_pod("writer").await?;
        let probe = "cat /data/f | tr -d '\\n'; if touch /data/g 2>/dev/null; then echo ' writable'; else echo ' read-only'; fi";
        work.create_pod(&pod(
            "reader",
            &image,
            &format!("({probe}) | tr -d '\\n' > /dev/termination-log"),
            &[Use::mount("data", "/data").read_only()],
        ))
        .await?;
        let out = work.succeeded("reader").await?;
        ensure!(out == "kept read-only", "read-only pod saw {out:?}");
        work.delete_pod("reader").await?;
        work.delete_claim("data").await?;
        Ok::<(), anyhow::Error>(())
    }
    .await;
    explained(&cluster, result)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_plugin_restart_under_a_running_pod() -> Result<()> {
    if !have_root("node_plugin_restart_under_a_running_pod") {
        return Ok(());
    }
    let (cluster, _carina) = cluster_with_carina().await?;
    let result = async {
        let work = Workload::new(cluster.client(), "default");
        let image = busybox_image()?;
        work.create_claim(&claim("data", "csi-carina-lvm-ext4", "128Mi", false))
            .await?;
        work.create_pod(&sleeper(
            "app",
            &image,
            "echo before > /data/f && sync",
            &[Use::mount("data", "/data")],
        ))
        .await?;
        work.running("app").await?;

        // Kill the node plugin's pod at once; the DaemonSet makes a new one.
        let plugins: Api<Pod> = Api::namespaced(cluster.client(), NAMESPACE);
        let selector = ListParams::default().labels("app.kubernetes.io/name=carina-node");
        let old: Vec<String> = plugins
            .list(&selector)
            .await?
            .into_iter()
            .filter_map(|p| p.metadata.name)
            .collect();
        ensure!(old.len() == 1, "node plugin pods: {old:?}");
        plugins
            .delete(&old[0], &DeleteParams::default().grace_period(0))
            .await?;
        let sets: Api<DaemonSet> = Api::namespaced(cluster.client(), NAMESPACE);
        let old_name = old[0].clone();
        await_object(
            &plugins,
            &old_name,
            "gone",
            Duration::from_secs(60),
            |p: Option<&Pod>| p.is_none(),
        )
        .await?;
        await_object(
            &sets,
            "carina-node",
            "ready again",
            Duration::from_secs(120),
            |d: Option<&DaemonSet>| {
                d.and_then(|d| d.status.as_ref())
                    .is_some_and(|s| s.number_ready == 1 && s.updated_number_scheduled == Some(1))
            },
        )
        .await?;

        // The data stayed reachable through the restart.
        let seen = exec(
            &cluster,
            "app",
            "cat /data/f && echo after >> /data/f && cat /data/f",
        )?;
        ensure!(seen == "before\nbefore\nafter\n", "pod saw {seen:?}");

        // The new plugin unpublishes and unstages what the old one set up.
        let pv = work.volume_of("data").await?;
        let pv_name = pv.metadata.name.clone().context("PV without a name")?;
        work.delete_pod("app").await?;
        let left: Vec<_> = carina_tests::local::host::mounts_under(cluster.kubelet_root())
            .into_iter()
            .filter(|m| m.to_string_lossy().contains(&pv_name))
            .collect();
        ensure!(
            left.is_empty(),
            "mounts of {pv_name} left after the pod went: {left:?}"
        );
        work.delete_claim("data").await?;
        Ok::<(), anyhow::Error>(())
    }
    .await;
    explained(&cluster, result)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capacity_keeps_a_pod_pending_until_space_is_freed() -> Result<()> {
    if !have_root("capacity_keeps_a_pod_pending_until_space_is_freed") {
        return Ok(());
    }
    let mut cluster = LocalCluster::start(local_options()?).await?;
    let layout = Layout {
        extender: true,
        // The extender's answer is the subject: kube-scheduler's own
        // capacity check would answer first once the CSIStorageCapacity is
        // published.
        capacity_tracking: false,
        snapshots: false,
        ..Layout::standard()
    };
    let _carina = Carina::install(&mut cluster, &layout).await?;
    let result = async {
        let work = Workload::new(cluster.client(), "default");
        let image = busybox_image()?;
        let with_extender = |mut p: Pod| {
            if let Some(spec) = p.spec.as_mut() {
                spec.scheduler_name = Some(SCHEDULER_NAME.to_string());
            }
            p
        };
        // carina-vg-ssd has 2 GiB: the first claim takes most of it.
        work.create_claim(&claim("filler", "csi-carina-lvm-ext4", "1536Mi", false))
            .await?;
        work.create_pod(&with_extender(sleeper(
            "filler",
            &image,
            "true",
            &[Use::mount("filler", "/data")],
        )))
        .await?;
        work.running("filler").await?;

        work.create_claim(&claim("second", "csi-carina-lvm-ext4", "1Gi", false))
            .await?;
        work.create_pod(&with_extender(sleeper(
            "second",
            &image,
            "true",
            &[Use::mount("second", "/data")],
        )))
        .await?;
        // The extender's reason reaches the pod's FailedScheduling event.
        let events: Api<Event> = Api::namespaced(cluster.client(), "default");
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        let reason = loop {
            let found = events
                .list(
                    &ListParams::default()
                        .fields("involvedObject.name=second,reason=FailedScheduling"),
                )
                .await?
                .into_iter()
                .filter_map(|e| e.message)
                .find(|m| m.contains("device group \"carina-vg-ssd\""));
            if let Some(m) = found {
                break m;
            }
            ensure!(
                std::time::Instant::now() < deadline,
                "no FailedScheduling event with the extender's reason\n{}",
                describe(&cluster)
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        let pending = work.pods.get("second").await?;
        ensure!(
            carina_tests::local::workload::phase(Some(&pending)) == Some("Pending"),
            "second pod is not pending: {:?}",
            pending.status
        );
        println!("extender's reason: {reason}");

        // Freeing the space lets the scheduler place it.
        work.delete_pod("filler").await?;
        work.delete_claim("filler").await?;
        work.running("second").await?;
        work.delete_pod("second").await?;
        work.delete_claim("second").await?;
        Ok::<(), anyhow::Error>(())
    }
    .await;
    explained(&cluster, result)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_volume_stats_match_the_file_system() -> Result<()> {
    if !have_root("kubelet_volume_stats_match_the_file_system") {
        return Ok(());
    }
    let (cluster, _carina) = cluster_with_carina().await?;
    let result = async {
        let work = Workload::new(cluster.client(), "default");
        let image = busybox_image()?;
        work.create_claim(&claim("data", "csi-carina-lvm-ext4", "256Mi", false))
            .await?;
        work.create_pod(&sleeper(
            "app",
            &image,
            "dd if=/dev/zero of=/data/f bs=1M count=20 && sync",
            &[Use::mount("data", "/data")],
        ))
        .await?;
        work.running("app").await?;
        // `df -k`: size, used and available KiB; `df -i`: inodes used.
        let df = exec(
            &cluster,
            "app",
            "df -k /data | tail -n 1; df -i /data | tail -n 1",
        )?;
        let cols: Vec<Vec<u64>> = df
            .lines()
            .map(|l| {
                l.split_whitespace()
                    .skip(1)
                    .take(3)
                    .filter_map(|c| c.parse().ok())
                    .collect()
            })
            .collect();
        ensure!(
            cols.len() == 2 && cols.iter().all(|c| c.len() == 3),
            "df printed {df:?}"
        );
        let (capacity, used, available) = (cols[0][0] * 1024, cols[0][1] * 1024, cols[0][2] * 1024);
        let (inodes, inodes_used) = (cols[1][0], cols[1][1]);
        ensure!(
            used >= 20 << 20,
            "df says {used} bytes used after writing 20 MiB"
        );

        // The kubelet refreshes volume stats every volumeStatsAggPeriod (10 s
        // here); wait for the ones after the write.
        let path = format!("/api/v1/nodes/{}/proxy/metrics", cluster.node_name());
        let deadline = std::time::Instant::now() + Duration::from_secs(90);
        let stats = loop {
            let text = cluster.kubectl(&["get", "--raw", &path])?;
            let stats = volume_stats(&text, "data");
            if stats
                .get("used_bytes")
                .is_some_and(|u| *u >= (20 << 20) as f64)
            {
                break stats;
            }
            ensure!(
                std::time::Instant::now() < deadline,
                "kubelet_volume_stats_used_bytes for claim data never reached 20 MiB: {stats:?}"
            );
            tokio::time::sleep(Duration::from_secs(1)).await;
        };
        for (metric, want) in [
            ("capacity_bytes", capacity),
            ("used_bytes", used),
            ("available_bytes", available),
            ("inodes", inodes),
            ("inodes_used", inodes_used),
        ] {
            let got = stats.get(metric).copied().unwrap_or(-1.0);
            ensure!(
                got == want as f64,
                "kubelet_volume_stats_{metric} is {got}, the file system says {want} ({stats:?})"
            );
        }
        work.delete_pod("app").await?;
        work.delete_claim("data").await?;
        Ok::<(), anyhow::Error>(())
    }
    .await;
    explained(&cluster, result)
}

/// The `kubelet_volume_stats_*` samples of claim `claim` in `default`, by
/// the part of the name after the prefix.
fn volume_stats(exposition: &str, claim: &str) -> std::collections::BTreeMap<String, f64> {
    let label = format!("persistentvolumeclaim=\"{claim}\"");
    exposition
        .lines()
        .filter(|l| l.starts_with("kubelet_volume_stats_") && l.contains(&label))
        .filter(|l| l.contains("namespace=\"default\""))
        .filter_map(|l| {
            let (name, rest) = l.split_once('{')?;
            let value = rest.rsplit_once('}')?.1.split_whitespace().next()?;
            Some((
                name.trim_start_matches("kubelet_volume_stats_").to_string(),
                value.parse().ok()?,
            ))
        })
        .collect()
}
