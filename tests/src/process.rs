//! Processes under test: the project's binaries started as real processes
//! with their output in a log file, stopped (SIGTERM, then SIGKILL) when
//! the guard drops.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

/// A binary of this workspace, next to the test executable's target dir
/// (`target/<profile>/<name>`). `cargo build --workspace --bins` makes them.
pub fn workspace_binary(name: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    // target/<profile>/deps/<test>-<hash> → target/<profile>/<name>
    let profile_dir = exe
        .parent()
        .and_then(|deps| {
            if deps.ends_with("deps") {
                deps.parent()
            } else {
                Some(deps)
            }
        })
        .context("test executable has no directory")?;
    let path = profile_dir.join(name);
    if !path.exists() {
        bail!(
            "{} not found: run `cargo build --workspace --bins` first",
            path.display()
        );
    }
    Ok(path)
}

/// The node binary that honours `CARINA_TEST_KILL_AT`: `carina-node` with
/// the cargo feature `crashpoints`. `cargo build --workspace --bins` leaves
/// it out (the feature is off there, as in every image).
pub const CRASHPOINTS_NODE: &str = "carina-node-crashpoints";

/// Builds [`CRASHPOINTS_NODE`] once per test process, beside the other
/// workspace binaries (`cargo build -p carina-node --features crashpoints
/// --bin carina-node-crashpoints`: only that binary is written, so the
/// `carina-node` the other tests run keeps its default features), and
/// returns its path.
pub fn crashpoints_node_binary() -> Result<PathBuf> {
    static BUILT: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| build_crashpoints_node().map_err(|e| format!("{e:#}")))
        .clone()
        .map_err(anyhow::Error::msg)
}

fn build_crashpoints_node() -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let deps = exe.parent().context("test executable has no directory")?;
    let profile_dir = if deps.ends_with("deps") {
        deps.parent().context("deps without a parent")?
    } else {
        deps
    };
    let target_dir = profile_dir
        .parent()
        .context("profile directory without a parent")?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "-q", "-p", "carina-node"])
        .args(["--features", "crashpoints"])
        .args(["--bin", CRASHPOINTS_NODE])
        .env("CARGO_TARGET_DIR", target_dir)
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => {}
        Some("release") => {
            cmd.arg("--release");
        }
        Some(other) => {
            cmd.args(["--profile", other]);
        }
        None => bail!("{} has no profile name", profile_dir.display()),
    }
    let status = cmd.status().with_context(|| format!("run {cmd:?}"))?;
    ensure!(status.success(), "{cmd:?} failed: {status}");
    workspace_binary(CRASHPOINTS_NODE)
}

/// An upstream tool built by `tests/tools/build.sh`: the `env` variable if
/// set, else `<cache>/<dir>/bin/<name>` under `CARINA_TOOLS_CACHE`
/// (default `/var/cache/carina-tools`).
pub fn upstream_tool(env: &str, dir: &str, name: &str) -> Result<PathBuf> {
    if let Some(p) = std::env::var_os(env) {
        return Ok(PathBuf::from(p));
    }
    let path = tools_cache().join(dir).join("bin").join(name);
    if !path.exists() {
        bail!(
            "{} not found: run tests/tools/build.sh first (or set {env})",
            path.display()
        );
    }
    Ok(path)
}

/// The cache of `tests/tools/build.sh`: `CARINA_TOOLS_CACHE`, by default
/// `/var/cache/carina-tools`.
pub fn tools_cache() -> PathBuf {
    std::env::var_os("CARINA_TOOLS_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/carina-tools"))
}

/// A running child process; its stdout and stderr go to `log`.
#[derive(Debug)]
pub struct ChildGuard {
    pub name: String,
    pub log: PathBuf,
    child: Option<Child>,
}

impl ChildGuard {
    /// Starts `program args...` with output appended to `log`.
    pub fn spawn(
        name: &str,
        program: &Path,
        args: &[String],
        env: &[(&str, &str)],
        log: &Path,
    ) -> Result<ChildGuard> {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)?;
        let err = out.try_clone()?;
        let child = Command::new(program)
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .with_context(|| format!("start {}", program.display()))?;
        Ok(ChildGuard {
            name: name.to_string(),
            log: log.to_path_buf(),
            child: Some(child),
        })
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Fails if the process has already exited (with its log's tail).
    pub fn check_running(&mut self) -> Result<()> {
        if let Some(child) = self.child.as_mut()
            && let Some(status) = child.try_wait()?
        {
            bail!(
                "{} exited ({status}); log:\n{}",
                self.name,
                tail(&self.log, 40)
            );
        }
        Ok(())
    }

    /// Sends `signal` (a name `kill` knows: `STOP`, `CONT`, `TERM`, ...)
    /// without waiting for any effect.
    pub fn signal(&self, signal: &str) -> Result<()> {
        let Some(child) = self.child.as_ref() else {
            bail!("{} is not running", self.name);
        };
        let status = Command::new("kill")
            .args([format!("-{signal}"), child.id().to_string()])
            .status()
            .context("run kill")?;
        if !status.success() {
            bail!(
                "kill -{signal} {} ({}) failed: {status}",
                child.id(),
                self.name
            );
        }
        Ok(())
    }

    /// SIGKILL at once (a crash: no shutdown code runs), and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Sends SIGTERM and waits up to `grace`, then SIGKILL.
    pub fn stop(&mut self, grace: Duration) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        // Already exited (and reaped): its pid may belong to someone else now.
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        let pid = child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(10));
    }
}

/// Waits until `path` exists (a unix socket being created), checking that
/// `child` is still alive. The wait is for a process to start, bounded by
/// `timeout`.
pub fn wait_for_path(path: &Path, child: &mut ChildGuard, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if path.exists() {
            return Ok(());
        }
        child.check_running()?;
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!(
        "{} did not appear within {timeout:?}; {} log:\n{}",
        path.display(),
        child.name,
        tail(&child.log, 40)
    )
}

/// The last `n` lines of a file, leaving out the frames of Rust
/// backtraces: a process that failed with `RUST_BACKTRACE` set ends its
/// log with dozens of frames, which would push the error itself out.
pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| !is_backtrace_frame(l)).collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// `  12: crate::function` or `             at src/file.rs:1:2`.
fn is_backtrace_frame(line: &str) -> bool {
    let trimmed = line.trim_start();
    if trimmed.len() == line.len() {
        return false;
    }
    if trimmed.starts_with("at ") {
        return true;
    }
    match trimmed.split_once(": ") {
        Some((index, _)) => !index.is_empty() && index.bytes().all(|b| b.is_ascii_digit()),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backtrace_frames_are_left_out_of_the_tail() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("log");
        std::fs::write(
            &log,
            "start\nError: listen on 127.0.0.1:1 (metrics)\n\nStack backtrace:\n   0: anyhow::error\n             at /src/error.rs:1:2\n  12: carina_node::main\nlast: words\n",
        )
        .expect("write the log");
        assert_eq!(
            tail(&log, 4),
            "Error: listen on 127.0.0.1:1 (metrics)\n\nStack backtrace:\nlast: words"
        );
    }
}
