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

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::Stream;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream, ReadBuf};
use tokio::net::{UnixListener, UnixStream};
use tonic::transport::server::Connected;

/// What an invalid authority is replaced with.
const LOCAL_AUTHORITY: &[u8] = b"localhost";

/// The HTTP/2 client connection preface.
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Frame types and flags the relay looks at (RFC 9113, section 6).
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

/// The largest frame payload the relay writes: the protocol's default
/// SETTINGS_MAX_FRAME_SIZE, which every server accepts.
const MAX_WRITE_FRAME: usize = 16_384;

/// The largest frame it reads: the protocol's maximum.
const MAX_READ_FRAME: usize = (1 << 24) - 1;

/// The largest header block it assembles from CONTINUATION frames.
const MAX_HEADER_BLOCK: usize = 1 << 20;

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

/// Copies the client's bytes to the server, rewriting header blocks.
async fn rewrite_requests<R, W>(mut from: R, mut to: W) -> io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut preface = [0u8; 24];
    from.read_exact(&mut preface).await?;
    to.write_all(&preface).await?;
    if &preface != PREFACE {
        // Not HTTP/2 with prior knowledge: pass it on for the server to
        // refuse.
        tokio::io::copy(&mut from, &mut to).await?;
        return Ok(());
    }
    let mut decoder = fluke_hpack::Decoder::new();
    // A HEADERS frame whose block continues in CONTINUATION frames.
    let mut pending: Option<PendingBlock> = None;
    loop {
        let mut header = [0u8; 9];
        match from.read_exact(&mut header).await {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => break,
            Err(e) => return Err(e),
        }
        let length =
            usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
        if length > MAX_READ_FRAME {
            return Err(invalid("frame too large"));
        }
        let kind = header[3];
        let flags = header[4];
        let stream = u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & 0x7fff_ffff;
        let mut payload = vec![0u8; length];
        from.read_exact(&mut payload).await?;

        match (kind, pending.as_mut()) {
            (HEADERS, None) => {
                let block = HeadersFrame::parse(flags, &payload)?;
                let started = PendingBlock {
                    stream,
                    flags,
                    priority: block.priority,
                    fragment: block.fragment.to_vec(),
                };
                if flags & END_HEADERS != 0 {
                    write_block(&mut to, &mut decoder, &started).await?;
                } else {
                    started.check_size()?;
                    pending = Some(started);
                }
            }
            (CONTINUATION, Some(block)) if block.stream == stream => {
                block.fragment.extend_from_slice(&payload);
                block.check_size()?;
                if flags & END_HEADERS != 0 {
                    let done = pending.take().expect("pending block");
                    write_block(&mut to, &mut decoder, &done).await?;
                }
            }
            // Anything between a HEADERS frame and its last CONTINUATION
            // is a connection error; let the server see it.
            (_, Some(_)) => return Err(invalid("frame interleaved with a header block")),
            _ => {
                to.write_all(&header).await?;
                to.write_all(&payload).await?;
            }
        }
        to.flush().await?;
    }
    let _ = to.shutdown().await;
    Ok(())
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

/// A HEADERS frame's parts (RFC 9113, section 6.2).
struct HeadersFrame<'a> {
    priority: Option<[u8; 5]>,
    fragment: &'a [u8],
}

