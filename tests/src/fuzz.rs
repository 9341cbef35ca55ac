//! What the fuzz tests share: a small seeded generator, so a failure names
//! the seed and case that reproduce it, byte-level mutation of valid
//! messages, raw gRPC calls (bodies sent as they are), the rule every
//! refusal must keep, and the per-RPC counts the tests print.

use std::collections::BTreeMap;

use bytes::{Buf, BufMut};
use http::uri::PathAndQuery;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::Channel;
use tonic::{Code, Request, Status};

/// xorshift64*: small, seeded, enough to spread inputs.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed` (any value; zero is avoided).
    pub fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number below `n` (0 for `n` of 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    /// Up to `max` random bytes.
    pub fn bytes(&mut self, max: usize) -> Vec<u8> {
        let n = self.below(max + 1);
        (0..n).map(|_| self.next_u64() as u8).collect()
    }

    /// `bytes` with one to eight bytes replaced, inserted or removed.
    pub fn mutate(&mut self, mut bytes: Vec<u8>) -> Vec<u8> {
        for _ in 0..=self.below(8) {
            let at = self.below(bytes.len() + 1);
            match self.below(3) {
                0 if at < bytes.len() => bytes[at] = self.next_u64() as u8,
                1 => bytes.insert(at, self.next_u64() as u8),
                _ if at < bytes.len() => {
                    bytes.remove(at);
                }
                _ => {}
            }
        }
        bytes
    }
}

/// The seed and the number of cases of a fuzz test: `CARINA_FUZZ_SEED`
/// and `CARINA_FUZZ_CASES`, else the defaults given.
pub fn settings(default_seed: u64, default_cases: usize) -> (u64, usize) {
    let env = |name: &str| std::env::var(name).ok();
    (
        env("CARINA_FUZZ_SEED")
            .and_then(|v| v.parse().ok())
            .unwrap_or(default_seed),
        env("CARINA_FUZZ_CASES")
            .and_then(|v| v.parse().ok())
            .unwrap_or(default_cases),
    )
}

/// Up to `max` pieces of names, paths and odd characters.
pub fn text(rng: &mut Rng, max: usize) -> String {
    const PIECES: &[&str] = &[
        "a",
        "Z",
        "-",
        ".",
        "/",
        "..",
        " ",
        "\0",
        "\u{e9}",
        "\u{1F4BE}",
        "%",
        "\\",
        "\"",
        "{",
        "}",
        "0",
        "9",
        "pvc-",
        "carina",
        ":",
        "\n",
    ];
    let n = rng.below(max + 1);
    (0..n).map(|_| *rng.pick(PIECES)).collect()
}

/// Sends and receives gRPC message bodies as they are, so a test can send
/// bytes that are no message at all.
#[derive(Debug, Clone, Copy, Default)]
pub struct RawCodec;

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCodec;
    type Decoder = RawCodec;
    fn encoder(&mut self) -> RawCodec {
        RawCodec
    }
    fn decoder(&mut self) -> RawCodec {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = Status;
    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
        let mut out = vec![0u8; src.remaining()];
        src.copy_to_slice(&mut out);
        Ok(Some(out))
    }
}

/// A gRPC client that sends bodies through [`RawCodec`].
pub type RawClient = tonic::client::Grpc<Channel>;

/// One unary call of `path` (`/package.Service/Method`) with `body` sent
/// as it is: the answer's body, or the refusal.
pub async fn unary(
    raw: &mut RawClient,
    path: &PathAndQuery,
    body: &[u8],
) -> Result<Vec<u8>, Status> {
    raw.ready()
        .await
        .map_err(|e| Status::from_error(e.into()))?;
    raw.unary(Request::new(body.to_vec()), path.clone(), RawCodec)
        .await
        .map(tonic::Response::into_inner)
}

/// What is wrong with a refusal, if anything: no answer came (the status
/// was made on the client's side: a dropped connection, a reset stream),
/// the server answered `UNKNOWN`, or `INTERNAL` for a body that `decodes`
/// as the request (INTERNAL is for bytes that are no request at all).
pub fn refusal_fault(status: &Status, decodes: bool) -> Option<&'static str> {
    if std::error::Error::source(status).is_some() {
        return Some("no answer (a status made by the client: the call failed on the way)");
    }
    match status.code() {
        Code::Unknown => Some("UNKNOWN"),
        Code::Internal if decodes => Some("INTERNAL for a message that decodes"),
        _ => None,
    }
}

/// The outcome counts of one RPC: calls, accepted, refusals by code.
#[derive(Debug, Clone, Default)]
pub struct Tally {
    pub calls: usize,
    pub accepted: usize,
    pub refused: BTreeMap<&'static str, usize>,
}

impl Tally {
    pub fn accept(&mut self) {
        self.calls += 1;
        self.accepted += 1;
    }

    pub fn refuse(&mut self, code: Code) {
        self.calls += 1;
        *self
            .refused
            .entry(carina_proto::code_name(code))
            .or_default() += 1;
    }

    /// Refusals in all.
    pub fn refusals(&self) -> usize {
        self.refused.values().sum()
    }
}

/// The tallies as a Markdown table (RPC, calls, accepted, refusals by
/// code), for the docs.
pub fn table(tallies: &[(&str, Tally)]) -> String {
    let mut out =
        String::from("| RPC | calls | accepted | refused by code |\n| --- | ---: | ---: | --- |\n");
    for (rpc, t) in tallies {
        let codes: Vec<String> = t.refused.iter().map(|(c, n)| format!("{c} {n}")).collect();
        out.push_str(&format!(
            "| {rpc} | {} | {} | {} |\n",
            t.calls,
            t.accepted,
            if codes.is_empty() {
                "-".to_string()
            } else {
                codes.join(", ")
            }
        ));
    }
    out
}
