//! The NodeStorage surface under hostile input: a real `carina-node`
//! process (one HOST group) gets, for every RPC, messages with random
//! field values, valid messages with a few bytes changed, and random
//! bytes, sent over mTLS as the controller would (a streamed answer,
//! CopyLV's, is read to its end and judged by the status it ends with).
//! For every call:
//!
//! - the node answers (no panic, no dropped connection) and keeps serving;
//! - a refusal carries a code that says what was wrong: never `UNKNOWN`,
//!   and `INTERNAL` only for bytes that do not decode as the request;
//! - a refused call changes nothing (the volumes and groups are the same
//!   before and after it).
//!
//! Accepted calls are allowed their effect (volumes made are deleted at
//! the end, an accepted configuration is replaced by the original one).
//! The generator is seeded, so a failure names the seed and case that
//! reproduce it. `CARINA_FUZZ_CASES` sets the calls per RPC (default
//! 1000) and `CARINA_FUZZ_SEED` the seed.

use std::path::Path;

use anyhow::{Context, Result, bail, ensure};
use carina_proto::nodestorage as pb;
use carina_tests::cluster::{NodeArgs, Pki};
use carina_tests::fuzz::{self, RawClient, RawCodec, Rng, Tally, text};
use carina_tests::grpc::{Client, create_lv, host_config};
use carina_tests::{have_root, unique};
use prost::Message;
use tonic::Code;

const SERVICE: &str = "/carina.nodestorage.v1.NodeStorage/";

