//! `make bench-scale`: the scale simulation of `carina_tests::scale` at
//! full size — 100 `carina-node` processes (10 on LVM loop disks, 90 on
//! HOST tmpfs roots), one kube-apiserver with etcd,
//! `carina-controller --mode kube` and the `carina-scheduler` extender as
//! processes, 1,000 volumes created and deleted through the controller's
//! CSI socket with external-provisioner's default 100 calls at once; half
//! placed by the extender and pinned, half `Immediate`.
//!
//! Usage: `carina-bench scale [--out DIR] [--nodes N] [--lvm-nodes N]
//! [--volumes N] [--concurrency N]`. Writes its group into
//! `DIR/benchmarks.{json,md}` beside the groups already there.
//!
//! Reported: throughput; p50/p99 per create and per delete, by kind,
//! beside the bare `mkdir(2)`/`rmdir(2)` on a tmpfs and the bare
//! `lvcreate`/`lvremove` measured first in the same run; the
//! controller's and the extender's CPU seconds (both phases) and peak
//! resident memory; kube-apiserver requests per volume (all, and those on
//! Carina's two resources); how long after a change completed its node's
//! `NodeStorageResource` showed it (target: p99 ≤ 2 s); the extender's
//! `/filter` + `/prioritize` time for each pinned volume's pod during the
//! creates. The simulation's correctness checks run too: a run whose
//! volumes misbehave reports nothing.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use carina_tests::scale::churn::{Created, Deleted};
use carina_tests::scale::run::Run;
use carina_tests::scale::{ScaleCluster, Shape};
use carina_tests::{MountGuard, have_root};

use crate::pool::LvmPool;
use crate::report::{self, Entry, timed};

/// Bare commands measured for each floor.
const FLOOR_SAMPLES: usize = 50;
/// The freshness target, in milliseconds.
const FRESHNESS_TARGET_MS: f64 = 2000.0;

pub async fn main(args: impl Iterator<Item = String>) -> Result<()> {
    let mut out = PathBuf::from("docs");
    let mut shape = Shape::full();
    let mut it = args;
    while let Some(a) = it.next() {
        let mut number = |flag: &str| -> Result<usize> {
            it.next()
                .with_context(|| format!("{flag} needs a number"))?
                .parse()
                .with_context(|| flag.to_string())
        };
        match a.as_str() {
            "--out" => out = PathBuf::from(it.next().context("--out needs a directory")?),
            "--nodes" => shape.nodes = number("--nodes")?,
            "--lvm-nodes" => shape.lvm_nodes = number("--lvm-nodes")?,
            "--volumes" => shape.volumes = number("--volumes")?,
            "--concurrency" => shape.concurrency = number("--concurrency")?,
            other => bail!(
                "unknown argument {other:?} (expected --out DIR, --nodes N, --lvm-nodes N, --volumes N, --concurrency N)"
            ),
        }
    }
    if !have_root("carina-bench scale") {
        bail!("carina-bench scale needs root (loop devices, lvm, tmpfs)");
    }

    let floors = Floors::measure().await?;
    println!(
        "scale: starting {} nodes ({} LVM), {} volumes, {} calls at once",
        shape.nodes, shape.lvm_nodes, shape.volumes, shape.concurrency
    );
    let t0 = Instant::now();
    let mut cluster = ScaleCluster::start(shape).await?;
    println!("scale: cluster up in {:.1} s", t0.elapsed().as_secs_f64());
    let run = cluster.run().await;
    let logs = cluster.log_dir();
    cluster.stop().await;
    let run = run.with_context(|| format!("the scale run failed; logs in {}", logs.display()))?;

    let entries = entries(&shape, &run, &floors);
    report::write(&out, &entries, &crate::machine_context())?;
    for e in &entries {
        println!("{}", e.line(60));
    }
    let p99 = report::percentile_ms(&run.create_freshness, 99.0)
        .max(report::percentile_ms(&run.delete_freshness, 99.0));
    println!(
        "scale: capacity record freshness p99 {p99:.0} ms (target: within {FRESHNESS_TARGET_MS:.0} ms); {} CSI calls retried",
        run.retries()
    );
    println!("wrote {}/benchmarks.json and benchmarks.md", out.display());
    Ok(())
}

/// The bare operations under a create and a delete, measured before the
/// simulation starts.
struct Floors {
    mkdir: Vec<Duration>,
    rmdir: Vec<Duration>,
    lvcreate: Vec<Duration>,
    lvremove: Vec<Duration>,
}

