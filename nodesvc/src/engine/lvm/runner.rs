//! How the node runs `lvm` commands ([`LvmRunner`]): through one
//! persistent `lvm` shell per node (the protocol is in [`super::shell`]),
//! or, when that is turned off or cannot be used, as a process per command.
//!
//! - **One command at a time.** The shell runs a command when the one
//!   before has answered. A command that finds it busy runs as a process
//!   of its own, as it would without the shell, so the shell never makes a
//!   command wait for another group's (the engine serialises each group's
//!   mutations itself).
//! - **Spans and errors** are those of a process: each command gets the
//!   span [`Cmd::traced`] gives (`lvm.lvcreate`, the command line, the exit
//!   code, the duration), and a failure carries the command line and the
//!   messages a process would have printed on stderr.
//! - **Timeouts.** Every command keeps its limit. A command that overruns
//!   it is `TimedOut`; the shell is killed with it (it may be stuck in the
//!   kernel or on a lock) and the next command starts a new one.
//! - **A dead shell.** One that died while idle is noticed before the next
//!   command, which then runs on a new shell (nothing was lost). One that
//!   dies, or answers nonsense, while running a command makes that command
//!   `Interrupted`, a retryable error (`UNAVAILABLE`): whether it took
//!   effect is unknown. The next command starts a new shell.
//! - **An abandoned command** (its caller's future was dropped, e.g. a
//!   cancelled request) runs on in the shell. The next command first looks
//!   for its answer: if it is there, it is dropped and the shell goes on;
//!   if not, the shell is killed (as a process is when its caller goes) and
//!   replaced, so an answer is never taken for another command's.
//! - **Starting** asks `lvm config` for the profile directory (once),
//!   writes the shell's profile there if it differs, starts `lvm` and waits
//!   for its answer to `formats`, which proves the shell reports as it
//!   must; each step within the limit of the command that needs the shell
//!   (at most 30 s). If that fails, commands run as processes and a start is tried
//!   again a minute later.

use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use carina_sys::command::{Cmd, CommandError, DEFAULT_TIMEOUT, Output};
use carina_sys::coprocess;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio::process::{Child, ChildStdin};
use tokio::sync::Mutex;
use tokio::time::Instant;
use tracing::Instrument;

use super::shell::{self, PROFILE, PROFILE_NAME};

/// How the node runs `lvm` commands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LvmOptions {
    /// Through one persistent `lvm` shell (the default), or a process per
    /// command.
    pub shell: bool,
    /// The limit of each `lvm` command.
    pub timeout: Duration,
}

impl Default for LvmOptions {
    fn default() -> Self {
        LvmOptions {
            shell: true,
            timeout: DEFAULT_TIMEOUT,
        }
    }
}

/// The longest a start may take (`lvm config`, the first answer), and no
/// longer than the limit of the command that needs the shell.
const START_LIMIT: Duration = Duration::from_secs(30);
/// After a failed start, commands run as processes this long.
const START_BACKOFF: Duration = Duration::from_secs(60);
/// How long a shell that closed its report pipe gets to exit.
const EXIT_GRACE: Duration = Duration::from_secs(1);
/// The tail of the shell's own stderr kept for an error message.
const STDERR_KEEP: usize = 8 << 10;

/// Runs the node's `lvm` commands. Shared by every LVM group of an engine.
#[derive(Debug)]
pub struct LvmRunner {
    options: LvmOptions,
    /// `None` when the shell is turned off.
    slot: Option<Mutex<Slot>>,
    /// The running shell's pid, 0 when none runs; readable while a command
    /// holds the slot.
    pid: AtomicU32,
}

impl LvmRunner {
    pub fn new(options: LvmOptions) -> LvmRunner {
        LvmRunner {
            slot: options.shell.then(|| Mutex::new(Slot::default())),
            options,
            pid: AtomicU32::new(0),
        }
    }

    /// The options in force.
    pub fn options(&self) -> &LvmOptions {
        &self.options
    }

    /// The pid of the running shell, if one runs (diagnostics and tests).
    pub fn shell_pid(&self) -> Option<u32> {
        Some(self.pid.load(Ordering::Relaxed)).filter(|p| *p != 0)
    }

    /// Runs an `lvm` command under the node's limit: in the shell when it
    /// is on, free, running and able to say the command, else as a process.
    /// Errors are those of [`Cmd::run`], plus `Interrupted` when the shell
    /// died or garbled its answer while running the command.
    pub async fn run(&self, cmd: Cmd) -> Result<Output, CommandError> {
        let cmd = cmd.timeout(self.options.timeout);
        let (Some(slot), Some(line)) = (&self.slot, shell_line(&cmd)) else {
            return cmd.run().await;
        };
        let Ok(mut slot) = slot.try_lock() else {
            return cmd.run().await;
        };
        let limit = cmd.time_limit();
        if !slot.ensure_shell(&self.pid, limit).await {
            drop(slot);
            return cmd.run().await;
        }
        let command = cmd.line();
        cmd.traced(slot.run(&line, &command, limit, &self.pid))
            .await
    }
}

