//! Every manifest under `deploy/` is a valid object for a real
//! kube-apiserver: each document is applied with a server-side dry run
//! (schema, defaulting and validation run; nothing is stored).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use carina_tests::have_root;
use carina_tests::kube::KubeCluster;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::{Discovery, Scope};

fn manifests(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
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
    let discovery = Discovery::new(client.clone()).run().await?;
    let deploy = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy");
    let mut files = Vec::new();
    manifests(&deploy, &mut files)?;
    files.sort();
    let mut applied = 0;
    let mut failures = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file)?;
        for (i, doc) in serde_yaml::Deserializer::from_str(&text).enumerate() {
            let value = serde_yaml::Value::deserialize_from(doc)
                .with_context(|| format!("{} document {i}", file.display()))?;
            if value.is_null() {
                continue;
            }
            let obj: DynamicObject = serde_yaml::from_value(value)
                .with_context(|| format!("{} document {i}", file.display()))?;
            // KubeSchedulerConfiguration and friends are files for a
            // program, not API objects.
            let Some(types) = obj.types.clone() else {
                continue;
            };
            let gvk = GroupVersionKind::try_from(&types)?;
            if gvk.group.ends_with(".config.k8s.io") {
                continue;
            }
            let Some((resource, caps)) = discovery.resolve_gvk(&gvk) else {
                failures.push(format!("{}: unknown kind {gvk:?}", file.display()));
                continue;
            };
            let name = obj.metadata.name.clone().context("object without a name")?;
            let api: Api<DynamicObject> = match caps.scope {
                Scope::Namespaced => {
                    let ns = obj
                        .metadata
                        .namespace
                        .clone()
                        .unwrap_or_else(|| "default".into());
                    Api::namespaced_with(client.clone(), &ns, &resource)
                }
                Scope::Cluster => Api::all_with(client.clone(), &resource),
            };
            let params = PatchParams::apply("carina-manifest-test").dry_run();
            match api.patch(&name, &params, &Patch::Apply(&obj)).await {
                Ok(_) => applied += 1,
                Err(e) => failures.push(format!("{} {}/{name}: {e}", file.display(), gvk.kind)),
            }
        }
    }
    if !failures.is_empty() {
        bail!("manifests the API server refuses:\n{}", failures.join("\n"));
    }
    assert!(applied >= 10, "only {applied} objects found under deploy/");
    Ok(())
}

/// `serde_yaml`'s multi-document iterator yields deserializers; this turns
/// one into a value.
trait FromDocument {
    fn deserialize_from(doc: serde_yaml::Deserializer<'_>) -> Result<serde_yaml::Value>;
}

impl FromDocument for serde_yaml::Value {
    fn deserialize_from(doc: serde_yaml::Deserializer<'_>) -> Result<serde_yaml::Value> {
        use serde::Deserialize;
        Ok(serde_yaml::Value::deserialize(doc)?)
    }
}
