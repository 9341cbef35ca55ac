//! The images and upstream programs a [`LocalCluster`] runs: the test
//! images of `tests/tools/build.sh`, Carina's own from `make images`, and
//! where each tool's build is kept.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{Context, Result, bail, ensure};

use super::LocalOptions;
use crate::manifests::repo_root;

/// The options of a cluster Carina can be installed into: the test images
/// (pause, busybox, the CSI sidecars) and Carina's own, imported before
/// the kubelet starts.
pub fn local_options() -> Result<LocalOptions> {
    let mut images: Vec<PathBuf> = test_images()?.into_iter().map(|(_, path)| path).collect();
    images.extend(carina_images()?);
    Ok(LocalOptions {
        images,
        extenders: Vec::new(),
    })
}

/// The archives of `tests/tools/build.sh test-images`, with the image
/// reference each provides (from its `images.tsv`).
pub fn test_images() -> Result<Vec<(String, PathBuf)>> {
    images_of_tool("test-images", "CARINA_TEST_IMAGES")
}

/// The archives of `tests/tools/build.sh e2e-images` (agnhost, nginx, ...
/// as the e2e suite names them).
pub fn e2e_images() -> Result<Vec<(String, PathBuf)>> {
    images_of_tool("e2e-images", "CARINA_E2E_IMAGES")
}

/// The archives an image tool of `tests/tools/build.sh` made (or those in
/// the folder `env` names), with the reference each provides.
fn images_of_tool(tool: &str, env: &str) -> Result<Vec<(String, PathBuf)>> {
    let dir = match std::env::var_os(env) {
        Some(dir) => PathBuf::from(dir),
        None => tool_path(tool)?,
    };
    // The tool's folder, or its bin/ folder.
    let tsv = [dir.join("images.tsv"), dir.join("../images.tsv")]
        .into_iter()
        .find(|p| p.exists())
        .with_context(|| {
            format!(
                "no images.tsv in {}: run tests/tools/build.sh {tool} first (or set {env})",
                dir.display()
            )
        })?;
    read_images_tsv(&tsv)
}

/// Where `tests/tools/build.sh` keeps `tool` (`--print-path`; builds
/// nothing).
pub fn tool_path(tool: &str) -> Result<PathBuf> {
    let script = repo_root().join("tests/tools/build.sh");
    let out = std::process::Command::new(&script)
        .args(["--print-path", tool])
        .output()
        .with_context(|| format!("run {}", script.display()))?;
    ensure!(
        out.status.success(),
        "{} --print-path {tool}: {}",
        script.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// `images.tsv`: `<file>\t<reference>` rows beside the archives.
fn read_images_tsv(tsv: &Path) -> Result<Vec<(String, PathBuf)>> {
    let dir = tsv.parent().context("images.tsv without a folder")?;
    let text = std::fs::read_to_string(tsv).with_context(|| format!("read {}", tsv.display()))?;
    let mut out = Vec::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let mut cols = line.split('\t');
        let (Some(file), Some(reference)) = (cols.next(), cols.next()) else {
            bail!("{}: bad row {line:?}", tsv.display());
        };
        let path = dir.join(file);
        ensure!(
            path.exists(),
            "{} lists {file}, which is missing",
            tsv.display()
        );
        out.push((reference.to_string(), path));
    }
    Ok(out)
}

/// Carina's own images, built once per test process by `make images`
/// (hack/images.sh) into `<target>/local-images`; within one run of
/// hack/test.sh (`CARINA_TEST_RUN`), a process keeps the archives an
/// earlier one built from the same binaries.
pub fn carina_images() -> Result<Vec<PathBuf>> {
    static BUILT: OnceLock<Result<Vec<PathBuf>, String>> = OnceLock::new();
    BUILT
        .get_or_init(|| build_carina_images().map_err(|e| format!("{e:#}")))
        .clone()
        .map_err(anyhow::Error::msg)
}

fn build_carina_images() -> Result<Vec<PathBuf>> {
    let root = repo_root();
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let out = target.join("local-images");
    // Test processes building at once take turns.
    let lock = std::fs::File::create(target.join(".local-images.lock"))?;
    lock.lock()?;
    let script = root.join("hack/images.sh");
    let status = std::process::Command::new(&script)
        .arg(&out)
        .current_dir(&root)
        .env("IMAGE_BUILD_DIR", target.join("image-build"))
        .env(
            "IMAGES_REUSE_KEY",
            std::env::var("CARINA_TEST_RUN").unwrap_or_default(),
        )
        .status()
        .with_context(|| format!("run {}", script.display()))?;
    ensure!(status.success(), "{} failed: {status}", script.display());
    let names = ["carina-node", "carina-controller", "carina-scheduler"];
    Ok(names
        .iter()
        .map(|n| out.join(format!("{n}.oci.tar")))
        .collect())
}
