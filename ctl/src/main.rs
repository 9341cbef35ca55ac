//! `carinactl`: the command-line client of a Carina node's NodeStorage
//! service and the maker of development certificates (the commands of
//! `carina_node::cli`), and `carinactl migrate`, which reads a cluster
//! through a Kubernetes client ([`migrate`]).
//!
//! Exit statuses: those of `carina_node::cli` (0 success, 1 a failed call,
//! 2 usage, 3 a local failure), and 4 when `migrate plan` found something
//! that blocks `migrate apply` (a Go Carina program still runs).

mod migrate;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use carina_node::cli::{
    self, Printer,
    args::{self, Connection, Output},
};
use carina_proto::telemetry::{self, TelemetryConfig};

/// Drive a Carina node's NodeStorage service over mutual TLS, make
/// development certificates for it, and take a Go Carina cluster over.
#[derive(Debug, Parser)]
#[command(name = "carinactl", version, propagate_version = true)]
struct Cli {
    #[command(flatten)]
    connection: Connection,

    /// Output format: aligned tables with human sizes, or JSON with exact
    /// byte counts.
    #[arg(
        short = 'o',
        long,
        env = "CARINA_OUTPUT",
        value_enum,
        default_value_t = Output::Table,
        global = true
    )]
    output: Output,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Take over a cluster that runs Go Carina: list what will happen to
    /// every Go object and volume (`plan`), then do it (`apply`).
    #[command(subcommand)]
    Migrate(migrate::MigrateCommand),
    #[command(flatten)]
    Node(args::Command),
}

#[tokio::main]
async fn main() -> ExitCode {
    // Parsing exits with clap's status (2 for usage, 0 for --help).
    let args = Cli::parse();
    // Quiet unless asked (RUST_LOG); traces go out only when the OTEL_*
    // variables ask for them, continuing into the node it calls.
    let config = TelemetryConfig::from_lookup("carinactl", |k| {
        std::env::var(k)
            .ok()
            .or_else(|| (k == "RUST_LOG").then(|| "warn".to_string()))
    });
    let _telemetry = match config.and_then(telemetry::init_with) {
        Ok(guard) => Some(guard),
        Err(e) => {
            eprintln!("warning: telemetry: {e}");
            None
        }
    };
    let result = match args.command {
        Command::Migrate(cmd) => {
            let out = Printer {
                format: args.output,
            };
            migrate::run(cmd, &args.connection, &out).await
        }
        Command::Node(command) => cli::run(args::Cli {
            connection: args.connection,
            output: args.output,
            command,
        })
        .await
        .map(|()| migrate::Outcome::Done),
    };
    match result {
        Ok(migrate::Outcome::Done) => ExitCode::SUCCESS,
        Ok(migrate::Outcome::Blocked) => ExitCode::from(migrate::EXIT_BLOCKED),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn node_and_migrate_commands_parse() {
        let cli = Cli::try_parse_from(["carinactl", "lv", "get", "a", "--endpoint", "n:7443"])
            .expect("parses");
        assert!(matches!(cli.command, Command::Node(args::Command::Lv(_))));
        assert_eq!(cli.connection.endpoint, "n:7443");
        let cli =
            Cli::try_parse_from(["carinactl", "migrate", "plan", "-o", "json"]).expect("parses");
        assert!(matches!(
            cli.command,
            Command::Migrate(migrate::MigrateCommand::Plan { .. })
        ));
        assert_eq!(cli.output, Output::Json);
    }
}
