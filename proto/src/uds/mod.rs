//! gRPC over unix sockets for every client, not only those that send a
//! well-formed `:authority`.
//!
//! The HTTP/2 server under tonic refuses a request whose `:authority` is
//! not `host[:port]` (it resets the stream with PROTOCOL_ERROR). Over a
//! unix socket several gRPC clients send the socket's path there: the
//! kubelet's plugin-registration client (grpc-go with a bare path target),
//! grpc-java, gRPC C-core (Python, Ruby, C++) percent-encoded, csc. The
//! authority means nothing on a unix socket, so [`incoming`] puts each
//! accepted connection behind a small relay that rewrites the request
//! header blocks: an `:authority` that is not a valid authority becomes
//! `localhost` (what grpc-go and tonic's clients send); every other byte
//! passes unchanged, in both directions.
//!
//! The relay follows the client's HPACK state (RFC 7541) to read each
//! header block and writes it back as literals that never touch the
//! server's dynamic table, so both sides stay consistent. A block it
//! cannot decode ends the connection, as the server would have.
//!
//! This file accepts the connections and runs the relay; [`rewrite`]
//! rewrites the request header blocks.

mod rewrite;

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::Stream;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, DuplexStream, ReadBuf};
use tokio::net::{UnixListener, UnixStream};
use tonic::transport::server::Connected;

use rewrite::rewrite_requests;

/// Bytes buffered between the relay and the server.
const PIPE_BYTES: usize = 256 * 1024;

/// One accepted connection, as the gRPC server sees it.
#[derive(Debug)]
pub struct UdsConnection {
    pipe: DuplexStream,
}

impl Connected for UdsConnection {
    type ConnectInfo = ();

    fn connect_info(&self) -> Self::ConnectInfo {}
}

impl AsyncRead for UdsConnection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.pipe).poll_read(cx, buf)
    }
}

impl AsyncWrite for UdsConnection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.pipe).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.pipe).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.pipe).poll_shutdown(cx)
    }
}

/// The connections accepted on `listener`, each behind the relay, for
/// `serve_with_incoming`. Must be polled inside a tokio runtime.
pub fn incoming(listener: UnixListener) -> impl Stream<Item = io::Result<UdsConnection>> {
    futures::stream::unfold(listener, |listener| async move {
        let next = match listener.accept().await {
            Ok((client, _)) => Ok(relay(client)),
            Err(e) => Err(e),
        };
        Some((next, listener))
    })
}

/// Starts the relay for one client and returns the server's end.
fn relay(client: UnixStream) -> UdsConnection {
    let (server_end, relay_end) = tokio::io::duplex(PIPE_BYTES);
    let (client_read, mut client_write) = client.into_split();
    let (mut relay_read, relay_write) = tokio::io::split(relay_end);
    tokio::spawn(async move {
        let requests = async {
            let mut relay_write = relay_write;
            let result = rewrite_requests(client_read, &mut relay_write).await;
            if let Err(e) = &result {
                tracing::debug!(error = %e, "unix socket client closed or sent what HTTP/2 refuses");
            }
            // The server sees the requests end however they ended: a
            // connection left half open (a client gone before its
            // preface, a probe) would hold a graceful shutdown for its
            // whole grace period.
            let _ = relay_write.shutdown().await;
        };
        let responses = async {
            let _ = tokio::io::copy(&mut relay_read, &mut client_write).await;
            let _ = client_write.shutdown().await;
        };
        tokio::join!(requests, responses);
    });
    UdsConnection { pipe: server_end }
}