impl<'a> HeadersFrame<'a> {
    fn parse(flags: u8, payload: &'a [u8]) -> io::Result<HeadersFrame<'a>> {
        let mut rest = payload;
        let mut pad = 0;
        if flags & PADDED != 0 {
            let (&len, tail) = rest
                .split_first()
                .ok_or_else(|| invalid("HEADERS without padding length"))?;
            pad = usize::from(len);
            rest = tail;
        }
        let mut priority = None;
        if flags & PRIORITY != 0 {
            if rest.len() < 5 {
                return Err(invalid("HEADERS priority truncated"));
            }
            let mut p = [0u8; 5];
            p.copy_from_slice(&rest[..5]);
            priority = Some(p);
            rest = &rest[5..];
        }
        if pad > rest.len() {
            return Err(invalid("HEADERS padding longer than the frame"));
        }
        Ok(HeadersFrame {
            priority,
            fragment: &rest[..rest.len() - pad],
        })
    }
}

/// A header block being assembled.
struct PendingBlock {
    stream: u32,
    flags: u8,
    priority: Option<[u8; 5]>,
    fragment: Vec<u8>,
}

impl PendingBlock {
    fn check_size(&self) -> io::Result<()> {
        if self.fragment.len() > MAX_HEADER_BLOCK {
            return Err(invalid("header block too large"));
        }
        Ok(())
    }
}

/// Decodes a complete header block, fixes its authority, and writes it as
/// one HEADERS frame (plus CONTINUATION frames if it is long).
async fn write_block<W: AsyncWrite + Unpin>(
    to: &mut W,
    decoder: &mut fluke_hpack::Decoder<'_>,
    block: &PendingBlock,
) -> io::Result<()> {
    let mut fields: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    decoder
        .decode_with_cb(&block.fragment, |name, value| {
            fields.push((name.into_owned(), value.into_owned()))
        })
        .map_err(|e| invalid(&format!("HPACK: {e:?}")))?;
    let encoded = encode_literals(
        fields
            .iter()
            .map(|(n, v)| (n.as_slice(), fixed_value(n, v))),
    );

    let mut first = Vec::with_capacity(encoded.len().min(MAX_WRITE_FRAME) + 5);
    let mut flags = block.flags & (END_STREAM | PRIORITY);
    if let Some(p) = block.priority {
        first.extend_from_slice(&p);
    }
    let room = MAX_WRITE_FRAME - first.len();
    let (head, mut tail) = encoded.split_at(encoded.len().min(room));
    first.extend_from_slice(head);
    if tail.is_empty() {
        flags |= END_HEADERS;
    }
    write_frame(to, HEADERS, flags, block.stream, &first).await?;
    while !tail.is_empty() {
        let (chunk, rest) = tail.split_at(tail.len().min(MAX_WRITE_FRAME));
        let flags = if rest.is_empty() { END_HEADERS } else { 0 };
        write_frame(to, CONTINUATION, flags, block.stream, chunk).await?;
        tail = rest;
    }
    Ok(())
}

/// The value to send for header `name`: a valid authority for an invalid
/// `:authority`, the value itself otherwise.
fn fixed_value<'a>(name: &[u8], value: &'a [u8]) -> &'a [u8] {
    if name == b":authority" && http::uri::Authority::try_from(value).is_err() {
        LOCAL_AUTHORITY
    } else {
        value
    }
}

/// Header fields as HPACK literals without indexing, with literal names and
/// no Huffman coding (RFC 7541, section 6.2.2): nothing enters the
/// decoder's dynamic table.
fn encode_literals<'a>(fields: impl Iterator<Item = (&'a [u8], &'a [u8])>) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in fields {
        out.push(0x00);
        for s in [name, value] {
            // A 7-bit-prefix length with the Huffman bit clear.
            out.extend(fluke_hpack::encoder::encode_integer(s.len(), 7));
            out.extend_from_slice(s);
        }
    }
    out
}

