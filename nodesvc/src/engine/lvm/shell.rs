//! What the node says to `lvm`'s shell and how it reads the answers. Pure
//! functions with unit tests; [`super::runner`] runs the process.
//!
//! `lvm` started without arguments reads one command per line on stdin and
//! runs each in the same process, which saves the start-up of a process per
//! command (program load, `lvm.conf` parsing, library set-up). The shell is
//! made to answer every command, on a pipe of its own, with one JSON
//! object: the *log report* of that command, plus its main report when the
//! command has one (`pvs`):
//!
//! ```text
//! {"report": [{"pvseg": [...]}], "log": [{..., "log_type":"error", "log_message":"..."},
//!   {..., "log_type":"status", "log_context":"shell", "log_object_type":"cmd", "log_ret_code":"5"}]}
//! ```
//!
//! - **Settings.** The shell reads its report settings once, when it
//!   starts, from `lvm.conf` and a command profile; per-command `--config`
//!   cannot turn the log report on. So the node writes its own profile,
//!   [`PROFILE`], as `<profile_dir>/carina-shell.profile` and starts the
//!   shell with `LVM_COMMAND_PROFILE=carina-shell`: JSON output, the
//!   command log report on, every row selected. `LVM_REPORT_FD` points the
//!   reports at a pipe that carries nothing else, so neither a prompt (GNU
//!   readline builds echo `lvm> ` and the input to stdout when stdin is not
//!   a terminal; editline builds do not) nor stray output can get in the
//!   way. `HOME=/dev/null` keeps the shell from writing a history file after
//!   every command.
//! - **Framing.** Commands run one at a time; the answer to a command is
//!   the next complete JSON value on the report pipe ([`take_answer`]).
//!   The shell writes it after the command has finished, so it also marks
//!   the command's end.
//! - **Exit status.** In the shell the log report covers a command's whole
//!   run, and its last row in the `shell` context for the `cmd` object is
//!   the command's status, with lvm's internal return code: 1 is success
//!   (exit status 0 of a process), anything else is the exit status the
//!   same command would have had as a process (5: failed, 3: bad command
//!   line, 2: no such command). This is the status `lvm` itself computes,
//!   not a guess from the text ([`outcome`]).
//! - **stderr.** The error and warning rows of the log report, in order,
//!   are what a process would have printed on stderr, and stand in for it
//!   in errors (`` `lvm lvcreate ...` failed (lvm shell status 5): Volume
//!   group "vg" has insufficient free space ...``). Anything the shell
//!   still prints on its real stderr (messages outside the log report's
//!   coverage) while a command runs is added after them.
//! - **What the shell cannot say.** Its line splitter knows no escapes: an
//!   argument is bare, or wholly in `"..."` or `'...'` without that quote
//!   inside, lines end at a newline, and a line of 64 words or more is
//!   refused without an answer. [`line`] says `None` for such a command,
//!   which then runs as a process of its own.

use std::ffi::OsString;
use std::path::PathBuf;

use carina_sys::command::{CommandError, Output};
use serde::{Deserialize, Deserializer};

/// The command profile the shell is started with (`LVM_COMMAND_PROFILE`).
pub(super) const PROFILE_NAME: &str = "carina-shell";

/// The text of `<profile_dir>/carina-shell.profile`.
pub(super) const PROFILE: &str = r#"# Written by carina-node, rewritten when it differs: the settings of its
# persistent lvm shell (LVM_COMMAND_PROFILE=carina-shell), which reads each
# command's outcome from the command's log report.
report {
	output_format="json"
}
log {
	report_command_log=1
	command_log_selection="all"
	command_log_sort="log_seq_num"
	command_log_cols="log_seq_num,log_type,log_context,log_object_type,log_object_name,log_message,log_errno,log_ret_code"
}
"#;

/// The most words the shell takes on one line (its `MAX_ARGS` is 64 and a
/// line that reaches it is refused without an answer).
const MAX_WORDS: usize = 63;

/// Words the shell acts on itself instead of running an lvm command: no
/// status row (`lastlog`) or no answer at all (`exit`, `quit`).
const SHELL_WORDS: &[&str] = &["exit", "quit", "lastlog"];

