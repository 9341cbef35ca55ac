//! The Kubernetes client every Carina component builds: kube's client for
//! a [`Config`] (kubeconfig or in-cluster service account, its TLS
//! settings, credentials, impersonation headers and retries), over TCP
//! connections with Nagle's algorithm off.
//!
//! kube's stock client leaves Nagle's algorithm on. A request goes out as
//! more than one small TLS record (headers, then the body), and the second
//! one waits until the API server acknowledges the first, which a delayed
//! ACK holds back for up to 40 ms: a `PATCH` of a status took 50 ms on
//! loopback instead of 2. [`connector`] is the one place the connection is
//! made; [`client`] puts kube's middleware on it in kube's order (base URI,
//! retries on 429/503/504, authorization, extra headers, a debug `HTTP` span
//! per request named after the verb).
//!
//! A configuration with a proxy (`proxy-url`) gets kube's stock client,
//! which handles or refuses the proxy as kube is built.

use std::path::{Path, PathBuf};

use hyper_timeout::TimeoutConnector;
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kube::client::retry::RetryPolicy;
use kube::client::{Body, ConfigExt};
use kube::config::{InferConfigError, KubeConfigOptions, KubeconfigError};
use kube::{Client, Config};
use tower::retry::RetryLayer;
use tower::{BoxError, ServiceBuilder};
use tower_http::trace::TraceLayer;

/// The connector under every client: TCP with `TCP_NODELAY`, then TLS
/// (rustls) as `config` says (server CA, client certificate, server name).
/// `http://` URLs stay plain.
pub type Connector = hyper_rustls::HttpsConnector<HttpConnector>;

/// Why no client could be made.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The kubeconfig file could not be read or used.
    #[error("kubeconfig {}: {source}", path.display())]
    Kubeconfig {
        path: PathBuf,
        #[source]
        source: KubeconfigError,
    },
    /// No kubeconfig was named, and none was found (`KUBECONFIG`,
    /// `~/.kube/config`, the in-cluster service account).
    #[error("no kubeconfig given, and none inferred (KUBECONFIG, ~/.kube/config, in-cluster): {0}")]
    Infer(#[source] InferConfigError),
    /// The configuration's TLS or credential settings are unusable.
    #[error("a Kubernetes client from the configuration: {0}")]
    Build(#[source] kube::Error),
}

/// The configuration from `kubeconfig` (its current context), or, without
/// one, inferred as kube does: `KUBECONFIG`, `~/.kube/config`, then the
/// in-cluster service account.
pub async fn config(kubeconfig: Option<&Path>) -> Result<Config, ClientError> {
    let Some(path) = kubeconfig else {
        return Config::infer().await.map_err(ClientError::Infer);
    };
    let failed = |source| ClientError::Kubeconfig {
        path: path.to_path_buf(),
        source,
    };
    let file = kube::config::Kubeconfig::read_from(path).map_err(failed)?;
    Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
        .await
        .map_err(failed)
}

/// A client from `kubeconfig`, or the inferred configuration without one
/// (see [`config`]).
pub async fn connect(kubeconfig: Option<&Path>) -> Result<Client, ClientError> {
    client(config(kubeconfig).await?)
}

/// The connector for `config`'s cluster: TCP with `TCP_NODELAY` and the
/// configuration's TLS.
pub fn connector(config: &Config) -> Result<Connector, ClientError> {
    let mut tcp = HttpConnector::new();
    tcp.set_nodelay(true);
    // The URL's scheme decides between TLS and plain HTTP, not this layer.
    tcp.enforce_http(false);
    config
        .rustls_https_connector_with_connector(tcp)
        .map_err(ClientError::Build)
}

/// A client for `config` over [`connector`], with kube's middleware.
pub fn client(config: Config) -> Result<Client, ClientError> {
    if config.proxy_url.is_some() {
        return Client::try_from(config).map_err(ClientError::Build);
    }
    let mut connection = TimeoutConnector::new(connector(&config)?);
    connection.set_connect_timeout(config.connect_timeout);
    connection.set_read_timeout(config.read_timeout);
    connection.set_write_timeout(config.write_timeout);
    connection.set_reset_reader_on_write(config.reset_reader_on_write);
    let http: HttpClient<_, Body> = HttpClient::builder(TokioExecutor::new()).build(connection);
    let trace = TraceLayer::new_for_http().make_span_with(|req: &http::Request<Body>| {
        // kube names each request by its verb in the extensions.
        let verb = req.extensions().get::<&'static str>().copied();
        tracing::debug_span!(
            "HTTP",
            http.request.method = %req.method(),
            url.full = %req.uri(),
            otel.name = verb.unwrap_or("HTTP"),
            otel.kind = "client",
        )
    });
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(
            config
                .default_retry
                .then(|| RetryLayer::new(RetryPolicy::server_retry())),
        )
        .option_layer(config.auth_layer().map_err(ClientError::Build)?)
        .layer(config.extra_headers_layer().map_err(ClientError::Build)?)
        .layer(trace)
        .map_err(BoxError::from)
        .service(http);
    Ok(Client::new(service, config.default_namespace))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;

    use http_body_util::Full;
    use hyper::body::Incoming;
    use hyper::server::conn::http1;
    use hyper::service::service_fn;
    use hyper_util::rt::TokioIo;
    use tokio::net::TcpListener;
    use tower::{Service, ServiceExt};

    fn local_config(port: u16) -> Config {
        let url = format!("http://127.0.0.1:{port}");
        Config::new(url.parse().expect("a URL"))
    }

    #[tokio::test]
    async fn connections_have_nodelay() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("address").port();
        let accept = tokio::spawn(async move { listener.accept().await });
        let mut connector = connector(&local_config(port)).expect("connector");
        let uri = format!("http://127.0.0.1:{port}").parse().expect("a URI");
        let stream = connector
            .ready()
            .await
            .expect("ready")
            .call(uri)
            .await
            .expect("connected");
        let hyper_rustls::MaybeHttpsStream::Http(tcp) = stream else {
            panic!("an http:// URL got TLS");
        };
        assert!(tcp.inner().nodelay().expect("TCP_NODELAY readable"));
        accept.await.expect("accept task").expect("accepted");
    }

    /// The client sends kube's requests through the configuration's
    /// middleware: the base URL, the bearer token, extra headers.
    #[tokio::test]
    async fn requests_carry_the_configured_credentials() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("address").port();
        let server = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.expect("accept");
            let answer = service_fn(|req: http::Request<Incoming>| async move {
                let auth = req
                    .headers()
                    .get(http::header::AUTHORIZATION)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("none")
                    .to_string();
                let body = format!("{} {auth}", req.uri().path());
                Ok::<_, Infallible>(http::Response::new(Full::new(bytes::Bytes::from(body))))
            });
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), answer)
                .await;
        });
        let mut config = local_config(port);
        config.auth_info.token = Some("secret-token".to_string().into());
        let client = client(config).expect("client");
        let readyz = http::Request::get("/readyz")
            .body(Vec::new())
            .expect("request");
        let text = client.request_text(readyz).await.expect("answer");
        assert_eq!(text, "/readyz Bearer secret-token");
        drop(client);
        server.abort();
    }
}
