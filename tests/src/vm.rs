//! The `vm` tier's harness: a stock Debian kernel booted under QEMU (TCG)
//! with device-mapper, bcache and the storage file systems, which this
//! machine's kernel lacks.
//!
//! The guest (`tests/tools/build.sh kernel`: vmlinux and a busybox
//! initramfs carrying this machine's own storage tools, see
//! `tests/vm/build-guest.sh`) mounts a virtio-9p share and runs its
//! `run.sh`. The host side of a test puts its own executable there and has
//! the guest run one `#[ignore]`d test function of it with
//! [`GUEST_ENV`] set; that function drives the node's engine and servers
//! against the guest's real drivers and prints a [`PASS`] line per check.
//! The disks are sparse files attached as virtio-blk, so nothing touches
//! the host's loop devices or LVM.
//!
//! ```ignore
//! let run = Vm::new("storage")?.disk("vda", 1 << 30).guest_test("guest_storage").boot()?;
//! run.assert_passed(&["lvm-create", "lvm-expand"]);
//! ```
//!
//! The verdict is read from the console only: the run passes when it
//! shows `VMTEST done rc=0` and every expected check's pass line. qemu is
//! killed by its PID on drop, also after a panic, and when the time limit
//! runs out.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::process::tools_cache;

/// Set (to `1`) in the guest for the test function the guest runs.
pub const GUEST_ENV: &str = "CARINA_VM_GUEST";
/// The prefix of a check's pass line on the guest's console.
pub const PASS: &str = "VMCHECK pass";
/// The guest's last line: `VMTEST done rc=<exit code of run.sh>`.
pub const DONE: &str = "VMTEST done rc=";

/// Where the guest mounts the host's share.
pub const GUEST_SHARE: &str = "/host";

/// True inside the guest (the test function the host side asked for).
pub fn in_guest() -> bool {
    std::env::var(GUEST_ENV).is_ok_and(|v| v == "1")
}

/// True if `dev` is a block device the device-mapper driver made (its
/// `/sys/dev/block/<major>:<minor>/dm` exists).
pub fn is_device_mapper(dev: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    let Ok(meta) = std::fs::metadata(dev) else {
        return false;
    };
    if !meta.file_type().is_block_device() {
        return false;
    }
    let Ok((major, minor)) = carina_node::engine::devnum::of_path(dev) else {
        return false;
    };
    Path::new(&format!("/sys/dev/block/{major}:{minor}/dm/name")).exists()
}

/// Prints a check's pass line (in the guest), with its time.
pub fn pass(check: &str, started: Instant) {
    println!("{PASS} {check} ({:.1}s)", started.elapsed().as_secs_f64());
}

