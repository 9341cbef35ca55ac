//! `make images` (hack/images.sh): the three OCI archives are built twice
//! from the same inputs and come out byte for byte the same; each is read
//! back by skopeo (an independent OCI implementation), its manifest digest
//! is the one the summary states, its configuration runs the right
//! program as the right user, and its root file system runs that program:
//! the node's with LVM set up for a container.
//!
//! Needs root, mmdebstrap and skopeo (`make deps`) and the apt sources.
//! Last, containerd (from `tests/tools/build.sh containerd`, run privately)
//! imports each archive and reports the reference and digest we state.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail, ensure};
use carina_tests::containerd::{Containerd, import};
use carina_tests::{have_root, run, unique};
use serde_json::Value;

/// One row of `images.tsv`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Built {
    reference: String,
    manifest_digest: String,
    compressed_bytes: u64,
}

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Runs hack/images.sh into `out` with a fixed time stamp; the binaries
/// are built once into the shared target directory.
fn build_images(out: &Path) -> Result<BTreeMap<String, Built>> {
    let root = repo_root();
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let script = root.join("hack/images.sh");
    let status = std::process::Command::new(&script)
        .arg(out)
        .current_dir(&root)
        .env("SOURCE_DATE_EPOCH", "1700000000")
        .env("IMAGE_TAG", "test")
        .env("IMAGE_BUILD_DIR", target.join("image-build"))
        // Both builds run whole: nothing kept from an earlier one.
        .env_remove("IMAGES_REUSE_KEY")
        .status()
        .with_context(|| format!("run {}", script.display()))?;
    ensure!(status.success(), "{} failed: {status}", script.display());
    let summary = std::fs::read_to_string(out.join("images.tsv"))?;
    let mut built = BTreeMap::new();
    for line in summary.lines().filter(|l| !l.starts_with('#')) {
        let cols: Vec<&str> = line.split('\t').collect();
        let [name, reference, digest, compressed, _uncompressed] = cols[..] else {
            bail!("images.tsv: unexpected row {line:?}");
        };
        built.insert(
            name.to_string(),
            Built {
                reference: reference.to_string(),
                manifest_digest: digest.to_string(),
                compressed_bytes: compressed.parse()?,
            },
        );
    }
    Ok(built)
}

fn sha256_of(path: &Path) -> Result<String> {
    let out = run("sha256sum", &[path.to_str().context("UTF-8 path")?])?;
    Ok(out
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string())
}

fn skopeo_json(args: &[&str]) -> Result<Value> {
    let out = run("skopeo", args)?;
    serde_json::from_str(&out).with_context(|| format!("skopeo {args:?}: {out}"))
}

/// Unpacks the single layer of an archive into `dest` with skopeo's copy
/// into a plain directory, checking every blob's digest on the way.
fn unpack(archive: &Path, dest: &Path) -> Result<()> {
    let layout = dest.with_extension("blobs");
    run(
        "skopeo",
        &[
            "copy",
            "--quiet",
            &format!("oci-archive:{}", archive.display()),
            &format!("dir:{}", layout.display()),
        ],
    )?;
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(layout.join("manifest.json"))?)?;
    let layers = manifest["layers"].as_array().context("layers")?;
    ensure!(layers.len() == 1, "one layer, got {}", layers.len());
    let digest = layers[0]["digest"].as_str().context("layer digest")?;
    let blob = layout.join(digest.trim_start_matches("sha256:"));
    std::fs::create_dir_all(dest)?;
    run(
        "tar",
        &[
            "-xzf",
            blob.to_str().context("UTF-8")?,
            "-C",
            dest.to_str().context("UTF-8")?,
        ],
    )?;
    Ok(())
}

fn in_root(root: &Path, args: &[&str]) -> Result<String> {
    let mut full = vec![root.to_str().context("UTF-8")?];
    full.extend_from_slice(args);
    run("chroot", &full)
}

