//! The options a StorageClass may add to `mkfs`: a space-separated list
//! (`-b 4096 -O ^has_journal`, `-i size=512 -m reflink=1`), checked
//! against what each filesystem's mkfs is allowed to be told here.
//!
//! The list is an allowlist, not a blocklist: an option that reads a host
//! path (`mke2fs -d`, `mkfs.xfs -p`, `-c options=`), points the filesystem
//! at another device (`-J device=`, `-l logdev=`, `-r rtdev=`), gives
//! every volume of a class the same UUID (`-U`, `-m uuid=`), moves the
//! filesystem away from the start of the device (`-E offset=`, where the
//! next probe would find the device blank and format it again) or makes
//! no filesystem at all (`-n`, `-N`) is not on it. Values are checked as
//! far as their shape: numbers, feature words, `key=value` sub-options
//! with known keys. Whether mkfs accepts the combination is mkfs's to say
//! when the volume is first staged.

use crate::format::FsType;

/// The longest option list a class may give.
pub const MAX_LEN: usize = 1024;

/// What follows an option letter.
#[derive(Debug, Clone, Copy)]
enum Value {
    /// Nothing: the option stands alone (`-j`, `-K`).
    None,
    /// A number, possibly with a fraction (`-m 0.5`) or a unit (`64k`).
    Number,
    /// A list of words (`-O ^has_journal,quota`, `-T largefile`).
    Words,
    /// One of these words.
    OneOf(&'static [&'static str]),
    /// `key[=value]` sub-options, comma-separated, with keys from the list.
    SubOptions(&'static [&'static str]),
    /// A filesystem label of at most this many bytes.
    Label(usize),
}

/// `mke2fs` (`mkfs.ext4`, `mkfs.ext3`).
const EXT: &[(char, Value)] = &[
    ('b', Value::Number),
    ('C', Value::Number),
    (
        'E',
        Value::SubOptions(&[
            "stride",
            "stripe_width",
            "stripe-width",
            "resize",
            "lazy_itable_init",
            "lazy_journal_init",
            "assume_storage_prezeroed",
            "root_owner",
            "discard",
            "nodiscard",
            "num_backup_sb",
            "packed_meta_blocks",
            "quotatype",
            "encoding",
            "encoding_flags",
            "orphan_file_size",
        ]),
    ),
    ('e', Value::OneOf(&["continue", "remount-ro", "panic"])),
    ('G', Value::Number),
    ('g', Value::Number),
    ('I', Value::Number),
    ('i', Value::Number),
    (
        'J',
        Value::SubOptions(&["size", "fast_commit_size", "location"]),
    ),
    ('j', Value::None),
    ('L', Value::Label(16)),
    ('m', Value::Number),
    ('N', Value::Number),
    ('O', Value::Words),
    ('T', Value::Words),
];

/// `mkfs.xfs`.
const XFS: &[(char, Value)] = &[
    ('b', Value::SubOptions(&["size"])),
    (
        'd',
        Value::SubOptions(&[
            "agcount",
            "agsize",
            "su",
            "sunit",
            "sw",
            "swidth",
            "noalign",
            "extszinherit",
            "cowextsize",
            "concurrency",
        ]),
    ),
    (
        'i',
        Value::SubOptions(&["size", "maxpct", "align", "sparse", "nrext64", "perblock"]),
    ),
    ('K', Value::None),
    (
        'l',
        Value::SubOptions(&[
            "internal",
            "size",
            "version",
            "sunit",
            "su",
            "lazy-count",
            "concurrency",
        ]),
    ),
    ('L', Value::Label(12)),
    (
        'm',
        Value::SubOptions(&[
            "crc",
            "finobt",
            "rmapbt",
            "reflink",
            "bigtime",
            "inobtcount",
        ]),
    ),
    (
        'n',
        Value::SubOptions(&["size", "version", "ftype", "parent"]),
    ),
    ('s', Value::SubOptions(&["size"])),
];

/// Checked options to add to mkfs for one filesystem.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MkfsOptions {
    args: Vec<String>,
}

