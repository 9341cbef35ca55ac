//! The command line of `carinactl` (clap derive). Every connection flag
//! has an environment fallback, so a shell can be pointed at a node once:
//!
//! ```text
//! export CARINA_ENDPOINT=https://node-a:7443 CARINA_CA=ca.pem \
//!        CARINA_CERT=controller.pem CARINA_KEY=controller-key.pem
//! carinactl lv list
//! ```

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use super::size::parse_size;

/// The endpoint used when neither `--endpoint` nor `CARINA_ENDPOINT` is set.
pub const DEFAULT_ENDPOINT: &str = "https://127.0.0.1:7443";

/// Drive a Carina node's NodeStorage service over mutual TLS, and make
/// development certificates for it.
#[derive(Debug, Parser)]
#[command(name = "carinactl", version, propagate_version = true)]
pub struct Cli {
    #[command(flatten)]
    pub connection: Connection,

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
    pub output: Output,

    #[command(subcommand)]
    pub command: Command,
}

/// Where the node is and how to prove who we are.
#[derive(Debug, Clone, Args)]
pub struct Connection {
    /// The node's NodeStorage endpoint: https://host:port or host:port.
    #[arg(long, env = "CARINA_ENDPOINT", default_value = DEFAULT_ENDPOINT, global = true)]
    pub endpoint: String,

    /// The CA certificate (PEM) the node's certificate must be signed by.
    #[arg(long, env = "CARINA_CA", global = true)]
    pub ca: Option<PathBuf>,

    /// Our client certificate (PEM); its role decides what we may call.
    #[arg(long, env = "CARINA_CERT", global = true)]
    pub cert: Option<PathBuf>,

    /// The private key (PEM) of --cert.
    #[arg(long, env = "CARINA_KEY", global = true)]
    pub key: Option<PathBuf>,

    /// The node name the server's certificate must carry [default: the
    /// endpoint's host].
    #[arg(long, env = "CARINA_SERVER_NAME", global = true)]
    pub server_name: Option<String>,

    /// How long one call may take (`30`, `30s`, `2m`); `watch` is not
    /// limited.
    #[arg(
        long,
        env = "CARINA_TIMEOUT",
        default_value = "60s",
        value_parser = parse_timeout,
        global = true
    )]
    pub timeout: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Development certificates: a CA, node (server) and role (client)
    /// certificates.
    #[command(subcommand)]
    Certs(CertsCommand),
    /// Logic volumes: create, get, list, resize, delete.
    #[command(subcommand)]
    Lv(LvCommand),
    /// Capacity of every device group (or of one).
    Capacity {
        /// Only this device group.
        #[arg(long)]
        group: Option<String>,
    },
    /// Print every capacity update until interrupted (Ctrl-C).
    Watch,
    /// Every disk the node sees, and which group took it.
    Disks,
    /// The node's device-group configuration.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// bcache devices made of two volumes.
    #[command(subcommand)]
    Bcache(BcacheCommand),
    /// Pods' IO limits on the node's volumes (what the control plane sets
    /// from pod annotations), as read back from their cgroups.
    #[command(subcommand)]
    Iolimits(IoLimitsCommand),
}

#[derive(Debug, Subcommand)]
pub enum CertsCommand {
    /// Create a development CA: ca.pem and ca-key.pem in DIR.
    Init {
        /// Directory to write to (created if missing).
        #[arg(long)]
        dir: PathBuf,
        /// Trust domain of the client SPIFFE IDs this CA will issue;
        /// recorded in DIR/trust-domain for `certs issue client`.
        #[arg(long, default_value = carina_proto::tls::DEFAULT_TRUST_DOMAIN)]
        trust_domain: String,
        /// Validity in days.
        #[arg(long, default_value_t = 3650)]
        days: u32,
        /// Replace an existing CA (everything it signed stops being trusted
        /// once its holders load the new ca.pem).
        #[arg(long)]
        force: bool,
    },
    /// Issue a certificate signed by the CA in --ca-dir.
    #[command(subcommand)]
    Issue(IssueCommand),
}

#[derive(Debug, Subcommand)]
pub enum IssueCommand {
    /// A node's server certificate: node-NAME.pem, node-NAME-key.pem.
    Server {
        /// The node name (DNS SAN; clients check it).
        #[arg(long)]
        node: String,
        /// More DNS names (repeat or comma-separate).
        #[arg(long, value_delimiter = ',')]
        dns: Vec<String>,
        /// IP addresses (repeat or comma-separate).
        #[arg(long, value_delimiter = ',')]
        ip: Vec<IpAddr>,
        #[command(flatten)]
        common: IssueArgs,
    },
    /// A client certificate for a role: ROLE.pem, ROLE-key.pem.
    Client {
        /// controller may call everything, reader only the read RPCs.
        #[arg(long, value_parser = ["controller", "reader"])]
        role: String,
        /// Trust domain of the SPIFFE ID [default: the one recorded by
        /// `certs init`, else carina.storage.io].
        #[arg(long)]
        trust_domain: Option<String>,
        #[command(flatten)]
        common: IssueArgs,
    },
}

#[derive(Debug, Clone, Args)]
pub struct IssueArgs {
    /// Directory to write to (created if missing).
    #[arg(long)]
    pub dir: PathBuf,
    /// Directory holding ca.pem and ca-key.pem [default: --dir].
    #[arg(long)]
    pub ca_dir: Option<PathBuf>,
    /// Validity in days.
    #[arg(long, default_value_t = 365)]
    pub days: u32,
}

