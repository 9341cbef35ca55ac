//! Size policy: a CSI capacity range becomes one size, rounded up to the
//! group's allocation unit (not to whole GiB) and never above the limit.

use crate::error::CsiError;
use crate::types::CapacityRange;

/// Size given when a request names neither a required size nor a limit.
pub const DEFAULT_SIZE: u64 = 1 << 30;

/// Validates the raw `int64` fields of a capacity range.
pub fn range(required: i64, limit: i64) -> Result<CapacityRange, CsiError> {
    if required < 0 {
        return Err(CsiError::invalid(
            "capacity_range.required_bytes",
            format!("{required} is negative"),
        ));
    }
    if limit < 0 {
        return Err(CsiError::invalid(
            "capacity_range.limit_bytes",
            format!("{limit} is negative"),
        ));
    }
    if limit > 0 && required > limit {
        return Err(CsiError::invalid(
            "capacity_range",
            format!("required_bytes {required} exceeds limit_bytes {limit}"),
        ));
    }
    Ok(CapacityRange {
        required_bytes: required as u64,
        limit_bytes: limit as u64,
    })
}

/// The size to allocate for `range` in a group whose unit is `unit`:
/// the required size (or [`DEFAULT_SIZE`], capped by the limit) rounded up
/// to the unit; if that passes the limit, the limit rounded down, as long
/// as it still covers the required size. Otherwise `OUT_OF_RANGE`.
pub fn allocation(range: &CapacityRange, unit: u64) -> Result<u64, CsiError> {
    let unit = unit.max(1);
    let want = wanted(range);
    let up = want
        .div_ceil(unit)
        .checked_mul(unit)
        .ok_or_else(|| CsiError::OutOfRange(format!("{want} bytes cannot be rounded to {unit}")))?;
    if range.limit_bytes == 0 || up <= range.limit_bytes {
        return Ok(up);
    }
    let down = range.limit_bytes / unit * unit;
    if down >= range.required_bytes.max(1) {
        Ok(down)
    } else {
        Err(CsiError::OutOfRange(format!(
            "no multiple of the allocation unit ({unit} bytes) lies between required_bytes {} and limit_bytes {}",
            range.required_bytes, range.limit_bytes
        )))
    }
}

/// The range of the backing volume of a bcache device whose usable size
/// must lie in `range`: the device starts
/// [`crate::params::BCACHE_DATA_OFFSET`] bytes into its backing volume.
/// An unset required size is the default size, as in [`allocation`].
pub fn bcache_backing(range: &CapacityRange) -> CapacityRange {
    let offset = crate::params::BCACHE_DATA_OFFSET;
    let usable = wanted(range);
    CapacityRange {
        required_bytes: usable.saturating_add(offset),
        limit_bytes: match range.limit_bytes {
            0 => 0,
            limit => limit.saturating_add(offset),
        },
    }
}

/// The size `range` asks for before rounding: the required size, or
/// [`DEFAULT_SIZE`] capped by the limit when none is required.
fn wanted(range: &CapacityRange) -> u64 {
    match (range.required_bytes, range.limit_bytes) {
        (0, 0) => DEFAULT_SIZE,
        (0, limit) => DEFAULT_SIZE.min(limit),
        (required, _) => required,
    }
}

/// True if an existing volume of `size` satisfies `range` (idempotent
/// repeats of CreateVolume).
pub fn satisfies(range: &CapacityRange, size: u64) -> bool {
    size >= range.required_bytes && (range.limit_bytes == 0 || size <= range.limit_bytes)
}

