//! Running external tools: argv only (never a shell), a timeout on every
//! run, and errors that carry the command line and its stderr.
//!
//! Tool-specific builders (`lvm`, `sgdisk`, `losetup`, ...) live next to
//! their parsers, in the crates that know those tools; they end in
//! [`Cmd::run`], or — for a command a long-lived interpreter carries out
//! instead of a process of its own (`lvm`'s shell, see
//! [`crate::coprocess`]) — in [`Cmd::traced`], which gives it the same span.

use std::ffi::OsString;
use std::fmt;
use std::future::Future;
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use tracing::Instrument;

/// Default limit for one command run.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// Programs whose first argument names the operation.
const SUBCOMMAND_TOOLS: &[&str] = &["lvm"];

/// How a command run ended, for [`observe_commands`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Exit status 0.
    Ok,
    /// A non-zero exit or a signal.
    Failed,
    /// Killed at its timeout.
    TimedOut,
    /// The program could not be started.
    Spawn,
    /// Its interpreter died or garbled the answer.
    Interrupted,
}

impl Outcome {
    /// A lower-case name (`ok`, `failed`, `timed_out`, `spawn`, `interrupted`).
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Failed => "failed",
            Outcome::TimedOut => "timed_out",
            Outcome::Spawn => "spawn",
            Outcome::Interrupted => "interrupted",
        }
    }

    fn of<T>(result: &Result<T, CommandError>) -> Outcome {
        match result {
            Ok(_) => Outcome::Ok,
            Err(CommandError::Failed { .. }) => Outcome::Failed,
            Err(CommandError::TimedOut { .. }) => Outcome::TimedOut,
            Err(CommandError::Spawn { .. }) => Outcome::Spawn,
            Err(CommandError::Interrupted { .. }) => Outcome::Interrupted,
        }
    }
}

/// Told of every finished command: its [`Cmd::span_name`] (the program,
/// and for `lvm` the subcommand: a bounded set), how it ended and how long
/// it took.
pub type Observer = fn(command: &str, outcome: Outcome, took: Duration);

static OBSERVER: OnceLock<Observer> = OnceLock::new();

/// Installs the process's command observer (metrics). The first call
/// wins; later ones return `false` and change nothing.
pub fn observe_commands(observer: Observer) -> bool {
    OBSERVER.set(observer).is_ok()
}

/// Errors from running an external command.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    /// The program could not be started (usually: not installed).
    #[error("cannot run `{command}`: {source}")]
    Spawn {
        command: String,
        #[source]
        source: std::io::Error,
    },
    /// The program exited unsuccessfully.
    #[error("`{command}` failed ({status}): {stderr}")]
    Failed {
        command: String,
        status: String,
        /// The exit code (`None` when a signal ended the program).
        code: Option<i32>,
        stderr: String,
    },
    /// The program did not finish in time and was killed.
    #[error("`{command}` timed out after {timeout:?}")]
    TimedOut { command: String, timeout: Duration },
    /// What ran the command (a long-lived interpreter such as `lvm`'s
    /// shell) died or stopped making sense before the command's outcome
    /// was known. Whether it took effect is unknown; a retry on a fresh
    /// interpreter is the way on.
    #[error("`{command}` was interrupted: {reason}")]
    Interrupted { command: String, reason: String },
}

impl CommandError {
    /// The stderr of a failed command, empty for other kinds.
    pub fn stderr(&self) -> &str {
        match self {
            CommandError::Failed { stderr, .. } => stderr,
            _ => "",
        }
    }

    /// The exit code of a program that failed by exiting non-zero.
    pub fn exit_code(&self) -> Option<i32> {
        match self {
            CommandError::Failed { code, .. } => *code,
            _ => None,
        }
    }
}

/// What a successful command printed.
#[derive(Debug, Clone)]
pub struct Output {
    pub stdout: String,
    pub stderr: String,
}

/// A command line under construction.
#[derive(Debug, Clone)]
pub struct Cmd {
    program: String,
    args: Vec<OsString>,
    env: Vec<(String, String)>,
    timeout: Duration,
    stdin: Option<Vec<u8>>,
}

