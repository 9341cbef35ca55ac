//! gRPC test harness: a real `NodeStorage` server on `127.0.0.1:0` with a
//! development CA, certificates laid out like a mounted Kubernetes Secret
//! (so rotation is an atomic symlink swap), and clients per role.
//!
//! ```ignore
//! let (engine, _dirs) = host_engine("g", None).await?;
//! let node = TestNode::start(engine, "node-a").await?;
//! let mut client = node.client("controller").await?;
//! ```
//!
//! Dropping a [`TestNode`] stops its server.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use carina_node::engine::{Config, Engine, EngineOptions};
use carina_node::server::NodeServer;
use carina_node::server::metrics::Metrics;
use carina_proto::devcerts::{CertifiedKey, DevCa, Validity};
use carina_proto::nodestorage as pb;
use carina_proto::nodestorage::node_storage_client::NodeStorageClient;
use carina_proto::tls::{
    ClientTls, DEFAULT_TRUST_DOMAIN, ReloadingServerConfig, ServerTlsFiles, connect,
};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::{Channel, Endpoint, Uri};

/// How often the test server looks at its certificate files.
pub const TEST_RELOAD_INTERVAL: Duration = Duration::from_millis(50);

/// A client of the node's `NodeStorage` service.
pub type Client = NodeStorageClient<Channel>;

/// Certificate files in the layout kubelet gives a mounted Secret:
/// `tls.crt`, `tls.key` and `ca.crt` are symlinks into `..data/`, and
/// `..data` is a symlink to a versioned directory that is swapped in one
/// rename.
#[derive(Debug)]
pub struct CertDir {
    dir: tempfile::TempDir,
    version: u32,
}

impl CertDir {
    /// A directory holding `server` and `ca_pem`.
    pub fn new(server: &CertifiedKey, ca_pem: &str) -> Result<CertDir> {
        let dir = tempfile::Builder::new().prefix("carina-tls-").tempdir()?;
        let mut cd = CertDir { dir, version: 0 };
        cd.write(server, ca_pem)?;
        for name in ["tls.crt", "tls.key", "ca.crt"] {
            std::os::unix::fs::symlink(format!("..data/{name}"), cd.dir.path().join(name))?;
        }
        Ok(cd)
    }