/// Why an existing volume of `size` (`None`: unknown) does not satisfy
/// `range`, in the words every provisioner uses; `None` if it does.
pub fn unsatisfied(range: &CapacityRange, size: Option<u64>) -> Option<String> {
    if size.is_some_and(|s| satisfies(range, s)) {
        return None;
    }
    let limit = match range.limit_bytes {
        0 => "unlimited".to_string(),
        l => l.to_string(),
    };
    Some(format!(
        "the request asks for {}..{limit} bytes",
        range.required_bytes
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bcache_backing_volumes_carry_the_data_offset() {
        let offset = crate::params::BCACHE_DATA_OFFSET;
        let r = |required_bytes, limit_bytes| CapacityRange {
            required_bytes,
            limit_bytes,
        };
        assert_eq!(bcache_backing(&r(0, 0)), r(DEFAULT_SIZE + offset, 0));
        assert_eq!(
            bcache_backing(&r(0, 1 << 20)),
            r((1 << 20) + offset, (1 << 20) + offset)
        );
        assert_eq!(bcache_backing(&r(5 << 20, 0)), r((5 << 20) + offset, 0));
        // With 4 MiB units a backing volume of 8 MiB holds 8 MiB - 8 KiB:
        // a request for exactly 4 MiB gets the next unit.
        let backing = allocation(&bcache_backing(&r(4 << 20, 8 << 20)), 4 << 20).expect("fits");
        assert_eq!(backing, 8 << 20);
        assert!(satisfies(&r(4 << 20, 8 << 20), backing - offset));
        assert!(allocation(&bcache_backing(&r(4 << 20, 4 << 20)), 4 << 20).is_err());
    }

    const MIB: u64 = 1 << 20;

    fn r(required: u64, limit: u64) -> CapacityRange {
        CapacityRange {
            required_bytes: required,
            limit_bytes: limit,
        }
    }

    #[test]
    fn validation() {
        assert!(matches!(
            range(-1, 0),
            Err(CsiError::InvalidArgument { .. })
        ));
        assert!(matches!(
            range(0, -1),
            Err(CsiError::InvalidArgument { .. })
        ));
        assert!(matches!(
            range(10, 5),
            Err(CsiError::InvalidArgument { .. })
        ));
        assert_eq!(range(5, 0).expect("ok"), r(5, 0));
        assert_eq!(range(5, 5).expect("ok"), r(5, 5));
    }

    #[test]
    fn rounding() {
        assert_eq!(allocation(&r(10 * MIB, 0), 4 * MIB).expect("ok"), 12 * MIB);
        assert_eq!(allocation(&r(0, 0), 4 * MIB).expect("ok"), DEFAULT_SIZE);
        assert_eq!(
            allocation(&r(0, 100 * MIB), 4 * MIB).expect("ok"),
            100 * MIB
        );
        assert_eq!(
            allocation(&r(0, 101 * MIB), 4 * MIB).expect("ok"),
            100 * MIB
        );
        // 10 MiB..11 MiB with 4 MiB extents: nothing fits.
        assert!(matches!(
            allocation(&r(10 * MIB, 11 * MIB), 4 * MIB),
            Err(CsiError::OutOfRange(_))
        ));
        // Exactly at the limit.
        assert_eq!(
            allocation(&r(12 * MIB, 12 * MIB), 4 * MIB).expect("ok"),
            12 * MIB
        );
        assert_eq!(allocation(&r(1, 0), 1).expect("ok"), 1);
        assert!(matches!(
            allocation(&r(u64::MAX, 0), 4096),
            Err(CsiError::OutOfRange(_))
        ));
    }

    #[test]
    fn satisfaction() {
        assert!(satisfies(&r(10, 0), 12));
        assert!(!satisfies(&r(10, 11), 12));
        assert!(!satisfies(&r(13, 0), 12));
    }

    #[test]
    fn unsatisfied_says_the_range() {
        assert_eq!(unsatisfied(&r(MIB, 0), Some(MIB)), None);
        assert_eq!(
            unsatisfied(&r(MIB, 2 * MIB), Some(4 * MIB)).as_deref(),
            Some("the request asks for 1048576..2097152 bytes")
        );
        assert_eq!(
            unsatisfied(&r(MIB, 0), None).as_deref(),
            Some("the request asks for 1048576..unlimited bytes")
        );
    }
}
