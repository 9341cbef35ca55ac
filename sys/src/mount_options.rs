//! Mount options a caller passes through (a StorageClass's
//! `mountOptions`, arriving as CSI `mount_flags`): which are refused, and
//! which of them a bind mount can carry.
//!
//! A flag may hold several options separated by commas, as `mount -o`
//! reads them. Refused are the options that change what is mounted or
//! where rather than how: `bind`/`rbind`/`move`/`remount` (the node
//! decides those), `loop` and its `offset`/`sizelimit` (a file as a
//! device), `helper` (another program), the `user`/`owner`/`group`
//! family (mounts by unprivileged users) and util-linux's `X-mount.*`
//! (creates directories, mounts subdirectories, remaps owners). Anything
//! else goes to the kernel, which refuses what it does not know.

/// The longest flag accepted.
pub const MAX_LEN: usize = 256;

/// Options the node sets itself or that would mount something else.
const REFUSED: &[&str] = &[
    "bind",
    "rbind",
    "move",
    "rmove",
    "remount",
    "loop",
    "offset",
    "sizelimit",
    "encryption",
    "helper",
    "user",
    "users",
    "nouser",
    "owner",
    "group",
];

/// Options a bind mount takes per mount point (`mount -o
/// remount,bind,...`); the rest belong to the filesystem and were set when
/// it was mounted.
const PER_MOUNT: &[&str] = &[
    "ro",
    "rw",
    "nosuid",
    "suid",
    "nodev",
    "dev",
    "noexec",
    "exec",
    "noatime",
    "atime",
    "nodiratime",
    "diratime",
    "relatime",
    "norelatime",
    "strictatime",
    "nostrictatime",
    "nosymfollow",
    "symfollow",
];

/// Checks one flag (one or more comma-separated options); the error says
/// which option and why.
pub fn check(flag: &str) -> Result<(), String> {
    if flag.len() > MAX_LEN {
        return Err(format!("is {} bytes; at most {MAX_LEN}", flag.len()));
    }
    for option in flag.split(',') {
        if option.is_empty() {
            return Err(format!("{flag:?} holds an empty option"));
        }
        if let Some(c) = option
            .chars()
            .find(|c| c.is_whitespace() || c.is_control() || !c.is_ascii())
        {
            return Err(format!("option {option:?} holds {c:?}"));
        }
        let name = option.split_once('=').map_or(option, |(n, _)| n);
        if REFUSED.contains(&name) || name.starts_with("X-mount.") || name.starts_with("x-mount.") {
            return Err(format!(
                "option {name:?} is refused: it changes what is mounted or who may mount it, which the node decides"
            ));
        }
    }
    Ok(())
}

/// The options of `flags` a bind mount applies per mount point, in order.
pub fn per_mount(flags: &[String]) -> Vec<String> {
    flags
        .iter()
        .flat_map(|f| f.split(','))
        .filter(|o| PER_MOUNT.contains(o))
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn takes_filesystem_and_mount_options() {
        for flag in [
            "noatime",
            "discard",
            "data=ordered,errors=remount-ro",
            "nouuid",
            "context=\"system_u:object_r:container_file_t:s0\"",
            "commit=60",
        ] {
            check(flag).unwrap_or_else(|e| panic!("{flag}: {e}"));
        }
    }

    #[test]
    fn refuses_what_changes_the_mount_itself() {
        for (flag, says) in [
            ("bind", "\"bind\" is refused"),
            ("noatime,rbind", "\"rbind\" is refused"),
            ("loop=/dev/loop7", "\"loop\" is refused"),
            ("offset=4096", "\"offset\" is refused"),
            ("X-mount.mkdir", "\"X-mount.mkdir\" is refused"),
            ("X-mount.subdir=etc", "is refused"),
            ("helper=evil", "\"helper\" is refused"),
            ("users", "\"users\" is refused"),
            ("noatime,,nodev", "holds an empty option"),
            ("no atime", "holds ' '"),
            ("noatime\n", "holds '\\n'"),
            ("é", "holds 'é'"),
        ] {
            let e = check(flag).expect_err(flag);
            assert!(e.contains(says), "{flag:?}: {e}");
        }
        assert!(
            check(&"a".repeat(300))
                .expect_err("long")
                .contains("at most 256")
        );
    }

    #[test]
    fn a_bind_mount_carries_the_per_mount_options() {
        let flags = [
            "noatime,discard".to_string(),
            "ro".into(),
            "data=journal".into(),
        ];
        assert_eq!(per_mount(&flags), ["noatime", "ro"]);
        assert!(per_mount(&["discard".to_string()]).is_empty());
    }

    proptest! {
        /// Whatever a flag holds, an accepted one names no refused option
        /// and holds no blank or control character.
        #[test]
        fn accepted_flags_hold_no_refused_option(flag in "[a-zA-Z.=,/ \n-]{0,30}") {
            if check(&flag).is_ok() {
                for option in flag.split(',') {
                    let name = option.split('=').next().unwrap_or_default();
                    prop_assert!(!option.is_empty());
                    prop_assert!(!REFUSED.contains(&name));
                    prop_assert!(!name.starts_with("X-mount."));
                    prop_assert!(!option.contains([' ', '\n']));
                }
            }
        }
    }
}