async fn write_frame<W: AsyncWrite + Unpin>(
    to: &mut W,
    kind: u8,
    flags: u8,
    stream: u32,
    payload: &[u8],
) -> io::Result<()> {
    let len = payload.len();
    let mut header = [0u8; 9];
    header[0] = (len >> 16) as u8;
    header[1] = (len >> 8) as u8;
    header[2] = len as u8;
    header[3] = kind;
    header[4] = flags;
    header[5..9].copy_from_slice(&stream.to_be_bytes());
    to.write_all(&header).await?;
    to.write_all(payload).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::LazyLock;

    use carina_sys::testkit::mutated_bytes;
    use proptest::prelude::*;

    /// A client that goes away before (or in the middle of) its preface
    /// ends the server's side of the relay: the server reads the end and
    /// closes the connection, so it holds no graceful shutdown.
    #[tokio::test]
    async fn a_client_gone_early_ends_the_servers_side() {
        for sent in [&b""[..], &PREFACE[..10]] {
            let (mut client, server) = UnixStream::pair().expect("pair");
            let mut conn = relay(server);
            client.write_all(sent).await.expect("write");
            drop(client);
            let mut seen = Vec::new();
            tokio::time::timeout(
                std::time::Duration::from_secs(10),
                conn.read_to_end(&mut seen),
            )
            .await
            .expect("the server's side ends instead of waiting forever")
            .expect("read");
            assert!(seen.is_empty(), "{seen:?}");
        }
    }

    /// One frame as a client writes it.
    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut f = vec![
            (payload.len() >> 16) as u8,
            (payload.len() >> 8) as u8,
            payload.len() as u8,
            kind,
            flags,
        ];
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    /// A client's connection: preface, a header block over HEADERS and
    /// CONTINUATION, a PING.
    static CONNECTION: LazyLock<Vec<u8>> = LazyLock::new(|| {
        let block = fluke_hpack::Encoder::new().encode(vec![
            (&b":method"[..], &b"POST"[..]),
            (b":authority", b"/tmp/x.sock"),
            (b":path", b"/svc/M"),
        ]);
        let (a, b) = block.split_at(block.len() / 2);
        let mut input = PREFACE.to_vec();
        input.extend(frame(
            HEADERS,
            PADDED,
            1,
            &[[2].as_slice(), a, &[0, 0]].concat(),
        ));
        input.extend(frame(CONTINUATION, END_HEADERS, 1, b));
        input.extend(frame(0x6, 0, 0, &[0; 8]));
        input
    });

    /// Relays `input` as the server would receive it.
    fn relayed(input: &[u8]) -> (io::Result<()>, Vec<u8>) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime");
        let mut out = Vec::new();
        let result = runtime.block_on(rewrite_requests(input, &mut out));
        (result, out)
    }

    /// Whether `bytes` is a whole number of frames.
    fn whole_frames(mut bytes: &[u8]) -> bool {
        while !bytes.is_empty() {
            if bytes.len() < 9 {
                return false;
            }
            let len =
                usize::from(bytes[0]) << 16 | usize::from(bytes[1]) << 8 | usize::from(bytes[2]);
            let Some(rest) = bytes.get(9 + len..) else {
                return false;
            };
            bytes = rest;
        }
        true
    }

    proptest! {
        /// A HEADERS payload of any flags and bytes is split as RFC 9113
        /// section 6.2 says, or refused when it is too short for what its
        /// flags announce.
        #[test]
        fn headers_frames_of_any_bytes(
            flags in any::<u8>(),
            payload in prop::collection::vec(any::<u8>(), 0..40),
        ) {
            let pad_byte = usize::from(flags & PADDED != 0);
            let prio = if flags & PRIORITY != 0 { 5 } else { 0 };
            let pad = if pad_byte == 1 { payload.first().map(|&p| usize::from(p)) } else { Some(0) };
            let expected = pad
                .filter(|pad| pad_byte + prio + pad <= payload.len())
                .map(|pad| &payload[pad_byte + prio..payload.len() - pad]);
            match HeadersFrame::parse(flags, &payload) {
                Ok(f) => {
                    prop_assert_eq!(Some(f.fragment), expected);
                    prop_assert_eq!(f.priority.is_some(), prio == 5);
                }
                Err(_) => prop_assert_eq!(expected, None),
            }
        }

        /// Whatever `:authority` a client sends, the server gets a valid
        /// one, the client's own when it is valid; other headers pass.
        #[test]
        fn any_authority_becomes_a_valid_one(value in prop::collection::vec(any::<u8>(), 0..40)) {
            let fixed = fixed_value(b":authority", &value);
            prop_assert!(http::uri::Authority::try_from(fixed).is_ok(), "{:?}", fixed);
            if http::uri::Authority::try_from(&value[..]).is_ok() {
                prop_assert_eq!(fixed, &value[..]);
            }
            prop_assert_eq!(fixed_value(b":path", &value), &value[..]);
        }

        /// Frames other than HEADERS and CONTINUATION pass byte for byte.
        #[test]
        fn other_frames_pass_unchanged(
            frames in prop::collection::vec(
                (any::<u8>().prop_filter("not a header frame", |k| *k != HEADERS && *k != CONTINUATION),
                 any::<u8>(), any::<u32>(), prop::collection::vec(any::<u8>(), 0..40)),
                0..6,
            ),
        ) {
            let mut input = PREFACE.to_vec();
            for (kind, flags, stream, payload) in &frames {
                input.extend(frame(*kind, *flags, *stream, payload));
            }
            let (result, out) = relayed(&input);
            prop_assert!(result.is_ok(), "{:?}", result);
            prop_assert_eq!(out, input);
        }

        /// A damaged connection, or any bytes after the preface, is relayed
        /// or ends the connection, never a panic; what reaches the server
        /// after the preface is whole frames.
        #[test]
        fn relay_takes_damaged_connections(
            input in prop_oneof![
                mutated_bytes(&CONNECTION),
                prop::collection::vec(any::<u8>(), 0..200)
                    .prop_map(|b| [PREFACE.as_slice(), &b].concat()),
            ],
        ) {
            let (_, out) = relayed(&input);
            if input.starts_with(PREFACE) {
                prop_assert!(out.starts_with(PREFACE));
                prop_assert!(whole_frames(&out[PREFACE.len()..]), "{:?}", out);
            }
        }
    }

    fn decode(block: &[u8]) -> Vec<(String, String)> {
        let mut d = fluke_hpack::Decoder::new();
        let mut out = Vec::new();
        d.decode_with_cb(block, |n, v| {
            out.push((
                String::from_utf8_lossy(&n).into_owned(),
                String::from_utf8_lossy(&v).into_owned(),
            ))
        })
        .expect("decodes");
        out
    }

    #[test]
    fn literals_round_trip_and_authority_is_fixed() {
        let fields: Vec<(&[u8], &[u8])> = vec![
            (b":method", b"POST"),
            (
                b":authority",
                b"/var/lib/kubelet/plugins_registry/x-reg.sock",
            ),
            (b":path", b"/pluginregistration.Registration/GetInfo"),
            (b"content-type", b"application/grpc"),
        ];
        let block = encode_literals(fields.iter().map(|(n, v)| (*n, fixed_value(n, v))));
        let got = decode(&block);
        assert_eq!(got[1], (":authority".into(), "localhost".into()));
        assert_eq!(got[2].1, "/pluginregistration.Registration/GetInfo");
        assert_eq!(got.len(), 4);
    }

    #[test]
    fn valid_and_percent_encoded_authorities() {
        assert_eq!(fixed_value(b":authority", b"localhost"), b"localhost");
        assert_eq!(
            fixed_value(b":authority", b"127.0.0.1:7443"),
            b"127.0.0.1:7443"
        );
        assert_eq!(
            fixed_value(b":authority", b"%2Frun%2Fcsi.sock"),
            b"localhost"
        );
        assert_eq!(fixed_value(b":authority", b"tmp/csi.sock"), b"localhost");
        assert_eq!(fixed_value(b":path", b"/a/b"), b"/a/b");
    }

    #[test]
    fn headers_frame_parts() {
        // PADDED | PRIORITY: pad length 2, 5 priority bytes, block, padding.
        let payload = [2, 0, 0, 0, 3, 16, 0xAA, 0xBB, 0, 0];
        let f = HeadersFrame::parse(PADDED | PRIORITY, &payload).expect("parses");
        assert_eq!(f.priority, Some([0, 0, 0, 3, 16]));
        assert_eq!(f.fragment, &[0xAA, 0xBB]);
        assert!(HeadersFrame::parse(PADDED, &[9, 1]).is_err());
    }

    #[tokio::test]
    async fn a_path_authority_reaches_the_server_as_localhost() {
        // A client's HEADERS frame split over a CONTINUATION frame, with a
        // Huffman-free literal block and a PING after it.
        let mut enc = fluke_hpack::Encoder::new();
        let block = enc.encode(vec![
            (&b":method"[..], &b"POST"[..]),
            (b":scheme", b"http"),
            (b":authority", b"/tmp/x.sock"),
            (b":path", b"/svc/M"),
        ]);
        let (a, b) = block.split_at(block.len() / 2);
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, 0, 1, a));
        input.extend(frame(CONTINUATION, END_HEADERS, 1, b));
        input.extend(frame(0x6, 0, 0, &[0; 8]));
        let mut out = Vec::new();
        rewrite_requests(&input[..], &mut out)
            .await
            .expect("relays");

        assert_eq!(&out[..24], PREFACE);
        let rest = &out[24..];
        let len = usize::from(rest[0]) << 16 | usize::from(rest[1]) << 8 | usize::from(rest[2]);
        assert_eq!(rest[3], HEADERS);
        assert_eq!(rest[4], END_HEADERS);
        let fields = decode(&rest[9..9 + len]);
        assert!(
            fields.contains(&(":authority".into(), "localhost".into())),
            "{fields:?}"
        );
        assert!(
            fields.contains(&(":path".into(), "/svc/M".into())),
            "{fields:?}"
        );
        // The PING passes unchanged.
        assert_eq!(&rest[9 + len..], &frame(0x6, 0, 0, &[0; 8])[..]);
    }
}
