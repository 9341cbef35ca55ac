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
//!
//! The parts: `start` starts (and restarts) etcd and the apiserver,
//! `pki` makes the certificates and kubeconfigs, `crds` installs Carina's
//! CRDs, `components` runs kube-scheduler and kube-controller-manager,
//! `wait` waits on objects by watch, `candidate` runs a Lease candidate
//! and reads who holds a Lease, and `fake_bridge` is the kube
//! provisioner's test bench.

mod candidate;
mod components;
mod crds;
pub mod fake_bridge;
mod pki;
mod start;
mod wait;

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Result;
use carina_proto::devcerts::Validity;
use kube::Client;

use self::pki::{Pki, client_cert, kubeconfig_yaml, write_pair};
use crate::process::{ChildGuard, upstream_tool};

pub use self::candidate::{Candidate, await_lease_holder, lease_holder, short_lease};
pub use self::components::Component;
pub use self::wait::{client_from, gone, wait_for};

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
}
