//! Property tests: every parser of host output takes arbitrary input,
//! and valid samples with a few edits, without panicking; what it accepts
//! is well formed.

use proptest::prelude::*;

use crate::testkit::{mutated_text, noisy_text};
use crate::{format, loopdev, mount};

/// `text` escaped as the kernel writes a mountinfo field.
fn escape(text: &str) -> String {
    let mut out = String::new();
    for c in text.chars() {
        match c {
            ' ' | '\t' | '\n' | '\\' => out.push_str(&format!("\\{:03o}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

/// Text of any characters, those the kernel escapes often.
fn path_text() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            any::<char>(),
            prop::sample::select(vec![' ', '\t', '\n', '\\', '/'])
        ],
        0..20,
    )
    .prop_map(|c| c.into_iter().collect())
}

/// Options as a list of at least one, without `,` or space.
fn options() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec("[a-z0-9=_.:]{0,8}", 1..4)
}

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

    /// A line as the kernel writes it, paths of any characters escaped,
    /// reads back field for field.
    #[test]
    fn mountinfo_lines_round_trip(
        (id, parent, major, minor) in (any::<u32>(), any::<u32>(), any::<u32>(), any::<u32>()),
        (root, mount_point, source) in (path_text(), path_text(), path_text()),
        optional in prop::collection::vec("(shared|master|propagate_from):[0-9]{1,4}|unbindable", 0..3),
        options in options(),
        fs_type in "[a-z0-9._]{1,12}",
        super_options in options(),
    ) {
        let mut fields = vec![
            id.to_string(),
            parent.to_string(),
            format!("{major}:{minor}"),
            escape(&root),
            escape(&mount_point),
            options.join(","),
        ];
        fields.extend(optional);
        fields.push("-".into());
        fields.extend([fs_type.clone(), escape(&source), super_options.join(",")]);
        let line = fields.join(" ");
        let entries = mount::parse_mountinfo(&line).expect("a kernel line");
        prop_assert_eq!(entries.len(), 1);
        let e = &entries[0];
        prop_assert_eq!((e.id, e.parent, e.major, e.minor), (id, parent, major, minor));
        prop_assert_eq!(e.root.to_str(), Some(root.as_str()));
        prop_assert_eq!(e.mount_point.to_str(), Some(mount_point.as_str()));
        prop_assert_eq!(e.source.to_str(), Some(source.as_str()));
        prop_assert_eq!(&e.options, &options);
        prop_assert_eq!(&e.fs_type, &fs_type);
        prop_assert_eq!(&e.super_options, &super_options);
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
