//! NodeStorage benchmarks: `CreateLV` + `DeleteLV` over mutual-TLS gRPC
//! against the engine called directly and the bare `lvcreate`/`lvremove`
//! (interleaved, one run); `Capacity` throughput with 16 concurrent
//! clients against the engine called directly; and the resident memory of
//! a `carina-node` process idle and holding 1,000 volumes.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use carina_node::engine::Engine;
use carina_proto::devcerts::{DevCa, Validity};
use carina_proto::nodestorage as pb;
use carina_proto::tls::{ClientTls, DEFAULT_TRUST_DOMAIN, connect};
use carina_tests::grpc::{Client, TestNode, create_lv, host_engine};
use carina_tests::ports::free_port;
use carina_tests::unique;

use crate::pool::LvmPool;
use crate::report::{Entry, timed};

const GROUP: &str = "NodeStorage over mTLS gRPC";
const SIZE: u64 = 8 << 20;

/// CreateLV+DeleteLV over gRPC vs engine vs bare commands, same VG.
pub async fn create_delete(iterations: usize) -> Result<Vec<Entry>> {
    let pool = LvmPool::new("bench-grpc", 2 << 30).await?;
    let (engine, vg) = (&pool.engine, &pool.vg);
    let node = TestNode::start(engine.clone(), "bench-node").await?;
    let mut client = node.client("controller").await?;

    let (mut grpc, mut direct, mut bare) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..(iterations + 5) {
        let record = i >= 5;
        let name = format!("g{i}");
        let t0 = Instant::now();
        client
            .create_lv(create_lv(&name, vg, SIZE))
            .await
            .context("CreateLV")?;
        client
            .delete_lv(pb::DeleteLvRequest { name })
            .await
            .context("DeleteLV")?;
        let g = t0.elapsed();

        let name = format!("e{i}");
        let t0 = Instant::now();
        engine.create_volume(pool.request(&name, SIZE)).await?;
        engine.delete_volume(&name).await?;
        let e = t0.elapsed();

        let name = format!("b{i}");
        let t0 = Instant::now();
        pool.bare_lvcreate(&name, "8m").run().await?;
        pool.bare_lvremove(&name).run().await?;
        let b = t0.elapsed();
        if record {
            grpc.push(g);
            direct.push(e);
            bare.push(b);
        }
    }
    node.stop().await?;
    Ok(vec![
        timed(
            GROUP,
            "grpc.lvm.create_delete",
            "lvcreate + lvremove",
            &grpc,
            Some(&bare),
        ),
        timed(
            GROUP,
            "grpc.lvm.create_delete_vs_engine",
            "engine called directly",
            &grpc,
            Some(&direct),
        ),
    ])
}

/// `Capacity` requests per second from 16 concurrent mTLS clients, and the
/// same 16-way load on the engine called directly.
pub async fn capacity_throughput(duration: Duration) -> Result<Vec<Entry>> {
    const CLIENTS: usize = 16;
    let group = unique("bench-cap");
    let (engine, _dirs) = host_engine(&group, None).await?;
    let node = TestNode::start(engine.clone(), "bench-node").await?;
    let mut clients = Vec::with_capacity(CLIENTS);
    for _ in 0..CLIENTS {
        clients.push(node.client("reader").await?);
    }

    let grpc_lat = run_load(clients, duration, |mut c: Client| async move {
        c.capacity(pb::CapacityRequest {
            device_group: String::new(),
        })
        .await
        .map(drop)
        .map_err(anyhow::Error::from)?;
        Ok(c)
    })
    .await?;
    let engines: Vec<Engine> = (0..CLIENTS).map(|_| engine.clone()).collect();
    let direct_lat = run_load(engines, duration, |e: Engine| async move {
        e.capacity(None).await?;
        Ok(e)
    })
    .await?;
    node.stop().await?;
    let rps = |lat: &[Duration]| lat.len() as f64 / duration.as_secs_f64();
    let (g, d) = (rps(&grpc_lat), rps(&direct_lat));
    let round = |x: f64| (x * 10.0).round() / 10.0;
    Ok(vec![
        Entry {
            name: "grpc.capacity.throughput_16_clients".into(),
            unit: "req/s".into(),
            p50: round(g),
            p99: round(g),
            floor_p50: Some(round(d)),
            ratio: Some((g / d * 1000.0).round() / 1000.0),
            iterations: grpc_lat.len(),
            group: GROUP.into(),
            floor: "engine.capacity() from 16 tasks".into(),
        },
        timed(
            GROUP,
            "grpc.capacity.latency_16_clients",
            "engine.capacity() under the same load",
            &grpc_lat,
            Some(&direct_lat),
        ),
    ])
}