#[test]
fn images_are_reproducible_and_run() -> Result<()> {
    if !have_root("images_are_reproducible_and_run") {
        return Ok(());
    }
    let tmp = tempfile::tempdir()?;
    let (first, second) = (tmp.path().join("first"), tmp.path().join("second"));
    let built = build_images(&first)?;
    let again = build_images(&second)?;
    let names: Vec<&str> = built.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        ["carina-controller", "carina-node", "carina-scheduler"]
    );
    assert_eq!(built, again, "the same inputs give the same digests");
    for name in built.keys() {
        let file = format!("{name}.oci.tar");
        assert_eq!(
            sha256_of(&first.join(&file))?,
            sha256_of(&second.join(&file))?,
            "{file} differs between two builds"
        );
    }

    for (name, image) in &built {
        let archive = first.join(format!("{name}.oci.tar"));
        let source = format!("oci-archive:{}", archive.display());
        let inspect = skopeo_json(&["inspect", &source])?;
        assert_eq!(inspect["Digest"], image.manifest_digest.as_str(), "{name}");
        assert_eq!(inspect["Os"], "linux");
        assert_eq!(inspect["Architecture"], "amd64");
        assert!(
            image.reference.ends_with(&format!("/{name}:test")),
            "{image:?}"
        );
        let config = skopeo_json(&["inspect", "--config", &source])?;
        let entry = format!("/usr/local/bin/{name}");
        assert_eq!(config["config"]["Entrypoint"], serde_json::json!([entry]));
        let user = if name == "carina-node" { "0" } else { "65532" };
        assert_eq!(config["config"]["User"], user, "{name}");
        assert_eq!(
            config["created"], "2023-11-14T22:13:20Z",
            "time stamp from SOURCE_DATE_EPOCH"
        );
        assert!(image.compressed_bytes > 0);

        let root = tmp.path().join(format!("root-{name}"));
        unpack(&archive, &root)?;
        let binary = std::fs::read(root.join(entry.trim_start_matches('/')))?;
        let checkout = std::fs::canonicalize(repo_root())?;
        let checkout = checkout.to_string_lossy();
        assert!(
            !binary
                .windows(checkout.len())
                .any(|w| w == checkout.as_bytes()),
            "{name} names the checkout {checkout}"
        );
        let help = in_root(&root, &[&entry, "--help"])?;
        assert!(help.contains("Usage"), "{name} --help: {help}");
    }

    // The node's root holds every tool the engine calls, and LVM is set up
    // for a container.
    let node = tmp.path().join("root-carina-node");
    for tool in [
        "lvm",
        "sgdisk",
        "sfdisk",
        "partx",
        "blkid",
        "wipefs",
        "losetup",
        "lsblk",
        "mount",
        "umount",
        "mkfs.ext4",
        "resize2fs",
        "mkfs.xfs",
        "xfs_growfs",
        "xfs_quota",
        "make-bcache",
        "bcache-super-show",
        "carinactl",
    ] {
        in_root(&node, &["/bin/sh", "-c", &format!("command -v {tool}")])
            .with_context(|| format!("{tool} in the node image"))?;
    }
    for (key, want) in [
        ("activation/udev_sync", "udev_sync=0"),
        ("activation/udev_rules", "udev_rules=0"),
        ("activation/monitoring", "monitoring=0"),
        (
            "devices/obtain_device_list_from_udev",
            "obtain_device_list_from_udev=0",
        ),
        ("global/locking_dir", "locking_dir=\"/run/lock/lvm\""),
    ] {
        let got = in_root(&node, &["lvm", "lvmconfig", "--type", "current", key])?;
        assert_eq!(got.trim(), want, "{key}");
    }
    let version = in_root(&node, &["lvm", "version"])?;
    assert!(version.contains("LVM version"), "{version}");

    // containerd takes each archive as it is: the reference from the
    // index's annotation, the manifest digest we state, every blob present.
    let mut containerd = Containerd::start()?;
    let namespace = unique("images");
    for (name, image) in &built {
        let archive = first.join(format!("{name}.oci.tar"));
        let listed = import(&mut containerd, &namespace, &archive)?;
        assert!(
            listed.contains(&(image.reference.clone(), image.manifest_digest.clone())),
            "{name}: containerd lists {listed:?}, want {} at {}",
            image.reference,
            image.manifest_digest
        );
        let filter = format!("name=={}", image.reference);
        let check = containerd.ctr(&namespace, &["images", "check", &filter])?;
        assert!(
            check.contains("complete"),
            "{name}: ctr images check: {check}"
        );
    }
    Ok(())
}