    /// Replaces all three files at once (an atomic swap of `..data`).
    pub fn write(&mut self, server: &CertifiedKey, ca_pem: &str) -> Result<()> {
        self.version += 1;
        let versioned = format!("..v{}", self.version);
        let vdir = self.dir.path().join(&versioned);
        std::fs::create_dir(&vdir)?;
        std::fs::write(vdir.join("tls.crt"), &server.cert_pem)?;
        std::fs::write(vdir.join("tls.key"), &server.key_pem)?;
        std::fs::write(vdir.join("ca.crt"), ca_pem)?;
        let tmp = self.dir.path().join("..data_tmp");
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&versioned, &tmp)?;
        std::fs::rename(&tmp, self.dir.path().join("..data"))?;
        Ok(())
    }

    pub fn files(&self) -> ServerTlsFiles {
        ServerTlsFiles {
            cert: self.dir.path().join("tls.crt"),
            key: self.dir.path().join("tls.key"),
            ca: self.dir.path().join("ca.crt"),
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// A server certificate for `node` that also names localhost and 127.0.0.1.
pub fn server_cert(ca: &DevCa, node: &str, validity: Validity) -> Result<CertifiedKey> {
    Ok(ca.issue_server(
        node,
        &["localhost".to_string()],
        &[IpAddr::V4(Ipv4Addr::LOCALHOST)],
        validity,
    )?)
}

/// A running in-process `NodeStorage` server.
#[derive(Debug)]
pub struct TestNode {
    pub addr: SocketAddr,
    pub node_name: String,
    /// The CA that signed the server certificate and must sign clients'.
    pub ca: Arc<DevCa>,
    pub engine: Engine,
    pub metrics: Arc<Metrics>,
    pub certs: CertDir,
    tls: ReloadingServerConfig,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<()>>>,
}

impl TestNode {
    /// Serves `engine` as node `node_name` with a fresh CA.
    pub async fn start(engine: Engine, node_name: &str) -> Result<TestNode> {
        let ca = DevCa::new("carina test CA", Validity::days(1))?;
        let server = server_cert(&ca, node_name, Validity::days(1))?;
        Self::start_with(engine, node_name, ca, &server).await
    }

    /// Serves `engine` as `node_name` presenting `server` (signed by `ca`).
    pub async fn start_with(
        engine: Engine,
        node_name: &str,
        ca: DevCa,
        server: &CertifiedKey,
    ) -> Result<TestNode> {
        let certs = CertDir::new(server, ca.cert_pem())?;
        let tls = ReloadingServerConfig::watch(certs.files(), TEST_RELOAD_INTERVAL)?;
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let node = NodeServer::new(engine.clone(), node_name).grace_period(Duration::from_secs(5));
        let metrics = node.metrics();
        let (stop, stopped) = oneshot::channel::<()>();
        let serve_tls = tls.clone();
        let task = tokio::spawn(async move {
            node.serve(listener, serve_tls, async {
                let _ = stopped.await;
            })
            .await
            .context("serve")
        });
        Ok(TestNode {
            addr,
            node_name: node_name.to_string(),
            ca: Arc::new(ca),
            engine,
            metrics,
            certs,
            tls,
            stop: Some(stop),
            task: Some(task),
        })
    }

    /// `127.0.0.1:<port>`.
    pub fn endpoint(&self) -> String {
        self.addr.to_string()
    }

    /// A client certificate for `role` in the default trust domain.
    pub fn issue_client(&self, role: &str, validity: Validity) -> Result<CertifiedKey> {
        Ok(self.ca.issue_client(DEFAULT_TRUST_DOMAIN, role, validity)?)
    }

    /// Client credentials for `role` that expect this node's name.
    pub fn client_tls(&self, role: &str) -> Result<ClientTls> {
        let cert = self.issue_client(role, Validity::days(1))?;
        Ok(ClientTls {
            ca_pem: self.ca.cert_pem().as_bytes().to_vec(),
            cert_pem: cert.cert_pem.into_bytes(),
            key_pem: cert.key_pem.into_bytes(),
            server_name: self.node_name.clone(),
        })
    }

    /// A connected client with role `role`.
    pub async fn client(&self, role: &str) -> Result<Client> {
        let channel = connect(&self.endpoint(), &self.client_tls(role)?).await?;
        Ok(NodeStorageClient::new(channel))
    }

    /// Waits until the server has loaded new certificate files.
    pub async fn wait_for_reload(&mut self, timeout: Duration) -> Result<()> {
        tokio::time::timeout(timeout, self.tls.changed())
            .await
            .context("the server did not reload its certificate files")
    }

    /// Stops the server and waits for it (in-flight calls finish first).
    pub async fn stop(mut self) -> Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match self.task.take() {
            Some(task) => task.await?,
            None => Ok(()),
        }
    }
}

impl Drop for TestNode {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// A shared (not whole-disk) CreateLV of `size` bytes in `group`.
pub fn create_lv(name: &str, group: &str, size: u64) -> pb::CreateLvRequest {
    pb::CreateLvRequest {
        name: name.into(),
        device_group: group.into(),
        size_bytes: size,
        exclusive: false,
    }
}

/// The node's volume `name`, `None` when it has none (`NOT_FOUND`).
pub async fn get_lv(client: &mut Client, name: &str) -> Result<Option<pb::LogicVolume>> {
    match client
        .get_lv(pb::GetLvRequest {
            name: name.to_string(),
        })
        .await
    {
        Ok(r) => Ok(r.into_inner().volume),
        Err(s) if s.code() == tonic::Code::NotFound => Ok(None),
        Err(s) => Err(anyhow::Error::from(s).context(format!("GetLV {name}"))),
    }
}

/// `config.json` text with one HOST group `group` at `root`.
pub fn host_config(group: &str, root: &Path, reserve_bytes: u64) -> String {
    format!(
        r#"{{"diskSelector":[{{"name":"{group}","policy":"HOST","root":"{}","reserveBytes":{reserve_bytes}}}],"diskScanInterval":"0"}}"#,
        root.display()
    )
}

/// Directories an engine started by [`host_engine`] lives in; keep it
/// alive as long as the engine.
#[derive(Debug)]
pub struct EngineDirs {
    pub root: PathBuf,
    _root: Option<tempfile::TempDir>,
}

/// An engine with one HOST group `group` (reserve 0) at `root`, or at a
/// fresh temp dir when `root` is `None`.
pub async fn host_engine(group: &str, root: Option<&Path>) -> Result<(Engine, EngineDirs)> {
    let (root, root_guard) = match root {
        Some(r) => (r.to_path_buf(), None),
        None => {
            let d = tempfile::Builder::new().prefix("carina-host-").tempdir()?;
            (d.path().to_path_buf(), Some(d))
        }
    };
    let engine = start_engine(&host_config(group, &root, 0)).await?;
    Ok((
        engine,
        EngineDirs {
            root,
            _root: root_guard,
        },
    ))
}

/// An engine over `config_json`.
pub async fn start_engine(config_json: &str) -> Result<Engine> {
    let config = Config::from_json(config_json)?;
    Ok(Engine::start(
        config,
        EngineOptions {
            device_mapper: None,
            ..Default::default()
        },
    )
    .await?)
}

/// A channel to a gRPC server on the unix socket at `path` (CSI sockets).
pub async fn unix_channel(path: PathBuf) -> Result<Channel> {
    // tonic wants a URI; the connector ignores it and dials the socket.
    Ok(Endpoint::from_static("http://csi.invalid")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(path).await?,
                ))
            }
        }))
        .await?)
}

