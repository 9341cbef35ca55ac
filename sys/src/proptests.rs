//! Property tests: every parser of host output takes arbitrary input,
//! and valid samples with a few edits, without panicking; what it accepts
//! is well formed.

use proptest::prelude::*;

use crate::testkit::{mutated_text, noisy_text};
use crate::{format, loopdev, mount};

const MOUNTINFO: &str = "\
22 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw,errors=remount-ro
42 22 0:40 /sub /mnt/with\\040space rw,relatime shared:22 master:3 - tmpfs tmp\\040fs rw,size=1024k
";

const LOSETUP: &str = r#"{"loopdevices": [
  {"name": "/dev/loop0", "sizelimit": 0, "offset": 0, "autoclear": false, "ro": false,
   "back-file": "/var/lib/disk.img", "dio": false, "log-sec": 512}
]}"#;

const BLKID: &str = "DEVNAME=/dev/loop3\nUUID=0f6c\nBLOCK_SIZE=4096\nTYPE=ext4\nPTTYPE=gpt\n";

proptest! {
    #[test]
    fn mountinfo_takes_anything(text in prop_oneof![noisy_text(), mutated_text(MOUNTINFO)]) {
        if let Ok(entries) = mount::parse_mountinfo(&text) {
            prop_assert!(entries.len() <= text.lines().count());
        }
        let _ = mount::unescape(&text);
    }

    #[test]
    fn mountinfo_fields_in_any_number(fields in prop::collection::vec("[^ \n]{0,12}", 0..16)) {
        let _ = mount::parse_mountinfo(&fields.join(" "));
    }

    #[test]
    fn losetup_json_takes_anything(text in prop_oneof![noisy_text(), mutated_text(LOSETUP)]) {
        let _ = loopdev::parse_losetup(&text);
    }

    #[test]
    fn blkid_export_takes_anything(text in prop_oneof![noisy_text(), mutated_text(BLKID)]) {
        let _ = format::parse_blkid_export(&text);
    }
}