/// The shell line of `cmd`, if the shell can run it.
fn shell_line(cmd: &Cmd) -> Option<String> {
    if cmd.program() != "lvm" || cmd.has_stdin() {
        return None;
    }
    shell::line(cmd.arguments())
}

#[derive(Debug, Default)]
struct Slot {
    shell: Option<Shell>,
    /// lvm's profile directory, asked once.
    profile_dir: Option<PathBuf>,
    /// After a failed start: no new try before this.
    next_start: Option<Instant>,
}

impl Slot {
    /// Whether a live shell is there, started if needed.
    async fn ensure_shell(&mut self, pid: &AtomicU32, limit: Duration) -> bool {
        if let Some(shell) = &mut self.shell {
            match shell.child.try_wait() {
                Ok(None) if !shell.busy => return true,
                Ok(None) => {
                    if shell.settle_abandoned() {
                        return true;
                    }
                    tracing::warn!(
                        carina.lvm.shell.pid = shell.pid,
                        "the lvm shell still runs a command its caller abandoned; starting a new one"
                    );
                }
                Ok(Some(status)) => tracing::warn!(
                    carina.lvm.shell.pid = shell.pid,
                    %status,
                    stderr = %take(&shell.stderr),
                    "the lvm shell exited while idle; starting a new one"
                ),
                Err(e) => {
                    tracing::warn!(carina.lvm.shell.pid = shell.pid, error = %e, "cannot check the lvm shell; starting a new one")
                }
            }
            self.discard(pid);
        }
        if self.next_start.is_some_and(|t| Instant::now() < t) {
            return false;
        }
        let span = tracing::info_span!("lvm shell start", otel.name = "lvm.shell.start");
        match self.start(limit.min(START_LIMIT)).instrument(span).await {
            Ok(shell) => {
                tracing::info!(carina.lvm.shell.pid = shell.pid, "lvm shell started");
                pid.store(shell.pid, Ordering::Relaxed);
                self.shell = Some(shell);
                self.next_start = None;
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot start the lvm shell; lvm commands run as processes for {START_BACKOFF:?}");
                self.next_start = Some(Instant::now() + START_BACKOFF);
                false
            }
        }
    }

    async fn start(&mut self, limit: Duration) -> Result<Shell, StartError> {
        let dir = match &self.profile_dir {
            Some(dir) => dir.clone(),
            None => {
                let dir = profile_dir(limit).await?;
                self.profile_dir = Some(dir.clone());
                dir
            }
        };
        install_profile(&dir).await?;
        Shell::spawn(limit).await
    }

    /// Runs one command line on the live shell.
    async fn run(
        &mut self,
        line: &str,
        command: &str,
        timeout: Duration,
        pid: &AtomicU32,
    ) -> Result<Output, CommandError> {
        let interrupted = |reason: String| CommandError::Interrupted {
            command: command.to_string(),
            reason,
        };
        let sent = match self.shell.as_mut() {
            Some(shell) => shell.send(line).await,
            None => return Err(interrupted("no lvm shell runs".to_string())),
        };
        if let Err(e) = sent {
            // The shell closed its stdin, so it never read this command:
            // it died while idle, and the command may run on a new one.
            tracing::warn!(error = %e, "the lvm shell is gone; starting a new one");
            self.discard(pid);
            if !self.ensure_shell(pid, timeout).await {
                return Err(interrupted(format!(
                    "the lvm shell was gone ({e}) and no new one started"
                )));
            }
            let resent = match self.shell.as_mut() {
                Some(shell) => shell.send(line).await,
                None => return Err(interrupted("no lvm shell runs".to_string())),
            };
            if let Err(e) = resent {
                self.discard(pid);
                return Err(interrupted(format!(
                    "cannot write to the new lvm shell: {e}"
                )));
            }
        }
        let Some(shell) = self.shell.as_mut() else {
            return Err(interrupted("no lvm shell runs".to_string()));
        };
        let result = shell.answer(command, timeout).await;
        if matches!(
            result,
            Err(CommandError::TimedOut { .. } | CommandError::Interrupted { .. })
        ) {
            self.discard(pid);
        }
        result
    }

    /// Drops the shell; it is killed if it still runs.
    fn discard(&mut self, pid: &AtomicU32) {
        if let Some(mut shell) = self.shell.take() {
            let _ = shell.child.start_kill();
        }
        pid.store(0, Ordering::Relaxed);
    }
}

