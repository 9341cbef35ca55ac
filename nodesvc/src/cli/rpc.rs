//! The commands that call a node: connect over mutual TLS, make the call,
//! print the answer.

use std::time::Duration;

use serde::Serialize;
use tonic::Request;
use tracing::Instrument;

use carina_proto::nodestorage::node_storage_client::NodeStorageClient;
use carina_proto::nodestorage::{
    ApplyConfigRequest, CacheMode, CapacityRequest, CapacityResponse, ClearPodIoLimitsRequest,
    CreateBcacheRequest, CreateLvRequest, DeleteBcacheRequest, DeleteLvRequest, GetBcacheRequest,
    GetLvRequest, IoLimits, ListDisksRequest, ListLVsRequest, ListPodIoLimitsRequest, LogicVolume,
    ResizeLvRequest, SetCacheModeRequest, SetPodIoLimitsRequest, WatchCapacityRequest,
};
use carina_proto::tls::{self, ClientTls, TlsError};
use carina_proto::trace::{TracedChannel, traced};

use super::args::{
    BcacheCommand, CacheModeArg, Command, ConfigCommand, Connection, IoLimitsCommand, LvCommand,
};
use super::render;
use super::size::format_size;
use super::{CliError, Printer, error_chain};

type Client = NodeStorageClient<TracedChannel>;

// JSON envelopes, named after the proto responses' fields.

#[derive(Debug, Serialize)]
struct OneVolume<'a> {
    /// Only for `lv create`: false when the volume already existed.
    #[serde(skip_serializing_if = "Option::is_none")]
    created: Option<bool>,
    volume: render::VolumeView<'a>,
}

#[derive(Debug, Serialize)]
struct Volumes<'a> {
    volumes: Vec<render::VolumeView<'a>>,
}

#[derive(Debug, Serialize)]
struct Disks<'a> {
    disks: Vec<render::DiskView<'a>>,
}

#[derive(Debug, Serialize)]
struct PodLimits<'a> {
    limits: Vec<render::PodLimitView<'a>>,
}

#[derive(Debug, Serialize)]
struct Device<'a> {
    device: render::BcacheView<'a>,
}

/// A connected client and the per-call timeout.
struct Node {
    client: Client,
    timeout: Duration,
}

impl Node {
    fn request<T>(&self, message: T) -> Request<T> {
        let mut request = Request::new(message);
        request.set_timeout(self.timeout);
        request
    }
}

/// The host part of an endpoint (`https://node-a:7443` → `node-a`,
/// `[::1]:7443` → `::1`): what the server certificate must name unless
/// `--server-name` says otherwise.
pub fn endpoint_host(endpoint: &str) -> &str {
    let rest = endpoint
        .split_once("://")
        .map_or(endpoint, |(_, rest)| rest)
        .trim_end_matches('/');
    if let Some(bracketed) = rest.strip_prefix('[') {
        return bracketed
            .split_once(']')
            .map_or(bracketed, |(host, _)| host);
    }
    rest.rsplit_once(':').map_or(rest, |(host, _)| host)
}

/// The TLS identity the flags describe. Missing files are a usage error.
pub fn client_tls(c: &Connection) -> Result<ClientTls, CliError> {
    let need = |value: &Option<std::path::PathBuf>, flag: &str, var: &str| {
        value.clone().ok_or_else(|| {
            CliError::Usage(format!(
                "missing {flag} (or {var}): calling a node needs the CA, a client certificate and its key"
            ))
        })
    };
    let ca = need(&c.ca, "--ca", "CARINA_CA")?;
    let cert = need(&c.cert, "--cert", "CARINA_CERT")?;
    let key = need(&c.key, "--key", "CARINA_KEY")?;
    let server_name = c
        .server_name
        .clone()
        .unwrap_or_else(|| endpoint_host(&c.endpoint).to_string());
    ClientTls::from_files(&ca, &cert, &key, server_name).map_err(tls_error)
}

