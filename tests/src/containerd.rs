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
    /// Starts a containerd whose files all live in a new temporary folder.
    pub fn start() -> Result<Containerd> {
        let dir = tempfile::Builder::new()
            .prefix("carina-containerd-")
            .tempdir()?;
        let root = dir.path().join("root");
        let state = dir.path().join("state");
        let socket = dir.path().join("containerd.sock");
        let config = dir.path().join("config.toml");
        std::fs::write(&config, config_text(&root, &state, &socket))?;
        let log = dir.path().join("containerd.log");
        let program = containerd_binary("containerd")?;
        let mut daemon = ChildGuard::spawn(
            "containerd",
            &program,
            &[
                "--config".to_string(),
                config.to_string_lossy().into_owned(),
            ],
            &[],
            &log,
        )?;
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
}

impl Drop for Containerd {
    fn drop(&mut self) {
        self.daemon.stop(Duration::from_secs(10));
        // Unpacked layers and any snapshot a test mounted live under the
        // root; deepest first.
        let mut mounts = mounts_under(self.dir.path());
        mounts.sort_by_key(|m| std::cmp::Reverse(m.components().count()));
        for m in mounts {
            let _ = run("umount", &["-l", &m.to_string_lossy()]);
        }
    }
}

/// The daemon's configuration: everything under the test's folder, the
/// CRI plugins off.
fn config_text(root: &Path, state: &Path, socket: &Path) -> String {
    format!(
        r#"version = 3
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime", "io.containerd.cri.v1.images", "io.containerd.nri.v1.nri"]

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

/// Mount points at or below `dir`, from /proc/self/mountinfo.
fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    carina_sys::mount::parse_mountinfo(&text)
        .unwrap_or_default()
        .into_iter()
        .map(|m| m.mount_point)
        .filter(|p| p.starts_with(dir))
        .collect()
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
