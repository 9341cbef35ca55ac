//! Long-lived helper processes that read commands on stdin and answer on
//! a pipe of their own (`lvm`'s shell with `LVM_REPORT_FD`): argv only,
//! like [`crate::command`], plus one extra pipe whose write end the child
//! finds at the descriptor number named in an environment variable.
//!
//! What the commands and answers mean is the caller's business; this
//! module only starts the process and hands over its four pipes.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::process::Stdio;

use tokio::net::unix::pipe;
use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout};

/// A running helper and its pipes. Dropping it kills the process.
#[derive(Debug)]
pub struct Coprocess {
    pub child: Child,
    /// Where commands go.
    pub stdin: ChildStdin,
    /// The answer pipe (the child's end is named by the variable given to
    /// [`spawn`]).
    pub answers: pipe::Receiver,
    pub stdout: ChildStdout,
    pub stderr: ChildStderr,
}

impl Coprocess {
    /// The process id (`None` once it has been reaped).
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }
}

/// Starts `program` with `args`, `env` added to the inherited
/// environment (and `LC_ALL=C`), stdin, stdout and stderr piped, and the
/// write end of a fresh pipe open in the child at the descriptor number
/// that `answer_fd_var` gives. No other descriptor of ours leaks into it.
///
/// Errors: the pipe cannot be made or the program cannot be started.
pub fn spawn(
    program: &str,
    args: &[&str],
    env: &[(&str, &str)],
    answer_fd_var: &str,
) -> io::Result<Coprocess> {
    // Both ends are close-on-exec, so no other child of this process
    // inherits them; only ours clears the flag on its copy of the write end.
    let (reader, writer) = io::pipe()?;
    let fd = writer.as_raw_fd();
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .envs(env.iter().copied())
        .env("LC_ALL", "C")
        .env(answer_fd_var, fd.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    // Passing a descriptor other than 0-2 to a child has no safe API in
    // std or tokio. Sound: the closure runs in the forked child before
    // exec and only calls fcntl(2) (async-signal-safe, no allocation) on
    // `fd`, which `writer` keeps open in the parent until spawn() returns,
    // so it is open in the child; it changes the child's descriptor table
    // only.
    #[allow(unsafe_code)]
    unsafe {
        cmd.pre_exec(move || {
            if libc::fcntl(fd, libc::F_SETFD, 0) == -1 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn()?;
    // The child holds its own copy; ours must go, or the answer pipe would
    // never report end-of-file when the child dies.
    drop(writer);
    let answers = pipe::Receiver::from_owned_fd(OwnedFd::from(reader))?;
    let (Some(stdin), Some(stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        // All three were asked for as pipes above.
        return Err(io::Error::other("a piped standard stream is missing"));
    };
    Ok(Coprocess {
        child,
        stdin,
        answers,
        stdout,
        stderr,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn the_child_writes_to_the_answer_pipe_and_its_end_closes_it() {
        // `sh` only to use the descriptor the variable names (through
        // /proc: dash redirects only descriptors 0-9); the module itself
        // never goes through a shell.
        let script = r#"read line; echo "got $line" >"/proc/self/fd/$ANSWER_FD"; echo out"#;
        let mut co = spawn("sh", &["-c", script], &[], "ANSWER_FD").expect("spawn sh");
        co.stdin.write_all(b"hello\n").await.expect("write");
        let mut answer = String::new();
        co.answers
            .read_to_string(&mut answer)
            .await
            .expect("read answers to end-of-file");
        assert_eq!(answer, "got hello\n");
        let mut out = String::new();
        co.stdout.read_to_string(&mut out).await.expect("stdout");
        assert_eq!(out, "out\n");
        assert!(co.child.wait().await.expect("wait").success());
    }

    #[tokio::test]
    async fn a_missing_program_is_an_error() {
        assert!(spawn("carina-no-such-tool", &[], &[], "X_FD").is_err());
    }
}