/// The guest's kernel and initramfs: `CARINA_VM_KERNEL_DIR`, else the dir
/// `tests/tools/build.sh --print-path kernel` names.
pub fn kernel_dir() -> Result<PathBuf> {
    let dir = match std::env::var_os("CARINA_VM_KERNEL_DIR") {
        Some(d) => PathBuf::from(d),
        None => {
            let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tools/build.sh");
            let out = Command::new(&script)
                .args(["--print-path", "kernel"])
                .env("CARINA_TOOLS_CACHE", tools_cache())
                .output()
                .with_context(|| format!("run {}", script.display()))?;
            if !out.status.success() {
                bail!(
                    "{} --print-path kernel: {}",
                    script.display(),
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
            PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
        }
    };
    for f in ["vmlinux", "initrd.cpio"] {
        if !dir.join(f).is_file() {
            bail!(
                "{} not found: run tests/tools/build.sh kernel first",
                dir.join(f).display()
            );
        }
    }
    Ok(dir)
}

/// A guest to boot: its disks, its share and what it runs.
#[derive(Debug)]
pub struct Vm {
    name: String,
    dir: tempfile::TempDir,
    disks: Vec<PathBuf>,
    memory_mib: u32,
    timeout: Duration,
    commands: Vec<String>,
    env: Vec<(String, String)>,
}

impl Vm {
    /// A guest named `name` (in logs) with an empty share.
    pub fn new(name: &str) -> Result<Vm> {
        let dir = tempfile::Builder::new()
            .prefix(&format!("carina-vm-{name}-"))
            .tempdir_in(crate::disk_dir())?;
        std::fs::create_dir_all(dir.path().join("share/lib"))?;
        std::fs::create_dir_all(dir.path().join("share/logs"))?;
        Ok(Vm {
            name: name.to_string(),
            dir,
            disks: Vec::new(),
            memory_mib: 512,
            timeout: Duration::from_secs(600),
            commands: Vec::new(),
            env: Vec::new(),
        })
    }

    /// A sparse virtio disk of `bytes`; the guest sees them in order as
    /// `/dev/vda`, `/dev/vdb`, ...
    pub fn disk(mut self, bytes: u64) -> Result<Vm> {
        let path = self
            .dir
            .path()
            .join(format!("disk{}.raw", self.disks.len()));
        std::fs::File::create(&path)?.set_len(bytes)?;
        self.disks.push(path);
        Ok(self)
    }

    /// The time the whole boot may take before qemu is killed.
    pub fn timeout(mut self, timeout: Duration) -> Vm {
        self.timeout = timeout;
        self
    }

    /// Copies `file` into the share as `name` (executable); the guest
    /// finds it at `/host/<name>`.
    pub fn share_file(self, file: &Path, name: &str) -> Result<Vm> {
        let dest = self.dir.path().join("share").join(name);
        std::fs::copy(file, &dest)
            .with_context(|| format!("copy {} into the share", file.display()))?;
        Ok(self)
    }

    /// The guest's memory (512 MiB unless set).
    pub fn memory_mib(mut self, mib: u32) -> Vm {
        self.memory_mib = mib;
        self
    }

    /// Sets `key=value` in the environment of everything the guest runs.
    pub fn guest_env(mut self, key: &str, value: &str) -> Vm {
        self.env.push((key.to_string(), value.to_string()));
        self
    }

    /// Puts the workspace binary `name` (`carina-node`, ...) into the
    /// share without its debug information, its libraries beside it; the
    /// guest finds it at `/host/<name>`, beside the test executable, where
    /// [`crate::process::workspace_binary`] looks for it.
    pub fn share_binary(self, name: &str) -> Result<Vm> {
        let bin = crate::process::workspace_binary(name)?;
        self.share_stripped(&bin, name)?;
        Ok(self)
    }

    /// Copies `exe` stripped into the share as `name`, and the libraries
    /// it links into the share's `lib`.
    fn share_stripped(&self, exe: &Path, name: &str) -> Result<()> {
        let share = self.dir.path().join("share");
        crate::run(
            "strip",
            &[
                "--strip-debug",
                "-o",
                &share.join(name).to_string_lossy(),
                &exe.to_string_lossy(),
            ],
        )?;
        let ldd = crate::run("ldd", &[&exe.to_string_lossy()])?;
        for lib in ldd.lines().filter_map(|l| {
            let mut f = l.split_whitespace();
            (f.nth(1) == Some("=>")).then(|| f.next()).flatten()
        }) {
            let lib = Path::new(lib);
            if let Some(file) = lib.file_name() {
                std::fs::copy(lib, share.join("lib").join(file))?;
            }
        }
        Ok(())
    }

    /// Has the guest run `test` (exactly, with `--ignored`) of this test
    /// executable with [`GUEST_ENV`] set. The executable goes into the
    /// share without its debug information, its libraries beside it.
    pub fn guest_test(mut self, test: &str) -> Result<Vm> {
        let exe = std::env::current_exe()?;
        self.share_stripped(&exe, "test")?;
        self.commands.push(format!(
            "{GUEST_ENV}=1 LD_LIBRARY_PATH={GUEST_SHARE}/lib CARINA_TEST_LOG_DIR={GUEST_SHARE}/logs \
             RUST_BACKTRACE=1 {GUEST_SHARE}/test --exact {test} --ignored --nocapture --test-threads=1"
        ));
        Ok(self)
    }

    /// Boots the guest, waits until it powers off (or the time limit), and
    /// returns its console.
    pub fn boot(self) -> Result<Console> {
        let kernel = kernel_dir()?;
        let share = self.dir.path().join("share");
        let mut script = String::from("#!/bin/sh\nset -e\n");
        for (k, v) in &self.env {
            script.push_str(&format!("export {k}='{v}'\n"));
        }
        for c in &self.commands {
            script.push_str(c);
            script.push('\n');
        }
        std::fs::write(share.join("run.sh"), script)?;
        crate::run("chmod", &["-R", "a+rx", &share.to_string_lossy()])?;
        let log = crate::test_log_dir().join(format!("vm-{}.console", self.name));
        let out = std::fs::File::create(&log)?;
        let mut args: Vec<String> = [
            "-accel",
            "tcg,tb-size=64",
            "-cpu",
            "max",
            "-smp",
            "1",
            "-nodefaults",
            "-no-user-config",
            "-display",
            "none",
            "-serial",
            "stdio",
            "-monitor",
            "none",
            "-no-reboot",
            "-append",
            "console=ttyS0 panic=-1 quiet loglevel=4",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(["-m".into(), self.memory_mib.to_string()]);
        // qboot starts a PVH kernel faster than SeaBIOS.
        let qboot = Path::new("/usr/share/qemu/qboot.rom");
        if qboot.exists() {
            args.extend(["-bios".into(), qboot.to_string_lossy().into_owned()]);
        }
        args.extend([
            "-kernel".into(),
            kernel.join("vmlinux").to_string_lossy().into_owned(),
            "-initrd".into(),
            kernel.join("initrd.cpio").to_string_lossy().into_owned(),
            "-virtfs".into(),
            format!(
                "local,path={},mount_tag=host,security_model=none,id=host",
                share.display()
            ),
        ]);
        for d in &self.disks {
            args.extend([
                "-drive".into(),
                format!("file={},format=raw,if=virtio,cache=unsafe", d.display()),
            ]);
        }
        let started = Instant::now();
        let child = Command::new("qemu-system-x86_64")
            .args(&args)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .context("start qemu-system-x86_64 (hack/install-deps.sh installs it)")?;
        let mut qemu = Qemu(Some(child));
        let status = qemu.wait(self.timeout)?;
        let text = std::fs::read_to_string(&log)?;
        let console = Console {
            text,
            log,
            seconds: started.elapsed().as_secs_f64(),
        };
        match status {
            Some(s) if s.success() => Ok(console),
            Some(s) => bail!("qemu exited with {s}; console:\n{}", console.text),
            None => bail!(
                "the guest did not power off within {:?}; console:\n{}",
                self.timeout,
                console.text
            ),
        }
    }
}

/// qemu, killed by its PID on drop (also when the test panics).
struct Qemu(Option<Child>);

impl Qemu {
    /// The exit status, or `None` after killing it at `timeout`.
    fn wait(&mut self, timeout: Duration) -> Result<Option<std::process::ExitStatus>> {
        let deadline = Instant::now() + timeout;
        let Some(child) = self.0.as_mut() else {
            bail!("qemu is not running");
        };
        loop {
            if let Some(status) = child.try_wait()? {
                self.0 = None;
                return Ok(Some(status));
            }
            if Instant::now() >= deadline {
                self.kill();
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Qemu {
    fn drop(&mut self) {
        self.kill();
    }
}

/// What the guest printed on its console.
#[derive(Debug)]
pub struct Console {
    pub text: String,
    /// The console's copy in the test-log dir.
    pub log: PathBuf,
    /// From qemu's start to its exit.
    pub seconds: f64,
}

impl Console {
    /// Prints the console (each line marked `guest|`, so nothing in it
    /// reads as this process's own test summary) and panics unless the
    /// guest finished with rc=0 and printed a pass line for every check
    /// of `checks`.
    pub fn assert_passed(&self, checks: &[&str]) {
        for line in self.text.lines() {
            println!("guest| {line}");
        }
        println!("vm: qemu ran {:.1}s", self.seconds);
        let done = self
            .text
            .lines()
            .filter_map(|l| l.trim_end_matches('\r').split(DONE).nth(1))
            .map(|rest| rest.split_whitespace().next().unwrap_or_default())
            .collect::<Vec<_>>();
        assert_eq!(
            done,
            ["0"],
            "the guest did not finish with rc=0 (console: {})",
            self.log.display()
        );
        let passed: Vec<&str> = self
            .text
            .lines()
            // The first may follow the test runner's `test name ... `.
            .filter_map(|l| l.trim_end_matches('\r').split(PASS).nth(1))
            .filter_map(|rest| rest.split_whitespace().next())
            .collect();
        for check in checks {
            assert!(
                passed.contains(check),
                "no pass line for {check} (passed: {passed:?}; console: {})",
                self.log.display()
            );
        }
    }
}
