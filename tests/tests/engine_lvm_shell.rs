//! Engine tests of the node's persistent `lvm` shell on real loop devices:
//! volumes made, grown and deleted through it, the same errors as a
//! process per command, a shell killed while idle or mid-command, and a
//! command that hangs past its limit.
//!
//! A command is made to hang by holding the VG's own lock (the `flock` lvm
//! takes on `<locking_dir>/V_<vg>`), so it blocks inside the shell until
//! the lock is released or the shell is killed (or its caller gives up
//! on it). Every wait here is for a
//! state (the shell blocked on the lock, a pid gone), with a generous
//! bound that only turns a hang into a failure.

use std::path::PathBuf;
use std::time::Duration;

use carina_node::engine::lvm::{LvmOptions, LvmRunner, lvm_cmd};
use carina_node::engine::{Engine, Error};
use carina_node::server::status;
use carina_sys::command::CommandError;
use carina_tests::engine::EngineFixture;
use carina_tests::lvmlock::{VgLock, blocked_on_a_lock};
use carina_tests::{lvm, run, wait_until};
use tonic::Code;

const MIB: u64 = 1 << 20;

/// The longest any wait below may take before the test fails.
const PATIENCE: Duration = Duration::from_secs(120);

async fn fixture(test: &str, lvm: LvmOptions) -> Option<EngineFixture> {
    EngineFixture::with_lvm(test, "LVM", &[128 * MIB], 0, lvm).await
}

fn shell_on() -> LvmOptions {
    LvmOptions::default()
}

fn shell_off() -> LvmOptions {
    LvmOptions {
        shell: false,
        ..LvmOptions::default()
    }
}

/// The running shell's pid, checked to be an `lvm` child of this process.
fn shell_pid(engine: &Engine) -> u32 {
    let pid = engine.lvm_shell_pid().expect("an lvm shell runs");
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("the shell's stat");
    // pid (comm) state ppid ...
    let (comm, rest) = stat
        .split_once(") ")
        .map(|(head, rest)| (head.rsplit_once('(').map_or("", |(_, c)| c), rest))
        .expect("stat format");
    assert_eq!(comm, "lvm", "{stat}");
    let ppid: u32 = rest
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("ppid");
    assert_eq!(ppid, std::process::id(), "the shell is our child");
    pid
}

/// Whether `pid` is gone or a zombie (dead, not yet reaped).
fn dead(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state == "Z" || state == "X"),
    }
}

fn kill(pid: u32) {
    run("kill", &["-KILL", &pid.to_string()]).expect("kill the shell");
}

#[tokio::test]
async fn volumes_are_made_grown_and_deleted_through_one_shell() {
    let Some(f) = fixture("shell_lifecycle", shell_on()).await else {
        return;
    };
    let pid = shell_pid(&f.engine);
    let v = f
        .engine
        .create_volume(f.req("vol-a", 8 * MIB))
        .await
        .expect("create");
    assert_eq!(v.size_bytes, 8 * MIB);
    let grown = f
        .engine
        .resize_volume("vol-a", 16 * MIB)
        .await
        .expect("grow");
    assert_eq!(grown.size_bytes, 16 * MIB);
    assert_eq!(f.names().await, ["vol-a"]);
    f.engine.delete_volume("vol-a").await.expect("delete");
    assert!(f.names().await.is_empty());
    assert_eq!(shell_pid(&f.engine), pid, "one shell ran every command");
}

#[tokio::test]
async fn without_the_shell_every_command_is_a_process() {
    let Some(f) = fixture("shell_off", shell_off()).await else {
        return;
    };
    assert_eq!(f.engine.lvm_shell_pid(), None);
    f.engine
        .create_volume(f.req("vol-a", 8 * MIB))
        .await
        .expect("create");
    f.engine
        .resize_volume("vol-a", 12 * MIB)
        .await
        .expect("grow");
    f.engine.delete_volume("vol-a").await.expect("delete");
    assert_eq!(f.engine.lvm_shell_pid(), None);
}