/// A `CopyLV` call read to its end.
#[derive(Debug)]
pub struct CopyRun {
    /// The progress messages before the last (all with `done` false).
    pub progress: Vec<pb::CopyLvProgress>,
    /// The last message (`done`, with the target), or the status the
    /// call ended with, whether it came from the call itself (a request
    /// refused up front) or as the stream's item (a copy that failed).
    pub outcome: std::result::Result<pb::CopyLvProgress, tonic::Status>,
}

/// Calls `CopyLV` and reads its stream to the end. An error is a broken
/// stream: a `done` message that is not the last, or an end without one.
pub async fn copy_lv(client: &mut Client, req: pb::CopyLvRequest) -> Result<CopyRun> {
    let mut stream = match client.copy_lv(req).await {
        Ok(r) => r.into_inner(),
        Err(status) => {
            return Ok(CopyRun {
                progress: Vec::new(),
                outcome: Err(status),
            });
        }
    };
    let mut progress: Vec<pb::CopyLvProgress> = Vec::new();
    loop {
        match stream.message().await {
            Ok(Some(m)) => {
                if let Some(done) = progress.last().filter(|p| p.done) {
                    anyhow::bail!("a message after the done one: {done:?}, then {m:?}");
                }
                progress.push(m);
            }
            Ok(None) => break,
            Err(status) => {
                if let Some(done) = progress.last().filter(|p| p.done) {
                    anyhow::bail!("an error after the done message {done:?}: {status:?}");
                }
                return Ok(CopyRun {
                    progress,
                    outcome: Err(status),
                });
            }
        }
    }
    match progress.pop() {
        Some(last) if last.done => Ok(CopyRun {
            progress,
            outcome: Ok(last),
        }),
        last => anyhow::bail!("the stream ended without a done message: last {last:?}"),
    }
}
