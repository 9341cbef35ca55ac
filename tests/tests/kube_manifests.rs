//! Every manifest under `deploy/` (outside the Helm chart, whose
//! templates `kube_chart.rs` renders and checks) is a valid object for a
//! real kube-apiserver: each document is applied with a server-side dry
//! run (schema, defaulting and validation run; nothing is stored).

use std::path::{Path, PathBuf};

use anyhow::Result;
use carina_tests::have_root;
use carina_tests::kube::KubeCluster;
use carina_tests::manifests::{dry_run, repo_root};

fn manifests(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            // Templates, not manifests.
            if path.file_name().is_some_and(|n| n == "helm") {
                continue;
            }
            manifests(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            out.push(path);
        }
    }
    Ok(())
}

#[tokio::test]
async fn every_deploy_manifest_passes_a_server_side_dry_run() -> Result<()> {
    if !have_root("kube_manifests") {
        return Ok(());
    }
    let cluster = KubeCluster::start().await?;
    cluster.install_crds().await?;
    let client = cluster.client();
    let mut files = Vec::new();
    manifests(&repo_root().join("deploy"), &mut files)?;
    files.sort();
    let mut applied = 0;
    let mut failures = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file)?;
        let report = dry_run(&client, &text, &file.display().to_string()).await?;
        applied += report.applied;
        failures.extend(report.failures);
    }
    assert!(
        failures.is_empty(),
        "manifests the API server refuses:\n{}",
        failures.join("\n")
    );
    assert!(applied >= 10, "only {applied} objects found under deploy/");
    Ok(())
}
