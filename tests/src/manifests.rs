//! Kubernetes manifests under test: the Helm chart rendered by a real
//! `helm` (from `tests/tools/build.sh helm`), multi-document YAML split
//! into objects, and a server-side dry run of each object against a real
//! kube-apiserver (schema, defaulting, validation and admission run;
//! nothing is stored).
//!
//! ```ignore
//! let chart = Chart::new()?;
//! let yaml = chart.template("kube-system", Some(values_yaml))?;
//! let report = dry_run(&cluster.client(), &yaml, "default values").await?;
//! report.ok()?;
//! ```

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use kube::Client;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::{Discovery, Scope};
use serde::Deserialize;

use crate::process::upstream_tool;

/// Field manager of the dry runs.
const FIELD_MANAGER: &str = "carina-manifest-test";

/// The release name the chart is rendered with (object names do not
/// depend on it).
pub const RELEASE: &str = "carina";

/// The repository's root (the parent of `tests/`).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// `helm`, from `tests/tools/build.sh helm` (or `CARINA_HELM`).
pub fn helm_binary() -> Result<PathBuf> {
    upstream_tool("CARINA_HELM", "helm-v3.21.4", "helm")
}

/// The chart `deploy/helm/carina` and a `helm` whose configuration, cache
/// and data directories are private to this value (removed on drop), so
/// nothing is read from or written to the user's home.
#[derive(Debug)]
pub struct Chart {
    helm: PathBuf,
    dir: PathBuf,
    home: tempfile::TempDir,
}

/// What a `helm` run printed.
#[derive(Debug)]
pub struct HelmOutput {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

impl Chart {
    pub fn new() -> Result<Chart> {
        Ok(Chart {
            helm: helm_binary()?,
            dir: repo_root().join("deploy/helm/carina"),
            home: tempfile::Builder::new().prefix("carina-helm-").tempdir()?,
        })
    }

    /// The chart's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The `helm` binary.
    pub fn helm(&self) -> &Path {
        &self.helm
    }

    /// Environment for `helm` runs: private home directories.
    pub fn env(&self) -> Vec<(String, PathBuf)> {
        let home = self.home.path();
        vec![
            ("HELM_CONFIG_HOME".into(), home.join("config")),
            ("HELM_CACHE_HOME".into(), home.join("cache")),
            ("HELM_DATA_HOME".into(), home.join("data")),
        ]
    }