impl MkfsOptions {
    /// Checks `text` as options for `fs`'s mkfs. The error says which
    /// option or value is refused and why, for the caller to put beside
    /// the field it came from.
    pub fn parse(fs: FsType, text: &str) -> Result<MkfsOptions, String> {
        if text.len() > MAX_LEN {
            return Err(format!("is {} bytes; at most {MAX_LEN}", text.len()));
        }
        if let Some(c) = text
            .chars()
            .find(|c| c.is_control() && !c.is_ascii_whitespace())
        {
            return Err(format!("holds the control character {c:?}"));
        }
        let table = match fs {
            FsType::Ext4 | FsType::Ext3 => EXT,
            FsType::Xfs => XFS,
        };
        let tool = fs.mkfs();
        let mut args = Vec::new();
        let mut words = text.split_ascii_whitespace();
        while let Some(word) = words.next() {
            let letter = option_letter(word).ok_or_else(|| {
                format!("{word:?} is not an option; write each as -X, its value after a space")
            })?;
            let (_, value) = table.iter().find(|(l, _)| *l == letter).ok_or_else(|| {
                format!(
                    "{word} is not an option Carina passes to {tool} (allowed: {})",
                    allowed(table)
                )
            })?;
            args.push(word.to_string());
            if let Value::None = value {
                continue;
            }
            let given = words
                .next()
                .ok_or_else(|| format!("{word} needs a value"))?;
            check_value(*value, given).map_err(|why| format!("{word} {given:?}: {why}"))?;
            args.push(given.to_string());
        }
        Ok(MkfsOptions { args })
    }

    /// The arguments, in the order given.
    pub fn args(&self) -> &[String] {
        &self.args
    }

    pub fn is_empty(&self) -> bool {
        self.args.is_empty()
    }
}

/// `X` of `-X`.
fn option_letter(word: &str) -> Option<char> {
    let mut chars = word.strip_prefix('-')?.chars();
    let letter = chars.next()?;
    (letter.is_ascii_alphabetic() && chars.next().is_none()).then_some(letter)
}

fn allowed(table: &[(char, Value)]) -> String {
    table
        .iter()
        .map(|(l, _)| format!("-{l}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn check_value(kind: Value, value: &str) -> Result<(), String> {
    let all = |ok: fn(char) -> bool| !value.is_empty() && value.chars().all(ok);
    match kind {
        Value::None => Ok(()),
        Value::Number if all(number_char) && value.starts_with(|c: char| c.is_ascii_digit()) => {
            Ok(())
        }
        Value::Number => Err("is not a number".into()),
        Value::Words if all(|c| c.is_ascii_alphanumeric() || "_^,".contains(c)) => Ok(()),
        Value::Words => Err("is not a comma-separated list of words".into()),
        Value::OneOf(words) if words.contains(&value) => Ok(()),
        Value::OneOf(words) => Err(format!("is not one of {}", words.join(", "))),
        Value::Label(max) if value.len() > max => Err(format!("is longer than {max} bytes")),
        Value::Label(_) if value.starts_with('-') => Err("starts with a dash".into()),
        Value::Label(_) if all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c)) => Ok(()),
        Value::Label(_) => Err("holds characters other than letters, digits, _ . -".into()),
        Value::SubOptions(keys) => value.split(',').try_for_each(|sub| {
            let (key, v) = sub.split_once('=').unwrap_or((sub, ""));
            if !keys.contains(&key) {
                return Err(format!(
                    "{key:?} is not a sub-option Carina passes (allowed: {})",
                    keys.join(", ")
                ));
            }
            if !v
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._:-".contains(c))
            {
                return Err(format!(
                    "the value of {key} holds characters other than letters, digits, . _ : -"
                ));
            }
            Ok(())
        }),
    }
}

