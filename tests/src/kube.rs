//! A real Kubernetes control plane for tests: etcd and kube-apiserver as
//! processes on loopback, and on request kube-controller-manager and
//! kube-scheduler; the binaries are built by `tests/tools/build.sh`.
//!
//! ```ignore
//! let cluster = KubeCluster::start().await?;
//! cluster.install_crds().await?;
//! let lvs: Api<LogicVolume> = Api::all(cluster.client());
//! let _scheduler = cluster.start_scheduler(&[]).await?;
//! ```
//!
//! What it sets up, all in one temporary directory:
//! - etcd on two free loopback ports, `--unsafe-no-fsync`;
//! - a development CA (rcgen) that signs the apiserver's serving
//!   certificate (`localhost`, `127.0.0.1`, the in-cluster names) and an
//!   admin client certificate in group `system:masters`;
//! - an ECDSA service-account signing key (the apiserver accepts RSA or
//!   ECDSA; rcgen makes ECDSA without a C library);
//! - kube-apiserver with RBAC and client-certificate authentication, and the
//!   admission plugins `ServiceAccount` (it wants the token controller's
//!   work before admitting pods) and `TaintNodesByCondition` (it taints every
//!   new Node not-ready, and only a kubelet clears that) off;
//! - an admin kubeconfig that `kubectl`, the upstream components and
//!   [`kube::Client`] read.
//!
//! Start-up waits for etcd's `/health` and the apiserver's `/readyz` with a
//! deadline. Dropping the cluster stops the apiserver, then etcd, and
//! removes the directory; drop components started from it first. Process
//! logs go to `$CARINA_TEST_LOG_DIR/kube-<pid>-<n>/` when that variable is
//! set (so they survive the test), otherwise into the temporary directory.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use carina_api::crds_yaml;
use carina_proto::devcerts::{DevCa, Validity};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::wait::{await_condition, conditions};
use rcgen::{
    CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use serde::Deserialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::ports::free_ports;
use crate::process::{ChildGuard, tail, upstream_tool};
use crate::unique;

/// How long etcd and kube-apiserver together may take to become ready.
pub const START_TIMEOUT: Duration = Duration::from_secs(90);

/// How long a CRD may take to become `Established`.
pub const CRD_TIMEOUT: Duration = Duration::from_secs(30);

/// The Service network the apiserver is told about (nothing routes it).
pub const SERVICE_CLUSTER_IP_RANGE: &str = "10.0.0.0/24";

/// Field manager of the harness's server-side applies.
const FIELD_MANAGER: &str = "carina-tests";

/// Attempts at start-up when a port picked as free was taken meanwhile.
const PORT_ATTEMPTS: usize = 3;

/// `etcd`, from `tests/tools/build.sh etcd` (or `CARINA_ETCD`).
pub fn etcd_binary() -> Result<PathBuf> {
    upstream_tool("CARINA_ETCD", "etcd-v3.6.16", "etcd")
}

/// A Kubernetes binary (`kube-apiserver`, `kube-scheduler`,
/// `kube-controller-manager`) from `tests/tools/build.sh kube`, or the path
/// in `CARINA_KUBE_APISERVER` (`CARINA_KUBE_SCHEDULER`, ...).
pub fn kube_binary(name: &str) -> Result<PathBuf> {
    let env = format!("CARINA_{}", name.to_uppercase().replace('-', "_"));
    upstream_tool(&env, "kube-v1.36.3", name)
}

/// Whether start-up failed because a port picked as free was taken.
fn port_taken(e: &anyhow::Error) -> bool {
    format!("{e:#}").contains("address already in use")
}

/// How the apiserver is set up.
#[derive(Debug, Clone, Copy, Default)]
pub enum ApiServerMode {
    /// On loopback only, for tests with no kubelet: the `kubernetes`
    /// Service has no endpoints, ServiceAccount admission and the not-ready
    /// taint are off.
    #[default]
    Loopback,
    /// For a cluster with a real kubelet whose pods call the apiserver:
    /// served on every address and advertised at `host_ip` (the `kubernetes`
    /// Service points there), Node and RBAC authorization, ServiceAccount
    /// admission on (pods get tokens), and the kubelet client certificate
    /// for `kubectl logs/exec`.
    WithKubelet { host_ip: Ipv4Addr },
}

/// A program and arguments, to start a process of the cluster again.
#[derive(Debug, Clone)]
struct Relaunch {
    program: PathBuf,
    args: Vec<String>,
}

/// A running etcd + kube-apiserver pair with an admin client.
pub struct KubeCluster {
    client: Client,
    server: String,
    kubeconfig: PathBuf,
    log_dir: PathBuf,
    pki: Pki,
    mode: ApiServerMode,
    /// How etcd and the apiserver were started, to start them again.
    etcd_start: Relaunch,
    apiserver_start: Relaunch,
    etcd_port: u16,
    // Dropped in this order: the apiserver before its etcd, the directory
    // (data, certificates) last.
    apiserver: ChildGuard,
    etcd: ChildGuard,
    dir: tempfile::TempDir,
}

impl std::fmt::Debug for KubeCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeCluster")
            .field("server", &self.server)
            .field("kubeconfig", &self.kubeconfig)
            .field("log_dir", &self.log_dir)
            .finish_non_exhaustive()
    }
}