fn tls_error(e: TlsError) -> CliError {
    match e {
        TlsError::ServerName { .. } | TlsError::Endpoint { .. } => CliError::Usage(e.to_string()),
        TlsError::Connect { .. } => CliError::Connect(error_chain(&e)),
        TlsError::Read { .. }
        | TlsError::Pem { .. }
        | TlsError::Rustls { .. }
        | TlsError::Verifier { .. } => CliError::Local(error_chain(&e)),
    }
}

async fn connect(c: &Connection) -> Result<Node, CliError> {
    let tls = client_tls(c)?;
    let channel = tls::connect(&c.endpoint, &tls).await.map_err(tls_error)?;
    Ok(Node {
        client: NodeStorageClient::new(traced(channel)),
        timeout: c.timeout,
    })
}

/// Runs an RPC command (everything but `certs`).
pub async fn run(c: &Connection, command: Command, out: &Printer) -> Result<(), CliError> {
    let span = tracing::info_span!(
        "carinactl",
        otel.name = command_name(&command),
        otel.kind = "client",
        carina.node.endpoint = %c.endpoint,
    );
    async move {
        let mut node = connect(c).await?;
        match command {
            Command::Lv(cmd) => lv(&mut node, cmd, out).await,
            Command::Capacity { group } => capacity(&mut node, group, out).await,
            Command::Watch => watch(&mut node, out).await,
            Command::Disks => disks(&mut node, out).await,
            Command::Config(ConfigCommand::Apply { file }) => {
                apply_config(&mut node, &file, out).await
            }
            Command::Bcache(cmd) => bcache(&mut node, cmd, out).await,
            Command::Iolimits(cmd) => iolimits(&mut node, cmd, out).await,
            Command::Certs(_) => Err(CliError::Usage("certs does not call a node".to_string())),
        }
    }
    .instrument(span)
    .await
}

fn command_name(command: &Command) -> &'static str {
    match command {
        Command::Certs(_) => "carinactl certs",
        Command::Lv(LvCommand::Create { .. }) => "carinactl lv create",
        Command::Lv(LvCommand::Get { .. }) => "carinactl lv get",
        Command::Lv(LvCommand::List { .. }) => "carinactl lv list",
        Command::Lv(LvCommand::Resize { .. }) => "carinactl lv resize",
        Command::Lv(LvCommand::Delete { .. }) => "carinactl lv delete",
        Command::Capacity { .. } => "carinactl capacity",
        Command::Watch => "carinactl watch",
        Command::Disks => "carinactl disks",
        Command::Config(_) => "carinactl config apply",
        Command::Bcache(_) => "carinactl bcache",
        Command::Iolimits(_) => "carinactl iolimits",
    }
}

fn missing(what: &str) -> CliError {
    CliError::Rpc(Box::new(tonic::Status::internal(format!(
        "the node's answer has no {what}"
    ))))
}

fn print_volume(
    out: &Printer,
    heading: &str,
    v: &LogicVolume,
    created: Option<bool>,
) -> Result<(), CliError> {
    out.print(
        || {
            let mut text = String::new();
            if !heading.is_empty() {
                text.push_str(heading);
                text.push('\n');
            }
            text.push_str(&render::volumes_table([v]).render());
            text
        },
        || OneVolume {
            created,
            volume: render::volume_json(v),
        },
    )
}

