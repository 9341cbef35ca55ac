//! `carinactl`, the command-line client of a node's NodeStorage service:
//! arguments ([`args`]), sizes ([`size`]), tables ([`table`]) and the
//! rendering of messages ([`render`]), development certificates
//! ([`certs`]) and the RPC commands ([`rpc`]).
//!
//! Errors and exit statuses ([`CliError::exit_code`]):
//!
//! | status | meaning | printed as |
//! | --- | --- | --- |
//! | 0 | success | |
//! | 1 | the call failed: the node answered with a status, or could not be reached | `error: NOT_FOUND: volume "x" not found` |
//! | 2 | usage: a bad flag or value, missing TLS files | `error: ...` (clap's own message for flags) |
//! | 3 | local failure: reading or writing files, bad TLS material | `error: ...` |

pub mod args;
pub mod certs;
pub mod render;
pub mod rpc;
pub mod size;
pub mod table;

use std::error::Error as StdError;
use std::io::Write;

use serde::Serialize;
use tonic::{Code, Status};

use args::{CertsCommand, Cli, Command, IssueCommand, Output};

/// Exit status of a failed call.
pub const EXIT_RPC: u8 = 1;
/// Exit status of a usage error (the same as clap's).
pub const EXIT_USAGE: u8 = 2;
/// Exit status of a local failure.
pub const EXIT_LOCAL: u8 = 3;

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The node answered with a non-OK status.
    #[error("{}", status_line(.0))]
    Rpc(Box<Status>),
    /// The node could not be reached (TCP, TLS handshake, HTTP/2).
    #[error("UNAVAILABLE: {0}")]
    Connect(String),
    /// The command line asks for something impossible.
    #[error("{0}")]
    Usage(String),
    /// Something on this machine failed (files, TLS material).
    #[error("{0}")]
    Local(String),
}

impl CliError {
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Rpc(_) | CliError::Connect(_) => EXIT_RPC,
            CliError::Usage(_) => EXIT_USAGE,
            CliError::Local(_) => EXIT_LOCAL,
        }
    }

    /// The gRPC code, for the failures that have one.
    pub fn code(&self) -> Option<Code> {
        match self {
            CliError::Rpc(s) => Some(s.code()),
            CliError::Connect(_) => Some(Code::Unavailable),
            _ => None,
        }
    }
}

impl From<Status> for CliError {
    fn from(s: Status) -> CliError {
        CliError::Rpc(Box::new(s))
    }
}

pub use carina_proto::code_name;

/// `CODE: message`, with the causes of transport failures appended (their
/// status message alone is often just "transport error").
fn status_line(s: &Status) -> String {
    let mut line = format!("{}: {}", code_name(s.code()), s.message());
    if let Some(source) = s.source() {
        append_causes(&mut line, source);
    }
    line
}