#[derive(Debug, Subcommand)]
pub enum LvCommand {
    /// Create a volume (or return the existing one with these arguments).
    Create {
        name: String,
        /// The device group to carve it from.
        #[arg(long)]
        group: String,
        /// Size: 10Gi, 512Mi, 1G or bytes; rounded up by the node.
        #[arg(long, value_parser = parse_size)]
        size: u64,
        /// RAW groups: take a whole, empty disk.
        #[arg(long)]
        exclusive: bool,
    },
    /// Show one volume.
    Get { name: String },
    /// List volumes, following every page.
    List {
        /// Only this device group.
        #[arg(long)]
        group: Option<String>,
        /// Volumes per request (0: the node's default).
        #[arg(long, default_value_t = 0)]
        page_size: u32,
    },
    /// Grow a volume.
    Resize {
        name: String,
        /// The new size (at least the current one).
        #[arg(long, value_parser = parse_size)]
        size: u64,
    },
    /// Delete a volume.
    Delete { name: String },
}

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Replace the node's configuration with FILE (config.json; `-` reads
    /// standard input).
    Apply { file: PathBuf },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CacheModeArg {
    Writethrough,
    Writeback,
    Writearound,
    None,
}

#[derive(Debug, Subcommand)]
pub enum BcacheCommand {
    /// Assemble a bcache device from a backing and a cache volume; with
    /// --backing-group, make both volumes too.
    Create {
        name: String,
        /// The slow volume holding the data.
        #[arg(long)]
        backing: String,
        /// The fast volume caching it.
        #[arg(long)]
        cache: String,
        #[arg(long, value_enum, default_value_t = CacheModeArg::Writethrough)]
        mode: CacheModeArg,
        /// Make the backing volume in this group (with --size, --cache-group
        /// and --cache-ratio); the device then owns both volumes.
        #[arg(long, requires_all = ["size", "cache_group", "cache_ratio"])]
        backing_group: Option<String>,
        /// The backing volume's size (`10Gi`, `500M`, bytes).
        #[arg(long, value_parser = parse_size, requires = "backing_group")]
        size: Option<u64>,
        /// Make the cache volume in this group.
        #[arg(long, requires = "backing_group")]
        cache_group: Option<String>,
        /// The cache volume's size as a percentage of --size (1 to 100).
        #[arg(long, requires = "backing_group", value_parser = clap::value_parser!(u32).range(1..=100))]
        cache_ratio: Option<u32>,
    },
    /// Detach (flushing), stop and remove a bcache device; volumes it made
    /// are deleted with it, others stay.
    Delete { name: String },
    /// Show one bcache device.
    Get { name: String },
    /// Change the cache mode.
    SetMode {
        name: String,
        #[arg(value_enum)]
        mode: CacheModeArg,
    },
}

#[derive(Debug, Subcommand)]
pub enum IoLimitsCommand {
    /// The limits in force, per pod and volume.
    List {
        /// Only this pod (its metadata.uid).
        #[arg(long)]
        pod: Option<String>,
    },
    /// Set a pod's limits on one volume (replacing what it had; a limit
    /// left out is none).
    Set {
        /// The pod's metadata.uid.
        #[arg(long)]
        pod: String,
        /// The volume.
        #[arg(long)]
        volume: String,
        /// Bytes per second read (`10Mi`, `500M`, bytes).
        #[arg(long, value_parser = parse_size, default_value = "0")]
        read_bps: u64,
        /// Bytes per second written.
        #[arg(long, value_parser = parse_size, default_value = "0")]
        write_bps: u64,
        /// Read operations per second.
        #[arg(long, default_value_t = 0)]
        read_iops: u64,
        /// Write operations per second.
        #[arg(long, default_value_t = 0)]
        write_iops: u64,
    },
    /// Remove a pod's limits (on every volume, or on one).
    Clear {
        #[arg(long)]
        pod: String,
        #[arg(long)]
        volume: Option<String>,
    },
}

/// `30`, `30s`, `500ms`, `2m`: a positive duration.
pub fn parse_timeout(input: &str) -> Result<Duration, String> {
    let s = input.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("invalid duration {input:?} (examples: 30, 30s, 500ms, 2m)"))?;
    let d = match unit.trim() {
        "" | "s" => Duration::from_secs(n),
        "ms" => Duration::from_millis(n),
        "m" => Duration::from_secs(n.saturating_mul(60)),
        "h" => Duration::from_secs(n.saturating_mul(3600)),
        other => return Err(format!("invalid duration unit {other:?} (ms, s, m, h)")),
    };
    if d.is_zero() {
        return Err("the timeout must be greater than zero".to_string());
    }
    Ok(d)
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
    fn connection_flags_work_after_the_subcommand() {
        let cli = Cli::try_parse_from([
            "carinactl",
            "lv",
            "create",
            "a",
            "--group",
            "lvm",
            "--size",
            "1Gi",
            "--endpoint",
            "node-a:7443",
            "-o",
            "json",
        ])
        .expect("parses");
        assert_eq!(cli.connection.endpoint, "node-a:7443");
        assert_eq!(cli.output, Output::Json);
        match cli.command {
            Command::Lv(LvCommand::Create { name, size, .. }) => {
                assert_eq!(name, "a");
                assert_eq!(size, 1 << 30);
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn a_bad_size_is_a_usage_error() {
        let err = Cli::try_parse_from(["carinactl", "lv", "resize", "a", "--size", "lots"])
            .expect_err("refused");
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("examples: 10Gi"), "{err}");
    }

    #[test]
    fn timeouts() {
        assert_eq!(parse_timeout("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_timeout("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_timeout("500ms"), Ok(Duration::from_millis(500)));
        for bad in ["", "0", "s", "1d", "-1s"] {
            assert!(parse_timeout(bad).is_err(), "{bad}");
        }
    }
}
