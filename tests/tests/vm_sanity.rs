//! csi-sanity (the upstream CSI conformance suite) and the real binaries
//! on a real kernel (the `vm` tier): one boot of the guest
//! (`carina_tests::vm`) runs `guest_csi_sanity` of this executable, which
//! starts the workspace binaries from the share, `carina-node` (LVM with
//! `activation: auto` on one virtio disk, RAW on another, a second LVM
//! group for bcache caches on a third) and `carina-controller --mode
//! direct`, and runs the static csi-sanity binary against them once per
//! volume type (LVM, RAW, and a bcache class: backing volumes in the
//! first LVM group, caches in the second, on the kernel's driver),
//! restricted to its Node Service specs (the whole suite takes about 6
//! minutes per type under TCG; the host's `sanity` tier runs it all). The
//! bcache run skips the one spec that grows a volume through the
//! controller: a bcache volume cannot grow (`FAILED_PRECONDITION`). The
//! guest prints a pass line per type with csi-sanity's counts (`VMCHECK
//! pass csi-sanity-lvm ran 24 passed 24 failed 0 skipped 78`), then
//! restarts a SIGKILLed node over a deactivated volume group.
//! `real_kernel_csi_sanity` on the host boots the guest and fails unless
//! every type ran specs, all passed and none failed, and the bcache run
//! ran every spec the LVM run did but the skipped one.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use carina_csi::params::{BACKEND_GROUP, CACHE_GROUP, CACHE_POLICY, CACHE_RATIO, DISK_GROUP};
use carina_proto::csi;
use carina_proto::csi::controller_client::ControllerClient;
use carina_proto::csi::volume_capability::access_mode::Mode;
use carina_proto::csi::volume_capability::{AccessMode, AccessType, BlockVolume};
use carina_tests::cluster::{NodeArgs, Pki, Service, direct_controller_args};
use carina_tests::process::{tail, upstream_tool};
use carina_tests::sanity::{Summary, parse_summary};
use carina_tests::vm::is_device_mapper;
use carina_tests::vm::{GUEST_SHARE, PASS, Vm, in_guest, pass};
use carina_tests::{have_root, run, test_log_dir};

const MIB: u64 = 1 << 20;
const NODE: &str = "vm-sanity-node";
/// The LVM group (and volume group) on `/dev/vda`.
const VG: &str = "sanityvg";
/// The RAW group on `/dev/vdb`.
const RAW: &str = "sanityraw";
/// The LVM group for bcache caches on `/dev/vdc`.
const SSD: &str = "sanityssd";
/// The specs csi-sanity runs in the guest: each creates its volumes
/// through the controller, then stages, publishes, expands and deletes
/// them on the kernel's devices.
const FOCUS: &str = "Node Service";
/// The csi-sanity binary's name in the share.
const SANITY: &str = "csi-sanity";

/// The volume types csi-sanity runs against, in order: (label, the
/// StorageClass parameters besides the filesystem).
const TYPES: &[(&str, &[(&str, &str)])] = &[
    ("lvm", &[(DISK_GROUP, VG)]),
    ("raw", &[(DISK_GROUP, RAW)]),
    (
        "bcache",
        &[
            (BACKEND_GROUP, VG),
            (CACHE_GROUP, SSD),
            (CACHE_RATIO, "50"),
            (CACHE_POLICY, "writeback"),
        ],
    ),
];
/// The spec the bcache run skips: it grows the volume through
/// ControllerExpandVolume, which a bcache volume refuses.
const GROWS: &str = "should work if node-expand is called after node-publish";

/// The csi-sanity specs `label` skips (a ginkgo regular expression).
fn skipped_specs(label: &str) -> Option<&'static str> {
    (label == "bcache").then_some(GROWS)
}

