//! The Kubernetes storage e2e suite (`e2e.test` of Kubernetes v1.36.3)
//! against Carina on a real node, with the driver definition in
//! `tests/e2e/carina-driver.yaml`.
//!
//! `e2e_storage_subset` runs in `make test` (the `e2e` tier): the
//! provisioning, volumes, volumeMode, read-write-once-pod, capacity and
//! snapshottable suites.
//! `e2e_storage_full` (ignored by default; `make e2e`) runs every External
//! Storage suite for the driver except `[Disruptive]` tests and the
//! features [`SKIP`] names. Both print a table of ran, passed, failed and skipped tests per
//! suite with the suite's skip reasons, keep the JUnit report in the test
//! log folder, and fail if any test failed. What this machine cannot run is
//! skipped by name ([`skip`]), each with its reason. The subset also fails
//! when ginkgo's `Ran N of M Specs` differs from the count it expects
//! ([`SUBSET_SPECS`]): fewer specs ran than it knows of.
//!
//! Needs root and `tests/tools/build.sh etcd kube kubelet containerd
//! crictl cni helm test-images csi-snapshotter e2e e2e-images`.

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail, ensure};
use carina_tests::have_root;
use carina_tests::local::LocalCluster;
use carina_tests::local::carina::{Carina, Layout, e2e_images, local_options, tool_path};
use carina_tests::manifests::repo_root;

/// What the suite runs for every test.
const DRIVER_FOCUS: &str = r"External.Storage \[Driver: carina\.storage\.io\]";

/// Tests this node cannot run, each for its reason:
/// - `[Disruptive]` ones restart the kubelet;
/// - the features Carina or this cluster lacks: SELinux mounts, the
///   snapshot metadata service, group snapshots, VolumeAttributesClass, and
///   any feature off by default. The features that run are
///   VolumeSnapshotDataSource (the cluster has snapshot-controller and the
///   chart's csi-snapshotter) and VolumeSourceXFS (the node formats xfs);
/// - "any volume data source" deploys a volume populator and its
///   validator, whose images (`hello-populator`,
///   `volume-data-source-validator`) the test tools do not build.
const SKIP: &str = concat!(
    r"\[Disruptive\]",
    r"|\[Feature:(SELinux|SnapshotMetadata|VolumeGroupSnapshotDataSource|VolumeAttributesClass|OffByDefault)\]",
    r"|provisioning should provision storage with any volume data source",
);

/// "should not mount / map unused volumes" lists the kubelet's folders
/// through a host-exec pod that enters PID 1's mount namespace (`nsenter
/// --mount=/proc/1/ns/mnt`); machines whose PID 1 is a hypervisor's init
/// refuse that even to root, so it is skipped where this process cannot
/// open that namespace either.
const SKIP_WITHOUT_PID1_MOUNT_NS: &str =
    r"volumeMode should not mount / map unused volumes in a pod";

/// Growing a mounted ext4 (the default file system) needs
/// CAP_SYS_RESOURCE, which some machines (VMs, containers) deny even to
/// root: the kernel refuses the resize (`resize2fs: Permission denied to
/// resize filesystem`). The kubelet grows a file system only once it is
/// staged (mounted), so where the capability is missing the tests that
/// grow a default file system are skipped: the three resize tests
/// (offline, while a pod uses it, and for a pod re-created after the
/// controller's resize) and the expansion of a generic ephemeral volume
/// (late and immediate binding). The block patterns' resize tests still
/// run (and the node tier grows a mounted xfs).
const SKIP_WITHOUT_SYS_RESOURCE: &str = concat!(
    r"\(default fs\)\(allowExpansion\)\] volume-expand (should resize volume|Verify if offline PVC expansion works)",
    r"|Generic Ephemeral-volume \(default fs\) \((late|immediate)-binding\)\] ephemeral should support expansion of pvcs created for ephemeral pvcs",
);

