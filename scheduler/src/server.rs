//! The HTTP side: HTTP/1.1 with keep-alive (kube-scheduler reuses its
//! connections), JSON bodies.
//!
//! | request | answer |
//! | --- | --- |
//! | `POST …/filter` | `ExtenderFilterResult` |
//! | `POST …/prioritize` | `HostPriorityList` |
//! | `GET /healthz` | `ok` while the process serves |
//! | `GET /readyz` | `ok` once every cache has listed, else 503 |
//! | `GET /metrics` | the Prometheus metrics ([`crate::metrics`]) |
//!
//! The verbs match on the last path segment, so any `urlPrefix` path
//! works (`http://host:8099` or `http://host:8099/carina`) with
//! `filterVerb: filter` and `prioritizeVerb: prioritize`. A body that
//! does not parse is 400 with the reason; kube-scheduler reports a
//! non-200 answer as the extender's error.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::handler::Extender;
use crate::objects::Objects;

/// Largest request body accepted: `ExtenderArgs` with thousands of full
/// Node objects (when `nodeCacheCapable` is off) stays far below it.
pub const MAX_BODY_BYTES: usize = 256 << 20;

/// Serves `extender` on `listener` until `shutdown` completes; open
/// connections finish their current request. A failed accept (out of
/// file descriptors, a connection reset before it was taken) is logged
/// and retried after a short pause.
pub async fn serve<O>(
    listener: TcpListener,
    extender: Arc<Extender<O>>,
    shutdown: impl Future<Output = ()>,
) where
    O: Objects + ?Sized + 'static,
{
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed; retrying");
                    tokio::time::sleep(ACCEPT_PAUSE).await;
                    continue;
                }
            },
            () = &mut shutdown => return,
        };
        let _ = stream.set_nodelay(true);
        let extender = extender.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let extender = extender.clone();
                async move { Ok::<_, Infallible>(handle(&extender, req).await) }
            });
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
}

/// Pause after a failed accept.
const ACCEPT_PAUSE: std::time::Duration = std::time::Duration::from_millis(50);

async fn handle<O>(extender: &Extender<O>, req: Request<Incoming>) -> Response<Full<Bytes>>
where
    O: Objects + ?Sized,
{
    let started = std::time::Instant::now();
    let (parts, body) = req.into_parts();
    let verb = parts.uri.path().rsplit('/').next().unwrap_or_default();
    let answer = match Limited::new(body, MAX_BODY_BYTES).collect().await {
        Ok(b) => respond(extender, &parts.method, parts.uri.path(), &b.to_bytes()).await,
        Err(e) => text(
            StatusCode::BAD_REQUEST,
            format!("cannot read the request body: {e}"),
        ),
    };
    if verb != "metrics" {
        extender.metrics().observe(
            verb,
            answer.status().as_u16(),
            started.elapsed().as_secs_f64(),
        );
    }
    answer
}

/// The answer to one request, given its method, path and whole body.
pub async fn respond<O>(
    extender: &Extender<O>,
    method: &Method,
    path: &str,
    body: &[u8],
) -> Response<Full<Bytes>>
where
    O: Objects + ?Sized,
{
    let verb = path.rsplit('/').next().unwrap_or_default();
    match (method, verb) {
        (&Method::POST, "filter") => json(extender.filter(body).await),
        (&Method::POST, "prioritize") => json(extender.prioritize(body).await),
        (&Method::GET, "healthz") => text(StatusCode::OK, "ok".into()),
        (&Method::GET, "metrics") => response(
            StatusCode::OK,
            crate::metrics::CONTENT_TYPE,
            extender.metrics().encode().into(),
        ),
        (&Method::GET, "readyz") if extender.ready() => text(StatusCode::OK, "ok".into()),
        (&Method::GET, "readyz") => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "caches not synced yet".into(),
        ),
        (_, "filter" | "prioritize" | "healthz" | "readyz" | "metrics") => text(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("{method} not allowed"),
        ),
        _ => text(StatusCode::NOT_FOUND, format!("no such path {path:?}")),
    }
}

fn json<E: std::fmt::Display>(answer: Result<Vec<u8>, E>) -> Response<Full<Bytes>> {
    match answer {
        Ok(body) => response(StatusCode::OK, "application/json", body.into()),
        Err(e) => text(StatusCode::BAD_REQUEST, e.to_string()),
    }
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    response(status, "text/plain; charset=utf-8", body.into())
}

fn response(status: StatusCode, content_type: &'static str, body: Bytes) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::MemoryObjects;
    use carina_csi::strategy::Strategy;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn request(addr: std::net::SocketAddr, raw: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr)
            .await
            .expect("connects");
        s.write_all(raw.as_bytes()).await.expect("writes");
        let mut out = String::new();
        s.read_to_string(&mut out).await.expect("reads");
        out
    }

    #[tokio::test]
    async fn serves_the_verbs_and_probes_over_http() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("binds");
        let addr = listener.local_addr().expect("addr");
        let extender = Arc::new(Extender::new(
            Arc::new(MemoryObjects::new()),
            Strategy::Binpack,
            Duration::from_millis(10),
        ));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, extender, async {
            let _ = stopped.await;
        }));
        let ok = request(
            addr,
            "GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert!(ok.starts_with("HTTP/1.1 200") && ok.ends_with("ok"), "{ok}");
        let body = r#"{"Pod":{"metadata":{"name":"p"}},"NodeNames":["n1","n2"]}"#;
        let filtered = request(
            addr,
            &format!(
                "POST /carina/filter HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            ),
        )
        .await;
        assert!(
            filtered.contains(r#""NodeNames":["n1","n2"]"#),
            "{filtered}"
        );
        let bad = request(
            addr,
            "POST /prioritize HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 1\r\n\r\n{",
        )
        .await;
        assert!(bad.starts_with("HTTP/1.1 400"), "{bad}");
        let missing = request(
            addr,
            "GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert!(missing.starts_with("HTTP/1.1 404"), "{missing}");
        // Every answer above is in /metrics, by verb and code.
        let metrics = request(
            addr,
            "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
        let body = metrics.split("\r\n\r\n").nth(1).expect("a body");
        let scrape = prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string())))
            .expect("parses");
        let count = |verb: &str, code: &str| {
            scrape
                .samples
                .iter()
                .find(|s| {
                    s.metric == "carina_extender_request_duration_seconds_count"
                        && s.labels.get("verb") == Some(verb)
                        && s.labels.get("code") == Some(code)
                })
                .map(|s| format!("{:?}", s.value))
        };
        for (verb, code) in [
            ("filter", "200"),
            ("prioritize", "400"),
            ("other", "404"),
            ("other", "200"),
        ] {
            assert!(count(verb, code).is_some(), "{verb} {code}: {body}");
        }
        let _ = stop.send(());
        server.await.expect("joins");
    }
}