/// An LV removed behind the engine's back: its `lvremove` fails in lvm.
async fn failed_lvremove(lvm_options: LvmOptions, test: &str) -> Option<CommandError> {
    let f = fixture(test, lvm_options).await?;
    let v = f
        .engine
        .create_volume(f.req("gone", 4 * MIB))
        .await
        .expect("create");
    let dev = v.device_path.expect("device");
    run("losetup", &["-d", &dev.to_string_lossy()]).expect("detach");
    let disks: Vec<String> = f.disks.iter().map(|d| d.dev()).collect();
    let disks: Vec<&str> = disks.iter().map(String::as_str).collect();
    lvm(
        &disks,
        &[
            "lvremove",
            "-f",
            "-y",
            "--driverloaded",
            "n",
            &format!("{}/gone", f.group),
        ],
    )
    .expect("remove the LV behind the engine's back");
    match f.engine.delete_volume("gone").await {
        Err(Error::Command(e)) => Some(e),
        other => panic!("delete of a vanished LV: {other:?}"),
    }
}

#[tokio::test]
async fn a_failed_command_names_itself_its_status_and_lvm_messages_as_a_process_does() {
    let Some(shell) = failed_lvremove(shell_on(), "shell_failure").await else {
        return;
    };
    let Some(process) = failed_lvremove(shell_off(), "process_failure").await else {
        return;
    };
    for e in [&shell, &process] {
        assert!(matches!(e, CommandError::Failed { .. }), "{e}");
        assert_eq!(e.exit_code(), Some(5), "{e}");
        let text = e.to_string();
        assert!(text.starts_with("`lvm lvremove --config "), "{text}");
        assert!(
            e.stderr().contains("Failed to find logical volume"),
            "{text}"
        );
    }
    assert!(
        shell.to_string().contains("(lvm shell status 5)"),
        "{shell}"
    );
    assert!(
        process.to_string().contains("(exit status: 5)"),
        "{process}"
    );
}

#[tokio::test]
async fn a_shell_killed_while_idle_is_replaced_without_an_error() {
    let Some(f) = fixture("shell_idle_kill", shell_on()).await else {
        return;
    };
    let old = shell_pid(&f.engine);
    kill(old);
    wait_until("the killed shell is dead", PATIENCE, || dead(old))
        .await
        .expect("the wait");
    f.engine
        .create_volume(f.req("after", 4 * MIB))
        .await
        .expect("create on a new shell");
    let new = shell_pid(&f.engine);
    assert_ne!(new, old);
    f.engine.delete_volume("after").await.expect("delete");
    assert_eq!(shell_pid(&f.engine), new);
}

#[tokio::test]
async fn a_shell_killed_mid_command_fails_it_retryably_and_the_next_runs_on_a_new_one() {
    let Some(f) = fixture("shell_busy_kill", shell_on()).await else {
        return;
    };
    let old = shell_pid(&f.engine);
    let lock = VgLock::exclusive(&f.group);
    let engine = f.engine.clone();
    let req = f.req("vol-k", 4 * MIB);
    let create = tokio::spawn(async move { engine.create_volume(req).await });
    wait_until(
        "lvcreate waits for the VG lock in the shell",
        PATIENCE,
        || blocked_on_a_lock(old),
    )
    .await
    .expect("the wait");
    kill(old);
    let err = create
        .await
        .expect("the create task")
        .expect_err("its shell was killed");
    assert!(
        matches!(err, Error::Command(CommandError::Interrupted { .. })),
        "{err}"
    );
    assert_eq!(status::code(&err), Code::Unavailable, "{err}");
    let text = err.to_string();
    assert!(text.starts_with("`lvm lvcreate "), "{text}");
    assert!(text.contains("exited (signal: 9"), "{text}");
    assert_eq!(f.engine.lvm_shell_pid(), None, "the dead shell is dropped");
    drop(lock);

    // The retry the error asks for works, on a new shell.
    let v = f
        .engine
        .create_volume(f.req("vol-k", 4 * MIB))
        .await
        .expect("retried create");
    assert_eq!(v.size_bytes, 4 * MIB);
    assert_ne!(shell_pid(&f.engine), old);
    f.engine.delete_volume("vol-k").await.expect("delete");
}