#[test]
fn real_kernel_csi_sanity() {
    if !have_root("real_kernel_csi_sanity") {
        return;
    }
    let sanity = upstream_tool("CARINA_CSI_SANITY", "csi-sanity-v5.6.0", SANITY)
        .expect("csi-sanity (tests/tools/build.sh csi-sanity)");
    let console = Vm::new("sanity")
        .and_then(|vm| vm.disk(4096 * MIB))
        .and_then(|vm| vm.disk(4096 * MIB))
        .and_then(|vm| vm.disk(1024 * MIB))
        .and_then(|vm| vm.share_file(&sanity, SANITY))
        .and_then(|vm| vm.share_binary("carina-node"))
        .and_then(|vm| vm.share_binary("carina-controller"))
        .map(|vm| {
            vm.memory_mib(768)
                .guest_env("CARINA_CSI_SANITY", &format!("{GUEST_SHARE}/{SANITY}"))
                .timeout(Duration::from_secs(600))
        })
        .and_then(|vm| vm.guest_test("guest_csi_sanity"))
        .and_then(Vm::boot)
        .expect("the guest boots and powers off");
    let checks: Vec<String> = std::iter::once("node-device-mapper".to_string())
        .chain(TYPES.iter().map(|(label, _)| format!("csi-sanity-{label}")))
        .chain(std::iter::once("node-restart".to_string()))
        .collect();
    let checks: Vec<&str> = checks.iter().map(String::as_str).collect();
    console.assert_passed(&checks);
    let mut ran = std::collections::HashMap::new();
    for (label, _) in TYPES {
        let check = format!("csi-sanity-{label}");
        let s = counts(&console.text, &check)
            .unwrap_or_else(|| panic!("no counts on the pass line of {check}"));
        assert_eq!(s.failed, 0, "{check}: {s:?}");
        assert!(s.ran > 0 && s.passed == s.ran, "{check}: {s:?}");
        println!(
            "vm: csi-sanity {label}: ran {} passed {} failed {} skipped {}{}",
            s.ran,
            s.passed,
            s.failed,
            s.skipped,
            skipped_specs(label)
                .map_or_else(String::new, |r| format!(" (skipped on purpose: {r})"))
        );
        ran.insert(*label, s.ran);
    }
    let made = |check: &str| -> Option<u32> {
        let line = console
            .text
            .lines()
            .filter_map(|l| l.split(PASS).nth(1))
            .find(|rest| rest.split_whitespace().next() == Some(check))?;
        let words: Vec<&str> = line.split_whitespace().collect();
        let i = words.iter().position(|w| *w == "made")?;
        words.get(i + 1)?.parse().ok()
    };
    for (label, _) in TYPES {
        let n = made(&format!("csi-sanity-{label}")).unwrap_or(0);
        assert!(
            n > 0,
            "csi-sanity-{label}: the node made no volume of its kind"
        );
        println!("vm: csi-sanity {label}: the node made and deleted {n} volumes of its kind");
    }
    // The bcache run skipped only the spec that grows a volume.
    assert_eq!(
        ran["bcache"] + 1,
        ran["lvm"],
        "the bcache run ran every spec of the LVM run but {GROWS:?}"
    );
}

/// The counts on `check`'s pass line: `... <check> ran N passed P failed F
/// skipped S (T s)`.
fn counts(console: &str, check: &str) -> Option<Summary> {
    let line = console
        .lines()
        .filter_map(|l| l.split(PASS).nth(1))
        .find(|rest| rest.split_whitespace().next() == Some(check))?;
    let words: Vec<&str> = line.split_whitespace().collect();
    let field = |name: &str| -> Option<u32> {
        let i = words.iter().position(|w| *w == name)?;
        words.get(i + 1)?.parse().ok()
    };
    Some(Summary {
        ran: field("ran")?,
        total: 0,
        passed: field("passed")?,
        failed: field("failed")?,
        skipped: field("skipped")?,
    })
}

#[test]
fn pass_line_counts_parse() {
    let console = "x\nVMCHECK pass csi-sanity-lvm ran 58 passed 57 failed 1 skipped 33 (80.1s)\n";
    assert_eq!(
        counts(console, "csi-sanity-lvm"),
        Some(Summary {
            ran: 58,
            total: 0,
            passed: 57,
            failed: 1,
            skipped: 33
        })
    );
    assert_eq!(counts(console, "csi-sanity-raw"), None);
}

fn config() -> String {
    format!(
        r#"{{"diskSelector":[
            {{"name":"{VG}","re":["^vda$"],"policy":"LVM","activation":"auto","reserveBytes":0,"minDiskBytes":1048576}},
            {{"name":"{RAW}","re":["^vdb$"],"policy":"RAW","reserveBytes":0,"minDiskBytes":1048576}},
            {{"name":"{SSD}","re":["^vdc$"],"policy":"LVM","activation":"auto","reserveBytes":0,"minDiskBytes":1048576}}
        ],"diskScanInterval":"0"}}"#
    )
}

fn write(dir: &Path, name: &str, text: &str) -> Result<PathBuf> {
    let p = dir.join(name);
    std::fs::write(&p, text).with_context(|| format!("write {}", p.display()))?;
    Ok(p)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "runs inside the vm tier's guest, which real_kernel_csi_sanity boots"]
