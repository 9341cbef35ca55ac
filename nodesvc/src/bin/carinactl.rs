//! `carinactl`: the command-line client of a Carina node's NodeStorage
//! service, and the maker of development certificates. See
//! `carina_node::cli` for the commands, output formats and exit statuses.

use std::process::ExitCode;

use clap::Parser;

use carina_node::cli::{self, args::Cli};
use carina_proto::telemetry::{self, TelemetryConfig};

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
    match cli::run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
