//! Validation of the names and sizes that reach the engine: volume names
//! become LVM LV names, directory names and (part of) GPT partition names,
//! so they are held to the strictest of those rules.

use super::error::{Error, Result};

/// Longest accepted volume name.
pub const MAX_VOLUME_NAME: usize = 100;
/// Largest accepted size: sizes travel as `int64` in CSI.
pub const MAX_SIZE_BYTES: u64 = i64::MAX as u64;

/// LVM reserves these substrings for its internal volumes.
const LVM_RESERVED: &[&str] = &[
    "_cdata", "_cmeta", "_corig", "_mlog", "_mimage", "_pmspare", "_rimage", "_rmeta", "_tdata",
    "_tmeta", "_vorigin", "_vdata",
];

/// Checks a volume name; the error names the field `name`.
pub fn check_volume_name(name: &str) -> Result<()> {
    check_volume_name_field("name", name)
}

/// [`check_volume_name`] of a request field named otherwise (`source`).
pub fn check_volume_name_field(field: &str, name: &str) -> Result<()> {
    name_rules(name, MAX_VOLUME_NAME).map_err(|reason| Error::invalid(field, reason))
}

/// Checks a device-group name (it becomes the VG name).
pub fn check_group_name(name: &str) -> std::result::Result<(), String> {
    name_rules(name, 64)
}

fn name_rules(name: &str, max: usize) -> std::result::Result<(), String> {
    if name.is_empty() {
        return Err("must not be empty".into());
    }
    if name.len() > max {
        return Err(format!(
            "is {} bytes long, at most {max} allowed",
            name.len()
        ));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '+')))
    {
        return Err(format!(
            "{bad:?} is not allowed (use ASCII letters, digits, '.', '_', '-', '+')"
        ));
    }
    if name.starts_with('-') {
        return Err("must not start with '-'".into());
    }
    if name == "." || name == ".." || name.starts_with('.') {
        return Err("must not start with '.'".into());
    }
    if name.starts_with("snapshot") || name.starts_with("pvmove") {
        return Err("must not start with \"snapshot\" or \"pvmove\" (reserved by LVM)".into());
    }
    if let Some(r) = LVM_RESERVED.iter().find(|r| name.contains(*r)) {
        return Err(format!("must not contain {r:?} (reserved by LVM)"));
    }
    Ok(())
}

/// Checks a requested size; the error names `field`.
pub fn check_size(field: &str, size: u64) -> Result<()> {
    if size == 0 {
        return Err(Error::invalid(field, "must be greater than zero"));
    }
    if size > MAX_SIZE_BYTES {
        return Err(Error::invalid(
            field,
            format!("{size} exceeds the largest size, {MAX_SIZE_BYTES}"),
        ));
    }
    Ok(())
}

/// Rounds `size` up to a multiple of `unit`, or `None` on overflow.
pub fn round_up(size: u64, unit: u64) -> Option<u64> {
    if unit <= 1 {
        return Some(size);
    }
    size.div_ceil(unit).checked_mul(unit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_kubernetes_and_sanity_names() {
        for ok in [
            "pvc-0a1b2c3d-4e5f-6789-abcd-ef0123456789",
            "sanity-controller-create-single-vol-4D9A8C1E-29F1BAA6",
            "a",
            "vol_1.2+3",
        ] {
            check_volume_name(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
    }

    #[test]
    fn rejects_bad_names() {
        let long = "x".repeat(MAX_VOLUME_NAME + 1);
        for bad in [
            "",
            &long,
            "a/b",
            "..",
            ".",
            "-x",
            "a b",
            " a",
            "a\0b",
            "é",
            "a\tb",
            "snapshot1",
            "pvmove0",
            "x_tmeta",
            ".hidden",
        ] {
            let err = check_volume_name(bad).expect_err(bad);
            assert!(err.to_string().starts_with("name: "), "{bad:?}: {err}");
        }
    }

    #[test]
    fn sizes() {
        assert!(check_size("size_bytes", 0).is_err());
        assert!(check_size("size_bytes", MAX_SIZE_BYTES + 1).is_err());
        assert!(check_size("size_bytes", u64::MAX).is_err());
        assert!(check_size("size_bytes", 1).is_ok());
        assert_eq!(round_up(1, 4096), Some(4096));
        assert_eq!(round_up(4096, 4096), Some(4096));
        assert_eq!(round_up(4097, 4096), Some(8192));
        assert_eq!(round_up(5, 0), Some(5));
        assert_eq!(round_up(u64::MAX, 4096), None);
    }
}
