//! `make bench`: measures Carina against the physical floor — the raw
//! commands it stands on — in the same run, and writes
//! `docs/benchmarks.json` and `docs/benchmarks.md`.
//!
//! Usage: `carina-bench [--out DIR] [--iterations N] [--only GROUP]`,
//! or `carina-bench scale [...]` for the scale simulation alone
//! (`make bench-scale`, see `scale.rs`).
//! Needs root and loop devices, like the engine tests; `--only scheduler`
//! runs just the scheduler extender's group, which needs neither;
//! `--only kube` just the Kubernetes control plane's group, `--only
//! engine` the engine groups (LVM and RAW), `--only raw` the RAW one,
//! `--only pod` the real node's PVC-to-running-Pod group, `--only copy`
//! the volume-copy group (LVM, RAW and HOST against `dd` and `cp -a`).

mod copy;
mod csi;
mod engine;
mod grpc;
mod kube;
mod pod;
mod pool;
mod raw;
mod report;
mod scale;
mod scheduler;
mod steps;

use std::path::PathBuf;

use anyhow::{Context, Result, bail};

struct Args {
    out: PathBuf,
    iterations: usize,
    /// Run only this group (`scheduler`, `kube`, `engine`, `raw`, `pod`,
    /// `copy`).
    only: Option<String>,
}

fn parse_args() -> Result<Args> {
    let mut args = Args {
        out: PathBuf::from("docs"),
        iterations: 100,
        only: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--out" => args.out = PathBuf::from(it.next().context("--out needs a directory")?),
            "--iterations" => {
                args.iterations = it
                    .next()
                    .context("--iterations needs a number")?
                    .parse()
                    .context("--iterations")?
            }
            "--only" => match it.next().as_deref() {
                Some(group @ ("scheduler" | "kube" | "engine" | "raw" | "pod" | "copy")) => {
                    args.only = Some(group.into())
                }
                other => bail!(
                    "--only {other:?}: only `scheduler`, `kube`, `engine`, `raw`, `pod` or `copy` can run alone"
                ),
            },
            other => bail!(
                "unknown argument {other:?} (expected --out DIR, --iterations N, --only scheduler|kube|engine|raw|pod|copy)"
            ),
        }
    }
    if args.iterations == 0 {
        bail!("--iterations must be at least 1");
    }
    Ok(args)
}

#[tokio::main]
async fn main() -> Result<()> {
    if std::env::args().nth(1).as_deref() == Some("scale") {
        return scale::main(std::env::args().skip(2)).await;
    }
    let args = parse_args()?;
    let mut entries = Vec::new();
    if args.only.as_deref() == Some("scheduler") {
        entries.extend(scheduler::latency(args.iterations).await?);
        return finish(&args, &entries);
    }
    if !carina_tests::have_root("carina-bench") {
        bail!("carina-bench needs root (loop devices, lvm)");
    }
    match args.only.as_deref() {
        Some("kube") => {
            entries.extend(kube::create_volume(args.iterations).await?);
            return finish(&args, &entries);
        }
        Some("engine") => {
            entries.extend(engine::lvm_create_delete(args.iterations).await?);
            entries.extend(raw::create_delete(args.iterations).await?);
            return finish(&args, &entries);
        }
        Some("raw") => {
            entries.extend(raw::create_delete(args.iterations).await?);
            return finish(&args, &entries);
        }
        Some("pod") => {
            entries.extend(pod::pvc_to_running().await?);
            return finish(&args, &entries);
        }
        Some("copy") => {
            entries.extend(copy::copy_volume(args.iterations).await?);
            return finish(&args, &entries);
        }
        _ => {}
    }
    entries.extend(engine::lvm_create_delete(args.iterations).await?);
    entries.extend(raw::create_delete(args.iterations).await?);
    entries.extend(copy::copy_volume(args.iterations).await?);
    entries.extend(grpc::create_delete(args.iterations).await?);
    entries.extend(grpc::capacity_throughput(std::time::Duration::from_secs(5)).await?);
    entries.extend(grpc::node_memory().await?);
    entries.extend(csi::full_cycle(args.iterations).await?);
    entries.extend(kube::create_volume(args.iterations).await?);
    entries.extend(scheduler::latency(args.iterations).await?);
    entries.extend(pod::pvc_to_running().await?);
    finish(&args, &entries)
}

/// Writes the report files and prints the entries.
fn finish(args: &Args, entries: &[report::Entry]) -> Result<()> {
    let context = machine_context();
    report::write(&args.out, entries, &context)?;
    for e in entries {
        println!("{}", e.line(55));
    }
    println!(
        "wrote {}/benchmarks.json and benchmarks.md",
        args.out.display()
    );
    Ok(())
}

/// A line about the machine the figures come from.
fn machine_context() -> String {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let dm = if carina_node::engine::detect_device_mapper() {
        "device-mapper"
    } else {
        "loop (no device-mapper)"
    };
    format!(
        "Last run: {cpus} CPUs, Linux {}, LVM activation: {dm}; volumes on a sparse file behind a loop device.",
        kernel.trim()
    )
}
