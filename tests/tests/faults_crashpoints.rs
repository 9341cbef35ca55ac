//! `CARINA_TEST_KILL_AT` stops only the test build. The same variable in
//! the environment of `carina-node` as `cargo build --workspace --bins`
//! (and every image) makes it, with default features, changes nothing: a
//! CreateLV that passes the named crash point is answered and the node
//! keeps running. The build with the feature `crashpoints`
//! (`carina-node-crashpoints`) given the same variable and the same call
//! dies there by SIGKILL, which shows the variable and the point are ones
//! that kill.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use carina_tests::cluster::{NodeArgs, Pki, Service};
use carina_tests::grpc::{create_lv, get_lv, host_config};
use carina_tests::{have_root, unique};

const MIB: u64 = 1 << 20;
/// A point every CreateLV passes, whatever its policy.
const POINT: &str = "create.begun";

/// A node with one HOST group, `CARINA_TEST_KILL_AT=create.begun` in its
/// environment, run as `binary`.
struct Rig {
    service: Service,
    args: NodeArgs,
    pki: Pki,
    group: String,
    _dir: tempfile::TempDir,
}

impl Rig {
    async fn start(crashpoints: bool) -> Result<Rig> {
        let dir = tempfile::Builder::new()
            .prefix("carina-crashpoints-")
            .tempdir()?;
        let root = dir.path().join("host");
        std::fs::create_dir_all(&root)?;
        let group = unique("cp-host");
        let pki = Pki::write(&dir.path().join("pki"))?;
        let mut args = NodeArgs::new(
            &unique("cp-node"),
            &pki,
            &host_config(&group, &root, 0),
            &dir.path().join("node"),
            &dir.path().join("node.log"),
        )?;
        if crashpoints {
            args = args.with_crashpoints()?;
        }
        args.env
            .push((carina_sys::crashpoint::ENV.to_string(), POINT.to_string()));
        let service = args.start().await?;
        Ok(Rig {
            service,
            args,
            pki,
            group,
            _dir: dir,
        })
    }

    /// CreateLV of a new volume: the node's answer.
    async fn create(&self, name: &str) -> Result<Result<(), tonic::Status>> {
        let mut client = self
            .pki
            .node_client(&self.args.name, &self.args.endpoint())
            .await?;
        Ok(client
            .create_lv(create_lv(name, &self.group, 8 * MIB))
            .await
            .map(drop))
    }
}

/// The default build ignores the variable: the CreateLV that passes the
/// point succeeds, the volume is there, and the process still runs.
#[tokio::test]
async fn a_default_build_ignores_the_kill_variable() -> Result<()> {
    if !have_root("a_default_build_ignores_the_kill_variable") {
        return Ok(());
    }
    let mut rig = Rig::start(false).await?;
    let name = unique("cp-vol");
    if let Err(status) = rig.create(&name).await? {
        bail!(
            "CreateLV on carina-node with {}={POINT} failed: {status:?} (log: {})",
            carina_sys::crashpoint::ENV,
            rig.args.log.display()
        );
    }
    rig.service
        .check_running()
        .context("carina-node stopped after passing the crash point")?;
    let mut client = rig
        .pki
        .node_client(&rig.args.name, &rig.args.endpoint())
        .await?;
    ensure!(
        get_lv(&mut client, &name).await?.is_some(),
        "the volume is not there"
    );
    rig.service.stop().await;
    Ok(())
}

/// The control: the test build, the same variable and call, dies at the
/// point by SIGKILL and answers nothing.
#[tokio::test]
async fn the_crashpoints_build_dies_at_the_named_point() -> Result<()> {
    if !have_root("the_crashpoints_build_dies_at_the_named_point") {
        return Ok(());
    }
    let mut rig = Rig::start(true).await?;
    let name = unique("cp-vol");
    let Err(status) = rig.create(&name).await? else {
        bail!("CreateLV succeeded on carina-node-crashpoints");
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        // Polling a process's exit: there is nothing to watch.
        match rig.service.check_running() {
            Err(e) => {
                let why = format!("{e:#}");
                ensure!(why.contains("SIGKILL"), "died, but not by SIGKILL: {why}");
                break;
            }
            Ok(()) if Instant::now() > deadline => {
                bail!("still running 30 s after CreateLV answered {status:?}")
            }
            Ok(()) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    let log = std::fs::read_to_string(&rig.args.log)?;
    ensure!(
        log.contains(POINT),
        "the log does not name the point: {log}"
    );
    rig.service.kill();
    Ok(())
}