/// The shell line that runs `lvm <args>`, or `None` when the shell cannot
/// say it (see the module header).
pub(super) fn line(args: &[OsString]) -> Option<String> {
    if args.is_empty() || args.len() > MAX_WORDS {
        return None;
    }
    let mut line = String::new();
    for (i, arg) in args.iter().enumerate() {
        let arg = arg.to_str()?;
        if i == 0 && (SHELL_WORDS.contains(&arg) || arg == "lvm") {
            return None;
        }
        if i > 0 {
            line.push(' ');
        }
        line.push_str(&word(arg)?);
    }
    Some(line)
}

/// One argument as the shell's splitter reads it back unchanged.
fn word(arg: &str) -> Option<String> {
    if arg.contains(['\n', '\r', '\0']) {
        return None;
    }
    let bare = !arg.is_empty()
        && !arg.starts_with(['"', '\'', '#'])
        && !arg.chars().any(|c| c.is_ascii_whitespace() || c == '\x0b');
    if bare {
        Some(arg.to_string())
    } else if !arg.contains('"') {
        Some(format!("\"{arg}\""))
    } else if !arg.contains('\'') {
        Some(format!("'{arg}'"))
    } else {
        None
    }
}

/// One command's answer: its main report, if it has one, and its log.
#[derive(Debug, Deserialize)]
pub(super) struct Answer {
    #[serde(default)]
    report: Option<serde_json::Value>,
    #[serde(default)]
    log: Vec<LogRow>,
}

#[derive(Debug, Deserialize)]
struct LogRow {
    #[serde(default)]
    log_type: String,
    #[serde(default)]
    log_context: String,
    #[serde(default)]
    log_object_type: String,
    #[serde(default)]
    log_message: String,
    #[serde(default, deserialize_with = "number")]
    log_ret_code: i64,
}

/// A number lvm writes as a string (`"5"`, `output_format=json`) or as a
/// number (`json_std`).
fn number<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Num {
        N(i64),
        S(String),
    }
    match Num::deserialize(d)? {
        Num::N(n) => Ok(n),
        Num::S(s) => s.trim().parse().map_err(serde::de::Error::custom),
    }
}

/// Takes the next complete answer off the front of `buf` (the bytes read
/// from the report pipe so far): `Ok(None)` while it is incomplete, an
/// error when the bytes are not an answer at all.
pub(super) fn take_answer(buf: &mut Vec<u8>) -> Result<Option<Answer>, serde_json::Error> {
    let Some(start) = buf.iter().position(|b| !b.is_ascii_whitespace()) else {
        buf.clear();
        return Ok(None);
    };
    // An answer ends in `}`: parse only then, not on every piece read.
    if buf.iter().rev().find(|b| !b.is_ascii_whitespace()) != Some(&b'}') {
        return Ok(None);
    }
    let mut values = serde_json::Deserializer::from_slice(&buf[start..]).into_iter::<Answer>();
    match values.next() {
        Some(Ok(answer)) => {
            let end = start + values.byte_offset();
            buf.drain(..end);
            Ok(Some(answer))
        }
        Some(Err(e)) if e.is_eof() => Ok(None),
        Some(Err(e)) => Err(e),
        None => Ok(None),
    }
}

/// lvm's return code of success (`ECMD_PROCESSED`); any other code is the
/// exit status of the same command run as a process.
const ECMD_PROCESSED: i64 = 1;