impl Cmd {
    /// Starts a command line for `program`, looked up on `PATH`.
    pub fn new(program: impl Into<String>) -> Self {
        Cmd {
            program: program.into(),
            args: Vec::new(),
            env: Vec::new(),
            timeout: DEFAULT_TIMEOUT,
            stdin: None,
        }
    }

    pub fn arg(mut self, arg: impl Into<OsString>) -> Self {
        self.args.push(arg.into());
        self
    }

    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    pub fn stdin(mut self, input: impl Into<Vec<u8>>) -> Self {
        self.stdin = Some(input.into());
        self
    }

    /// The arguments after the program.
    pub fn arguments(&self) -> &[OsString] {
        &self.args
    }

    /// The limit of one run.
    pub fn time_limit(&self) -> Duration {
        self.timeout
    }

    /// Whether the command is fed input on stdin.
    pub fn has_stdin(&self) -> bool {
        self.stdin.is_some()
    }

    /// What the command is given on stdin, if anything.
    pub fn input(&self) -> Option<&[u8]> {
        self.stdin.as_deref()
    }

    /// The program name without its directory (the span name uses it).
    pub fn program(&self) -> &str {
        self.program.rsplit('/').next().unwrap_or(&self.program)
    }

    /// The name of the command's span: the program, and for tools that
    /// take a subcommand first (`lvm lvcreate ...`) the subcommand too
    /// (`lvm.lvcreate`), so a trace shows which LVM operation took the
    /// time.
    pub fn span_name(&self) -> String {
        let program = self.program();
        match self.args.first().map(|a| a.to_string_lossy()) {
            Some(sub) if SUBCOMMAND_TOOLS.contains(&program) && !sub.starts_with('-') => {
                format!("{program}.{sub}")
            }
            _ => program.to_string(),
        }
    }

    /// The argv as one line, quoted where needed, for logs and errors.
    pub fn line(&self) -> String {
        let mut line = quote(&self.program);
        for arg in &self.args {
            line.push(' ');
            line.push_str(&quote(&arg.to_string_lossy()));
        }
        line
    }

    /// Runs the command; a non-zero exit, a spawn failure or the timeout is
    /// an error carrying the command line.
    pub async fn run(self) -> Result<Output, CommandError> {
        let line = self.line();
        self.traced(self.run_inner(line)).await
    }

    /// Awaits `run` — this command carried out by something other than a
    /// process of its own, such as an interpreter the caller keeps — under
    /// the span [`Cmd::run`] gives a command: named by
    /// [`Cmd::span_name`], with the command line, the exit code, the
    /// duration and the error; and tells the [`observe_commands`] observer.
    pub async fn traced<F>(&self, run: F) -> Result<Output, CommandError>
    where
        F: Future<Output = Result<Output, CommandError>>,
    {
        // An INFO span, so traces show where a request's time went at the
        // default filter; it prints no log line of its own.
        let span = tracing::info_span!(
            "command",
            otel.name = %self.span_name(),
            carina.command.line = %self.line(),
            carina.command.exit_code = tracing::field::Empty,
            carina.command.duration_ms = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
            error.message = tracing::field::Empty,
        );
        let started = Instant::now();
        let result = run.instrument(span.clone()).await;
        let took = started.elapsed();
        span.record("carina.command.duration_ms", took.as_millis() as u64);
        if let Some(observe) = OBSERVER.get() {
            observe(&self.span_name(), Outcome::of(&result), took);
        }
        if let Err(e) = &result {
            span.record("otel.status_code", "ERROR");
            span.record("error.message", e.to_string());
            if let Some(code) = e.exit_code() {
                span.record("carina.command.exit_code", code);
            }
        } else {
            span.record("carina.command.exit_code", 0);
        }
        result
    }