async fn lv(node: &mut Node, cmd: LvCommand, out: &Printer) -> Result<(), CliError> {
    match cmd {
        LvCommand::Create {
            name,
            group,
            size,
            exclusive,
        } => {
            let request = node.request(CreateLvRequest {
                name: name.clone(),
                device_group: group,
                size_bytes: size,
                exclusive,
            });
            let response = node.client.create_lv(request).await?.into_inner();
            let v = response.volume.ok_or_else(|| missing("volume"))?;
            let heading = if response.created {
                format!("volume {name} created ({})", format_size(v.size_bytes))
            } else {
                format!("volume {name} already exists with these arguments")
            };
            print_volume(out, &heading, &v, Some(response.created))
        }
        LvCommand::Get { name } => {
            let request = node.request(GetLvRequest { name });
            let response = node.client.get_lv(request).await?.into_inner();
            let v = response.volume.ok_or_else(|| missing("volume"))?;
            print_volume(out, "", &v, None)
        }
        LvCommand::List { group, page_size } => {
            let volumes = list_all(node, group.unwrap_or_default(), page_size).await?;
            out.print(
                || {
                    if volumes.is_empty() {
                        "no volumes\n".to_string()
                    } else {
                        render::volumes_table(&volumes).render()
                    }
                },
                || Volumes {
                    volumes: volumes.iter().map(render::volume_json).collect(),
                },
            )
        }
        LvCommand::Resize { name, size } => {
            let request = node.request(ResizeLvRequest {
                name: name.clone(),
                size_bytes: size,
            });
            let response = node.client.resize_lv(request).await?.into_inner();
            let v = response.volume.ok_or_else(|| missing("volume"))?;
            let heading = format!("volume {name} is {}", format_size(v.size_bytes));
            print_volume(out, &heading, &v, None)
        }
        LvCommand::Delete { name } => {
            let request = node.request(DeleteLvRequest { name: name.clone() });
            node.client.delete_lv(request).await?;
            out.print(
                || format!("volume {name} deleted\n"),
                || serde_json::json!({ "deleted": name }),
            )
        }
    }
}

/// Every page of `ListLVs`. A node that hands out the same page token
/// twice would loop forever; that is reported instead.
async fn list_all(
    node: &mut Node,
    device_group: String,
    page_size: u32,
) -> Result<Vec<LogicVolume>, CliError> {
    let mut volumes = Vec::new();
    let mut page_token = String::new();
    let mut seen = std::collections::HashSet::new();
    loop {
        let request = node.request(ListLVsRequest {
            device_group: device_group.clone(),
            page_size,
            page_token: page_token.clone(),
        });
        let page = node.client.list_l_vs(request).await?.into_inner();
        volumes.extend(page.volumes);
        if page.next_page_token.is_empty() {
            return Ok(volumes);
        }
        if !seen.insert(page.next_page_token.clone()) {
            return Err(CliError::Rpc(Box::new(tonic::Status::internal(format!(
                "the node returned page token {:?} twice",
                page.next_page_token
            )))));
        }
        page_token = page.next_page_token;
    }
}

fn print_capacity(out: &Printer, c: &CapacityResponse, stream: bool) -> Result<(), CliError> {
    let table = || {
        format!(
            "{}\n{}",
            render::capacity_heading(c),
            render::capacity_table(&c.groups).render()
        )
    };
    if stream {
        out.print_line(|| format!("{}\n", table()), || render::capacity_json(c))
    } else {
        out.print(table, || render::capacity_json(c))
    }
}

async fn capacity(node: &mut Node, group: Option<String>, out: &Printer) -> Result<(), CliError> {
    let request = node.request(CapacityRequest {
        device_group: group.unwrap_or_default(),
    });
    let response = node.client.capacity(request).await?.into_inner();
    print_capacity(out, &response, false)
}

/// Prints each capacity update until Ctrl-C (success) or until the stream
/// fails or ends (an error: a watch is meant to last).
async fn watch(node: &mut Node, out: &Printer) -> Result<(), CliError> {
    // No per-call timeout: the stream lasts as long as we do.
    let mut stream = node
        .client
        .watch_capacity(Request::new(WatchCapacityRequest {}))
        .await?
        .into_inner();
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    loop {
        tokio::select! {
            _ = &mut interrupted => return Ok(()),
            message = stream.message() => match message? {
                Some(update) => print_capacity(out, &update, true)?,
                None => {
                    return Err(CliError::Connect(
                        "the node ended the capacity watch".to_string(),
                    ));
                }
            },
        }
    }
}