/// What the command `command` (its line, for errors) did, from its answer
/// and what the shell printed on its real stderr meanwhile: the output a
/// process would have given, or the error it would have been.
pub(super) fn outcome(answer: Answer, command: &str, stderr: &str) -> Result<Output, CommandError> {
    let status = answer
        .log
        .iter()
        .rev()
        .find(|r| r.log_type == "status" && r.log_context == "shell" && r.log_object_type == "cmd")
        .map(|r| r.log_ret_code);
    let mut errors: Vec<&str> = answer
        .log
        .iter()
        .filter(|r| r.log_type == "error" || r.log_type == "warn")
        .map(|r| r.log_message.as_str())
        .collect();
    if !stderr.trim().is_empty() {
        errors.push(stderr.trim());
    }
    let stderr = errors.join("\n");
    let stdout = match answer.report {
        Some(report) => serde_json::json!({ "report": report }).to_string(),
        None => answer
            .log
            .iter()
            .filter(|r| r.log_type == "print")
            .map(|r| format!("{}\n", r.log_message))
            .collect(),
    };
    match status {
        Some(ECMD_PROCESSED) => Ok(Output { stdout, stderr }),
        Some(code) => Err(CommandError::Failed {
            command: command.to_string(),
            status: format!("lvm shell status {code}"),
            code: i32::try_from(code).ok(),
            stderr,
        }),
        None => Err(CommandError::Failed {
            command: command.to_string(),
            status: "no status in the lvm shell's log report".to_string(),
            code: None,
            stderr,
        }),
    }
}

