//! The Kubernetes storage e2e suite (`e2e.test` of Kubernetes v1.36.3)
//! against Carina on a real node, with the driver definition in
//! `tests/e2e/carina-driver.yaml`.
//!
//! `e2e_storage_subset` runs in `make test`: the provisioning, volumes and
//! volumeMode suites. `e2e_storage_full` (ignored by default; `make e2e`)
//! runs every External Storage suite for the driver except `[Disruptive]`
//! and `[Feature:...]` tests. Both print a table of ran, passed, failed and
//! skipped tests per suite, keep the JUnit report in the test log folder,
//! and fail if any test failed.
//!
//! Needs root and `tests/tools/build.sh etcd kube kubelet containerd
//! crictl cni helm test-images e2e e2e-images`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, ensure};
use carina_tests::have_root;
use carina_tests::local::LocalCluster;
use carina_tests::local::carina::{Carina, Layout, e2e_images, local_options, tool_path};
use carina_tests::manifests::repo_root;

/// What the suite runs for every test.
const DRIVER_FOCUS: &str = r"External.Storage \[Driver: carina\.storage\.io\]";

/// Tests this one node cannot run: disruptive ones restart the kubelet,
/// `[Feature:...]` ones need cluster features not set up here.
const SKIP: &str = r"\[Disruptive\]|\[Feature:";

/// Counts of one suite.
#[derive(Debug, Default)]
struct Counts {
    passed: usize,
    failed: usize,
    skipped: usize,
    failures: Vec<String>,
}

async fn run_suite(focus: &str, report_name: &str) -> Result<()> {
    let mut options = local_options()?;
    options
        .images
        .extend(e2e_images()?.into_iter().map(|(_, path)| path));
    let mut cluster = LocalCluster::start(options).await?;
    let _carina = Carina::install(&mut cluster, &Layout::e2e()).await?;

    let e2e = tool_path("e2e")?.join("e2e.test");
    let report_dir = cluster.log_dir().join(report_name);
    std::fs::create_dir_all(&report_dir)?;
    let junit = report_dir.join("junit.xml");
    let e2e_dir = repo_root().join("tests/e2e");
    let status = Command::new(&e2e)
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
            format!("--ginkgo.focus={DRIVER_FOCUS}.*({focus})"),
            format!("--ginkgo.skip={SKIP}"),
            format!("--ginkgo.junit-report={}", junit.display()),
            format!("--report-dir={}", report_dir.display()),
            "--ginkgo.timeout=4h".to_string(),
            "--ginkgo.no-color".to_string(),
            "--node-os-distro=debian".to_string(),
            "--minStartupPods=0".to_string(),
        ])
        .status()
        .with_context(|| format!("run {}", e2e.display()))?;
    let counts = read_junit(&junit)?;
    print_table(&counts);
    let failed: Vec<&String> = counts.values().flat_map(|c| &c.failures).collect();
    ensure!(
        failed.is_empty() && status.success(),
        "e2e.test exited {status}; failed: {failed:#?}"
    );
    Ok(())
}

/// Per-suite counts from ginkgo's JUnit report: a test's suite is the word
/// after its `[Testpattern: ...]`.
fn read_junit(path: &Path) -> Result<BTreeMap<String, Counts>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    let mut out: BTreeMap<String, Counts> = BTreeMap::new();
    for case in text.split("<testcase ").skip(1) {
        let name = attribute(case, "name").unwrap_or_default();
        let status = attribute(case, "status").unwrap_or_default();
        let Some(after) = name.split("[Testpattern: ").nth(1) else {
            continue;
        };
        let suite = after
            .split_once("] ")
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .unwrap_or("?")
            .to_string();
        let counts = out.entry(suite).or_default();
        match status.as_str() {
            "passed" => counts.passed += 1,
            "skipped" | "pending" => counts.skipped += 1,
            _ => {
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
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_storage_subset() -> Result<()> {
    if !have_root("e2e_storage_subset") {
        return Ok(());
    }
    run_suite(r"\] provisioning |\] volumes |\] volumeMode ", "e2e-subset").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the whole suite takes long; `make e2e` runs it"]
async fn e2e_storage_full() -> Result<()> {
    if !have_root("e2e_storage_full") {
        return Ok(());
    }
    run_suite(".", "e2e-full").await
}

#[test]
fn junit_cases_are_counted_per_suite() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path: PathBuf = dir.path().join("j.xml");
    std::fs::write(
        &path,
        r#"<testsuites><testsuite name="Kubernetes e2e suite">
<testcase name="[It] External Storage [Driver: carina.storage.io] [Testpattern: Dynamic PV (ext4)] volumes should store data" classname="x" status="passed" time="1"></testcase>
<testcase name="[It] External Storage [Driver: carina.storage.io] [Testpattern: Dynamic PV (block volmode)] volumes should store data" classname="x" status="skipped" time="0"><skipped message="no"></skipped></testcase>
<testcase name="[It] External Storage [Driver: carina.storage.io] [Testpattern: Dynamic PV (xfs)] provisioning should provision storage with pvc data source" classname="x" status="failed" time="3"><failure message="boom"></failure></testcase>
<testcase name="[SynchronizedBeforeSuite]" classname="x" status="passed" time="1"></testcase>
</testsuite></testsuites>"#,
    )
    .expect("write");
    let counts = read_junit(&path).expect("reads");
    assert_eq!(counts["volumes"].passed, 1);
    assert_eq!(counts["volumes"].skipped, 1);
    assert_eq!(counts["provisioning"].failed, 1);
    assert_eq!(counts.len(), 2);
}