/// The request of `rpc` with random field values drawn from pools of
/// good, bad and strange values.
fn random_message(rng: &mut Rng, rpc: &str, group: &str) -> Vec<u8> {
    let names = |rng: &mut Rng| -> String {
        match rng.below(6) {
            0 => format!("fuzz-{}", rng.below(4)),
            1 => String::new(),
            2 => "x".repeat(rng.below(400)),
            3 => format!("pvc-{:x}", rng.next_u64()),
            _ => text(rng, 40),
        }
    };
    let uids = |rng: &mut Rng| -> String {
        match rng.below(4) {
            0 => format!(
                "{:08x}-0000-4000-8000-{:012x}",
                rng.next_u64() as u32,
                rng.below(1 << 40)
            ),
            1 => String::new(),
            2 => "../".repeat(rng.below(8)),
            _ => text(rng, 40),
        }
    };
    let groups = |rng: &mut Rng| -> String {
        match rng.below(4) {
            0 | 1 => group.to_string(),
            2 => String::new(),
            _ => text(rng, 20),
        }
    };
    let sizes = |rng: &mut Rng| -> u64 {
        let any = rng.next_u64();
        *rng.pick(&[
            0,
            1,
            4095,
            4096,
            1 << 20,
            1 << 30,
            1 << 40,
            (1 << 63) - 1,
            1 << 63,
            u64::MAX,
            any,
        ])
    };
    match rpc {
        "CreateLV" => pb::CreateLvRequest {
            name: names(rng),
            device_group: groups(rng),
            size_bytes: sizes(rng),
            exclusive: rng.below(4) == 0,
        }
        .encode_to_vec(),
        "DeleteLV" => pb::DeleteLvRequest { name: names(rng) }.encode_to_vec(),
        "ResizeLV" => pb::ResizeLvRequest {
            name: names(rng),
            size_bytes: sizes(rng),
        }
        .encode_to_vec(),
        "CopyLV" => {
            // Mostly the volumes `seed_copy_volumes` made, so that copies
            // get past the names to the sizes, origins and snapshots.
            let volume = |rng: &mut Rng| match rng.below(2) {
                0 => format!("fuzz-{}", rng.below(4)),
                _ => names(rng),
            };
            pb::CopyLvRequest {
                source: volume(rng),
                target: volume(rng),
                snapshot: rng.below(2) == 0,
            }
            .encode_to_vec()
        }
        "AdoptLV" => pb::AdoptLvRequest {
            // Go Carina's ids of volumes the node does not have, beside
            // the names of every other RPC.
            name: match rng.below(3) {
                0 => format!("host-pvc-{}", rng.below(4)),
                1 => format!("volume-pvc-{:x}", rng.next_u64()),
                _ => names(rng),
            },
            device_group: groups(rng),
            policy: rng.below(5) as i32,
            size_bytes: sizes(rng),
        }
        .encode_to_vec(),
        "GetLV" => pb::GetLvRequest { name: names(rng) }.encode_to_vec(),
        "ListLVs" => pb::ListLVsRequest {
            device_group: groups(rng),
            page_size: {
                let any = rng.next_u64() as u32;
                *rng.pick(&[0, 1, 2, u32::MAX, any])
            },
            page_token: if rng.below(2) == 0 {
                String::new()
            } else {
                text(rng, 30)
            },
        }
        .encode_to_vec(),
        "Capacity" => pb::CapacityRequest {
            device_group: groups(rng),
        }
        .encode_to_vec(),
        "ListDisks" => pb::ListDisksRequest {}.encode_to_vec(),
        "ApplyConfig" => pb::ApplyConfigRequest {
            config_json: match rng.below(3) {
                0 => text(rng, 200),
                1 => rng
                    .mutate(host_config(group, Path::new("/nonexistent"), 0).into_bytes())
                    .into_iter()
                    .map(char::from)
                    .collect(),
                _ => r#"{"diskSelector": []}"#.to_string(),
            },
        }
        .encode_to_vec(),
        "CreateBcache" => pb::CreateBcacheRequest {
            name: names(rng),
            backing_volume: names(rng),
            cache_volume: names(rng),
            cache_mode: rng.below(7) as i32 - 1,
            ..Default::default()
        }
        .encode_to_vec(),
        "DeleteBcache" => pb::DeleteBcacheRequest { name: names(rng) }.encode_to_vec(),
        "GetBcache" => pb::GetBcacheRequest { name: names(rng) }.encode_to_vec(),
        "SetCacheMode" => pb::SetCacheModeRequest {
            name: names(rng),
            cache_mode: rng.below(7) as i32 - 1,
        }
        .encode_to_vec(),
        "SetPodIOLimits" => pb::SetPodIoLimitsRequest {
            pod_uid: uids(rng),
            volume: names(rng),
            limits: (rng.below(4) != 0).then(|| pb::IoLimits {
                read_bps: rng.next_u64() >> rng.below(64),
                write_bps: rng.next_u64() >> rng.below(64),
                read_iops: rng.next_u64() >> rng.below(64),
                write_iops: rng.next_u64() >> rng.below(64),
            }),
        }
        .encode_to_vec(),
        "ClearPodIOLimits" => pb::ClearPodIoLimitsRequest {
            pod_uid: uids(rng),
            volume: if rng.below(2) == 0 {
                String::new()
            } else {
                names(rng)
            },
        }
        .encode_to_vec(),
        "ListPodIOLimits" => pb::ListPodIoLimitsRequest {
            pod_uid: if rng.below(2) == 0 {
                String::new()
            } else {
                uids(rng)
            },
        }
        .encode_to_vec(),
        other => panic!("no generator for {other}"),
    }
}

/// Whether `bytes` decodes as the request message of `rpc`.
fn decodes(rpc: &str, bytes: &[u8]) -> bool {
    match rpc {
        "CreateLV" => pb::CreateLvRequest::decode(bytes).is_ok(),
        "DeleteLV" => pb::DeleteLvRequest::decode(bytes).is_ok(),
        "ResizeLV" => pb::ResizeLvRequest::decode(bytes).is_ok(),
        "CopyLV" => pb::CopyLvRequest::decode(bytes).is_ok(),
        "AdoptLV" => pb::AdoptLvRequest::decode(bytes).is_ok(),
        "GetLV" => pb::GetLvRequest::decode(bytes).is_ok(),
        "ListLVs" => pb::ListLVsRequest::decode(bytes).is_ok(),
        "Capacity" => pb::CapacityRequest::decode(bytes).is_ok(),
        "ListDisks" => pb::ListDisksRequest::decode(bytes).is_ok(),
        "ApplyConfig" => pb::ApplyConfigRequest::decode(bytes).is_ok(),
        "CreateBcache" => pb::CreateBcacheRequest::decode(bytes).is_ok(),
        "DeleteBcache" => pb::DeleteBcacheRequest::decode(bytes).is_ok(),
        "GetBcache" => pb::GetBcacheRequest::decode(bytes).is_ok(),
        "SetCacheMode" => pb::SetCacheModeRequest::decode(bytes).is_ok(),
        "SetPodIOLimits" => pb::SetPodIoLimitsRequest::decode(bytes).is_ok(),
        "ClearPodIOLimits" => pb::ClearPodIoLimitsRequest::decode(bytes).is_ok(),
        "ListPodIOLimits" => pb::ListPodIoLimitsRequest::decode(bytes).is_ok(),
        _ => false,
    }
}

