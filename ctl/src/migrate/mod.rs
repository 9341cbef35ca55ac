//! `carinactl migrate`: taking over a cluster that ran Go Carina v0.14.0.
//! `plan` reads the cluster (kubeconfig from `--kubeconfig`, else
//! `KUBECONFIG`, `~/.kube/config` or the in-cluster service account, as
//! kubectl finds it), prints what will happen to every Go object and
//! volume, and changes nothing (it only lists objects).

mod render;

use std::path::PathBuf;

use clap::Subcommand;
use tracing::Instrument;

use carina_controlplane::migrate::{Cluster, Plan, plan};
use carina_node::cli::{CliError, Printer};

/// Exit status of a plan with blockers.
pub const EXIT_BLOCKED: u8 = 4;

#[derive(Debug, Subcommand)]
pub enum MigrateCommand {
    /// Print what `migrate apply` would do to every Go Carina object and
    /// volume, and what blocks it; changes nothing. Exits 4 while a Go
    /// Carina program still runs.
    Plan {
        /// The kubeconfig to use [default: KUBECONFIG, ~/.kube/config, or
        /// the in-cluster service account].
        #[arg(long)]
        kubeconfig: Option<PathBuf>,
    },
}

/// How a migrate command ended, when it did not fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Done,
    /// The plan has blockers (printed).
    Blocked,
}

pub async fn run(cmd: MigrateCommand, out: &Printer) -> Result<Outcome, CliError> {
    match cmd {
        MigrateCommand::Plan { kubeconfig } => {
            let span = tracing::info_span!("carinactl.migrate.plan");
            let plan = read_plan(kubeconfig).instrument(span).await?;
            out.print(|| render::plan_table(&plan), || &plan)?;
            Ok(if plan.blocking {
                Outcome::Blocked
            } else {
                Outcome::Done
            })
        }
    }
}

async fn read_plan(kubeconfig: Option<PathBuf>) -> Result<Plan, CliError> {
    let client = carina_api::client::connect(kubeconfig.as_deref())
        .await
        .map_err(|e| CliError::Usage(carina_node::cli::error_chain(&e)))?;
    let cluster = Cluster::read(&client)
        .await
        .map_err(|e| CliError::Connect(carina_node::cli::error_chain(&e)))?;
    Ok(plan(&cluster))
}
