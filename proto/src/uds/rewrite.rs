//! The request side of the relay: the client's HTTP/2 frames copied to the
//! server, each header block read with the client's HPACK state and
//! written back as literals, an invalid `:authority` made `localhost`.

#[cfg(test)]
mod tests;

use std::io;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

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

/// Copies the client's bytes to the server, rewriting header blocks.
pub(super) async fn rewrite_requests<R, W>(mut from: R, mut to: W) -> io::Result<()>
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
