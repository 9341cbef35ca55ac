//! The geometry of a bcache device as `make-bcache` lays it out with its
//! defaults: where the data starts on the backing volume, the smallest
//! cache volume, and the cache volume's size for a backing volume and a
//! ratio. The node sizes the cache volumes it makes by this rule, and the
//! control planes and the scheduler place them by it; it lives here, below
//! the CSI crate and the node's engine, so both reach it.

/// Where a bcache device's data starts on its backing volume
/// (`make-bcache`'s default data offset, 16 sectors): the device is this
/// much smaller than the backing volume.
pub const BCACHE_DATA_OFFSET: u64 = 8192;

/// The smallest cache volume: `make-bcache` refuses a cache device of
/// fewer than 128 buckets, 64 MiB at its default bucket size (512 KiB).
pub const BCACHE_MIN_CACHE: u64 = 64 << 20;

/// The size of the cache volume for a backing volume of `size` bytes:
/// `ratio_percent` percent of it, rounded up, and at least
/// [`BCACHE_MIN_CACHE`] (the node rounds it further to its group's unit).
/// Saturates at `u64::MAX` instead of overflowing.
pub fn cache_bytes(size: u64, ratio_percent: u32) -> u64 {
    let bytes = (u128::from(size) * u128::from(ratio_percent)).div_ceil(100);
    u64::try_from(bytes)
        .unwrap_or(u64::MAX)
        .max(BCACHE_MIN_CACHE)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn cache_bytes_rounds_up_and_keeps_the_minimum() {
        assert_eq!(cache_bytes(200 * MIB, 50), 100 * MIB);
        assert_eq!(cache_bytes(200 * MIB + 1, 50), 100 * MIB + 1);
        assert_eq!(cache_bytes(100 * MIB, 50), BCACHE_MIN_CACHE);
        assert_eq!(cache_bytes(0, 100), BCACHE_MIN_CACHE);
        assert_eq!(cache_bytes(u64::MAX, 100), u64::MAX);
    }
}