/// The profile directory from `lvm config --typeconfig full
/// config/profile_dir` (`profile_dir="/etc/lvm/profile"`).
pub(super) fn parse_profile_dir(stdout: &str) -> Option<PathBuf> {
    stdout.lines().find_map(|l| {
        let value = l.trim().strip_prefix("profile_dir=")?;
        let path = value.trim().trim_matches('"');
        (!path.is_empty()).then(|| PathBuf::from(path))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// Whatever the report pipe delivers, taking answers off it never
        /// panics, and each answer taken shortens what is left.
        #[test]
        fn answers_are_taken_from_any_bytes(
            bytes in proptest::prelude::prop_oneof![
                proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300),
                carina_sys::testkit::mutated_bytes(br#"{"log": [{"log_seq_num": "1", "log_type": "status", "log_context": "shell", "log_object_type": "cmd", "log_object_name": "", "log_object_id": "", "log_object_group": "", "log_object_group_id": "", "log_message": "success", "log_errno": "0", "log_ret_code": "1"}]}"#),
            ],
        ) {
            let mut buf = bytes;
            for _ in 0..8 {
                let before = buf.len();
                match take_answer(&mut buf) {
                    Ok(Some(_)) => proptest::prop_assert!(buf.len() < before),
                    Ok(None) | Err(_) => break,
                }
            }
        }

        /// `lvm config` output of any text gives no profile directory or
        /// a non-empty one that a `profile_dir=` line of the text holds.
        #[test]
        fn profile_dir_from_any_text(
            text in proptest::prelude::prop_oneof![
                carina_sys::testkit::noisy_text(),
                carina_sys::testkit::mutated_text("profile_dir=\"/etc/lvm/profile\"\n"),
            ],
        ) {
            if let Some(dir) = parse_profile_dir(&text) {
                let dir = dir.to_str().expect("text in, text out").to_string();
                proptest::prop_assert!(!dir.is_empty());
                proptest::prop_assert!(
                    text.lines().any(|l| l.trim().starts_with("profile_dir=") && l.contains(&dir)),
                    "{:?} from {:?}", dir, text
                );
            }
        }

        /// Any argument list either becomes one shell line or is refused.
        #[test]
        fn any_arguments_make_a_line_or_none(words in proptest::collection::vec(".{0,20}", 1..6)) {
            let argv: Vec<OsString> = words.iter().map(OsString::from).collect();
            if let Some(l) = line(&argv) {
                proptest::prop_assert!(!l.contains('\n'));
            }
        }
    }

    fn args(words: &[&str]) -> Vec<OsString> {
        words.iter().map(OsString::from).collect()
    }

    /// lvm's `lvm_split`, as the shell reads a line back into words.
    fn split(line: &str) -> Vec<String> {
        let b = line.as_bytes();
        let (mut i, mut out) = (0, Vec::new());
        loop {
            while i < b.len() && b[i].is_ascii_whitespace() {
                i += 1;
            }
            if i >= b.len() || b[i] == b'#' {
                return out;
            }
            let quote = (b[i] == b'"' || b[i] == b'\'').then(|| {
                i += 1;
                b[i - 1]
            });
            let start = i;
            while i < b.len() && quote.map_or(!b[i].is_ascii_whitespace(), |q| b[i] != q) {
                i += 1;
            }
            out.push(line[start..i].to_string());
            i += 1;
        }
    }

    #[test]
    fn lines_read_back_as_the_same_words() {
        let config = r#"devices{obtain_device_list_from_udev=0 filter=["a|^/dev/loop3$|","r|.*|"]} activation{udev_sync=0}"#;
        for words in [
            vec![
                "lvcreate",
                "--config",
                config,
                "-n",
                "v",
                "vg",
                "/dev/loop3:0-2",
            ],
            vec!["pvs", "-S", "vg_name=a b", "", "#x", "it's", "\"q\""],
            vec!["lvs", "carina.storage.io/owner=carina", "tab\there"],
        ] {
            let l = line(&args(&words)).expect("sayable");
            assert_eq!(split(&l), words, "{l}");
        }
        let l = line(&args(&["lvcreate", "--config", config])).expect("sayable");
        assert!(l.contains(&format!("'{config}'")), "{l}");
    }

    #[test]
    fn what_the_shell_cannot_say_is_refused() {
        assert_eq!(line(&[]), None);
        assert_eq!(
            line(&args(&["lvs", "a\"b'c d"])),
            None,
            "both quotes and a space"
        );
        assert_eq!(
            line(&args(&["lvs", "a\nb"])),
            None,
            "a newline ends the line"
        );
        assert_eq!(line(&args(&["exit"])), None);
        assert_eq!(line(&args(&["lastlog"])), None);
        assert_eq!(
            line(&args(&["lvm", "lvs"])),
            None,
            "the shell strips a leading lvm"
        );
        let many: Vec<String> = (0..63).map(|i| format!("a{i}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        assert!(line(&args(&many)).is_some(), "63 words fit");
        let mut more = many.clone();
        more.push("a63");
        assert_eq!(line(&args(&more)), None, "64 words are refused");
    }

    // Captured from lvm 2.03.16's shell with PROFILE: `pvs --segments`,
    // a failed `lvcreate` and a successful one.
    const PVS: &str = r#"  {
      "report": [
          {
              "pvseg": [
                  {"pv_name":"/dev/loop0", "pe_start":"1048576", "pvseg_start":"0", "pvseg_size":"63", "lv_name":"", "lv_tags":""}
              ]
          }
      ]
      ,
      "log": [
          {"log_seq_num":"1", "log_type":"status", "log_context":"processing", "log_object_type":"pv", "log_object_name":"/dev/loop0", "log_message":"success", "log_errno":"0", "log_ret_code":"1"},
          {"log_seq_num":"4", "log_type":"status", "log_context":"shell", "log_object_type":"cmd", "log_object_name":"pvs", "log_message":"success", "log_errno":"0", "log_ret_code":"1"}
      ]
  }
"#;
    const FAILED: &str = r#"  {
      "log": [
          {"log_seq_num":"1", "log_type":"warn", "log_context":"shell", "log_object_type":"cmd", "log_object_name":"lvcreate", "log_message":"WARNING: Activation disabled. No device-mapper interaction will be attempted.", "log_errno":"0", "log_ret_code":"0"},
          {"log_seq_num":"2", "log_type":"error", "log_context":"processing", "log_object_type":"vg", "log_object_name":"xshvg", "log_message":"Volume group \"xshvg\" has insufficient free space (60 extents): 3000 required.", "log_errno":"-1", "log_ret_code":"0"},
          {"log_seq_num":"3", "log_type":"status", "log_context":"processing", "log_object_type":"vg", "log_object_name":"xshvg", "log_message":"failure", "log_errno":"-1", "log_ret_code":"5"},
          {"log_seq_num":"4", "log_type":"status", "log_context":"shell", "log_object_type":"cmd", "log_object_name":"lvcreate", "log_message":"failure", "log_errno":"0", "log_ret_code":"5"}
      ]
  }
"#;
    const CREATED: &str = r#"  {
      "log": [
          {"log_seq_num":"1", "log_type":"warn", "log_context":"shell", "log_object_type":"cmd", "log_object_name":"lvcreate", "log_message":"WARNING: Activation disabled. No device-mapper interaction will be attempted.", "log_errno":"0", "log_ret_code":"0"},
          {"log_seq_num":"3", "log_type":"print", "log_context":"processing", "log_object_type":"vg", "log_object_name":"xshvg", "log_message":"Logical volume \"v1\" created.", "log_errno":"0", "log_ret_code":"0"},
          {"log_seq_num":"4", "log_type":"status", "log_context":"processing", "log_object_type":"vg", "log_object_name":"xshvg", "log_message":"success", "log_errno":"0", "log_ret_code":"1"},
          {"log_seq_num":"5", "log_type":"status", "log_context":"shell", "log_object_type":"cmd", "log_object_name":"lvcreate", "log_message":"success", "log_errno":"0", "log_ret_code":"1"}
      ]
  }
"#;

    #[test]
    fn answers_are_cut_from_the_stream_however_it_arrives() {
        let stream = format!("{PVS}{FAILED}{CREATED}");
        for piece in [1, 7, 64, stream.len()] {
            let mut buf = Vec::new();
            let mut answers = Vec::new();
            for chunk in stream.as_bytes().chunks(piece) {
                buf.extend_from_slice(chunk);
                while let Some(a) = take_answer(&mut buf).expect("valid") {
                    answers.push(a);
                }
            }
            assert_eq!(answers.len(), 3, "pieces of {piece}");
            assert!(answers[0].report.is_some());
            assert!(buf.iter().all(u8::is_ascii_whitespace));
        }
    }

    #[test]
    fn garbage_on_the_report_pipe_is_an_error() {
        let mut buf = b"lvm> }".to_vec();
        assert!(take_answer(&mut buf).is_err());
        let mut empty = b"  \n".to_vec();
        assert!(take_answer(&mut empty).expect("blank").is_none());
        assert!(empty.is_empty());
    }

    fn answer(text: &str) -> Answer {
        take_answer(&mut text.as_bytes().to_vec())
            .expect("valid")
            .expect("complete")
    }

    #[test]
    fn success_gives_the_report_as_a_process_prints_it() {
        let out = outcome(answer(PVS), "lvm pvs", "").expect("success");
        let v: serde_json::Value = serde_json::from_str(&out.stdout).expect("json");
        assert_eq!(v["report"][0]["pvseg"][0]["pv_name"], "/dev/loop0");
        assert!(v.get("log").is_none());
        let created = outcome(answer(CREATED), "lvm lvcreate", "").expect("success");
        assert_eq!(created.stdout, "Logical volume \"v1\" created.\n");
        assert!(created.stderr.starts_with("WARNING: Activation disabled"));
    }

    #[test]
    fn failure_names_the_command_its_status_and_messages() {
        let e = outcome(answer(FAILED), "lvm lvcreate -n v2 xshvg", "  stray line\n")
            .expect_err("failed");
        assert_eq!(e.exit_code(), Some(5));
        assert_eq!(
            e.stderr(),
            "WARNING: Activation disabled. No device-mapper interaction will be attempted.\n\
             Volume group \"xshvg\" has insufficient free space (60 extents): 3000 required.\n\
             stray line"
        );
        let text = e.to_string();
        assert!(
            text.starts_with("`lvm lvcreate -n v2 xshvg` failed (lvm shell status 5): WARNING"),
            "{text}"
        );
    }

    #[test]
    fn an_answer_without_a_status_is_a_failure() {
        let e = outcome(answer(r#"{"log": []}"#), "lvm x", "").expect_err("no status");
        assert_eq!(e.exit_code(), None);
        assert!(e.to_string().contains("no status"), "{e}");
        let numeric = r#"{"log": [{"log_type":"status","log_context":"shell","log_object_type":"cmd","log_ret_code":1}]}"#;
        assert!(
            outcome(answer(numeric), "lvm x", "").is_ok(),
            "json_std numbers"
        );
    }

    #[test]
    fn profile_dir_is_read_from_lvm_config() {
        assert_eq!(
            parse_profile_dir("profile_dir=\"/etc/lvm/profile\"\n"),
            Some(PathBuf::from("/etc/lvm/profile"))
        );
        assert_eq!(parse_profile_dir(""), None);
    }
}