    async fn run_inner(&self, line: String) -> Result<Output, CommandError> {
        let started = Instant::now();
        let mut cmd = tokio::process::Command::new(&self.program);
        cmd.args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env("LC_ALL", "C")
            .stdin(if self.stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().map_err(|source| CommandError::Spawn {
            command: line.clone(),
            source,
        })?;
        if let (Some(input), Some(mut pipe)) = (&self.stdin, child.stdin.take()) {
            // A child that exits without reading its input closes the pipe;
            // its exit status tells the real story, so the write error is moot.
            let _ = pipe.write_all(input).await;
        }
        let output = match tokio::time::timeout(self.timeout, child.wait_with_output()).await {
            Ok(result) => result.map_err(|source| CommandError::Spawn {
                command: line.clone(),
                source,
            })?,
            Err(_) => {
                tracing::warn!(carina.command.line = %line, "command timed out");
                return Err(CommandError::TimedOut {
                    command: line,
                    timeout: self.timeout,
                });
            }
        };
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        tracing::debug!(
            carina.command.line = %line,
            status = %output.status,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "command finished"
        );
        if !output.status.success() {
            return Err(CommandError::Failed {
                command: line,
                status: output.status.to_string(),
                code: output.status.code(),
                stderr: stderr.trim().to_string(),
            });
        }
        Ok(Output { stdout, stderr })
    }
}

impl fmt::Display for Cmd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.line())
    }
}

/// Quotes one argument the way a shell user would read it.
fn quote(arg: &str) -> String {
    let plain = !arg.is_empty()
        && arg
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c));
    if plain {
        arg.to_string()
    } else {
        format!("'{}'", arg.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_quotes_only_what_needs_it() {
        let cmd = Cmd::new("/usr/sbin/lvm")
            .args(["lvcreate", "-n", "a b", "--config", "x{y=1}"])
            .arg("it's");
        assert_eq!(
            cmd.line(),
            r#"/usr/sbin/lvm lvcreate -n 'a b' --config 'x{y=1}' 'it'\''s'"#
        );
        assert_eq!(cmd.program(), "lvm");
        assert_eq!(cmd.span_name(), "lvm.lvcreate");
        assert_eq!(Cmd::new("lvm").arg("--version").span_name(), "lvm");
        assert_eq!(Cmd::new("sgdisk").arg("-n").span_name(), "sgdisk");
    }

    #[tokio::test]
    async fn the_observer_hears_every_outcome() {
        static SEEN: std::sync::Mutex<Vec<(String, Outcome)>> = std::sync::Mutex::new(Vec::new());
        fn record(command: &str, outcome: Outcome, _took: Duration) {
            SEEN.lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((command.to_string(), outcome));
        }
        assert!(observe_commands(record), "first install wins");
        assert!(!observe_commands(record), "second install changes nothing");
        Cmd::new("true").run().await.expect("true runs");
        Cmd::new("false").run().await.expect_err("false fails");
        Cmd::new("/nonexistent/carina-tool")
            .run()
            .await
            .expect_err("cannot spawn");
        Cmd::new("sleep")
            .arg("5")
            .timeout(Duration::from_millis(50))
            .run()
            .await
            .expect_err("times out");
        let seen = SEEN.lock().unwrap_or_else(|p| p.into_inner()).clone();
        for (command, outcome) in [
            ("true", Outcome::Ok),
            ("false", Outcome::Failed),
            ("carina-tool", Outcome::Spawn),
            ("sleep", Outcome::TimedOut),
        ] {
            assert!(
                seen.contains(&(command.to_string(), outcome)),
                "{command} {outcome:?} in {seen:?}"
            );
        }
    }

    #[tokio::test]
    async fn failure_carries_command_and_stderr() {
        let err = Cmd::new("sh")
            .args(["-c", "echo boom >&2; exit 3"])
            .run()
            .await
            .expect_err("must fail");
        let text = err.to_string();
        assert!(text.contains("sh -c"), "{text}");
        assert!(text.contains("boom"), "{text}");
        assert_eq!(err.stderr(), "boom");
        assert_eq!(err.exit_code(), Some(3));
    }

    #[tokio::test]
    async fn timeout_kills_the_command() {
        let err = Cmd::new("sleep")
            .arg("5")
            .timeout(Duration::from_millis(100))
            .run()
            .await
            .expect_err("must time out");
        assert!(matches!(err, CommandError::TimedOut { .. }), "{err}");
    }

    #[tokio::test]
    async fn missing_program_is_a_spawn_error() {
        let err = Cmd::new("carina-no-such-tool")
            .run()
            .await
            .expect_err("must fail");
        assert!(matches!(err, CommandError::Spawn { .. }), "{err}");
    }

    #[tokio::test]
    async fn stdin_is_fed() {
        let out = Cmd::new("cat")
            .stdin("hello")
            .run()
            .await
            .expect("cat runs");
        assert_eq!(out.stdout, "hello");
    }
}
