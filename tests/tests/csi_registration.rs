//! kubelet plugin registration served by a real `carina-node` process,
//! with the test doing what kubelet does: wait for
//! `carina.storage.io-reg.sock` in the registration directory, call
//! `GetInfo` on it, dial the CSI endpoint it advertises, report the
//! verdict with `NotifyRegistrationStatus`, and watch the socket vanish on
//! SIGTERM. Also: a crashed run's socket is replaced, a missing directory
//! stops the node with an error naming the flag, and every registration
//! call has its span.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;

use anyhow::{Context, Result};
use carina_node::csi_local::registration::PluginRegistration;
use carina_node::server::metrics::Metrics;
use carina_proto::csi;
use carina_proto::csi::identity_client::IdentityClient;
use carina_proto::csi::node_client::NodeClient;
use carina_proto::pluginregistration::registration_client::RegistrationClient;
use carina_proto::pluginregistration::{InfoRequest, PluginInfo, RegistrationStatus};
use carina_tests::cluster::{NodeArgs, Pki, START_TIMEOUT, Service};
use carina_tests::grpc::unix_channel;
use carina_tests::process::{tail, workspace_binary};
use carina_tests::spans::{SpanCollector, names as span_names};
use carina_tests::unique;
use opentelemetry::trace::TracerProvider as _;
use tokio::io::AsyncReadExt;
use tokio::sync::oneshot;
use tracing_subscriber::layer::SubscriberExt;

const SOCKET_NAME: &str = "carina.storage.io-reg.sock";

/// A node's files in a temporary directory: its certificates, its CSI
/// socket under `plugins/`, kubelet's `plugins_registry` (created or
/// not), and its log.
struct Fixture {
    args: NodeArgs,
    registry: PathBuf,
    _dir: tempfile::TempDir,
}

impl Fixture {
    fn new(make_registry: bool) -> Result<Fixture> {
        let dir = tempfile::Builder::new()
            .prefix("carina-registration-")
            .tempdir()?;
        let name = unique("node");
        let pki = Pki::write(&dir.path().join("pki"))?;
        // No device groups: registration needs none.
        let args = NodeArgs::new(
            &name,
            &pki,
            "{}",
            &dir.path().join("plugins/carina.storage.io"),
            &dir.path().join("carina-node.log"),
        )?;
        let registry = dir.path().join("plugins_registry");
        if make_registry {
            std::fs::create_dir(&registry)?;
        }
        Ok(Fixture {
            args,
            registry,
            _dir: dir,
        })
    }

    fn socket(&self) -> PathBuf {
        self.registry.join(SOCKET_NAME)
    }

    fn argv(&self) -> Vec<String> {
        let mut argv = self.args.argv();
        argv.extend([
            "--plugin-registration-dir".to_string(),
            self.registry.display().to_string(),
        ]);
        argv
    }

    /// Starts the node; ready once the registration socket accepts a
    /// connection, as kubelet finds it.
    async fn start(&self) -> Result<Service> {
        Service::start(
            "carina-node",
            &self.args.name,
            self.argv(),
            &self.socket(),
            &self.args.log,
        )
        .await
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.args.log).unwrap_or_default()
    }

    /// `carina_node_plugin_registered` for this node, from `/metrics`.
    async fn registered_gauge(&self) -> Result<Option<String>> {
        let text = metrics(self.args.metrics_port).await?;
        let prefix = format!(
            "carina_node_plugin_registered{{node=\"{}\"}} ",
            self.args.name
        );
        Ok(text
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .map(str::to_string))
    }
}

async fn registration_client(
    socket: &Path,
) -> Result<RegistrationClient<tonic::transport::Channel>> {
    Ok(RegistrationClient::new(
        unix_channel(socket.to_path_buf())
            .await
            .with_context(|| format!("dial {}", socket.display()))?,
    ))
}

async fn get_info(socket: &Path) -> Result<PluginInfo> {
    Ok(registration_client(socket)
        .await?
        .get_info(InfoRequest {})
        .await
        .context("GetInfo")?
        .into_inner())
}

async fn notify(socket: &Path, plugin_registered: bool, error: &str) -> Result<()> {
    registration_client(socket)
        .await?
        .notify_registration_status(RegistrationStatus {
            plugin_registered,
            error: error.to_string(),
        })
        .await
        .context("NotifyRegistrationStatus")?;
    Ok(())
}

