//! The `lvm` command line: a builder that confines every command to the
//! group's own disks and turns off udev, the `pvs` report the backend
//! reads, the `lvcreate`/`lvextend` extent ranges for contiguous
//! allocation, and the mapping of `lvcreate` failures. Pure functions; the
//! commands run in [`super::group`].

use std::path::{Path, PathBuf};

use carina_sys::command::{Cmd, CommandError};

use crate::engine::error::Error;

/// The tag on every LV (and VG) we create; list and delete see nothing else.
pub const OWNER_TAG: &str = "carina.storage.io/owner=carina";

/// An `lvm` command that sees only `devices`.
pub fn lvm_cmd(subcommand: &str, devices: &[PathBuf]) -> Cmd {
    Cmd::new("lvm")
        .arg(subcommand)
        .arg("--config")
        .arg(lvm_config(devices))
        .env("LVM_SUPPRESS_FD_WARNINGS", "1")
}

/// `--config` text: accept only `devices`, no udev.
pub fn lvm_config(devices: &[PathBuf]) -> String {
    let mut filter: Vec<String> = devices
        .iter()
        .map(|d| format!("\"a|^{}$|\"", regex::escape(&d.to_string_lossy())))
        .collect();
    filter.push("\"r|.*|\"".to_string());
    format!(
        "devices{{obtain_device_list_from_udev=0 filter=[{}]}} activation{{udev_sync=0 udev_rules=0}}",
        filter.join(",")
    )
}

const REPORT_FIELDS: &str = "pv_name,pe_start,pv_size,dev_size,pvseg_start,pvseg_size,lv_name,lv_tags,lv_size,vg_name,vg_extent_size,vg_size,vg_free,vg_tags";

/// Arguments of `pvs` for the whole picture of VG `vg` (parsed by
/// [`super::report::parse_pvsegs`]).
pub(super) fn pvsegs_args(vg: &str) -> Vec<String> {
    [
        "--segments",
        "--reportformat",
        "json",
        "--units",
        "b",
        "--nosuffix",
        "-o",
        REPORT_FIELDS,
        "-S",
    ]
    .into_iter()
    .map(str::to_string)
    .chain([format!("vg_name={vg}")])
    .collect()
}

/// The PV extent range `pv:first-last` of `extents` extents from `start`,
/// as `lvcreate`/`lvextend` take it to allocate exactly there.
pub(super) fn extent_range(pv: &Path, start: u64, extents: u64) -> String {
    format!("{}:{}-{}", pv.display(), start, start + extents - 1)
}

/// Maps an `lvcreate`/`lvextend` failure: lack of space is its own kind.
pub(super) fn map_lvcreate_error(e: CommandError, exhausted: impl FnOnce() -> Error) -> Error {
    let stderr = e.stderr();
    if stderr.contains("Insufficient free space") || stderr.contains("Insufficient suitable") {
        exhausted()
    } else {
        Error::Command(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_filters_only_our_devices() {
        let c = lvm_config(&[PathBuf::from("/dev/loop3")]);
        assert!(c.contains(r#"filter=["a|^/dev/loop3$|","r|.*|"]"#), "{c}");
        assert!(c.contains("udev_sync=0"));
    }

    #[test]
    fn insufficient_space_is_exhaustion() {
        let e = CommandError::Failed {
            command: "lvm lvcreate".into(),
            status: "exit status: 5".into(),
            code: Some(5),
            stderr: "Insufficient suitable contiguous allocatable extents for logical volume x: 25 more required".into(),
        };
        let mapped = map_lvcreate_error(e, || Error::ResourceExhausted {
            group: "g".into(),
            requested_bytes: 1,
            allocatable_bytes: 0,
        });
        assert!(matches!(mapped, Error::ResourceExhausted { .. }));
        let other = CommandError::Failed {
            command: "lvm".into(),
            status: "5".into(),
            code: Some(5),
            stderr: "boom".into(),
        };
        assert!(matches!(
            map_lvcreate_error(other, || unreachable!()),
            Error::Command(_)
        ));
    }

    #[test]
    fn pvs_reads_one_vg_and_ranges_name_first_and_last_extent() {
        let args = pvsegs_args("tvg");
        assert_eq!(args.first().map(String::as_str), Some("--segments"));
        assert_eq!(args[args.len() - 2..], ["-S", "vg_name=tvg"]);
        assert!(args.iter().any(|a| a == REPORT_FIELDS));
        assert_eq!(
            extent_range(Path::new("/dev/loop0"), 50, 10),
            "/dev/loop0:50-59"
        );
    }
}
