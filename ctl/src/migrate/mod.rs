//! `carinactl migrate`: taking over a cluster that ran Go Carina v0.14.0.
//! `plan` reads the cluster (kubeconfig from `--kubeconfig`, else
//! `KUBECONFIG`, `~/.kube/config` or the in-cluster service account, as
//! kubectl finds it), prints what will happen to every Go object and
//! volume, and changes nothing (it only lists objects). `apply` takes the
//! Go volumes over on their nodes, with the control-plane identity
//! (`--ca`, `--cert`, `--key` as for the node commands: a client
//! certificate of role `controller`).

mod render;

use std::path::PathBuf;

use clap::Subcommand;
use tracing::Instrument;

use carina_controlplane::migrate::apply::{ApplyError, ApplyReport, NodeAccess, apply};
use carina_controlplane::migrate::{Cluster, Plan, plan};
use carina_controlplane::nodes::pool::NodeClients;
use carina_node::cli::args::Connection;
use carina_node::cli::{CliError, Printer};
use carina_proto::tls::ClientTls;

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
    /// Take every Go volume of the plan over on its node and mark its
    /// LogicVolume adopted. Refuses while a Go Carina program runs;
    /// a re-run finishes an interrupted one, skipping what is done.
    Apply {
        /// The kubeconfig to use [default: as for `plan`].
        #[arg(long)]
        kubeconfig: Option<PathBuf>,
        /// The NodeStorage port of a Node without the
        /// carina.storage.io/node-endpoint annotation.
        #[arg(long, env = "CARINA_NODE_PORT", default_value_t = 7443)]
        node_port: u16,
    },
}

/// How a migrate command ended, when it did not fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Done,
    /// The plan has blockers (printed).
    Blocked,
}

pub async fn run(
    cmd: MigrateCommand,
    connection: &Connection,
    out: &Printer,
) -> Result<Outcome, CliError> {
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
        MigrateCommand::Apply {
            kubeconfig,
            node_port,
        } => {
            let span = tracing::info_span!("carinactl.migrate.apply");
            let report = run_apply(kubeconfig, connection, node_port)
                .instrument(span)
                .await?;
            out.print(|| render::apply_table(&report), || &report)?;
            if report.errors > 0 {
                return Err(CliError::Connect(format!(
                    "{} volume(s) not taken over (see above); run migrate apply again",
                    report.errors
                )));
            }
            Ok(Outcome::Done)
        }
    }
}

async fn run_apply(
    kubeconfig: Option<PathBuf>,
    connection: &Connection,
    port: u16,
) -> Result<ApplyReport, CliError> {
    let (Some(ca), Some(cert), Some(key)) = (&connection.ca, &connection.cert, &connection.key)
    else {
        return Err(CliError::Usage(
            "migrate apply calls nodes: give --ca, --cert and --key (a controller certificate)"
                .to_string(),
        ));
    };
    let tls = ClientTls::from_files(ca, cert, key, "")
        .map_err(|e| CliError::Usage(carina_node::cli::error_chain(&e)))?;
    let nodes = NodeAccess {
        clients: NodeClients::new(tls).call_timeout(connection.timeout),
        port,
    };
    let client = carina_api::client::connect(kubeconfig.as_deref())
        .await
        .map_err(|e| CliError::Usage(carina_node::cli::error_chain(&e)))?;
    apply(&client, &nodes).await.map_err(|e| match e {
        ApplyError::Blocked(_) => CliError::Usage(e.to_string()),
        ApplyError::Read(e) => CliError::Connect(carina_node::cli::error_chain(&e)),
    })
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