/// The `/metrics` text of the node whose metrics port is `port`.
async fn metrics(port: u16) -> Result<String> {
    use tokio::io::AsyncWriteExt;
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .await?;
    let mut text = String::new();
    s.read_to_string(&mut text).await?;
    Ok(text)
}

/// What kubelet does with the node's registration, from finding the
/// socket to the node's exit.
#[tokio::test]
async fn kubelet_registers_the_node_and_it_deregisters_on_sigterm() -> Result<()> {
    let fx = Fixture::new(true)?;
    let mut node = fx.start().await?;

    let info = get_info(&fx.socket()).await?;
    assert_eq!(info.r#type, "CSIPlugin");
    assert_eq!(info.name, "carina.storage.io");
    assert_eq!(info.supported_versions, ["1.0.0"]);
    assert_eq!(
        Path::new(&info.endpoint),
        fx.args.csi_socket,
        "the --csi-endpoint path, as a plain path"
    );

    // kubelet dials the advertised endpoint right away.
    let channel = unix_channel(PathBuf::from(&info.endpoint)).await?;
    let plugin = IdentityClient::new(channel.clone())
        .get_plugin_info(csi::GetPluginInfoRequest {})
        .await?
        .into_inner();
    assert_eq!(plugin.name, info.name, "the same driver on both sockets");
    let node_info = NodeClient::new(channel.clone())
        .node_get_info(csi::NodeGetInfoRequest {})
        .await?
        .into_inner();
    assert_eq!(node_info.node_id, fx.args.name);

    assert_eq!(
        fx.registered_gauge().await?.as_deref(),
        Some("0"),
        "not registered before kubelet says so"
    );
    notify(&fx.socket(), true, "").await?;
    assert_eq!(fx.registered_gauge().await?.as_deref(), Some("1"));

    // A failed registration: logged at error level, the node serves on.
    let reason = unique("RegisterPlugin error -- plugin version check failed");
    notify(&fx.socket(), false, &reason).await?;
    assert_eq!(fx.registered_gauge().await?.as_deref(), Some("0"));
    let log = fx.log();
    assert!(
        log.lines()
            .any(|l| l.contains(" ERROR ") && l.contains(&reason)),
        "no error line with {reason:?} in the log:\n{}",
        tail(&fx.args.log, 20)
    );
    node.check_running()?;
    // kubelet retries with a new GetInfo; both sockets still answer.
    assert_eq!(get_info(&fx.socket()).await?, info);
    let probe = IdentityClient::new(channel)
        .probe(csi::ProbeRequest {})
        .await?
        .into_inner();
    assert_eq!(probe.ready, Some(true));
    notify(&fx.socket(), true, "").await?;
    assert_eq!(fx.registered_gauge().await?.as_deref(), Some("1"));

    // SIGTERM (SIGKILL only after the stop grace, which would leave it).
    node.stop().await;
    assert!(
        !fx.socket().exists(),
        "the registration socket outlived the node; log:\n{}",
        tail(&fx.args.log, 20)
    );
    assert!(
        fx.log().contains("registration socket removed"),
        "removed by the node itself; log:\n{}",
        tail(&fx.args.log, 20)
    );
    Ok(())
}

/// A socket left behind (by hand, then by a SIGKILL) is replaced by the
/// next start, which kubelet sees as a new plugin socket.
#[tokio::test]
async fn a_stale_registration_socket_is_replaced() -> Result<()> {
    let fx = Fixture::new(true)?;
    drop(std::os::unix::net::UnixListener::bind(fx.socket())?);
    // A process another test forks in that instant holds a copy of the
    // listening descriptor until its exec closes it; only then does the
    // socket refuse connections, as a dead plugin's does.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::os::unix::net::UnixStream::connect(fx.socket()).is_ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "precondition: nothing listens on the stale socket"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    // Ready only once the socket accepts: the stale one never does.
    let mut node = fx.start().await?;
    assert_eq!(get_info(&fx.socket()).await?.name, "carina.storage.io");

    node.kill();
    assert!(fx.socket().exists(), "a crash leaves the socket");
    assert!(std::os::unix::net::UnixStream::connect(fx.socket()).is_err());
    node.restart().await?;
    assert_eq!(
        get_info(&fx.socket()).await?.endpoint,
        fx.args.csi_socket.display().to_string()
    );
    node.stop().await;
    assert!(!fx.socket().exists());
    Ok(())
}

/// Runs carina-node with `argv` until it exits (at most
/// [`START_TIMEOUT`]): its status and output.
async fn run_to_exit(argv: &[String]) -> Result<(std::process::ExitStatus, String)> {
    let child = tokio::process::Command::new(workspace_binary("carina-node")?)
        .args(argv)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let out = tokio::time::timeout(START_TIMEOUT, child.wait_with_output())
        .await
        .context("carina-node did not exit")??;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok((out.status, text))
}

/// A registration directory that does not exist is a deployment mistake:
/// the node refuses to start, naming the flag, and creates nothing.
#[tokio::test]
async fn a_missing_registration_dir_stops_the_node_naming_the_flag() -> Result<()> {
    let fx = Fixture::new(false)?;
    let (status, output) = run_to_exit(&fx.argv()).await?;
    assert!(!status.success(), "{status}; output:\n{output}");
    let expected = format!(
        "--plugin-registration-dir {}: does not exist",
        fx.registry.display()
    );
    assert!(output.contains(&expected), "no {expected:?} in:\n{output}");
    assert!(!fx.registry.exists(), "the directory is kubelet's to make");
    assert!(!fx.args.csi_socket.exists(), "refused before serving");

    // Registration without a CSI socket to register is refused too.
    std::fs::create_dir(&fx.registry)?;
    let mut argv = fx.argv();
    let at = argv
        .iter()
        .position(|a| a == "--csi-endpoint")
        .context("--csi-endpoint in argv")?;
    argv.drain(at..at + 2);
    let (status, output) = run_to_exit(&argv).await?;
    assert!(!status.success(), "{status}; output:\n{output}");
    assert!(
        output.contains("--plugin-registration-dir needs --csi-endpoint"),
        "{output}"
    );
    assert!(!fx.socket().exists());
    Ok(())
}

/// Each registration call is a server span continuing the caller's trace
/// context with the handler's span inside, the verdict is recorded for
/// `/metrics`, and shutdown removes the socket.
// One thread: the server's tasks run where the thread-local subscriber is.
#[tokio::test(flavor = "current_thread")]
async fn registration_calls_have_spans() -> Result<()> {
    let spans = SpanCollector::default();
    let provider = spans.provider();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
    let _default = tracing::subscriber::set_default(subscriber);

    let dir = tempfile::Builder::new()
        .prefix("carina-registration-")
        .tempdir()?;
    let registration = PluginRegistration::new(dir.path(), "/var/lib/kubelet/plugins/c/csi.sock")?;
    let socket = registration.bind()?;
    let path = socket.path().to_path_buf();
    let metrics = Arc::new(Metrics::default());
    let (stop, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(registration.serve(socket, metrics.clone(), async {
        let _ = stopped.await;
    }));

    assert_eq!(
        get_info(&path).await?.endpoint,
        "/var/lib/kubelet/plugins/c/csi.sock"
    );
    assert_eq!(metrics.plugin_registered(), Some(false));
    notify(&path, true, "").await?;
    assert_eq!(metrics.plugin_registered(), Some(true));
    notify(&path, false, "driver name mismatch").await?;
    assert_eq!(metrics.plugin_registered(), Some(false));

    let _ = stop.send(());
    server.await??;
    assert!(!path.exists(), "shutdown removes the socket");

    let spans = spans.flush(&provider);
    let names = span_names(&spans);
    for name in [
        "pluginregistration.Registration/GetInfo",
        "Registration/GetInfo",
        "pluginregistration.Registration/NotifyRegistrationStatus",
    ] {
        assert!(names.iter().any(|n| n == name), "no {name} in {names:?}");
    }
    let handlers: Vec<_> = spans
        .iter()
        .filter(|s| s.name == "Registration/NotifyRegistrationStatus")
        .collect();
    assert_eq!(handlers.len(), 2, "{names:?}");
    let registered = |s: &&opentelemetry_sdk::trace::SpanData| {
        s.attributes
            .iter()
            .find(|kv| kv.key.as_str() == "plugin.registered")
            .map(|kv| kv.value.to_string())
    };
    let values: Vec<_> = handlers.iter().map(registered).collect();
    assert_eq!(
        values,
        [Some("true".to_string()), Some("false".to_string())]
    );
    for handler in &handlers {
        let server = spans
            .iter()
            .find(|s| s.span_context.span_id() == handler.parent_span_id)
            .unwrap_or_else(|| panic!("handler span without its server span in {names:?}"));
        assert_eq!(
            server.name,
            "pluginregistration.Registration/NotifyRegistrationStatus"
        );
    }
    Ok(())
}