#[tokio::test]
async fn a_hung_command_times_out_and_the_next_runs_on_a_new_shell() {
    let timeout = Duration::from_secs(10);
    let Some(f) = fixture(
        "shell_hang",
        LvmOptions {
            timeout,
            ..LvmOptions::default()
        },
    )
    .await
    else {
        return;
    };
    let old = shell_pid(&f.engine);
    let lock = VgLock::exclusive(&f.group);
    let err = f
        .engine
        .create_volume(f.req("vol-h", 4 * MIB))
        .await
        .expect_err("lvcreate cannot get the VG lock");
    assert!(
        matches!(&err, Error::Command(CommandError::TimedOut { timeout: t, .. }) if *t == timeout),
        "{err}"
    );
    assert_eq!(status::code(&err), Code::DeadlineExceeded, "{err}");
    assert!(err.to_string().starts_with("`lvm lvcreate "), "{err}");
    wait_until("the hung shell is killed", PATIENCE, || dead(old))
        .await
        .expect("the wait");
    assert_eq!(f.engine.lvm_shell_pid(), None);
    drop(lock);

    let v = f
        .engine
        .create_volume(f.req("vol-h", 4 * MIB))
        .await
        .expect("create once the lock is free");
    assert_eq!(v.size_bytes, 4 * MIB);
    assert_ne!(shell_pid(&f.engine), old);
    f.engine.delete_volume("vol-h").await.expect("delete");
}

#[tokio::test]
async fn an_abandoned_command_never_lends_its_answer_to_the_next() {
    let Some(f) = fixture("shell_abandoned", shell_on()).await else {
        return;
    };
    // A runner of its own on the fixture's VG, so the engine's cache is
    // not involved.
    let runner = LvmRunner::new(LvmOptions::default());
    let devices: Vec<PathBuf> = f.disks.iter().map(|d| d.path.clone()).collect();
    let loop_mode = !f.engine.device_mapper();
    let lvm_of = |sub: &str| {
        let cmd = lvm_cmd(sub, &devices);
        if loop_mode && sub == "lvcreate" {
            cmd.args(["--driverloaded", "n"])
        } else {
            cmd
        }
    };
    let pvs = || lvm_of("pvs").args(["--reportformat", "json", "-o", "pv_name,vg_name"]);
    runner.run(pvs()).await.expect("pvs starts the shell");
    let pid = runner.shell_pid().expect("a shell runs");

    let lock = VgLock::exclusive(&f.group);
    let create = runner.run(lvm_of("lvcreate").args([
        "-q",
        "-an",
        "-Zn",
        "-Wn",
        "-l",
        "1",
        "-n",
        "abandoned",
        &f.group,
    ]));
    tokio::select! {
        r = create => panic!("lvcreate cannot finish while the VG is locked: {r:?}"),
        waited = wait_until("lvcreate waits for the VG lock", PATIENCE, || blocked_on_a_lock(pid)) => waited.expect("the wait"),
    }
    // Its caller is gone; the lvcreate goes on once the lock is free.
    drop(lock);

    let out = runner
        .run(pvs())
        .await
        .expect("pvs after the abandoned command");
    let report: serde_json::Value = serde_json::from_str(&out.stdout).expect("a JSON report");
    assert_eq!(
        report["report"][0]["pv"][0]["vg_name"], f.group,
        "pvs got its own answer: {}",
        out.stdout
    );
}
