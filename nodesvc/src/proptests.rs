//! Property tests of the node's parsers and validators: `config.json`,
//! lvm, lsblk, blkid and sfdisk output, on-disk GPT, names, carinactl's
//! sizes and timeouts, page tokens. Each takes arbitrary input and valid
//! samples with a few edits without panicking, and what it accepts is
//! consistent. (Parsers private to a module have theirs beside them.)

use std::io::Write;

use carina_sys::testkit::{mutated_bytes, mutated_text, noisy_text};
use proptest::prelude::*;

use crate::cli::{args, size};
use crate::engine::config::Config;
use crate::engine::{disks, gpt, lvm, names};
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
    fn names_take_anything(name in prop_oneof![noisy_text(), "[a-z0-9.-]{0,80}", "pvc-[0-9a-f-]{0,64}"]) {
        if names::check_volume_name(&name).is_ok() {
            prop_assert!(!name.is_empty());
        }
        let _ = names::check_group_name(&name);
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