async fn guest_csi_sanity() {
    assert!(in_guest(), "guest_csi_sanity runs only inside the guest");
    guest().await.unwrap_or_else(|e| panic!("{e:#}"));
}

async fn guest() -> Result<()> {
    let t = Instant::now();
    let work = tempfile::tempdir()?;
    let dir = work.path();
    let logs = test_log_dir();
    let pki = Pki::write(&dir.join("pki"))?;
    let node_args = NodeArgs::new(
        NODE,
        &pki,
        &config(),
        &dir.join("node"),
        &logs.join("vm-sanity-node.log"),
    )?;
    let mut node = node_args.start().await?;
    // The real binary's own account of the activation it chose.
    let log = std::fs::read_to_string(&node_args.log)?;
    if !log.contains(r#"lvm.activation="device-mapper""#) {
        bail!(
            "carina-node did not pick device-mapper activation; log:\n{}",
            tail(&node_args.log, 40)
        );
    }
    pass("node-device-mapper", t);
    let nodes = write(
        dir,
        "nodes.yaml",
        &format!(
            "nodes:\n  - name: {NODE}\n    endpoint: {}\n",
            node_args.endpoint()
        ),
    )?;
    let socket = dir.join("controller.sock");
    let mut controller = Service::start(
        "carina-controller",
        "carina-controller",
        direct_controller_args(&nodes, &pki, &socket),
        &socket,
        &logs.join("vm-sanity-controller.log"),
    )
    .await?;
    let sanity = upstream_tool("CARINA_CSI_SANITY", "csi-sanity-v5.6.0", SANITY)?;
    for (label, pairs) in TYPES {
        let t = Instant::now();
        let yaml: String = pairs
            .iter()
            .chain(&[("csi.storage.k8s.io/fstype", "ext4")])
            .map(|(k, v)| format!("{k}: \"{v}\"\n"))
            .collect();
        let params = write(dir, &format!("{label}.yaml"), &yaml)?;
        let skip = skipped_specs(label).map(|r| format!("--ginkgo.skip={r}"));
        let before = node_calls(node_args.metrics_port).await?;
        let out = tokio::process::Command::new(&sanity)
            .args(skip)
            .args([
                format!("--csi.endpoint={}", node_args.csi_socket.display()),
                format!("--csi.controllerendpoint={}", socket.display()),
                format!(
                    "--csi.mountdir={}",
                    dir.join(format!("{label}-mnt")).display()
                ),
                format!(
                    "--csi.stagingdir={}",
                    dir.join(format!("{label}-staging")).display()
                ),
                format!("--csi.testvolumesize={}", 64 * MIB),
                format!("--csi.testvolumeexpandsize={}", 128 * MIB),
                format!("--csi.testvolumeparameters={}", params.display()),
                "--ginkgo.no-color".into(),
                format!("--ginkgo.focus={FOCUS}"),
                "--ginkgo.timeout=8m".into(),
            ])
            .output()
            .await
            .with_context(|| format!("run {}", sanity.display()))?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        node.check_running()?;
        controller.check_running()?;
        let calls = node_calls(node_args.metrics_port).await?.since(&before);
        let Some(s) = parse_summary(&text) else {
            bail!("csi-sanity {label}: no ginkgo summary:\n{text}");
        };
        if !out.status.success() || s.failed > 0 || s.passed == 0 {
            bail!(
                "csi-sanity {label} ({}): {s:?}\n{text}\nnode log:\n{}",
                out.status,
                tail(&node_args.log, 60)
            );
        }
        // The node made (and deleted) the kind of volume the class asks
        // for, and nothing else.
        let tiered = *label == "bcache";
        let made = if tiered { calls.bcache } else { calls.lv };
        let other = if tiered { calls.lv } else { calls.bcache };
        if made.0 == 0 || made.0 != made.1 || other.0 != 0 || bcache_devices()? != 0 {
            bail!(
                "csi-sanity {label}: the node's successful calls (create, delete): \
                 {calls:?}; bcache devices left: {}",
                bcache_devices()?
            );
        }
        println!(
            "{PASS} csi-sanity-{label} ran {} passed {} failed {} skipped {} made {} ({:.1}s)",
            s.ran,
            s.passed,
            s.failed,
            s.skipped,
            made.0,
            t.elapsed().as_secs_f64()
        );
    }
    node_restart(&mut node, &controller).await?;
    controller.stop().await;
    node.stop().await;
    Ok(())
}

/// The node's successful NodeStorage calls that make and delete volumes:
/// (create, delete) of plain volumes and of bcache devices.
#[derive(Debug, Clone, Copy)]
struct NodeCalls {
    lv: (u64, u64),
    bcache: (u64, u64),
}

