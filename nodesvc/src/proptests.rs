//! Property tests of the node's parsers and validators: `config.json`,
//! lvm, lsblk, blkid and sfdisk output, on-disk GPT, mountinfo, cgroup
//! throttle files and pod directories, bcache's superblock report and
//! sysfs attributes, names and sizes, carinactl's sizes and timeouts,
//! page tokens. Each takes arbitrary input and valid
//! samples with a few edits without panicking, and what it accepts is
//! consistent. (Parsers private to a module have theirs beside them.)

use std::io::Write;

use carina_sys::testkit::{mutated_bytes, mutated_text, noisy_text};
use proptest::prelude::*;

use crate::cli::{args, size};
use crate::engine::bcache::sysfs::{self, DevNum};
use crate::engine::bcache::{CacheMode, tools};
use crate::engine::config::Config;
use crate::engine::iolimits::cgroup::{self, Limits};
use crate::engine::{disks, gpt, lvm, names, quota};
use crate::server::convert;

const CONFIG: &str = r#"{
  "diskSelector": [
    {"name": "carina-vg-ssd", "re": ["^/dev/vd[b-z]$"], "policy": "LVM", "nodeLabel": "kubernetes.io/hostname", "reserve": "10Gi"},
    {"name": "carina-raw-hdd", "re": ["sd+"], "policy": "RAW", "nodeLabel": "carina.storage.io/raw-disks"},
    {"name": "carina-host", "re": ["/opt/carina-hostpath"], "policy": "HOST"}
  ],
  "diskScanInterval": "300",
  "schedulerStrategy": "spreadout"
}"#;
const CONFIG_V09: &str = r#"{"diskSelector": ["loop*", "vd*"], "diskGroupPolicy": "type"}"#;
const PVSEGS: &str = include_str!("engine/testdata/pvs_segments.json");
const LSBLK: &str = include_str!("engine/testdata/lsblk.json");
const SFDISK: &str = include_str!("engine/testdata/sfdisk.json");
const GPT_512: &[u8] = include_bytes!("engine/testdata/gpt-512.bin");
const BLKID: &str = "DEVNAME=/dev/vdb\nPTUUID=5e0f\nPTTYPE=gpt\nTYPE=LVM2_member\n";
const MOUNTINFO: &str = "\
22 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw,errors=remount-ro
40 22 259:5 / /data rw,noatime shared:20 - xfs /dev/nvme1n1 rw,attr2,inode64,prjquota
41 40 259:6 / /data/ext rw,relatime shared:21 master:3 - ext4 /dev/nvme2n1 rw,prjquota
";
const IO_MAX: &str = "8:16 rbps=1048576 wbps=max riops=max wiops=120\n259:0 rbps=max wbps=2097152 riops=10 wiops=max\n";
const THROTTLE_V1: &str = "8:16 1048576\n259:0 2097152\n";
/// `bcache-super-show` of a backing device (bcache-tools 1.0.8).
const SUPER_SHOW: &str = "sb.magic\t\tok
sb.first_sector\t\t8 [match]
sb.csum\t\t\tBBB400679917FAC5 [match]
sb.version\t\t1 [backing device]

dev.label\t\t(empty)
dev.uuid\t\tfe041ed5-9818-48fc-aa0e-0071d44369dc
dev.data.cache_mode\t0 [writethrough]

cset.uuid\t\t3f1c1b9e-1d2e-4a11-9c1d-2a1b3c4d5e6f
";

/// Whether `name` keeps the rules [`names`] states: 1 to `max` bytes of
/// ASCII letters, digits, `.`, `_`, `-`, `+`, not starting with `-` or `.`.
fn keeps_name_rules(name: &str, max: usize) -> bool {
    !name.is_empty()
        && name.len() <= max
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-+".contains(&b))
        && !name.starts_with(['-', '.'])
        && !name.starts_with("snapshot")
        && !name.starts_with("pvmove")
}

fn any_limits() -> impl Strategy<Value = Limits> {
    (any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(r, w, ri, wi)| Limits {
        read_bps: r,
        write_bps: w,
        read_iops: ri,
        write_iops: wi,
    })
}

