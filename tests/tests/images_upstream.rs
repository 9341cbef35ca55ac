//! The images a test node runs besides Carina's own, from
//! `tests/tools/build.sh test-images` (pause, busybox, the CSI sidecars
//! the chart names and kube-scheduler for its second scheduler), taken as
//! a node's containerd takes them: each archive imports under the
//! reference and manifest digest `images.tsv` states, and runs with runc.
//! busybox runs a shell; pause stays up until SIGTERM and then exits 0;
//! each sidecar prints its version, and so does kube-scheduler run by
//! name, as the chart runs it.
//!
//! Needs root and runc (`make deps`); containerd and the archives come from
//! `tests/tools/build.sh containerd test-images`.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use carina_tests::containerd::{Containerd, containerd_binary, import};
use carina_tests::{have_root, run, unique};

/// One row of `images.tsv`: archive file, reference, manifest digest.
#[derive(Debug)]
struct TestImage {
    file: String,
    reference: String,
    digest: String,
}

/// The test-images tool's folder, as `build.sh --print-path` names it
/// (its name carries a digest of the images' inputs).
fn images_dir() -> Result<PathBuf> {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tools/build.sh");
    let script = script.to_str().context("UTF-8 path")?;
    let dir = PathBuf::from(run(script, &["--print-path", "test-images"])?.trim());
    ensure!(
        dir.join("images.tsv").exists(),
        "{} has no images.tsv: run tests/tools/build.sh test-images",
        dir.display()
    );
    Ok(dir)
}

fn read_images(dir: &std::path::Path) -> Result<Vec<TestImage>> {
    let text = std::fs::read_to_string(dir.join("images.tsv"))?;
    let mut images = Vec::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let [file, reference, digest] = line.split('\t').collect::<Vec<_>>()[..] else {
            bail!("images.tsv: unexpected row {line:?}");
        };
        images.push(TestImage {
            file: file.to_string(),
            reference: reference.to_string(),
            digest: digest.to_string(),
        });
    }
    Ok(images)
}

/// A child process killed if the test ends before it does.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// `ctr run` puts each container in the cgroup `/<namespace>/<id>` of
/// every hierarchy; runc removes the container's own, the namespace's
/// stays. Removed on drop, also when the test fails.
struct NamespaceCgroup(String);

impl Drop for NamespaceCgroup {
    fn drop(&mut self) {
        if let Err(e) = carina_tests::local::host::remove_cgroup(&self.0) {
            eprintln!("removing the cgroup /{}: {e:#}", self.0);
        }
    }
}

/// The status column of `ctr task ls` for task `id` (RUNNING, STOPPED...).
fn task_status(containerd: &mut Containerd, ns: &str, id: &str) -> Result<Option<String>> {
    let listing = containerd.ctr(ns, &["tasks", "ls"])?;
    Ok(listing.lines().skip(1).find_map(|l| {
        let cols: Vec<&str> = l.split_whitespace().collect();
        (cols.first() == Some(&id)).then(|| cols.get(2).unwrap_or(&"").to_string())
    }))
}

fn wait_status(containerd: &mut Containerd, ns: &str, id: &str, want: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status = task_status(containerd, ns, id)?;
        if status.as_deref() == Some(want) {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "task {id}: status {status:?}, want {want}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn test_images_import_and_run() -> Result<()> {
    if !have_root("test_images_import_and_run") {
        return Ok(());
    }
    let dir = images_dir()?;
    let images = read_images(&dir)?;
    let files: Vec<&str> = images.iter().map(|i| i.file.as_str()).collect();
    assert_eq!(
        files,
        [
            "pause.oci.tar",
            "busybox.oci.tar",
            "csi-provisioner.oci.tar",
            "csi-resizer.oci.tar",
            "csi-snapshotter.oci.tar",
            "kube-scheduler.oci.tar"
        ]
    );
    let reference = |file: &str| -> String {
        images
            .iter()
            .find(|i| i.file == file)
            .map(|i| i.reference.clone())
            .unwrap_or_default()
    };
    // The names a node asks for: containerd's sandbox image, the e2e
    // suite's busybox, the chart's sidecars.
    assert_eq!(reference("pause.oci.tar"), "registry.k8s.io/pause:3.10.2");
    assert!(
        reference("busybox.oci.tar").starts_with("registry.k8s.io/e2e-test-images/busybox:"),
        "{images:?}"
    );

    let mut containerd = Containerd::start()?;
    let ns = unique("test-images");
    let _cgroup = NamespaceCgroup(ns.clone());
    for image in &images {
        let listed = import(&mut containerd, &ns, &dir.join(&image.file))?;
        assert!(
            listed.contains(&(image.reference.clone(), image.digest.clone())),
            "{}: containerd lists {listed:?}, want {} at {}",
            image.file,
            image.reference,
            image.digest
        );
    }

    // busybox: a shell and its applets.
    let busybox = reference("busybox.oci.tar");
    let id = unique("busybox");
    let out = containerd.ctr(
        &ns,
        &[
            "run",
            "--rm",
            &busybox,
            &id,
            "/bin/sh",
            "-c",
            "echo ok; id -u; ls /bin/mount /usr/bin/sha256sum >/dev/null && echo applets",
        ],
    )?;
    assert_eq!(
        out.split_whitespace().collect::<Vec<_>>(),
        ["ok", "0", "applets"],
        "busybox said: {out}"
    );

    // pause: stays up until SIGTERM, then exits 0 (`ctr run` in the
    // foreground exits with the task's status).
    let pause = reference("pause.oci.tar");
    let id = unique("pause");
    let socket = containerd.socket().to_path_buf();
    let mut ctr_run = KillOnDrop(
        Command::new(containerd_binary("ctr")?)
            .arg("-a")
            .arg(&socket)
            .args(["-n", &ns, "run", "--rm", &pause, &id])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("start ctr run")?,
    );
    wait_status(&mut containerd, &ns, &id, "RUNNING")?;
    std::thread::sleep(Duration::from_millis(500));
    ensure!(
        ctr_run.0.try_wait()?.is_none(),
        "pause must keep running until a signal"
    );
    containerd.ctr(&ns, &["tasks", "kill", "--signal", "SIGTERM", &id])?;
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = ctr_run.0.try_wait()? {
            break status;
        }
        ensure!(Instant::now() < deadline, "pause ignored SIGTERM");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success(), "pause on SIGTERM: {status}");

    // The sidecars report the versions their references name.
    for name in ["csi-provisioner", "csi-resizer", "csi-snapshotter"] {
        let image = reference(&format!("{name}.oci.tar"));
        let version = image.rsplit(':').next().unwrap_or_default().to_string();
        let id = unique(name);
        let out = containerd.ctr(
            &ns,
            &["run", "--rm", &image, &id, &format!("/{name}"), "--version"],
        )?;
        assert!(out.contains(&version), "{name} --version: {out}");
    }

    // kube-scheduler runs by name from PATH, as the chart's pod runs it.
    let image = reference("kube-scheduler.oci.tar");
    let version = image.rsplit(':').next().unwrap_or_default().to_string();
    let id = unique("kube-scheduler");
    let out = containerd.ctr(
        &ns,
        &["run", "--rm", &image, &id, "kube-scheduler", "--version"],
    )?;
    assert!(out.contains(&version), "kube-scheduler --version: {out}");
    Ok(())
}