async fn disks(node: &mut Node, out: &Printer) -> Result<(), CliError> {
    let request = node.request(ListDisksRequest {});
    let response = node.client.list_disks(request).await?.into_inner();
    out.print(
        || render::disks_table(&response.disks).render(),
        || Disks {
            disks: response.disks.iter().map(render::disk_json).collect(),
        },
    )
}

async fn apply_config(
    node: &mut Node,
    file: &std::path::Path,
    out: &Printer,
) -> Result<(), CliError> {
    let config_json = if file.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin())
            .map_err(|e| CliError::Local(format!("read standard input: {e}")))?
    } else {
        std::fs::read_to_string(file)
            .map_err(|e| CliError::Local(format!("read {}: {e}", file.display())))?
    };
    let request = node.request(ApplyConfigRequest { config_json });
    let response = node.client.apply_config(request).await?.into_inner();
    out.print(
        || {
            format!(
                "configuration applied; device groups: {}\n",
                if response.device_groups.is_empty() {
                    "none".to_string()
                } else {
                    response.device_groups.join(", ")
                }
            )
        },
        || serde_json::json!({ "deviceGroups": response.device_groups }),
    )
}

fn cache_mode(mode: CacheModeArg) -> CacheMode {
    match mode {
        CacheModeArg::Writethrough => CacheMode::Writethrough,
        CacheModeArg::Writeback => CacheMode::Writeback,
        CacheModeArg::Writearound => CacheMode::Writearound,
        CacheModeArg::None => CacheMode::None,
    }
}

async fn bcache(node: &mut Node, cmd: BcacheCommand, out: &Printer) -> Result<(), CliError> {
    let device = match cmd {
        BcacheCommand::Create {
            name,
            backing,
            cache,
            mode,
            backing_group,
            size,
            cache_group,
            cache_ratio,
        } => {
            let request = node.request(CreateBcacheRequest {
                name,
                backing_volume: backing,
                cache_volume: cache,
                cache_mode: cache_mode(mode) as i32,
                backing_device_group: backing_group.unwrap_or_default(),
                size_bytes: size.unwrap_or_default(),
                cache_device_group: cache_group.unwrap_or_default(),
                cache_ratio_percent: cache_ratio.unwrap_or_default(),
            });
            node.client
                .create_bcache(request)
                .await?
                .into_inner()
                .device
        }
        BcacheCommand::Delete { name } => {
            let request = node.request(DeleteBcacheRequest { name: name.clone() });
            node.client.delete_bcache(request).await?;
            return out.print(
                || format!("bcache device {name} deleted\n"),
                || serde_json::json!({ "deleted": name }),
            );
        }
        BcacheCommand::Get { name } => {
            let request = node.request(GetBcacheRequest { name });
            node.client.get_bcache(request).await?.into_inner().device
        }
        BcacheCommand::SetMode { name, mode } => {
            let request = node.request(SetCacheModeRequest {
                name,
                cache_mode: cache_mode(mode) as i32,
            });
            node.client
                .set_cache_mode(request)
                .await?
                .into_inner()
                .device
        }
    };
    let device = device.ok_or_else(|| missing("device"))?;
    out.print(
        || render::bcache_table(&device).render(),
        || Device {
            device: render::bcache_json(&device),
        },
    )
}