proptest! {
    #[test]
    fn config_json_takes_anything(
        text in prop_oneof![noisy_text(), mutated_text(CONFIG), mutated_text(CONFIG_V09)]
    ) {
        if let Ok(config) = Config::from_json(&text) {
            // Accepted groups have names the engine accepts.
            for g in &config.groups {
                prop_assert!(names::check_group_name(&g.name).is_ok(), "{:?}", g.name);
            }
        }
    }

    #[test]
    fn lvm_reports_take_anything(text in prop_oneof![noisy_text(), mutated_text(PVSEGS)]) {
        let _ = lvm::parse_pvsegs(&text);
        let _ = lvm::parse_pv_vgs(&text);
    }

    #[test]
    fn lsblk_and_blkid_take_anything(
        json in prop_oneof![noisy_text(), mutated_text(LSBLK)],
        export in prop_oneof![noisy_text(), mutated_text(BLKID)],
    ) {
        let _ = disks::parse_lsblk(&json);
        let _ = disks::parse_blkid_export(&export);
        let _ = disks::parse_maj_min(&export);
    }

    #[test]
    fn sfdisk_json_takes_anything(text in prop_oneof![noisy_text(), mutated_text(SFDISK)]) {
        let _ = gpt::parse_sfdisk(&text);
    }

    /// The whole read of a disk's GPT, from a file holding a damaged copy
    /// of a real one: no panic, no allocation past the bound.
    #[test]
    fn on_disk_gpt_takes_damaged_disks(bytes in mutated_bytes(GPT_512)) {
        let mut file = tempfile::tempfile().expect("a temporary file");
        file.write_all(&bytes).expect("write");
        let _ = gpt::ondisk::read_from(&file, 512);
        let _ = gpt::ondisk::parse_header(&bytes, 512);
    }

    #[test]
    fn names_take_anything(
        name in prop_oneof![noisy_text(), "[a-z0-9.-]{0,80}", "pvc-[0-9a-f-]{0,64}", "[a-zA-Z0-9._+-]{90,110}"]
    ) {
        // What is accepted keeps the stated rules.
        if names::check_volume_name(&name).is_ok() {
            prop_assert!(keeps_name_rules(&name, names::MAX_VOLUME_NAME), "{:?}", name);
        }
        if names::check_group_name(&name).is_ok() {
            prop_assert!(keeps_name_rules(&name, 64), "{:?}", name);
        }
        // And a refusal is an INVALID_ARGUMENT naming the field.
        if let Err(e) = names::check_volume_name_field("source", &name) {
            prop_assert!(e.to_string().contains("source"), "{}", e);
        }
    }

    /// Sizes from 1 to 2^63-1 bytes are accepted, others refused.
    #[test]
    fn sizes_are_checked_against_int64(size in prop_oneof![any::<u64>(), Just(0u64), Just(i64::MAX as u64), Just(i64::MAX as u64 + 1)]) {
        prop_assert_eq!(names::check_size("capacity", size).is_ok(), size > 0 && size <= i64::MAX as u64);
    }

    /// Mountinfo of any text gives at most a mount per line, the same as
    /// the host parser reads, and each takes the mount lookups.
    #[test]
    fn quota_mountinfo_takes_anything(
        text in prop_oneof![noisy_text(), mutated_text(MOUNTINFO)],
        path in prop_oneof![noisy_text(), "/data(/ext)?(/[a-z]{1,4})?"],
    ) {
        let mounts = quota::parse_mountinfo(&text);
        prop_assert!(mounts.len() <= text.lines().count());
        for m in &mounts {
            if let Some(e) = quota::enforcement_of(m) {
                prop_assert_eq!(&e.mount_point, &m.mount_point);
            }
        }
        if let Some(m) = quota::mount_of(&mounts, std::path::Path::new(&path)) {
            prop_assert!(std::path::Path::new(&path).starts_with(&m.mount_point));
        }
    }

    /// Throttle files of any text are read or refused, never a panic.
    #[test]
    fn cgroup_throttle_files_take_anything(
        text in prop_oneof![noisy_text(), mutated_text(IO_MAX), mutated_text(THROTTLE_V1)],
    ) {
        if let Ok(all) = cgroup::parse_v2(&text) {
            prop_assert!(all.len() <= text.lines().count());
        }
        if let Ok(all) = cgroup::parse_v1(&text) {
            prop_assert!(all.len() <= text.lines().count());
        }
    }

    /// What the engine writes to `io.max` reads back as the same limits
    /// (`max`, no limit, is 0 both ways), and a v1 line as its value.
    #[test]
    fn io_max_lines_round_trip(major in any::<u32>(), minor in any::<u32>(), limits in any_limits()) {
        let line = cgroup::format_v2((major, minor), &limits);
        let read = cgroup::parse_v2(&line).expect("our own line");
        prop_assert_eq!(read.get(&(major, minor)), Some(&limits));
        prop_assert_eq!(read.len(), 1);
        let v1 = cgroup::parse_v1(&format!("{major}:{minor} {}", limits.read_bps)).expect("a v1 line");
        prop_assert_eq!(v1, vec![((major, minor), limits.read_bps)]);
    }

    /// A pod UID read from a cgroup directory name is a valid UID.
    #[test]
    fn pod_uids_from_any_directory_name(
        name in prop_oneof![
            noisy_text(),
            "pod[0-9a-f_-]{0,40}",
            "kubepods(-burstable|-besteffort)?-pod[0-9a-f_./-]{0,40}\\.slice",
        ],
    ) {
        if let Some(uid) = cgroup::pod_uid_of(&name) {
            prop_assert!(cgroup::valid_uid(&uid), "{:?} from {:?}", uid, name);
            prop_assert!(uid.len() <= 128 && !uid.contains(['/', '.', '_']));
        }
    }

    /// `bcache-super-show` output of any text: a superblock only when the
    /// text says the magic is good, with the UUIDs it shows.
    #[test]
    fn bcache_super_show_takes_anything(text in prop_oneof![noisy_text(), mutated_text(SUPER_SHOW)]) {
        if let Some(sb) = tools::parse_super_show(&text) {
            prop_assert!(text.lines().any(|l| l.starts_with("sb.magic") && l.ends_with("ok")));
            prop_assert!(text.contains(&sb.dev_uuid) && text.contains(&sb.cset_uuid));
            if let Some(mode) = sb.cache_mode {
                let bracketed = format!("[{mode}]");
                prop_assert!(text.contains(&bracketed));
            }
        }
    }

    /// A UUID is taken as a cache-set UUID only in its 8-4-4-4-12 form.
    #[test]
    fn bcache_uuids_of_any_text(
        text in prop_oneof![noisy_text(), mutated_text("3f1c1b9e-1d2e-4a11-9c1d-2a1b3c4d5e6f")],
    ) {
        if tools::is_uuid(&text) {
            prop_assert_eq!(text.len(), 36);
            for (i, b) in text.bytes().enumerate() {
                let dash = matches!(i, 8 | 13 | 18 | 23);
                prop_assert!(if dash { b == b'-' } else { b.is_ascii_hexdigit() }, "{:?}", text);
            }
        }
    }

    /// bcache's sysfs attributes of any text; a mode read is the one in
    /// brackets, a device number reads back.
    #[test]
    fn bcache_sysfs_attributes_take_anything(
        text in prop_oneof![noisy_text(), mutated_text("writethrough [writeback] writearound none"), "[0-9]{0,12}:[0-9]{0,12}"],
    ) {
        if let Some(mode) = sysfs::parse_cache_mode(&text) {
            let bracketed = format!("[{mode}]");
            prop_assert!(text.contains(&bracketed));
            prop_assert_eq!(CacheMode::from_kernel(mode.as_str()), Some(mode));
        }
        if let Some(DevNum { major, minor }) = sysfs::parse_devnum(&text) {
            let back = format!("{major}:{minor}");
            prop_assert_eq!(sysfs::parse_devnum(&back), Some(DevNum { major, minor }));
        }
        let _ = sysfs::parse_human_bytes(&text);
    }

    /// A size as bcache prints it (`12.5M`) is read as bytes, tenths
    /// included; sizes past u64 are refused.
    #[test]
    fn bcache_human_sizes(
        whole in prop_oneof![0u64..100_000, any::<u64>()],
        tenth in 0u64..10,
        unit in 0usize..9,
        noise in noisy_text(),
    ) {
        let units = ["", "k", "M", "G", "T", "P", "E", "Z", "Y"];
        let text = format!("{whole}.{tenth}{}", units[unit]);
        let unit_bytes = 1u128 << (10 * unit);
        // Z and Y, units past u64, are refused whatever the number.
        let want = (unit_bytes <= u128::from(u64::MAX))
            .then(|| u128::from(whole) * unit_bytes + u128::from(tenth) * unit_bytes / 10)
            .filter(|w| *w <= u128::from(u64::MAX));
        prop_assert_eq!(sysfs::parse_human_bytes(&text).map(u128::from), want, "{}", text);
        let _ = sysfs::parse_human_bytes(&format!("{whole}{noise}"));
    }

    #[test]
    fn carinactl_sizes_and_timeouts_take_anything(
        text in prop_oneof![noisy_text(), "[0-9]{1,25}(\\.[0-9]{0,4})?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E|B|b)?", "[0-9]{1,22}(ms|s|m|h)?"]
    ) {
        let _ = size::parse_size(&text);
        let _ = args::parse_timeout(&text);
    }

    #[test]
    fn page_tokens_take_anything(token in noisy_text()) {
        let _ = convert::parse_page_token(&token);
    }
}