impl Floors {
    async fn measure() -> Result<Floors> {
        let dir = tempfile::Builder::new()
            .prefix("carina-scale-floor-")
            .tempdir()?;
        let root = dir.path().join("tmpfs");
        let mount = MountGuard::mount("tmpfs", &root, Some("tmpfs"), Some("size=64m"))?;
        let (mut mkdir, mut rmdir) = (Vec::new(), Vec::new());
        for i in 0..FLOOR_SAMPLES {
            let path = root.join(format!("v-{i}"));
            let t0 = Instant::now();
            std::fs::create_dir(&path)?;
            mkdir.push(t0.elapsed());
            let t0 = Instant::now();
            std::fs::remove_dir(&path)?;
            rmdir.push(t0.elapsed());
        }
        drop(mount);

        let pool = LvmPool::new("bench-scale", 1 << 30).await?;
        let (mut lvcreate, mut lvremove) = (Vec::new(), Vec::new());
        for i in 0..FLOOR_SAMPLES {
            let name = format!("floor-{i}");
            let t0 = Instant::now();
            pool.bare_lvcreate(&name, "8m").run().await?;
            lvcreate.push(t0.elapsed());
            let t0 = Instant::now();
            pool.bare_lvremove(&name).run().await?;
            lvremove.push(t0.elapsed());
        }
        Ok(Floors {
            mkdir,
            rmdir,
            lvcreate,
            lvremove,
        })
    }
}

fn entries(shape: &Shape, run: &Run, floors: &Floors) -> Vec<Entry> {
    let group = format!(
        "Scale: {} carina-node processes ({} LVM, {} HOST), {} volumes created and deleted through the kube path, {} CSI calls at once",
        shape.nodes,
        shape.lvm_nodes,
        shape.nodes - shape.lvm_nodes,
        shape.volumes,
        shape.concurrency
    );
    let g = group.as_str();
    let created = |lvm: bool| -> Vec<Duration> {
        run.create
            .created
            .iter()
            .filter(|c| c.lvm == lvm)
            .map(Created::latency)
            .collect()
    };
    let deleted = |lvm: bool| -> Vec<Duration> {
        run.delete
            .deleted
            .iter()
            .filter(|d| d.lvm == lvm)
            .map(Deleted::latency)
            .collect()
    };
    let volumes = shape.volumes as f64;
    let per_volume = |resource: Option<&str>| -> f64 {
        let total: f64 = match resource {
            Some(r) => run.requests.get(r).copied().unwrap_or(0.0),
            None => run.requests.values().sum(),
        };
        total / volumes
    };
    let filter_prioritize: Vec<Duration> = run
        .create
        .scheduled
        .iter()
        .map(|s| s.filter + s.prioritize)
        .collect();
    const MIB: f64 = (1 << 20) as f64;
    vec![
        figure(
            g,
            "scale.creates_per_second",
            "1/s",
            volumes / run.create.wall.as_secs_f64(),
            shape.volumes,
        ),
        figure(
            g,
            "scale.deletes_per_second",
            "1/s",
            volumes / run.delete.wall.as_secs_f64(),
            shape.volumes,
        ),
        timed(
            g,
            "scale.create_volume.host",
            "mkdir(2) on tmpfs",
            &created(false),
            Some(&floors.mkdir),
        ),
        timed(
            g,
            "scale.create_volume.lvm",
            "lvcreate",
            &created(true),
            Some(&floors.lvcreate),
        ),
        timed(
            g,
            "scale.delete_volume.host",
            "rmdir(2) on tmpfs",
            &deleted(false),
            Some(&floors.rmdir),
        ),
        timed(
            g,
            "scale.delete_volume.lvm",
            "lvremove",
            &deleted(true),
            Some(&floors.lvremove),
        ),
        timed(
            g,
            "scale.nsr_freshness.create (target p99 ≤ 2000 ms)",
            "",
            &run.create_freshness,
            None,
        ),
        timed(
            g,
            "scale.nsr_freshness.delete (target p99 ≤ 2000 ms)",
            "",
            &run.delete_freshness,
            None,
        ),
        timed(
            g,
            "scale.extender.filter_prioritize (pinned pods, during the creates)",
            "",
            &filter_prioritize,
            None,
        ),
        figure(
            g,
            "scale.apiserver.requests_per_volume (all)",
            "requests",
            per_volume(None),
            shape.volumes,
        ),
        figure(
            g,
            "scale.apiserver.requests_per_volume (logicvolumes)",
            "requests",
            per_volume(Some("logicvolumes")),
            shape.volumes,
        ),
        figure(
            g,
            "scale.apiserver.requests_per_volume (nodestorageresources)",
            "requests",
            per_volume(Some("nodestorageresources")),
            shape.volumes,
        ),
        figure(
            g,
            "scale.controller.cpu_seconds",
            "s",
            run.controller.cpu_seconds,
            shape.volumes,
        ),
        figure(
            g,
            "scale.controller.peak_rss",
            "MiB",
            run.controller.peak_rss_bytes as f64 / MIB,
            shape.volumes,
        ),
        figure(
            g,
            "scale.extender.cpu_seconds",
            "s",
            run.extender.cpu_seconds,
            shape.volumes,
        ),
        figure(
            g,
            "scale.extender.peak_rss",
            "MiB",
            run.extender.peak_rss_bytes as f64 / MIB,
            shape.volumes,
        ),
    ]
}

/// One figure of the whole run (no percentiles, no floor).
fn figure(group: &str, name: &str, unit: &str, value: f64, iterations: usize) -> Entry {
    let v = (value * 1000.0).round() / 1000.0;
    Entry {
        name: name.to_string(),
        unit: unit.to_string(),
        p50: v,
        p99: v,
        floor_p50: None,
        ratio: None,
        iterations,
        group: group.to_string(),
        floor: String::new(),
    }
}