/// The specs `e2e_storage_subset` runs (ginkgo's `Ran N of M Specs`:
/// passed and failed, not skipped), kept by hand from its last full run.
/// The count is exact where [`SKIP_WITHOUT_PID1_MOUNT_NS`] applies (as on
/// the test machines; [`SKIP_WITHOUT_SYS_RESOURCE`] names no test of the
/// subset) and a floor elsewhere, where the volumeMode checks it names run
/// too. Fewer is a failure: a spec the run knew of was skipped or never
/// reached (a driver capability lost, an abort). More is one as well until
/// the count here is updated after reading the report.
const SUBSET_SPECS: usize = 28;

/// What a run's `Ran N of M Specs` must say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expected {
    Exactly(usize),
    AtLeast(usize),
    /// No count is kept (the whole suite): at least one spec.
    Some,
}

impl Expected {
    /// Checks the `ran` of a run against what is expected.
    fn check(self, ran: usize) -> Result<()> {
        match self {
            Expected::Exactly(n) if ran < n => {
                bail!(
                    "ginkgo ran {ran} specs, {n} expected: {} did not run",
                    n - ran
                )
            }
            Expected::Exactly(n) if ran > n => bail!(
                "ginkgo ran {ran} specs, {n} expected: update the expected count after reading the report"
            ),
            Expected::AtLeast(n) if ran < n => {
                bail!("ginkgo ran {ran} specs, at least {n} expected")
            }
            Expected::Some if ran == 0 => bail!("ginkgo ran no spec"),
            _ => Ok(()),
        }
    }
}

/// The specs and the total of ginkgo's summary line `Ran N of M Specs in
/// S seconds`.
fn ran_specs(line: &str) -> Option<(usize, usize)> {
    let rest = &line[line.find("Ran ")? + 4..];
    let (ran, rest) = rest.split_once(" of ")?;
    let (total, rest) = rest.split_once(' ')?;
    rest.starts_with("Specs")
        .then_some((ran.parse().ok()?, total.parse().ok()?))
}

/// Whether this process has CAP_SYS_RESOURCE (bit 24 of CapEff).
fn has_sys_resource() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .is_some_and(|caps| caps & (1 << 24) != 0)
}

/// The skip expression for this machine.
fn skip() -> String {
    let mut skip = SKIP.to_string();
    if !has_sys_resource() {
        println!("no CAP_SYS_RESOURCE here: skipping ext4 online expansion");
        skip = format!("{skip}|{SKIP_WITHOUT_SYS_RESOURCE}");
    }
    if let Err(e) = std::fs::File::open("/proc/1/ns/mnt") {
        println!("PID 1's mount namespace cannot be opened ({e}): skipping host-exec checks");
        skip = format!("{skip}|{SKIP_WITHOUT_PID1_MOUNT_NS}");
    }
    skip
}

/// Counts of one suite: the tests that ran, and those the suite itself
/// skipped for this driver, with the reasons it gave. Tests the focus left
/// out are not counted.
#[derive(Debug, Default)]
struct Counts {
    passed: usize,
    failed: usize,
    skipped: usize,
    failures: Vec<String>,
    /// Skip reasons and how many tests each one skipped.
    reasons: BTreeMap<String, usize>,
}