/// Appends `": cause"` for `err` and each of its sources whose text is not
/// already in `line`.
fn append_causes(line: &mut String, err: &(dyn StdError + 'static)) {
    let mut next = Some(err);
    while let Some(e) = next {
        let text = e.to_string();
        if !text.is_empty() && !line.contains(&text) {
            if line.is_empty() || line.ends_with(": ") {
                line.push_str(&text);
            } else {
                line.push_str(": ");
                line.push_str(&text);
            }
        }
        next = e.source();
    }
}

/// An error and all its causes on one line.
pub fn error_chain(err: &(dyn StdError + 'static)) -> String {
    let mut line = String::new();
    append_causes(&mut line, err);
    line
}

/// Runs one parsed command line, writing results to standard output.
pub async fn run(cli: Cli) -> Result<(), CliError> {
    let out = Printer { format: cli.output };
    match cli.command {
        Command::Certs(cmd) => run_certs(cmd, &out),
        other => rpc::run(&cli.connection, other, &out).await,
    }
}

fn run_certs(cmd: CertsCommand, out: &Printer) -> Result<(), CliError> {
    let (written, note) = match cmd {
        CertsCommand::Init {
            dir,
            trust_domain,
            days,
            force,
        } => (
            certs::init(&dir, &trust_domain, days, force)?,
            format!("trust domain {trust_domain}"),
        ),
        CertsCommand::Issue(IssueCommand::Server {
            node,
            dns,
            ip,
            common,
        }) => {
            let ca_dir = common.ca_dir.as_deref().unwrap_or(&common.dir);
            let w = certs::issue_server(ca_dir, &common.dir, &node, &dns, &ip, common.days)?;
            (w, format!("server certificate for node {node}"))
        }
        CertsCommand::Issue(IssueCommand::Client {
            role,
            trust_domain,
            common,
        }) => {
            let ca_dir = common.ca_dir.as_deref().unwrap_or(&common.dir);
            let (w, td) = certs::issue_client(
                ca_dir,
                &common.dir,
                &role,
                trust_domain.as_deref(),
                common.days,
            )?;
            let id = carina_proto::tls::spiffe_id(&td, &role);
            (w, format!("client certificate {id}"))
        }
    };
    let files: Vec<String> = written
        .files
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    out.print(
        || {
            let mut text = format!("{note}\n");
            for f in &files {
                text.push_str(&format!("  wrote {f}\n"));
            }
            text
        },
        || serde_json::json!({ "files": files }),
    )
}

/// Writes results in the chosen format.
#[derive(Debug, Clone, Copy)]
pub struct Printer {
    pub format: Output,
}

impl Printer {
    /// Prints `table()` or `json()` (pretty) depending on the format.
    pub fn print<J: Serialize>(
        &self,
        table: impl FnOnce() -> String,
        json: impl FnOnce() -> J,
    ) -> Result<(), CliError> {
        self.write(table, json, serde_json::to_string_pretty)
    }

    /// Prints one line of a stream: `table()` or compact JSON.
    pub fn print_line<J: Serialize>(
        &self,
        table: impl FnOnce() -> String,
        json: impl FnOnce() -> J,
    ) -> Result<(), CliError> {
        self.write(table, json, serde_json::to_string)
    }

    /// `table()`, or `json()` encoded by `encode` and ended by a newline.
    fn write<J: Serialize>(
        &self,
        table: impl FnOnce() -> String,
        json: impl FnOnce() -> J,
        encode: fn(&J) -> serde_json::Result<String>,
    ) -> Result<(), CliError> {
        let text = match self.format {
            Output::Table => table(),
            Output::Json => {
                let mut s =
                    encode(&json()).map_err(|e| CliError::Local(format!("encode JSON: {e}")))?;
                s.push('\n');
                s
            }
        };
        write_stdout(&text)
    }
}

fn write_stdout(text: &str) -> Result<(), CliError> {
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
        .map_err(|e| CliError::Local(format!("write to standard output: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_print_code_and_message() {
        let e = CliError::from(Status::resource_exhausted(
            "group lvm: 4 GiB requested, 1.7 GiB allocatable",
        ));
        assert_eq!(
            e.to_string(),
            "RESOURCE_EXHAUSTED: group lvm: 4 GiB requested, 1.7 GiB allocatable"
        );
        assert_eq!(e.exit_code(), EXIT_RPC);
        assert_eq!(e.code(), Some(Code::ResourceExhausted));
        let e = CliError::from(Status::permission_denied(
            "role reader may not call CreateLV",
        ));
        assert!(e.to_string().starts_with("PERMISSION_DENIED: "), "{e}");
        assert_eq!(CliError::Usage("x".into()).exit_code(), EXIT_USAGE);
        assert_eq!(CliError::Local("x".into()).exit_code(), EXIT_LOCAL);
    }

    #[test]
    fn causes_are_appended_once() {
        #[derive(Debug, thiserror::Error)]
        #[error("transport error")]
        struct Outer(#[source] std::io::Error);
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
        assert_eq!(
            error_chain(&Outer(io)),
            "transport error: connection refused"
        );
        let status = Status::from_error(Box::new(Outer(std::io::Error::other("reset"))));
        let line = status_line(&status);
        assert!(line.contains("reset"), "{line}");
        assert_eq!(line.matches("transport error").count(), 1, "{line}");
    }

    #[test]
    fn every_code_has_a_distinct_name() {
        let names: std::collections::HashSet<&str> =
            (0..=16).map(|i| code_name(Code::from_i32(i))).collect();
        assert_eq!(names.len(), 17);
    }
}