/// A volume's copy origin: source, snapshot, complete, completed at,
/// source size.
type Origin = (String, bool, bool, i64, u64);

/// A volume as [`state`] sees it: name, group, size and copy origin.
type VolumeState = (String, String, u64, Option<Origin>);

/// What a refused call must leave as it was: every volume (name, group,
/// size, copy origin) and every group.
async fn state(client: &mut Client) -> Result<(Vec<VolumeState>, Vec<String>)> {
    let mut volumes: Vec<VolumeState> = client
        .list_l_vs(pb::ListLVsRequest::default())
        .await?
        .into_inner()
        .volumes
        .into_iter()
        .map(|v| {
            let origin = v.origin.map(|o| {
                (
                    o.source,
                    o.snapshot,
                    o.complete,
                    o.completed_unix_nanos,
                    o.source_size_bytes,
                )
            });
            (v.name, v.device_group, v.size_bytes, origin)
        })
        .collect();
    volumes.sort();
    let mut groups: Vec<String> = client
        .capacity(pb::CapacityRequest::default())
        .await?
        .into_inner()
        .groups
        .into_iter()
        .map(|g| g.device_group)
        .collect();
    groups.sort();
    Ok((volumes, groups))
}

/// Makes the volumes `fuzz-0` to `fuzz-3` the CopyLV messages mostly
/// name, of different sizes, each holding a file (one the CreateLV cases
/// made already stays as it is).
async fn seed_copy_volumes(client: &mut Client, group: &str) -> Result<()> {
    for (i, size) in [1u64 << 20, 2 << 20, 2 << 20, 4 << 20]
        .into_iter()
        .enumerate()
    {
        let name = format!("fuzz-{i}");
        match client.create_lv(create_lv(&name, group, size)).await {
            Ok(r) => {
                let v = r.into_inner().volume.context("CreateLV without a volume")?;
                std::fs::write(Path::new(&v.host_path).join("data"), name.repeat(1000))
                    .with_context(|| format!("fill {name}"))?;
            }
            Err(s) if s.code() == Code::AlreadyExists => {}
            Err(s) => return Err(s).with_context(|| format!("create {name}")),
        }
    }
    Ok(())
}

/// Calls `rpc` with `body`: the call's status, for a server-streaming
/// RPC the status the stream ends with (its messages read and dropped).
async fn call(
    raw: &mut RawClient,
    rpc: &str,
    body: &[u8],
    path: &http::uri::PathAndQuery,
) -> Result<(), tonic::Status> {
    if !STREAMING.contains(&rpc) {
        return fuzz::unary(raw, path, body).await.map(drop);
    }
    let request = tonic::Request::new(body.to_vec());
    let mut stream = raw
        .server_streaming(request, path.clone(), RawCodec)
        .await?
        .into_inner();
    while stream.message().await?.is_some() {}
    Ok(())
}

/// The server-streaming RPCs among those fuzzed (their streams end).
const STREAMING: &[&str] = &["CopyLV"];

const MUTATING: &[&str] = &[
    "CreateLV",
    "DeleteLV",
    "ResizeLV",
    "CopyLV",
    "AdoptLV",
    "ApplyConfig",
    "CreateBcache",
    "DeleteBcache",
    "SetCacheMode",
    "SetPodIOLimits",
    "ClearPodIOLimits",
];