async fn run_suite(focus: &str, report_name: &str, expected: Expected) -> Result<()> {
    let mut options = local_options()?;
    options
        .images
        .extend(e2e_images()?.into_iter().map(|(_, path)| path));
    let mut cluster = LocalCluster::start(options).await?;
    let mut carina = Carina::install(&mut cluster, &Layout::e2e()).await?;

    let e2e = tool_path("e2e")?.join("e2e.test");
    let report_dir = cluster.log_dir().join(report_name);
    std::fs::create_dir_all(&report_dir)?;
    let junit = report_dir.join("junit.xml");
    let e2e_dir = repo_root().join("tests/e2e");
    let mut child = Command::new(&e2e)
        .current_dir(&e2e_dir)
        .args([
            format!(
                "--kubeconfig={}",
                cluster.kube().kubeconfig_path().display()
            ),
            format!(
                "--storage.testdriver={}",
                e2e_dir.join("carina-driver.yaml").display()
            ),
            format!("--repo-root={}", e2e_dir.display()),
            // The node's kubelet keeps its root under the cluster's folder.
            format!("--kubelet-root-dir={}", cluster.kubelet_root().display()),
            format!("--ginkgo.focus={DRIVER_FOCUS}.*({focus})"),
            format!("--ginkgo.skip={}", skip()),
            format!("--ginkgo.junit-report={}", junit.display()),
            format!("--report-dir={}", report_dir.display()),
            "--ginkgo.timeout=4h".to_string(),
            "--ginkgo.no-color".to_string(),
            "--node-os-distro=debian".to_string(),
            "--minStartupPods=0".to_string(),
        ])
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("run {}", e2e.display()))?;
    // Its output passes through; the summary line is kept.
    let mut ran = None;
    let stdout = child.stdout.take().context("e2e.test's stdout")?;
    for line in std::io::BufReader::new(stdout).split(b'\n') {
        let line = line.context("read e2e.test's output")?;
        let line = String::from_utf8_lossy(&line);
        println!("{line}");
        ran = ran_specs(&line).or(ran);
    }
    let status = child.wait().context("wait for e2e.test")?;
    carina.check_running()?;
    let counts = read_junit(&junit)?;
    print_table(&counts);
    let failed: Vec<&String> = counts.values().flat_map(|c| &c.failures).collect();
    ensure!(
        failed.is_empty() && status.success(),
        "e2e.test exited {status}; failed: {failed:#?}"
    );
    let (ran, total) = ran.context("e2e.test printed no `Ran N of M Specs`")?;
    println!("ginkgo ran {ran} of {total} specs ({expected:?} expected)");
    expected.check(ran)
}

/// Per-suite counts of this driver's tests from ginkgo's JUnit report: a
/// test's suite is the first word after its `[Testpattern: ...]` that is
/// not a tag (`[Slow]`, `[Serial]`, ...). A skip whose message is a bare
/// "skipped" is the focus leaving the test out; any other is the suite's.
fn read_junit(path: &Path) -> Result<BTreeMap<String, Counts>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    let mut out: BTreeMap<String, Counts> = BTreeMap::new();
    for case in text.split("<testcase ").skip(1) {
        let name = attribute(case, "name").unwrap_or_default();
        if !name.contains("[Driver: carina.storage.io]") {
            continue;
        }
        let status = attribute(case, "status").unwrap_or_default();
        let Some(after) = name.split("[Testpattern: ").nth(1) else {
            continue;
        };
        let suite = after
            .split_once("] ")
            .and_then(|(_, rest)| rest.split_whitespace().find(|w| !w.starts_with('[')))
            // A suite's tags may follow its name without a space
            // (`snapshottable[Feature:...]`).
            .and_then(|w| w.split('[').next())
            .unwrap_or("?")
            .to_string();
        match status.as_str() {
            "passed" => out.entry(suite).or_default().passed += 1,
            "skipped" | "pending" => {
                let message = case
                    .find("<skipped ")
                    .and_then(|i| attribute(&case[i..], "message"))
                    .unwrap_or_default();
                let reason = message
                    .trim_start_matches("skipped")
                    .trim_start_matches(" - ");
                if reason.trim().is_empty() {
                    continue;
                }
                let counts = out.entry(suite).or_default();
                counts.skipped += 1;
                *counts.reasons.entry(reason.trim().to_string()).or_default() += 1;
            }
            _ => {
                let counts = out.entry(suite).or_default();
                counts.failed += 1;
                counts.failures.push(name);
            }
        }
    }
    Ok(out)
}

/// An XML attribute's value (the report escapes `&`, `<`, `"`).
fn attribute(element: &str, key: &str) -> Option<String> {
    let start = element
        .find(&format!(" {key}=\""))
        .map(|i| i + key.len() + 3)
        .or_else(|| {
            element
                .starts_with(&format!("{key}=\""))
                .then_some(key.len() + 2)
        })?;
    let end = element[start..].find('"')? + start;
    Some(
        element[start..end]
            .replace("&quot;", "\"")
            .replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&#39;", "'")
            .replace("&#34;", "\"")
            .replace("&amp;", "&"),
    )
}

