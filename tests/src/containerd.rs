//! A private containerd for tests: its own root, state directory and
//! socket under a temporary folder, so it never meets a containerd the
//! machine runs. The CRI plugins are off (nothing here is a kubelet); the
//! content store, the image service and the overlayfs snapshotter are what
//! an image import needs. On drop the daemon stops, every mount it left
//! under its folder is taken down, and the folder goes.
//!
//! The binaries come from `tests/tools/build.sh containerd`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};

use crate::local::second::Enter;
use crate::process::{ChildGuard, upstream_tool, wait_for_path};
use crate::run;

/// The containerd version `tests/tools/build.sh` builds.
const TOOL_DIR: &str = "containerd-v2.4.2";

/// How long the daemon may take to open its socket.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// A containerd program (`containerd`, `ctr`, `containerd-shim-runc-v2`)
/// from the tool cache, or the path in `CARINA_CONTAINERD` (`CARINA_CTR`,
/// ...).
pub fn containerd_binary(name: &str) -> Result<PathBuf> {
    let env = format!("CARINA_{}", name.to_uppercase().replace('-', "_"));
    upstream_tool(&env, TOOL_DIR, name)
}

/// A running private containerd.
#[derive(Debug)]
pub struct Containerd {
    // Declared first: the daemon stops before its folder is cleaned.
    daemon: ChildGuard,
    socket: PathBuf,
    ctr: PathBuf,
    dir: tempfile::TempDir,
}

impl Containerd {
    /// Starts a containerd whose files all live in a new temporary folder,
    /// with the CRI plugins off.
    pub fn start() -> Result<Containerd> {
        Self::start_with(None)
    }

    /// Starts a containerd whose files all live in a new temporary folder;
    /// with `cri`, the CRI plugins serve a kubelet.
    pub fn start_with(cri: Option<&Cri>) -> Result<Containerd> {
        Self::start_in(cri, None)
    }

    /// [`start_with`](Self::start_with), the daemon (and so its shims and
    /// containers) in a node's own namespaces when `enter` is given.
    pub fn start_in(cri: Option<&Cri>, enter: Option<&Enter>) -> Result<Containerd> {
        let dir = tempfile::Builder::new()
            .prefix("carina-containerd-")
            .tempdir()?;
        let root = dir.path().join("root");
        let state = dir.path().join("state");
        let socket = dir.path().join("containerd.sock");
        let config = dir.path().join("config.toml");
        let mut text = config_text(&root, &state, &socket, cri.is_none());
        if let Some(cri) = cri {
            text.push_str(&cri.config_text());
        }
        std::fs::write(&config, text)?;
        let log = dir.path().join("containerd.log");
        let program = containerd_binary("containerd")?;
        // The shim is found on PATH, next to containerd.
        let tool_dir = program.parent().context("containerd has no directory")?;
        let path = format!(
            "{}:{}",
            tool_dir.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let args = [
            "--config".to_string(),
            config.to_string_lossy().into_owned(),
        ];
        let (program, args) = match enter {
            Some(enter) => enter.wrap(&program, &args),
            None => (program, args.to_vec()),
        };
        let mut daemon =
            ChildGuard::spawn("containerd", &program, &args, &[("PATH", &path)], &log)?;
        wait_for_path(&socket, &mut daemon, START_TIMEOUT)?;
        Ok(Containerd {
            daemon,
            socket,
            ctr: containerd_binary("ctr")?,
            dir,
        })
    }

    /// Runs `ctr -a <socket> -n <namespace> args...` and returns its stdout.
    pub fn ctr(&mut self, namespace: &str, args: &[&str]) -> Result<String> {
        self.daemon.check_running()?;
        let socket = self.socket.to_string_lossy().into_owned();
        let mut full = vec!["-a", &socket, "-n", namespace];
        full.extend_from_slice(args);
        let ctr = self.ctr.to_string_lossy().into_owned();
        run(&ctr, &full)
    }

    /// The daemon's socket, an absolute path (what `ctr -a` needs), for
    /// a `ctr` a test runs itself, e.g. in the background.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The folder holding the daemon's root, state and log.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The daemon's log file.
    pub fn log(&self) -> &Path {
        &self.daemon.log
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        self.daemon.stop(Duration::from_secs(10));
        // Shims outlive their daemon; each was started with its socket.
        crate::local::host::kill_with_argument(&self.socket.to_string_lossy());
        // Unpacked layers and any snapshot a test mounted live under the
        // root; deepest first.
        crate::local::host::unmount_under(self.dir.path());
    }
}

/// What the CRI plugins need to run a kubelet's pods.
#[derive(Debug, Clone)]
pub struct Cri {
    /// The pod sandbox image (imported beforehand; never pulled).
    pub sandbox_image: String,
    /// The OCI runtime, e.g. `/usr/sbin/runc`.
    pub runc: PathBuf,
    /// Where the CNI plugins are and where their configuration is.
    pub cni_bin_dir: PathBuf,
    pub cni_conf_dir: PathBuf,
}

impl Cri {
    fn config_text(&self) -> String {
        format!(
            r#"
[plugins]
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = "overlayfs"
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = "{sandbox}"
  [plugins.'io.containerd.cri.v1.runtime']
    # Without CAP_SYS_RESOURCE a negative oom_score_adj (the sandbox
    # asks for one) is refused and every pod fails to start; keep the
    # score the runtime itself has as the floor.
    restrict_oom_score_adj = true
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = "runc"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = "{runc}"
          SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ["{cni_bin}"]
      conf_dir = "{cni_conf}"
  [plugins.'io.containerd.nri.v1.nri']
    disable = true
"#,
            sandbox = self.sandbox_image,
            runc = self.runc.display(),
            cni_bin = self.cni_bin_dir.display(),
            cni_conf = self.cni_conf_dir.display(),
        )
    }
}

/// The daemon's configuration: everything under the test's folder; the
/// CRI plugins off when `no_cri`.
fn config_text(root: &Path, state: &Path, socket: &Path, no_cri: bool) -> String {
    let disabled = if no_cri {
        r#"disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime", "io.containerd.cri.v1.images", "io.containerd.nri.v1.nri"]"#
    } else {
        ""
    };
    format!(
        r#"version = 3
root = "{root}"
state = "{state}"
{disabled}

[grpc]
  address = "{socket}"

[ttrpc]
  address = "{socket}.ttrpc"
"#,
        root = root.display(),
        state = state.display(),
        socket = socket.display(),
    )
}

/// Imports an OCI archive into `namespace` (unpacked into the overlayfs
/// snapshotter, as a kubelet's pull would be) and returns the reference
/// and manifest digest of every image there, as `ctr images ls` shows
/// them.
pub fn import(
    containerd: &mut Containerd,
    namespace: &str,
    archive: &Path,
) -> Result<Vec<(String, String)>> {
    let path = archive.to_str().context("UTF-8 archive path")?;
    containerd.ctr(namespace, &["images", "import", path])?;
    // `ctr images ls`: REF TYPE DIGEST SIZE PLATFORMS LABELS.
    let listing = containerd.ctr(namespace, &["images", "ls"])?;
    Ok(listing
        .lines()
        .skip(1)
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            Some((cols.first()?.to_string(), cols.get(2)?.to_string()))
        })
        .collect())
}
