//! The relay end to end over socket pairs, and the header-block rewriting
//! frame by frame: whole frames out, literals, authorities.

use super::*;
use crate::uds::relay;
use std::sync::LazyLock;
use tokio::net::UnixStream;

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
        let len = usize::from(bytes[0]) << 16 | usize::from(bytes[1]) << 8 | usize::from(bytes[2]);
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