fn print_table(counts: &BTreeMap<String, Counts>) {
    println!(
        "{:<28} {:>5} {:>7} {:>7} {:>8}",
        "suite", "ran", "passed", "failed", "skipped"
    );
    for (suite, c) in counts {
        println!(
            "{suite:<28} {:>5} {:>7} {:>7} {:>8}",
            c.passed + c.failed,
            c.passed,
            c.failed,
            c.skipped
        );
    }
    println!("skip reasons:");
    for (suite, c) in counts {
        for (reason, n) in &c.reasons {
            println!("  {suite}: {n} × {reason}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_storage_subset() -> Result<()> {
    if !have_root("e2e_storage_subset") {
        return Ok(());
    }
    // Where PID 1's mount namespace opens, the checks skipped elsewhere
    // run too: the count is a floor there.
    let expected = if std::fs::File::open("/proc/1/ns/mnt").is_err() {
        Expected::Exactly(SUBSET_SPECS)
    } else {
        Expected::AtLeast(SUBSET_SPECS)
    };
    run_suite(
        r"\] provisioning |\] volumes |\] volumeMode |\] read-write-once-pod |\] capacity |\] snapshottable",
        "e2e-subset",
        expected,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the whole suite takes long; `make e2e` runs it"]
async fn e2e_storage_full() -> Result<()> {
    if !have_root("e2e_storage_full") {
        return Ok(());
    }
    run_suite(".", "e2e-full", Expected::Some).await
}

#[test]
fn junit_cases_are_counted_per_suite() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path: PathBuf = dir.path().join("j.xml");
    std::fs::write(
        &path,
        r#"<testsuites><testsuite name="Kubernetes e2e suite">
<testcase name="[It] External Storage [Driver: carina.storage.io] [Testpattern: Dynamic PV (ext4)] volumes should store data" classname="x" status="passed" time="1"></testcase>
<testcase name="[It] External Storage [Driver: carina.storage.io] [Testpattern: Dynamic PV (block volmode)] volumes should store data" classname="x" status="skipped" time="0"><skipped message="skipped - Driver &#34;carina.storage.io&#34; does not support X - skipping"></skipped></testcase>
<testcase name="[It] External Storage [Driver: carina.storage.io] [Testpattern: Dynamic PV (ext4)] volumes should allow exec" classname="x" status="skipped" time="0"><skipped message="skipped"></skipped></testcase>
<testcase name="[It] External Storage [Driver: carina.storage.io] [Testpattern: Dynamic PV (xfs)] [Slow] provisioning should provision storage with pvc data source" classname="x" status="failed" time="3"><failure message="boom"></failure></testcase>
<testcase name="[It] External Storage [Driver: other.example.com] [Testpattern: Dynamic PV (ext4)] volumes should store data" classname="x" status="passed" time="1"></testcase>
<testcase name="[SynchronizedBeforeSuite]" classname="x" status="passed" time="1"></testcase>
</testsuite></testsuites>"#,
    )
    .expect("write");
    let counts = read_junit(&path).expect("reads");
    assert_eq!(counts["volumes"].passed, 1);
    // The suite's own skip counts with its reason; the focus's does not.
    assert_eq!(counts["volumes"].skipped, 1);
    assert_eq!(
        counts["volumes"].reasons.keys().collect::<Vec<_>>(),
        [r#"Driver "carina.storage.io" does not support X - skipping"#]
    );
    // Tags between the pattern and the suite are not suites.
    assert_eq!(counts["provisioning"].failed, 1);
    assert_eq!(counts.len(), 2);
}

#[test]
fn the_skip_keeps_snapshots_and_xfs_and_leaves_out_what_carina_lacks() {
    let skip = regex::Regex::new(SKIP).expect("valid expression");
    let name = |pattern: &str, test: &str| {
        format!("External Storage [Driver: carina.storage.io] [Testpattern: {pattern}] {test}")
    };
    for (pattern, test) in [
        (
            "Dynamic Snapshot (delete policy)",
            "snapshottable[Feature:VolumeSnapshotDataSource] volume snapshot controller should check snapshot fields, check restore correctly works, check deletion (ephemeral)",
        ),
        (
            "Dynamic PV (default fs)",
            "provisioning should provision storage with snapshot data source [Feature:VolumeSnapshotDataSource]",
        ),
        (
            "Dynamic PV (xfs)",
            "multiVolume [Slow] should concurrently access the volume and its clone from pods on the same node [LinuxOnly] [Feature:VolumeSourceXFS]",
        ),
    ] {
        assert!(!skip.is_match(&name(pattern, test)), "{pattern} {test}");
    }
    for (pattern, test) in [
        (
            "Dynamic PV (default fs)",
            "volume-modify [Feature:VolumeAttributesClass] should create a volume with VAC",
        ),
        (
            "Dynamic Snapshot (delete policy)",
            "volumegroupsnapshottable[Feature:VolumeGroupSnapshotDataSource] VolumeGroupSnapshottable should create snapshots",
        ),
        (
            "Dynamic PV (default fs)",
            "disruptive[Disruptive] [LinuxOnly] Should test that pv written before kubelet restart is readable after restart.",
        ),
        (
            "Dynamic PV (default fs)",
            "provisioning should provision storage with any volume data source [Serial]",
        ),
    ] {
        assert!(skip.is_match(&name(pattern, test)), "{pattern} {test}");
    }
}

#[test]
fn the_sys_resource_skip_names_only_default_fs_growth() {
    let skip = regex::Regex::new(SKIP_WITHOUT_SYS_RESOURCE).expect("valid expression");
    let name = |pattern: &str, test: &str| {
        format!("External Storage [Driver: carina.storage.io] [Testpattern: {pattern}] {test}")
    };
    let expand = "ephemeral should support expansion of pvcs created for ephemeral pvcs";
    for (pattern, test) in [
        (
            "Dynamic PV (default fs)(allowExpansion)",
            "volume-expand Verify if offline PVC expansion works",
        ),
        (
            "Dynamic PV (default fs)(allowExpansion)",
            "volume-expand should resize volume when PVC is edited while pod is using it",
        ),
        (
            "Dynamic PV (default fs)(allowExpansion)",
            "volume-expand should resize volume when PVC is edited and the pod is re-created on the same node after controller resize is finished",
        ),
        (
            "Generic Ephemeral-volume (default fs) (late-binding)",
            expand,
        ),
        (
            "Generic Ephemeral-volume (default fs) (immediate-binding)",
            expand,
        ),
    ] {
        assert!(skip.is_match(&name(pattern, test)), "{pattern} {test}");
    }
    for (pattern, test) in [
        (
            "Dynamic PV (block volmode)(allowExpansion)",
            "volume-expand should resize volume when PVC is edited while pod is using it",
        ),
        (
            "Dynamic PV (default fs)(allowExpansion)",
            "volume-expand should not allow expansion of pvcs without AllowVolumeExpansion property",
        ),
        (
            "Generic Ephemeral-volume (block volmode) (late-binding)",
            expand,
        ),
        (
            "Generic Ephemeral-volume (default fs) (late-binding)",
            "ephemeral should create read/write inline ephemeral volume",
        ),
    ] {
        assert!(!skip.is_match(&name(pattern, test)), "{pattern} {test}");
    }
}

#[test]
fn ginkgos_summary_line_is_read() {
    assert_eq!(
        ran_specs("Ran 13 of 7468 Specs in 402.110 seconds"),
        Some((13, 7468))
    );
    assert_eq!(
        ran_specs("  Ran 0 of 7468 Specs in 0.020 seconds"),
        Some((0, 7468))
    );
    for line in [
        "Ran 13 of 7468 tests",
        "Ran x of 7468 Specs in 1 seconds",
        "Ran 13 of Specs",
        "STEP: Ran the pod",
        "",
    ] {
        assert_eq!(ran_specs(line), None, "{line:?}");
    }
}

#[test]
fn fewer_specs_than_expected_fail() {
    assert!(Expected::Exactly(13).check(13).is_ok());
    let fewer = Expected::Exactly(13).check(12).expect_err("fewer");
    assert!(fewer.to_string().contains("1 did not run"), "{fewer}");
    assert!(Expected::Exactly(13).check(14).is_err(), "more, uncounted");
    assert!(Expected::AtLeast(13).check(15).is_ok());
    assert!(Expected::AtLeast(13).check(12).is_err());
    assert!(Expected::Some.check(0).is_err());
    assert!(Expected::Some.check(1).is_ok());
}