/// Why no shell could be started.
#[derive(Debug, thiserror::Error)]
enum StartError {
    #[error("cannot ask lvm for its profile directory: {0}")]
    ProfileDir(#[from] CommandError),
    #[error("`lvm config` names no profile_dir: {0:?}")]
    NoProfileDir(String),
    #[error("cannot write the lvm shell's profile {path}: {source}")]
    Profile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start lvm: {0}")]
    Spawn(#[source] std::io::Error),
    #[error("the new lvm shell did not answer as it must: {0}")]
    Probe(#[source] CommandError),
}

/// lvm's profile directory (`config/profile_dir`).
async fn profile_dir(limit: Duration) -> Result<PathBuf, StartError> {
    let out = Cmd::new("lvm")
        .args(["config", "--typeconfig", "full", "config/profile_dir"])
        .env("LVM_SUPPRESS_FD_WARNINGS", "1")
        .timeout(limit)
        .run()
        .await?;
    shell::parse_profile_dir(&out.stdout).ok_or(StartError::NoProfileDir(out.stdout))
}

/// Writes [`PROFILE`] into `dir` unless it is there already; atomically
/// ([`carina_sys::atomic_file`]), so a concurrent reader never sees half
/// of it.
async fn install_profile(dir: &Path) -> Result<(), StartError> {
    let file = format!("{PROFILE_NAME}.profile");
    let path = dir.join(&file);
    if tokio::fs::read_to_string(&path).await.ok().as_deref() == Some(PROFILE) {
        return Ok(());
    }
    let owned = dir.to_path_buf();
    let written = tokio::task::spawn_blocking(move || {
        carina_sys::atomic_file::write(&owned, file.as_ref(), PROFILE.as_bytes(), 0o644)
    })
    .await
    .unwrap_or_else(|e| Err(std::io::Error::other(e)));
    if let Err(source) = written {
        return Err(StartError::Profile { path, source });
    }
    tracing::info!(path = %path.display(), "wrote the lvm shell's profile");
    Ok(())
}

/// A running `lvm` shell.
#[derive(Debug)]
struct Shell {
    child: Child,
    stdin: ChildStdin,
    /// The report pipe (`LVM_REPORT_FD`).
    answers: pipe::Receiver,
    /// Bytes read from `answers` and not yet taken as an answer.
    buf: Vec<u8>,
    /// The shell's own stderr since it was last taken.
    stderr: Arc<StdMutex<String>>,
    pid: u32,
    /// A command was sent and its answer not yet taken.
    busy: bool,
}

impl Shell {
    async fn spawn(limit: Duration) -> Result<Shell, StartError> {
        let co = coprocess::spawn(
            "lvm",
            &[],
            &[
                ("LVM_COMMAND_PROFILE", PROFILE_NAME),
                ("LVM_SUPPRESS_FD_WARNINGS", "1"),
                // No history file written after every command.
                ("HOME", "/dev/null"),
            ],
            "LVM_REPORT_FD",
        )
        .map_err(StartError::Spawn)?;
        let pid = co.pid().unwrap_or(0);
        let stderr = Arc::new(StdMutex::new(String::new()));
        // Both are read all the time, so the shell never blocks on a full
        // pipe; they end when it exits.
        tokio::spawn(drain(co.stdout, pid, None));
        tokio::spawn(drain(co.stderr, pid, Some(stderr.clone())));
        let mut shell = Shell {
            child: co.child,
            stdin: co.stdin,
            answers: co.answers,
            buf: Vec::new(),
            stderr,
            pid,
            busy: false,
        };
        // Without the profile's log report the shell would answer nothing:
        // a first answer proves it took.
        let probe = async {
            shell
                .send("formats")
                .await
                .map_err(|e| CommandError::Interrupted {
                    command: "lvm formats".to_string(),
                    reason: format!("cannot write to the lvm shell: {e}"),
                })?;
            shell.answer("lvm formats", limit).await
        }
        .await;
        match probe {
            Ok(_) => Ok(shell),
            Err(e) => {
                let _ = shell.child.start_kill();
                Err(StartError::Probe(e))
            }
        }
    }

    /// Writes one command line.
    async fn send(&mut self, line: &str) -> std::io::Result<()> {
        let stray = take(&self.stderr);
        if !stray.trim().is_empty() {
            tracing::warn!(carina.lvm.shell.pid = self.pid, stderr = %stray.trim(), "the lvm shell wrote to stderr between commands");
        }
        if self.buf.iter().any(|b| !b.is_ascii_whitespace()) {
            tracing::warn!(
                carina.lvm.shell.pid = self.pid,
                bytes = self.buf.len(),
                "dropping report output no command asked for"
            );
        }
        self.buf.clear();
        let mut bytes = Vec::with_capacity(line.len() + 1);
        bytes.extend_from_slice(line.as_bytes());
        bytes.push(b'\n');
        self.busy = true;
        self.stdin.write_all(&bytes).await?;
        self.stdin.flush().await
    }

    /// After a command whose caller went away: whether its answer has come
    /// (and is dropped), so the shell is free again.
    fn settle_abandoned(&mut self) -> bool {
        let mut chunk = [0u8; 4096];
        loop {
            match self.answers.try_read(&mut chunk) {
                Ok(0) => return false,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(_) => return false,
            }
        }
        match shell::take_answer(&mut self.buf) {
            Ok(Some(_)) => {
                tracing::debug!(
                    carina.lvm.shell.pid = self.pid,
                    "dropped the answer to an abandoned command"
                );
                self.busy = false;
                take(&self.stderr);
                true
            }
            Ok(None) | Err(_) => false,
        }
    }

    /// Waits for the answer to the command just sent.
    async fn answer(&mut self, command: &str, timeout: Duration) -> Result<Output, CommandError> {
        let deadline = Instant::now() + timeout;
        loop {
            match shell::take_answer(&mut self.buf) {
                Ok(Some(answer)) => {
                    self.busy = false;
                    return shell::outcome(answer, command, &take(&self.stderr));
                }
                Ok(None) => {}
                Err(e) => {
                    return Err(CommandError::Interrupted {
                        command: command.to_string(),
                        reason: format!("the lvm shell's answer is not a log report: {e}"),
                    });
                }
            }
            tokio::select! {
                biased;
                read = self.answers.read_buf(&mut self.buf) => match read {
                    Ok(0) => return self.gone(command, None, deadline).await,
                    Ok(_) => {}
                    Err(e) => {
                        return Err(CommandError::Interrupted {
                            command: command.to_string(),
                            reason: format!("cannot read the lvm shell's answer: {e}"),
                        });
                    }
                },
                status = self.child.wait() => {
                    return self.gone(command, status.ok(), deadline).await;
                }
                () = tokio::time::sleep_until(deadline) => {
                    tracing::warn!(carina.command.line = %command, carina.lvm.shell.pid = self.pid, "command timed out; killing the lvm shell");
                    let _ = self.child.start_kill();
                    return Err(CommandError::TimedOut {
                        command: command.to_string(),
                        timeout,
                    });
                }
            }
        }
    }

    /// The shell ended (its report pipe closed, or it exited) while a
    /// command ran. An answer it wrote before it went still counts; without
    /// one the command is `Interrupted`.
    async fn gone(
        &mut self,
        command: &str,
        status: Option<ExitStatus>,
        deadline: Instant,
    ) -> Result<Output, CommandError> {
        let grace = deadline.min(Instant::now() + EXIT_GRACE);
        let _ = tokio::time::timeout_at(grace, self.answers.read_to_end(&mut self.buf)).await;
        if let Ok(Some(answer)) = shell::take_answer(&mut self.buf) {
            self.busy = false;
            return shell::outcome(answer, command, &take(&self.stderr));
        }
        let status = match status {
            Some(s) => Some(s),
            None => tokio::time::timeout_at(grace, self.child.wait())
                .await
                .ok()
                .and_then(Result::ok),
        };
        let how = status.map_or_else(
            || "stopped answering".to_string(),
            |s| format!("exited ({s})"),
        );
        let stderr = take(&self.stderr);
        let stderr = stderr.trim();
        Err(CommandError::Interrupted {
            command: command.to_string(),
            reason: if stderr.is_empty() {
                format!("the lvm shell {how} before answering")
            } else {
                format!("the lvm shell {how} before answering: {stderr}")
            },
        })
    }
}

/// Takes what was collected.
fn take(buf: &StdMutex<String>) -> String {
    std::mem::take(&mut *buf.lock().unwrap_or_else(|p| p.into_inner()))
}

/// Reads one of the shell's output streams until it closes, logging it at
/// debug level and keeping its tail in `keep`.
async fn drain(mut from: impl AsyncRead + Unpin, pid: u32, keep: Option<Arc<StdMutex<String>>>) {
    let mut chunk = vec![0u8; 4096];
    loop {
        let n = match from.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let text = String::from_utf8_lossy(&chunk[..n]);
        tracing::debug!(carina.lvm.shell.pid = pid, output = %text, "lvm shell output");
        if let Some(keep) = &keep {
            let mut kept = keep.lock().unwrap_or_else(|p| p.into_inner());
            kept.push_str(&text);
            if kept.len() > STDERR_KEEP {
                let mut cut = kept.len() - STDERR_KEEP;
                while !kept.is_char_boundary(cut) {
                    cut += 1;
                }
                kept.drain(..cut);
            }
        }
    }
}