#[tokio::test]
async fn the_node_answers_every_message_with_a_typed_code_and_refusals_change_nothing() -> Result<()>
{
    if !have_root("fuzz_grpc") {
        return Ok(());
    }
    let (seed, cases) = fuzz::settings(0x00C0_FFEE, 1000);
    let dir = tempfile::tempdir()?;
    let root = dir.path().join("host");
    std::fs::create_dir_all(&root)?;
    let group = unique("fuzz");
    let config = host_config(&group, &root, 0);
    let pki = Pki::write(&dir.path().join("pki"))?;
    let node_name = unique("fuzz-node");
    let log = dir.path().join("node.log");
    let args = NodeArgs::new(&node_name, &pki, &config, &dir.path().join("node"), &log)?;
    let mut node = args.start().await?;
    let mut client = pki.node_client(&node_name, &args.endpoint()).await?;
    let channel = carina_proto::tls::connect(&args.endpoint(), &pki.client_tls(&node_name)?)
        .await
        .context("raw channel")?;
    let mut raw = tonic::client::Grpc::new(channel);

    let rpcs = [
        "CreateLV",
        "DeleteLV",
        "ResizeLV",
        "CopyLV",
        "AdoptLV",
        "GetLV",
        "ListLVs",
        "Capacity",
        "ListDisks",
        "ApplyConfig",
        "CreateBcache",
        "DeleteBcache",
        "GetBcache",
        "SetCacheMode",
        "SetPodIOLimits",
        "ClearPodIOLimits",
        "ListPodIOLimits",
    ];
    let mut rng = Rng::new(seed);
    let mut counts = Vec::new();
    for rpc in rpcs {
        let path: http::uri::PathAndQuery = format!("{SERVICE}{rpc}").parse()?;
        let mut tally = Tally::default();
        if rpc == "CopyLV" {
            seed_copy_volumes(&mut client, &group).await?;
        }
        for case in 0..cases {
            let body = match case % 3 {
                0 => random_message(&mut rng, rpc, &group),
                1 => {
                    let valid = random_message(&mut rng, rpc, &group);
                    rng.mutate(valid)
                }
                _ => rng.bytes(64),
            };
            let mutating = MUTATING.contains(&rpc);
            let before = if mutating {
                Some(state(&mut client).await?)
            } else {
                None
            };
            raw.ready().await.context("the node stopped taking calls")?;
            let answer = call(&mut raw, rpc, &body, &path).await;
            let at = || format!("{rpc} case {case} (seed {seed}), body {body:02x?}");
            match answer {
                Ok(_) => {
                    tally.accept();
                    if rpc == "ApplyConfig" {
                        client
                            .apply_config(pb::ApplyConfigRequest {
                                config_json: config.clone(),
                            })
                            .await
                            .with_context(|| format!("restore the configuration after {}", at()))?;
                    }
                }
                Err(status) => {
                    tally.refuse(status.code());
                    if let Some(fault) = fuzz::refusal_fault(&status, decodes(rpc, &body)) {
                        bail!("{}: {fault}: {status:?}", at());
                    }
                    // The node has nothing to wait for: it always answers.
                    ensure!(
                        !matches!(status.code(), Code::Unavailable | Code::Cancelled),
                        "{}: the node did not answer: {status:?}",
                        at()
                    );
                    if let Some(before) = before {
                        let after = state(&mut client).await?;
                        ensure!(
                            before == after,
                            "{}: refused ({status:?}) but changed {before:?} -> {after:?}",
                            at()
                        );
                    }
                }
            }
        }
        counts.push((rpc, tally));
        node.check_running()?;
    }

    // Still serving, and what the accepted creates made goes away.
    let (volumes, groups) = state(&mut client).await?;
    assert_eq!(
        groups,
        std::slice::from_ref(&group),
        "the original configuration is back"
    );
    for (name, _, _, _) in volumes {
        client
            .delete_lv(pb::DeleteLvRequest { name: name.clone() })
            .await
            .with_context(|| format!("delete {name}"))?;
    }
    assert!(state(&mut client).await?.0.is_empty());
    // The group's own bookkeeping (`.carina`) stays; no volume directory.
    let left: Vec<_> = std::fs::read_dir(&root)?
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| n != ".carina")
        .collect();
    assert!(left.is_empty(), "left in the HOST root: {left:?}");
    node.stop().await;
    println!(
        "seed {seed}, {cases} calls per RPC:\n{}",
        fuzz::table(&counts)
    );
    Ok(())
}