impl NodeCalls {
    fn since(self, before: &NodeCalls) -> NodeCalls {
        NodeCalls {
            lv: (self.lv.0 - before.lv.0, self.lv.1 - before.lv.1),
            bcache: (
                self.bcache.0 - before.bcache.0,
                self.bcache.1 - before.bcache.1,
            ),
        }
    }
}

/// [`NodeCalls`] from the node's `/metrics` on `port`.
async fn node_calls(port: u16) -> Result<NodeCalls> {
    let scrape = carina_tests::metrics::scrape(port).await?;
    let ok = |method: &str| {
        carina_tests::metrics::value(
            &scrape,
            "carina_node_grpc_requests_total",
            &[("method", method), ("code", "OK")],
        )
        .unwrap_or(0.0) as u64
    };
    Ok(NodeCalls {
        lv: (ok("CreateLV"), ok("DeleteLV")),
        bcache: (ok("CreateBcache"), ok("DeleteBcache")),
    })
}

/// The bcache devices the kernel runs (`/sys/block/bcacheN`).
fn bcache_devices() -> Result<usize> {
    Ok(std::fs::read_dir("/sys/block")?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("bcache"))
        .count())
}

/// The LVM volumes of [`VG`] as `lvs` shows them: (name, active).
fn lvs() -> Result<Vec<(String, bool)>> {
    let out = run(
        "lvm",
        &["lvs", "--noheadings", "-o", "lv_name,lv_active", VG],
    )?;
    Ok(out
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let name = f.next()?.to_string();
            Some((name, f.next() == Some("active")))
        })
        .collect())
}

/// The real `carina-node` killed (SIGKILL) with a volume in use, its
/// volume group deactivated as by a reboot, and started again: it finds
/// the volume, activates it (the device-mapper node is back with the data
/// written before), and the controller deletes it through it.
async fn node_restart(node: &mut Service, controller: &Service) -> Result<()> {
    let t = Instant::now();
    let mut csi = ControllerClient::new(controller.channel().await?);
    let before = lvs()?;
    let vol = csi
        .create_volume(csi::CreateVolumeRequest {
            name: "vm-restart".into(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: (64 * MIB) as i64,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![csi::VolumeCapability {
                access_mode: Some(AccessMode {
                    mode: Mode::SingleNodeWriter as i32,
                }),
                access_type: Some(AccessType::Block(BlockVolume {})),
            }],
            parameters: [(DISK_GROUP.to_string(), VG.to_string())].into(),
            ..Default::default()
        })
        .await
        .context("CreateVolume")?
        .into_inner()
        .volume
        .context("CreateVolume answered no volume")?;
    let made: Vec<String> = lvs()?
        .into_iter()
        .filter(|v| !before.contains(v))
        .map(|(name, _)| name)
        .collect();
    let [lv] = made.as_slice() else {
        bail!("CreateVolume made {made:?} in {VG}, not one volume");
    };
    let dev = Path::new("/dev").join(VG).join(lv);
    if !is_device_mapper(&dev) {
        bail!("{} is not a device-mapper device", dev.display());
    }
    let data = b"written before the node was killed";
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new().write(true).open(&dev)?;
        f.write_all(data)?;
        f.sync_all()?;
    }
    node.kill();
    run("lvm", &["vgchange", "-an", VG])?;
    if dev.exists() || lvs()?.iter().any(|(name, active)| name == lv && *active) {
        bail!("{} still active after vgchange -an", dev.display());
    }
    node.restart().await?;
    if !lvs()?.iter().any(|(name, active)| name == lv && *active) {
        bail!("{lv} not active after the node's start: {:?}", lvs()?);
    }
    if !is_device_mapper(&dev) {
        bail!("{} is not back as a device-mapper device", dev.display());
    }
    let mut back = vec![0u8; data.len()];
    {
        use std::io::Read;
        std::fs::File::open(&dev)?.read_exact(&mut back)?;
    }
    if back != data {
        bail!("the data did not survive the restart");
    }
    // The controller reaches the restarted node (a new connection).
    let mut csi = ControllerClient::new(controller.channel().await?);
    csi.delete_volume(csi::DeleteVolumeRequest {
        volume_id: vol.volume_id.clone(),
        secrets: Default::default(),
    })
    .await
    .context("DeleteVolume after the restart")?;
    if lvs()?.iter().any(|(name, _)| name == lv) || dev.exists() {
        bail!("{lv} left after DeleteVolume");
    }
    pass("node-restart", t);
    Ok(())
}