impl KubeCluster {
    /// Starts etcd and kube-apiserver and waits until the apiserver answers
    /// `/readyz` with `ok` (at most [`START_TIMEOUT`]). Fails with the
    /// processes' log tails if either exits or the deadline passes.
    pub async fn start() -> Result<KubeCluster> {
        Self::start_with(ApiServerMode::Loopback).await
    }

    /// [`KubeCluster::start`] with the apiserver set up for `mode`.
    pub async fn start_with(mode: ApiServerMode) -> Result<KubeCluster> {
        let mut attempt = 1;
        loop {
            match Self::try_start(mode).await {
                Err(e) if attempt < PORT_ATTEMPTS && port_taken(&e) => {
                    eprintln!("kube test cluster: a port was taken, retrying: {e:#}");
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    async fn try_start(mode: ApiServerMode) -> Result<KubeCluster> {
        let etcd_bin = etcd_binary()?;
        let apiserver_bin = kube_binary("kube-apiserver")?;
        let dir = tempfile::Builder::new().prefix("carina-kube-").tempdir()?;
        let log_dir = match std::env::var_os("CARINA_TEST_LOG_DIR") {
            Some(logs) => PathBuf::from(logs).join(unique("kube")),
            None => dir.path().join("logs"),
        };
        std::fs::create_dir_all(&log_dir)
            .with_context(|| format!("create {}", log_dir.display()))?;

        let host_ip = match mode {
            ApiServerMode::Loopback => None,
            ApiServerMode::WithKubelet { host_ip } => Some(host_ip),
        };
        let pki = Pki::write(&dir.path().join("pki"), host_ip)?;

        let [client_port, peer_port, secure_port] = free_ports()?;
        let etcd_url = format!("http://127.0.0.1:{client_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let etcd_args = [
            "--name=carina-test".to_string(),
            format!("--data-dir={}", dir.path().join("etcd").display()),
            format!("--listen-client-urls={etcd_url}"),
            format!("--advertise-client-urls={etcd_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=carina-test={peer_url}"),
            "--unsafe-no-fsync".to_string(),
            "--log-level=warn".to_string(),
        ];
        let mut etcd = ChildGuard::spawn(
            "etcd",
            &etcd_bin,
            &etcd_args,
            &[],
            &log_dir.join("etcd.log"),
        )?;
        let deadline = Instant::now() + START_TIMEOUT;
        wait_etcd_healthy(client_port, &mut etcd, deadline).await?;

        let server = format!("https://127.0.0.1:{secure_port}");
        let mut apiserver_args = vec![
            format!("--etcd-servers={etcd_url}"),
            format!("--secure-port={secure_port}"),
            format!("--cert-dir={}", dir.path().join("apiserver").display()),
            format!("--tls-cert-file={}", pki.serving_cert.display()),
            format!("--tls-private-key-file={}", pki.serving_key.display()),
            format!("--client-ca-file={}", pki.ca_cert.display()),
            // Published in kube-system/extension-apiserver-authentication,
            // which components with delegated authentication read.
            format!("--requestheader-client-ca-file={}", pki.ca_cert.display()),
            "--requestheader-allowed-names=front-proxy-client".to_string(),
            "--requestheader-username-headers=X-Remote-User".to_string(),
            "--requestheader-group-headers=X-Remote-Group".to_string(),
            "--requestheader-extra-headers-prefix=X-Remote-Extra-".to_string(),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".to_string(),
            format!("--service-account-key-file={}", pki.sa_public.display()),
            format!(
                "--service-account-signing-key-file={}",
                pki.sa_private.display()
            ),
            format!("--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}"),
            "--allow-privileged=true".to_string(),
            "--profiling=false".to_string(),
        ];
        match host_ip {
            None => apiserver_args.extend([
                "--bind-address=127.0.0.1".to_string(),
                "--advertise-address=127.0.0.1".to_string(),
                "--authorization-mode=RBAC".to_string(),
                "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition".to_string(),
                // The `kubernetes` Service cannot point at a loopback
                // address; nothing here needs it.
                "--endpoint-reconciler-type=none".to_string(),
            ]),
            Some(ip) => apiserver_args.extend([
                "--bind-address=0.0.0.0".to_string(),
                format!("--advertise-address={ip}"),
                "--authorization-mode=Node,RBAC".to_string(),
                format!("--kubelet-client-certificate={}", pki.admin_cert.display()),
                format!("--kubelet-client-key={}", pki.admin_key.display()),
                // The Node's name is not in DNS.
                "--kubelet-preferred-address-types=InternalIP,Hostname".to_string(),
            ]),
        }
        let mut apiserver = ChildGuard::spawn(
            "kube-apiserver",
            &apiserver_bin,
            &apiserver_args,
            &[],
            &log_dir.join("kube-apiserver.log"),
        )?;

        let kubeconfig = dir.path().join("admin.kubeconfig");
        std::fs::write(
            &kubeconfig,
            kubeconfig_yaml(&server, &pki.ca_cert, &pki.admin_cert, &pki.admin_key),
        )?;
        let client = client_from(&kubeconfig).await?;

        wait_ready(&client, &mut etcd, &mut apiserver, deadline).await?;
        Ok(KubeCluster {
            client,
            server,
            kubeconfig,
            log_dir,
            pki,
            mode,
            etcd_start: Relaunch {
                program: etcd_bin,
                args: etcd_args.to_vec(),
            },
            apiserver_start: Relaunch {
                program: apiserver_bin,
                args: apiserver_args,
            },
            etcd_port: client_port,
            apiserver,
            etcd,
            dir,
        })
    }

    /// Kills kube-apiserver (SIGKILL, a crash), leaves it down for
    /// `down`, and starts it again with the same arguments (its log
    /// appended); returns once `/readyz` says ok.
    pub async fn restart_apiserver(&mut self, down: Duration) -> Result<()> {
        self.apiserver.kill();
        tokio::time::sleep(down).await;
        let r = &self.apiserver_start;
        self.apiserver = ChildGuard::spawn(
            "kube-apiserver",
            &r.program,
            &r.args,
            &[],
            &self.log_dir.join("kube-apiserver.log"),
        )?;
        let deadline = Instant::now() + START_TIMEOUT;
        wait_ready(&self.client, &mut self.etcd, &mut self.apiserver, deadline).await
    }

    /// Kills etcd (SIGKILL), leaves it down for `down`, and starts it again
    /// on the same data directory and ports; returns once etcd is healthy
    /// and the apiserver, which stayed up, is ready again.
    pub async fn restart_etcd(&mut self, down: Duration) -> Result<()> {
        self.etcd.kill();
        tokio::time::sleep(down).await;
        let r = &self.etcd_start;
        self.etcd = ChildGuard::spawn(
            "etcd",
            &r.program,
            &r.args,
            &[],
            &self.log_dir.join("etcd.log"),
        )?;
        let deadline = Instant::now() + START_TIMEOUT;
        wait_etcd_healthy(self.etcd_port, &mut self.etcd, deadline).await?;
        wait_ready(&self.client, &mut self.etcd, &mut self.apiserver, deadline).await
    }

    /// A client authenticated as the admin (group `system:masters`).
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// The admin kubeconfig file (for `kubectl`, kube-scheduler,
    /// kube-controller-manager, external-provisioner).
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// The apiserver's URL, `https://127.0.0.1:<port>`.
    pub fn server_url(&self) -> &str {
        &self.server
    }

    /// The cluster's private directory, for files other components need
    /// (it is removed on drop).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The private key the apiserver signs ServiceAccount tokens with
    /// (PEM, ECDSA P-256).
    pub fn service_account_key(&self) -> &Path {
        &self.pki.sa_private
    }

    /// The CA certificate (PEM) that signed the apiserver's serving
    /// certificate and every client certificate of this cluster.
    pub fn ca_cert(&self) -> &Path {
        &self.pki.ca_cert
    }

    /// Writes a client certificate for `user` in `group` and its key into
    /// `dir` as `<file>.crt` and `<file>.key`; returns both paths.
    pub fn write_client_cert(
        &self,
        dir: &Path,
        file: &str,
        user: &str,
        group: &str,
    ) -> Result<(PathBuf, PathBuf)> {
        let (cert, key) = client_cert(&self.pki.ca, user, group, Validity::days(2))?;
        write_pair(dir, file, &cert, &key)
    }

    /// Writes a serving certificate for `name` (DNS SAN) and `ips` into
    /// `dir` as `<file>.crt` and `<file>.key`; returns both paths.
    pub fn write_serving_cert(
        &self,
        dir: &Path,
        file: &str,
        name: &str,
        ips: &[IpAddr],
    ) -> Result<(PathBuf, PathBuf)> {
        let issued = self
            .pki
            .ca
            .issue_server(name, &[], ips, Validity::days(2))?;
        write_pair(dir, file, &issued.cert_pem, &issued.key_pem)
    }

    /// A kubeconfig for the same apiserver with the client certificate
    /// `cert`/`key` instead of the admin's, written to `path`.
    pub fn write_kubeconfig(&self, path: &Path, cert: &Path, key: &Path) -> Result<()> {
        std::fs::write(
            path,
            kubeconfig_yaml(&self.server, &self.pki.ca_cert, cert, key),
        )?;
        Ok(())
    }

    /// [`write_kubeconfig`](Self::write_kubeconfig) for a client in
    /// another network namespace: the apiserver at `host` (an address
    /// its serving certificate names) instead of 127.0.0.1.
    pub fn write_kubeconfig_via(
        &self,
        path: &Path,
        host: Ipv4Addr,
        cert: &Path,
        key: &Path,
    ) -> Result<()> {
        let server = self.server.replacen("127.0.0.1", &host.to_string(), 1);
        std::fs::write(path, kubeconfig_yaml(&server, &self.pki.ca_cert, cert, key))?;
        Ok(())
    }

    /// The admin kubeconfig with the apiserver at `host` (see
    /// [`write_kubeconfig_via`](Self::write_kubeconfig_via)).
    pub fn write_admin_kubeconfig_via(&self, path: &Path, host: Ipv4Addr) -> Result<()> {
        let text = std::fs::read_to_string(&self.kubeconfig)?;
        let server = self.server.replacen("127.0.0.1", &host.to_string(), 1);
        std::fs::write(path, text.replace(&self.server, &server))?;
        Ok(())
    }

    /// Where `etcd.log` and `kube-apiserver.log` are written.
    pub fn log_dir(&self) -> &Path {
        &self.log_dir
    }

    /// Fails if etcd or the apiserver has exited.
    pub fn check_running(&mut self) -> Result<()> {
        self.etcd.check_running()?;
        self.apiserver.check_running()
    }

    /// Applies Carina's CRDs (the documents of [`crds_yaml`]) by
    /// server-side apply and waits, by watch, until each is `Established`
    /// (at most [`CRD_TIMEOUT`] each).
    pub async fn install_crds(&self) -> Result<()> {
        let api: Api<CustomResourceDefinition> = Api::all(self.client());
        let yaml = crds_yaml();
        let mut names = Vec::new();
        for doc in serde_yaml::Deserializer::from_str(&yaml) {
            let crd = CustomResourceDefinition::deserialize(doc).context("parse crds_yaml()")?;
            let name = crd.metadata.name.clone().context("a CRD without a name")?;
            api.patch(
                &name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&crd),
            )
            .await
            .with_context(|| format!("apply CRD {name}"))?;
            names.push(name);
        }
        for name in names {
            let established = await_condition(api.clone(), &name, conditions::is_crd_established());
            tokio::time::timeout(CRD_TIMEOUT, established)
                .await
                .with_context(|| format!("CRD {name} not Established within {CRD_TIMEOUT:?}"))?
                .with_context(|| format!("watch CRD {name}"))?;
        }
        Ok(())
    }
}

impl KubeCluster {
    /// Starts kube-scheduler with `extenders` (entries of
    /// `KubeSchedulerConfiguration.extenders`: `urlPrefix`, `filterVerb`,
    /// `prioritizeVerb`, `weight`, `nodeCacheCapable`, ...; empty for none),
    /// leader election off, and waits for its `/healthz`.
    pub async fn start_scheduler(&self, extenders: &[serde_json::Value]) -> Result<Component> {
        let config = self.dir().join(format!("{}.json", unique("scheduler")));
        let doc = serde_json::json!({
            "apiVersion": "kubescheduler.config.k8s.io/v1",
            "kind": "KubeSchedulerConfiguration",
            "clientConnection": {"kubeconfig": self.kubeconfig},
            "leaderElection": {"leaderElect": false},
            "extenders": extenders,
        });
        std::fs::write(&config, serde_json::to_vec_pretty(&doc)?)?;
        let args = vec![format!("--config={}", config.display())];
        self.start_component("kube-scheduler", args).await
    }

    /// Starts kube-controller-manager with every default controller, leader
    /// election off, plus `extra_args`, and waits for its `/healthz`.
    /// Without a kubelet ([`ApiServerMode::Loopback`]) the node-lifecycle
    /// controller stays off: it would taint every Node unreachable (unless
    /// the test renews the Nodes' Leases itself and passes its own
    /// `--controllers`, which then replaces this choice).
    pub async fn start_controller_manager(&self, extra_args: &[&str]) -> Result<Component> {
        let controllers = match self.mode {
            ApiServerMode::Loopback => "*,-node-lifecycle-controller",
            ApiServerMode::WithKubelet { .. } => "*",
        };
        let chosen = extra_args.iter().any(|a| a.starts_with("--controllers="));
        let mut args = vec![
            format!("--kubeconfig={}", self.kubeconfig.display()),
            "--leader-elect=false".to_string(),
            format!(
                "--service-account-private-key-file={}",
                self.pki.sa_private.display()
            ),
            format!("--root-ca-file={}", self.pki.ca_cert.display()),
            // Otherwise it creates the host's kubelet plugin directory.
            format!(
                "--flex-volume-plugin-dir={}",
                self.dir().join("flexvolume").display()
            ),
        ];
        if !chosen {
            args.push(format!("--controllers={controllers}"));
        }
        args.extend(extra_args.iter().map(|a| a.to_string()));
        self.start_component("kube-controller-manager", args).await
    }

    /// Starts a control-plane component with `args` plus what all share:
    /// delegated authentication and authorization through the admin
    /// kubeconfig, and `/healthz` served on a free loopback port with the
    /// apiserver's certificate (so the cluster CA verifies it).
    async fn start_component(&self, name: &str, args: Vec<String>) -> Result<Component> {
        let binary = kube_binary(name)?;
        let mut attempt = 1;
        loop {
            let [port] = free_ports()?;
            let kubeconfig = self.kubeconfig.display();
            let mut all = vec![
                format!("--authentication-kubeconfig={kubeconfig}"),
                format!("--authorization-kubeconfig={kubeconfig}"),
                "--bind-address=127.0.0.1".to_string(),
                format!("--secure-port={port}"),
                format!("--tls-cert-file={}", self.pki.serving_cert.display()),
                format!("--tls-private-key-file={}", self.pki.serving_key.display()),
            ];
            all.extend(args.iter().cloned());
            let log = self.log_dir.join(format!("{}.log", unique(name)));
            let child = ChildGuard::spawn(name, &binary, &all, &[], &log)?;
            let mut component = Component {
                child,
                url: format!("https://127.0.0.1:{port}"),
            };
            match component.wait_healthy(&self.kubeconfig).await {
                Ok(()) => return Ok(component),
                Err(e) if attempt < PORT_ATTEMPTS && port_taken(&e) => attempt += 1,
                Err(e) => return Err(e),
            }
        }
    }
}

/// A running kube-scheduler or kube-controller-manager; stopped on drop.
#[derive(Debug)]
pub struct Component {
    child: ChildGuard,
    url: String,
}

impl Component {
    /// Its HTTPS endpoint (`/healthz`, `/metrics`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Its log file.
    pub fn log(&self) -> &Path {
        &self.child.log
    }

    /// Fails (with the log's tail) if it has exited.
    pub fn check_running(&mut self) -> Result<()> {
        self.child.check_running()
    }

    /// Polls `/healthz` (a component has nothing to watch) until `ok`.
    async fn wait_healthy(&mut self, kubeconfig: &Path) -> Result<()> {
        let mut config = carina_api::client::config(Some(kubeconfig)).await?;
        config.cluster_url = self.url.parse()?;
        let client = carina_api::client::client(config)?;
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            self.child.check_running()?;
            let healthz = http::Request::get("/healthz").body(Vec::new())?;
            let last =
                match tokio::time::timeout(Duration::from_secs(5), client.request_text(healthz))
                    .await
                {
                    Ok(Ok(text)) if text.trim() == "ok" => return Ok(()),
                    Ok(Ok(text)) => text,
                    Ok(Err(e)) => format!("{e:#}"),
                    Err(_) => "/healthz took over 5s".to_string(),
                };
            if Instant::now() > deadline {
                bail!(
                    "{} not healthy within {START_TIMEOUT:?}: {last}\nlog:\n{}",
                    self.child.name,
                    tail(&self.child.log, 40)
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// Builds a client from a kubeconfig file, as a component does.
/// Waits, by watch, until the object `name` satisfies `done`, at most
/// `deadline`; the last object seen goes into the error.
pub async fn wait_for<K>(
    api: &Api<K>,
    name: &str,
    what: &str,
    deadline: Duration,
    done: impl Fn(&K) -> bool,
) -> Result<K>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let cond = move |obj: Option<&K>| obj.is_some_and(&done);
    match tokio::time::timeout(deadline, await_condition(api.clone(), name, cond)).await {
        Ok(found) => found
            .with_context(|| format!("watch {name}"))?
            .with_context(|| format!("{name} gone while waiting for {what}")),
        Err(_) => {
            let last = api.get_opt(name).await?;
            bail!("{name}: no {what} within {deadline:?}; last seen: {last:#?}")
        }
    }
}

/// Waits, by watch, until the object `name` is gone, at most `deadline`.
pub async fn gone<K>(api: &Api<K>, name: &str, deadline: Duration) -> Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let Some(obj) = api.get_opt(name).await? else {
        return Ok(());
    };
    let uid = obj.meta().uid.clone().unwrap_or_default();
    tokio::time::timeout(
        deadline,
        await_condition(api.clone(), name, conditions::is_deleted(&uid)),
    )
    .await
    .with_context(|| {
        format!(
            "{name} still there after {deadline:?} (finalizers: {:?})",
            obj.meta().finalizers
        )
    })??;
    Ok(())
}

pub async fn client_from(kubeconfig: &Path) -> Result<Client> {
    Ok(carina_api::client::connect(Some(kubeconfig)).await?)
}

/// Polls etcd's `/health` until it reports healthy, so the apiserver
/// starts against a serving etcd (and an etcd that cannot start fails with
/// its own log). This waits for an external process to start.
async fn wait_etcd_healthy(port: u16, etcd: &mut ChildGuard, deadline: Instant) -> Result<()> {
    loop {
        etcd.check_running()?;
        let last = match tokio::time::timeout(Duration::from_secs(5), etcd_health(port)).await {
            Ok(Ok(body)) if body.contains(r#""health":"true""#) => return Ok(()),
            Ok(Ok(body)) => body,
            Ok(Err(e)) => format!("{e:#}"),
            Err(_) => "/health took over 5s".to_string(),
        };
        if Instant::now() > deadline {
            bail!(
                "etcd not healthy within {START_TIMEOUT:?}: {last}\netcd log:\n{}",
                tail(&etcd.log, 40)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `GET /health` on etcd's plain-HTTP client port; the response body.
async fn etcd_health(port: u16) -> Result<String> {
    let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).await?;
    stream
        .write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .await?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await?;
    let response = String::from_utf8_lossy(&response);
    let body = response.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    Ok(body.to_string())
}

/// Polls `/readyz` until it says `ok`, failing early when a process exits.
/// This waits for external processes to start; nothing to watch exists yet.
async fn wait_ready(
    client: &Client,
    etcd: &mut ChildGuard,
    apiserver: &mut ChildGuard,
    deadline: Instant,
) -> Result<()> {
    loop {
        etcd.check_running()?;
        apiserver.check_running()?;
        let readyz = http::Request::get("/readyz").body(Vec::new())?;
        let last =
            match tokio::time::timeout(Duration::from_secs(5), client.request_text(readyz)).await {
                Ok(Ok(text)) if text.trim() == "ok" => return Ok(()),
                Ok(Ok(text)) => text,
                Ok(Err(e)) => format!("{e:#}"),
                Err(_) => "/readyz took over 5s".to_string(),
            };
        if Instant::now() > deadline {
            bail!(
                "kube-apiserver not ready within {START_TIMEOUT:?}: {last}\n\
                 kube-apiserver log:\n{}\netcd log:\n{}",
                tail(&apiserver.log, 40),
                tail(&etcd.log, 20)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The cluster's certificate and key files.
struct Pki {
    ca: DevCa,
    ca_cert: PathBuf,
    serving_cert: PathBuf,
    serving_key: PathBuf,
    admin_cert: PathBuf,
    admin_key: PathBuf,
    sa_public: PathBuf,
    sa_private: PathBuf,
}

impl Pki {
    /// Makes the CA, the apiserver's serving certificate, the admin client
    /// certificate and the service-account key pair, and writes them to
    /// `dir`.
    /// `host_ip`, when set, is one more address of the serving
    /// certificate.
    fn write(dir: &Path, host_ip: Option<Ipv4Addr>) -> Result<Pki> {
        std::fs::create_dir_all(dir)?;
        let validity = Validity::days(2);
        let ca = DevCa::new("carina-tests kubernetes CA", validity)?;
        let mut addresses = vec![
            IpAddr::V4(Ipv4Addr::LOCALHOST),
            // The first address of the Service range: the `kubernetes`
            // Service.
            IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
        ];
        addresses.extend(host_ip.map(IpAddr::V4));
        let serving = ca.issue_server(
            "kube-apiserver",
            &[
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ]
            .map(String::from),
            &addresses,
            validity,
        )?;
        let admin = client_cert(&ca, "carina-admin", "system:masters", validity)?;
        let sa = KeyPair::generate().context("generate service-account key")?;

        let pki = Pki {
            ca,
            ca_cert: dir.join("ca.crt"),
            serving_cert: dir.join("apiserver.crt"),
            serving_key: dir.join("apiserver.key"),
            admin_cert: dir.join("admin.crt"),
            admin_key: dir.join("admin.key"),
            sa_public: dir.join("sa.pub"),
            sa_private: dir.join("sa.key"),
        };
        std::fs::write(&pki.ca_cert, pki.ca.cert_pem())?;
        std::fs::write(&pki.serving_cert, &serving.cert_pem)?;
        std::fs::write(&pki.serving_key, &serving.key_pem)?;
        std::fs::write(&pki.admin_cert, &admin.0)?;
        std::fs::write(&pki.admin_key, &admin.1)?;
        std::fs::write(&pki.sa_public, sa.public_key_pem())?;
        std::fs::write(&pki.sa_private, sa.serialize_pem())?;
        Ok(pki)
    }
}

/// A client certificate for user `user` in group `group` (the apiserver
/// reads the user from CN and groups from O), as `(cert_pem, key_pem)`.
fn client_cert(
    ca: &DevCa,
    user: &str,
    group: &str,
    validity: Validity,
) -> Result<(String, String)> {
    let ca_key = KeyPair::from_pem(ca.key_pem()).context("parse CA key")?;
    let issuer = Issuer::from_ca_cert_pem(ca.cert_pem(), ca_key).context("parse CA")?;
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, user);
    dn.push(DnType::OrganizationName, group);
    params.distinguished_name = dn;
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    params.use_authority_key_identifier_extension = true;
    params.not_before = validity.not_before;
    params.not_after = validity.not_after;
    let key = KeyPair::generate().with_context(|| format!("generate {user}'s key"))?;
    let cert = params
        .signed_by(&key, &issuer)
        .with_context(|| format!("sign {user}'s certificate"))?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// Writes a certificate and key as `<dir>/<file>.crt` and `.key`.
fn write_pair(dir: &Path, file: &str, cert: &str, key: &str) -> Result<(PathBuf, PathBuf)> {
    std::fs::create_dir_all(dir)?;
    let paths = (
        dir.join(format!("{file}.crt")),
        dir.join(format!("{file}.key")),
    );
    std::fs::write(&paths.0, cert)?;
    std::fs::write(&paths.1, key)?;
    Ok(paths)
}

/// A kubeconfig that refers to the CA and client certificate files.
fn kubeconfig_yaml(server: &str, ca: &Path, cert: &Path, key: &Path) -> String {
    // JSON strings are YAML strings: quoting paths this way is exact.
    let q = |p: &Path| serde_json::Value::from(p.to_string_lossy()).to_string();
    format!(
        "apiVersion: v1\n\
         kind: Config\n\
         clusters:\n\
         - name: carina-test\n  \
           cluster:\n    \
             server: {server}\n    \
             certificate-authority: {ca}\n\
         users:\n\
         - name: carina-admin\n  \
           user:\n    \
             client-certificate: {cert}\n    \
             client-key: {key}\n\
         contexts:\n\
         - name: carina-test\n  \
           context:\n    \
             cluster: carina-test\n    \
             user: carina-admin\n\
         current-context: carina-test\n",
        ca = q(ca),
        cert = q(cert),
        key = q(key),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::config::Kubeconfig;

    #[test]
    fn kubeconfig_parses_and_points_at_the_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pki = Pki::write(dir.path(), None).expect("pki");
        let yaml = kubeconfig_yaml(
            "https://127.0.0.1:6443",
            &pki.ca_cert,
            &pki.admin_cert,
            &pki.admin_key,
        );
        let path = dir.path().join("kubeconfig");
        std::fs::write(&path, yaml).expect("write");
        let kc = Kubeconfig::read_from(&path).expect("parses");
        assert_eq!(kc.current_context.as_deref(), Some("carina-test"));
        let cluster = kc.clusters[0].cluster.as_ref().expect("cluster");
        assert_eq!(cluster.server.as_deref(), Some("https://127.0.0.1:6443"));
        let user = kc.auth_infos[0].auth_info.as_ref().expect("user");
        assert_eq!(
            user.client_key.as_deref(),
            Some(pki.admin_key.to_string_lossy().as_ref())
        );
    }
}

/// A leader-election candidate running in its own task, for tests of the
/// Lease: its leadership on `leading`; `stop` asks it to release and end
/// (then `task` finishes); aborting `task` is a crash.
#[derive(Debug)]
pub struct Candidate {
    pub leading: tokio::sync::watch::Receiver<bool>,
    pub stop: Option<tokio::sync::oneshot::Sender<()>>,
    pub task: tokio::task::JoinHandle<()>,
}

impl Candidate {
    /// Starts a candidate with `config`.
    pub fn start(
        client: &Client,
        config: carina_controlplane::kube::leader::LeaseConfig,
    ) -> Result<Candidate> {
        let elector =
            carina_controlplane::kube::leader::LeaderElector::new(client.clone(), config)?;
        let (tx, leading) = tokio::sync::watch::channel(false);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            elector
                .run(tx, async {
                    let _ = stopped.await;
                })
                .await;
        });
        Ok(Candidate {
            leading,
            stop: Some(stop),
            task,
        })
    }

    /// Waits until it leads, at most `within`.
    pub async fn until_leading(&mut self, within: Duration) -> Result<()> {
        tokio::time::timeout(within, self.leading.wait_for(|l| *l))
            .await
            .context("not leading in time")??;
        Ok(())
    }
}

impl Drop for Candidate {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}