    /// Runs `helm <args...>` with `values` (YAML, if any) as a values file
    /// appended as `-f`; returns what it printed, failed or not.
    pub fn run(&self, args: &[&str], values: Option<&str>) -> Result<HelmOutput> {
        let mut cmd = Command::new(&self.helm);
        cmd.args(args);
        if let Some(values) = values {
            let file = self
                .home
                .path()
                .join(format!("{}.yaml", crate::unique("values")));
            std::fs::write(&file, values)?;
            cmd.arg("-f").arg(file);
        }
        for (k, v) in self.env() {
            cmd.env(k, v);
        }
        let out = cmd
            .output()
            .with_context(|| format!("run {}", self.helm.display()))?;
        Ok(HelmOutput {
            success: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }

    /// `helm template` of the chart into `namespace` with `values`; fails
    /// with helm's message when helm refuses.
    pub fn template(&self, namespace: &str, values: Option<&str>) -> Result<String> {
        let dir = self.dir.to_string_lossy().into_owned();
        let out = self.run(
            &["template", RELEASE, &dir, "--namespace", namespace],
            values,
        )?;
        if !out.success {
            bail!("helm template refused: {}{}", out.stderr, out.stdout);
        }
        Ok(out.stdout)
    }

    /// `helm lint --strict` of the chart with `values`; fails with helm's
    /// report when it finds anything.
    pub fn lint(&self, namespace: &str, values: Option<&str>) -> Result<String> {
        let dir = self.dir.to_string_lossy().into_owned();
        let out = self.run(
            &["lint", "--strict", &dir, "--namespace", namespace],
            values,
        )?;
        if !out.success {
            bail!("helm lint failed:\n{}{}", out.stdout, out.stderr);
        }
        Ok(out.stdout)
    }
}

/// The objects of a multi-document YAML text (empty and comment-only
/// documents skipped).
pub fn objects(yaml: &str) -> Result<Vec<serde_json::Value>> {
    let mut out = Vec::new();
    for (i, doc) in serde_yaml::Deserializer::from_str(yaml).enumerate() {
        let value = serde_json::Value::deserialize(doc).with_context(|| format!("document {i}"))?;
        if !value.is_null() {
            out.push(value);
        }
    }
    Ok(out)
}

/// The one object of `kind` named `name`.
pub fn find<'a>(
    objects: &'a [serde_json::Value],
    kind: &str,
    name: &str,
) -> Result<&'a serde_json::Value> {
    let found: Vec<_> = objects
        .iter()
        .filter(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .collect();
    match found[..] {
        [one] => Ok(one),
        [] => bail!("no {kind} {name}"),
        _ => bail!("{} objects {kind} {name}", found.len()),
    }
}

/// The outcome of a dry run: objects the server accepted, and one line per
/// refusal.
#[derive(Debug, Default)]
pub struct DryRun {
    pub applied: usize,
    pub skipped: Vec<String>,
    pub failures: Vec<String>,
}

impl DryRun {
    /// Fails, listing every refusal, unless the server accepted all.
    pub fn ok(&self) -> Result<()> {
        if !self.failures.is_empty() {
            bail!(
                "objects the API server refuses:\n{}",
                self.failures.join("\n")
            );
        }
        Ok(())
    }
}

/// Applies every object of `yaml` by server-side apply with
/// `dryRun=All`, each to its own namespace (`default` when it names
/// none). Documents that are files for a program rather than API objects
/// (`*.config.k8s.io` kinds) are skipped. `source` names the text in
/// failure lines.
pub async fn dry_run(client: &Client, yaml: &str, source: &str) -> Result<DryRun> {
    let discovery = Discovery::new(client.clone()).run().await?;
    let mut report = DryRun::default();
    for (i, value) in objects(yaml)
        .with_context(|| source.to_string())?
        .into_iter()
        .enumerate()
    {
        let obj: DynamicObject = serde_json::from_value(value)
            .with_context(|| format!("{source}: object {i} is not a Kubernetes object"))?;
        let Some(types) = obj.types.clone() else {
            bail!("{source}: object {i} has no apiVersion/kind");
        };
        let gvk = GroupVersionKind::try_from(&types)?;
        if gvk.group.ends_with(".config.k8s.io") {
            report.skipped.push(format!("{}/{}", gvk.group, gvk.kind));
            continue;
        }
        let name = obj
            .metadata
            .name
            .clone()
            .with_context(|| format!("{source}: a {} without a name", gvk.kind))?;
        let Some((resource, caps)) = discovery.resolve_gvk(&gvk) else {
            report.failures.push(format!(
                "{source} {}/{name}: unknown kind {gvk:?}",
                gvk.kind
            ));
            continue;
        };
        let api: Api<DynamicObject> = match caps.scope {
            Scope::Namespaced => {
                let ns = obj.metadata.namespace.as_deref().unwrap_or("default");
                Api::namespaced_with(client.clone(), ns, &resource)
            }
            Scope::Cluster => Api::all_with(client.clone(), &resource),
        };
        let params = PatchParams::apply(FIELD_MANAGER).dry_run();
        match api.patch(&name, &params, &Patch::Apply(&obj)).await {
            Ok(_) => report.applied += 1,
            Err(e) => report
                .failures
                .push(format!("{source} {}/{name}: {e}", gvk.kind)),
        }
    }
    Ok(report)
}