async fn iolimits(node: &mut Node, cmd: IoLimitsCommand, out: &Printer) -> Result<(), CliError> {
    let limits = match cmd {
        IoLimitsCommand::List { pod } => {
            let request = node.request(ListPodIoLimitsRequest {
                pod_uid: pod.unwrap_or_default(),
            });
            node.client
                .list_pod_io_limits(request)
                .await?
                .into_inner()
                .limits
        }
        IoLimitsCommand::Set {
            pod,
            volume,
            read_bps,
            write_bps,
            read_iops,
            write_iops,
        } => {
            let request = node.request(SetPodIoLimitsRequest {
                pod_uid: pod,
                volume,
                limits: Some(IoLimits {
                    read_bps,
                    write_bps,
                    read_iops,
                    write_iops,
                }),
            });
            let limit = node.client.set_pod_io_limits(request).await?.into_inner();
            limit.limit.into_iter().collect()
        }
        IoLimitsCommand::Clear { pod, volume } => {
            let request = node.request(ClearPodIoLimitsRequest {
                pod_uid: pod.clone(),
                volume: volume.unwrap_or_default(),
            });
            let cleared = node
                .client
                .clear_pod_io_limits(request)
                .await?
                .into_inner()
                .cleared;
            return out.print(
                || format!("pod {pod}: limits removed on {cleared} volume(s)\n"),
                || serde_json::json!({ "podUid": pod, "cleared": cleared }),
            );
        }
    };
    out.print(
        || render::pod_limits_table(&limits).render(),
        || PodLimits {
            limits: limits.iter().map(render::pod_limit_json).collect(),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn connection(endpoint: &str) -> Connection {
        Connection {
            endpoint: endpoint.to_string(),
            ca: Some(PathBuf::from("/nonexistent/ca.pem")),
            cert: Some(PathBuf::from("/nonexistent/c.pem")),
            key: Some(PathBuf::from("/nonexistent/c-key.pem")),
            server_name: None,
            timeout: Duration::from_secs(1),
        }
    }

    #[test]
    fn server_name_defaults_to_the_endpoint_host() {
        for (endpoint, host) in [
            ("https://127.0.0.1:7443", "127.0.0.1"),
            ("https://node-a:7443/", "node-a"),
            ("node-b:7443", "node-b"),
            ("https://[::1]:7443", "::1"),
            ("[fe80::1]:1", "fe80::1"),
            ("node-c", "node-c"),
        ] {
            assert_eq!(endpoint_host(endpoint), host, "{endpoint}");
        }
    }

    #[test]
    fn missing_tls_flags_are_usage_errors() {
        let mut c = connection("https://127.0.0.1:7443");
        c.cert = None;
        let err = client_tls(&c).expect_err("no cert");
        assert_eq!(err.exit_code(), super::super::EXIT_USAGE);
        assert!(err.to_string().contains("--cert (or CARINA_CERT)"), "{err}");
        let err = client_tls(&connection("https://127.0.0.1:7443")).expect_err("no files");
        assert_eq!(err.exit_code(), super::super::EXIT_LOCAL);
        assert!(err.to_string().contains("/nonexistent/ca.pem"), "{err}");
    }

    #[tokio::test]
    async fn an_unreachable_node_is_unavailable() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        super::super::certs::init(d, "carina.storage.io", 1, false).expect("CA");
        super::super::certs::issue_client(d, d, "reader", None, 1).expect("client");
        // A port nobody listens on: bind one, then let it go.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .expect("bind")
            .local_addr()
            .expect("addr")
            .port();
        let c = Connection {
            endpoint: format!("127.0.0.1:{port}"),
            ca: Some(d.join("ca.pem")),
            cert: Some(d.join("reader.pem")),
            key: Some(d.join("reader-key.pem")),
            server_name: None,
            timeout: Duration::from_secs(5),
        };
        let err = match connect(&c).await {
            Ok(_) => panic!("nothing listens on {port}"),
            Err(e) => e,
        };
        assert_eq!(err.code(), Some(tonic::Code::Unavailable));
        let text = err.to_string();
        assert!(
            text.starts_with("UNAVAILABLE: connect to 127.0.0.1:"),
            "{text}"
        );
        assert!(text.to_lowercase().contains("refused"), "{text}");
    }
}