/// Digits, a decimal point and a size unit (`4096`, `0.5`, `64k`).
fn number_char(c: char) -> bool {
    c.is_ascii_digit() || ".kmgtKMGT".contains(c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ok(fs: FsType, text: &str) -> Vec<String> {
        MkfsOptions::parse(fs, text)
            .unwrap_or_else(|e| panic!("{text:?}: {e}"))
            .args()
            .to_vec()
    }

    fn refused(fs: FsType, text: &str) -> String {
        MkfsOptions::parse(fs, text).expect_err(text)
    }

    #[test]
    fn takes_what_classes_ask_for() {
        assert_eq!(
            ok(
                FsType::Ext4,
                " -b 4096\t-O ^has_journal,quota  -E lazy_itable_init=0,root_owner=1000:1000 -L data-1 -j "
            ),
            [
                "-b",
                "4096",
                "-O",
                "^has_journal,quota",
                "-E",
                "lazy_itable_init=0,root_owner=1000:1000",
                "-L",
                "data-1",
                "-j"
            ]
        );
        assert_eq!(
            ok(FsType::Ext3, "-m 0.5 -i 65536 -T largefile"),
            ["-m", "0.5", "-i", "65536", "-T", "largefile"]
        );
        assert_eq!(
            ok(
                FsType::Xfs,
                "-i size=512 -m reflink=1,crc=1 -d su=64k,sw=4 -K -L pg"
            ),
            [
                "-i",
                "size=512",
                "-m",
                "reflink=1,crc=1",
                "-d",
                "su=64k,sw=4",
                "-K",
                "-L",
                "pg"
            ]
        );
        assert!(ok(FsType::Xfs, "  ").is_empty());
    }

    #[test]
    fn refuses_what_reaches_outside_the_volume() {
        for (fs, text, says) in [
            (
                FsType::Ext4,
                "-d /etc",
                "-d is not an option Carina passes to mkfs.ext4",
            ),
            (
                FsType::Ext4,
                "-U 0b0e2c7e-5c50-4d8e-9a58-7f1c2f0d3b11",
                "-U is not an option",
            ),
            (
                FsType::Ext4,
                "-J device=/dev/sda",
                "\"device\" is not a sub-option",
            ),
            (
                FsType::Ext4,
                "-E offset=4096",
                "\"offset\" is not a sub-option",
            ),
            (FsType::Ext4, "-n", "-n is not an option"),
            (
                FsType::Xfs,
                "-p /etc/proto",
                "-p is not an option Carina passes to mkfs.xfs",
            ),
            (
                FsType::Xfs,
                "-l logdev=/dev/sdb",
                "\"logdev\" is not a sub-option",
            ),
            (
                FsType::Xfs,
                "-m uuid=0b0e2c7e-5c50-4d8e-9a58-7f1c2f0d3b11",
                "\"uuid\" is not a sub-option",
            ),
            (
                FsType::Xfs,
                "-d name=/dev/sdb",
                "\"name\" is not a sub-option",
            ),
            (FsType::Xfs, "-N", "-N is not an option"),
            (
                FsType::Xfs,
                "-O ^has_journal",
                "-O is not an option Carina passes to mkfs.xfs",
            ),
        ] {
            let e = refused(fs, text);
            assert!(e.contains(says), "{text:?}: {e}");
        }
    }

    #[test]
    fn refuses_malformed_values() {
        for (fs, text, says) in [
            (FsType::Ext4, "-b", "-b needs a value"),
            (FsType::Ext4, "-b four", "-b \"four\": is not a number"),
            (FsType::Ext4, "-b -O", "is not a number"),
            (
                FsType::Ext4,
                "-O $(reboot)",
                "is not a comma-separated list of words",
            ),
            (
                FsType::Ext4,
                "-e ignore",
                "is not one of continue, remount-ro, panic",
            ),
            (
                FsType::Ext4,
                "-L a-label-longer-than-16",
                "longer than 16 bytes",
            ),
            (FsType::Ext4, "-L a/b", "holds characters other than"),
            (
                FsType::Ext4,
                "-E root_owner=0;0",
                "the value of root_owner holds",
            ),
            (FsType::Ext4, "4096", "\"4096\" is not an option"),
            (FsType::Ext4, "--help", "\"--help\" is not an option"),
            (FsType::Ext4, "-b4096", "\"-b4096\" is not an option"),
            (FsType::Ext4, "-b\u{0}4096", "control character"),
            (FsType::Xfs, "-L thirteen-long", "longer than 12 bytes"),
        ] {
            let e = refused(fs, text);
            assert!(e.contains(says), "{text:?}: {e}");
        }
        assert!(refused(FsType::Ext4, &"-j ".repeat(400)).contains("at most 1024"));
    }

    proptest! {
        /// Whatever the text, what is accepted is a list of allowed
        /// option letters each followed by a value that starts with no
        /// dash and holds no path separator or shell character.
        #[test]
        fn accepted_options_stay_inside(text in "[-a-zA-Z0-9 =,/.^$;_]{0,40}", xfs in any::<bool>()) {
            let fs = if xfs { FsType::Xfs } else { FsType::Ext4 };
            let table = if xfs { XFS } else { EXT };
            if let Ok(opts) = MkfsOptions::parse(fs, &text) {
                let mut args = opts.args().iter();
                while let Some(opt) = args.next() {
                    let letter = option_letter(opt).expect("an option");
                    let (_, value) = table.iter().find(|(l, _)| *l == letter).expect("allowed");
                    if !matches!(value, Value::None) {
                        let v = args.next().expect("a value");
                        prop_assert!(!v.starts_with('-'), "{v}");
                        prop_assert!(!v.contains(['/', '$', ';', ' ']), "{v}");
                    }
                }
            }
        }
    }
}