/// Runs `op` in a loop on each of `workers` until `duration` passes;
/// returns every call's latency.
async fn run_load<W, F, Fut>(workers: Vec<W>, duration: Duration, op: F) -> Result<Vec<Duration>>
where
    W: Send + 'static,
    F: Fn(W) -> Fut + Send + Sync + Copy + 'static,
    Fut: std::future::Future<Output = Result<W>> + Send,
{
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for w in workers {
        let stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            let mut w = w;
            let mut lat = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let t0 = Instant::now();
                w = op(w).await?;
                lat.push(t0.elapsed());
            }
            anyhow::Ok(lat)
        }));
    }
    tokio::time::sleep(duration).await;
    stop.store(true, Ordering::Relaxed);
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await??);
    }
    Ok(all)
}

/// Resident memory of a real `carina-node` process: idle, then holding
/// 1,000 HOST volumes.
pub async fn node_memory() -> Result<Vec<Entry>> {
    let bin = sibling_binary("carina-node")?;
    let dir = tempfile::tempdir()?;
    let ca = DevCa::new("carina bench CA", Validity::days(1))?;
    let server = ca.issue_server(
        "bench-node",
        &["localhost".to_string()],
        &[],
        Validity::days(1),
    )?;
    let client = ca.issue_client(DEFAULT_TRUST_DOMAIN, "controller", Validity::days(1))?;
    let write = |name: &str, text: &str| -> Result<PathBuf> {
        let p = dir.path().join(name);
        std::fs::write(&p, text)?;
        Ok(p)
    };
    let (cert, key, ca_file) = (
        write("node.pem", &server.cert_pem)?,
        write("node-key.pem", &server.key_pem)?,
        write("ca.pem", ca.cert_pem())?,
    );
    let root = dir.path().join("volumes");
    let group = "bench-host";
    let config = write(
        "config.json",
        &format!(
            r#"{{"diskSelector":[{{"name":"{group}","policy":"HOST","root":"{}","reserveBytes":0}}],"diskScanInterval":"0"}}"#,
            root.display()
        ),
    )?;
    let port = free_port()?;
    let metrics_port = free_port()?;
    let mut child = tokio::process::Command::new(&bin)
        .arg("--config")
        .arg(&config)
        .args([
            "--node-name",
            "bench-node",
            "--listen",
            &format!("127.0.0.1:{port}"),
        ])
        .args(["--metrics-listen", &format!("127.0.0.1:{metrics_port}")])
        .arg("--tls-cert")
        .arg(&cert)
        .arg("--tls-key")
        .arg(&key)
        .arg("--tls-ca")
        .arg(&ca_file)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("start {}", bin.display()))?;
    let pid = child.id().context("carina-node pid")?;
    let tls = ClientTls {
        ca_pem: ca.cert_pem().as_bytes().to_vec(),
        cert_pem: client.cert_pem.into_bytes(),
        key_pem: client.key_pem.into_bytes(),
        server_name: "bench-node".into(),
    };
    let mut c = None;
    for _ in 0..100 {
        if let Ok(ch) = connect(&format!("127.0.0.1:{port}"), &tls).await {
            c = Some(pb::node_storage_client::NodeStorageClient::new(ch));
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut c = match (c, child.try_wait()?) {
        (Some(c), _) => c,
        (None, Some(status)) => {
            bail!("carina-node exited at start ({status}); run it by hand to see why")
        }
        (None, None) => bail!("carina-node did not come up within 10 s"),
    };
    c.capacity(pb::CapacityRequest::default()).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle = rss_mib(pid)?;
    for i in 0..1000 {
        c.create_lv(create_lv(&format!("v{i:04}"), group, 1 << 20))
            .await
            .with_context(|| format!("CreateLV v{i:04}"))?;
    }
    let listed = c
        .list_l_vs(pb::ListLVsRequest {
            device_group: String::new(),
            page_size: 1000,
            page_token: String::new(),
        })
        .await?
        .into_inner();
    if listed.volumes.len() != 1000 {
        bail!(
            "expected 1000 volumes, the node lists {}",
            listed.volumes.len()
        );
    }
    let loaded = rss_mib(pid)?;
    let _ = child.start_kill();
    let _ = child.wait().await;
    let entry = |name: &str, v: f64| Entry {
        name: name.into(),
        unit: "MiB".into(),
        p50: (v * 10.0).round() / 10.0,
        p99: (v * 10.0).round() / 10.0,
        floor_p50: None,
        ratio: None,
        iterations: 1,
        group: "carina-node resident memory".into(),
        floor: String::new(),
    };
    Ok(vec![
        entry("node.rss.idle", idle),
        entry("node.rss.1000_volumes", loaded),
    ])
}

fn rss_mib(pid: u32) -> Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .context("VmRSS")?;
    Ok(kb / 1024.0)
}

/// A binary built next to this one (same cargo profile and target dir).
fn sibling_binary(name: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let path = exe
        .parent()
        .context("bench binary has no directory")?
        .join(name);
    if !path.exists() {
        bail!(
            "{} not found: build it first (make bench does)",
            path.display()
        );
    }
    Ok(path)
}
