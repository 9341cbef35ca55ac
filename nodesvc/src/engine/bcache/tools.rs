//! The two bcache-tools programs the engine runs: `make-bcache` (formats a
//! backing and a cache device with a cache-set UUID the engine chose) and
//! `bcache-super-show` (reads a superblock back). Both go through the
//! workspace's command runner (argv only, a timeout, a span per run); the
//! parsing is a pure function with tests on captured output.

use std::path::Path;
use std::time::Duration;

use carina_sys::command::Cmd;

use super::CacheMode;
use crate::engine::error::{Error, Result};

/// `make-bcache` writes two superblocks; it needs no more than this.
const MAKE_TIMEOUT: Duration = Duration::from_secs(60);
const SHOW_TIMEOUT: Duration = Duration::from_secs(15);
/// `bcache-super-show`'s exit status when the device holds no bcache
/// superblock (it prints `bad magic`).
const SHOW_NO_SUPERBLOCK: i32 = 2;

/// What a bcache superblock says the device is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Backing,
    Cache,
}

/// The fields of a bcache superblock the engine uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superblock {
    pub role: Role,
    /// `dev.uuid`: this device.
    pub dev_uuid: String,
    /// `cset.uuid`: the cache set it belongs (backing: is meant) to.
    pub cset_uuid: String,
    /// Backing devices: the cache mode recorded in the superblock.
    pub cache_mode: Option<CacheMode>,
}

/// Parses `bcache-super-show` output. `None` if it shows no valid
/// superblock (bad magic or checksum).
pub fn parse_super_show(text: &str) -> Option<Superblock> {
    let mut magic_ok = false;
    let mut csum_ok = true;
    let mut role = None;
    let mut dev_uuid = None;
    let mut cset_uuid = None;
    let mut cache_mode = None;
    for line in text.lines() {
        let mut parts = line.splitn(2, char::is_whitespace);
        let key = parts.next().unwrap_or_default();
        let value = parts.next().unwrap_or_default().trim();
        match key {
            "sb.magic" => magic_ok = value == "ok",
            "sb.csum" => csum_ok = value.ends_with("[match]"),
            "sb.version" => {
                role = if value.contains("[backing device]") {
                    Some(Role::Backing)
                } else if value.contains("[cache device]") {
                    Some(Role::Cache)
                } else {
                    None
                }
            }
            "dev.uuid" => dev_uuid = Some(value.to_string()),
            "cset.uuid" => cset_uuid = Some(value.to_string()),
            // `0 [writethrough]`
            "dev.data.cache_mode" => {
                cache_mode = value
                    .split_once('[')
                    .and_then(|(_, rest)| rest.strip_suffix(']'))
                    .and_then(CacheMode::from_kernel)
            }
            _ => {}
        }
    }
    if !magic_ok || !csum_ok {
        return None;
    }
    Some(Superblock {
        role: role?,
        dev_uuid: dev_uuid?,
        cset_uuid: cset_uuid?,
        cache_mode,
    })
}

/// The bcache superblock on `dev`, or `None` if it holds none.
pub async fn super_show(dev: &Path) -> Result<Option<Superblock>> {
    match Cmd::new("bcache-super-show")
        .arg(dev)
        .timeout(SHOW_TIMEOUT)
        .run()
        .await
    {
        Ok(out) => parse_super_show(&out.stdout).map(Some).ok_or_else(|| {
            Error::parse(
                format!("bcache-super-show {}", dev.display()),
                "no superblock fields",
            )
        }),
        Err(e)
            if e.exit_code() == Some(SHOW_NO_SUPERBLOCK) && e.stderr().contains("superblock") =>
        {
            Ok(None)
        }
        Err(e) => Err(e.into()),
    }
}

/// make-bcache's bucket size when it is given none.
const DEFAULT_BUCKET: u64 = 512 << 10;
/// The smallest bucket size chosen (a 4 KiB block).
const MIN_BUCKET: u64 = 4 << 10;
/// The buckets a cache device gets at least. The kernel refuses to
/// register a cache with 512 buckets or fewer (`cache_alloc`, Linux 6.1),
/// while make-bcache accepts 128: a cache under 256 MiB formatted with the
/// default bucket never registers.
pub const MIN_BUCKETS: u64 = 1024;

/// The bucket size for a cache device of `cache_bytes`: the default when
/// it holds [`MIN_BUCKETS`] of them, else the largest power of two that
/// gives that many.
pub fn bucket_bytes(cache_bytes: u64) -> u64 {
    let mut bucket = DEFAULT_BUCKET;
    while bucket > MIN_BUCKET && cache_bytes / bucket < MIN_BUCKETS {
        bucket /= 2;
    }
    bucket
}

/// The `make-bcache` command line that formats `backing` and/or `cache`
/// (a path and its size in bytes) as members of the cache set
/// `cset_uuid`. Never `--wipe-bcache`: a device that already holds a
/// superblock is refused by the tool.
pub fn make_bcache_cmd(
    cset_uuid: &str,
    backing: Option<&Path>,
    cache: Option<(&Path, u64)>,
    mode: CacheMode,
) -> Cmd {
    let mut cmd = Cmd::new("make-bcache")
        .timeout(MAKE_TIMEOUT)
        .args(["--cset-uuid", cset_uuid]);
    if mode == CacheMode::Writeback {
        cmd = cmd.arg("--writeback");
    }
    if let Some(b) = backing {
        cmd = cmd.arg("-B").arg(b);
    }
    if let Some((c, bytes)) = cache {
        cmd = cmd
            .arg("--bucket")
            .arg(format!("{}k", bucket_bytes(bytes) >> 10))
            .arg("-C")
            .arg(c);
    }
    cmd
}

/// Runs [`make_bcache_cmd`].
pub async fn make_bcache(
    cset_uuid: &str,
    backing: Option<&Path>,
    cache: Option<(&Path, u64)>,
    mode: CacheMode,
) -> Result<()> {
    make_bcache_cmd(cset_uuid, backing, cache, mode)
        .run()
        .await?;
    Ok(())
}

/// A fresh random UUID (version 4) in the usual text form.
pub fn new_uuid() -> Result<String> {
    use std::io::Read;
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .map_err(|e| Error::io("read", "/dev/urandom", e))?;
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    Ok(format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    ))
}

/// Whether `s` is a UUID in the text form the kernel accepts.
pub fn is_uuid(s: &str) -> bool {
    let groups: Vec<&str> = s.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.chars().all(|c| c.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `bcache-super-show` 1.0.8 on a backing device `make-bcache` had
    /// just formatted.
    const BACKING: &str = "sb.magic\t\tok
sb.first_sector\t\t8 [match]
sb.csum\t\t\tBBB400679917FAC5 [match]
sb.version\t\t1 [backing device]

dev.label\t\t(empty)
dev.uuid\t\tfe041ed5-9818-48fc-aa0e-0071d44369dc
dev.sectors_per_block\t1
dev.sectors_per_bucket\t1024
dev.data.first_sector\t16
dev.data.cache_mode\t0 [writethrough]
dev.data.cache_state\t0 [detached]

cset.uuid\t\t3f1c1b9e-1d2e-4a11-9c1d-2a1b3c4d5e6f
";

    /// The same for the cache device of that call.
    const CACHE: &str = "sb.magic\t\tok
sb.first_sector\t\t8 [match]
sb.csum\t\t\t852BEEB0A07F300A [match]
sb.version\t\t0 [cache device]

dev.label\t\t(empty)
dev.uuid\t\t6be9fdc9-49d4-49a4-99ac-27266b049e7f
dev.sectors_per_block\t1
dev.sectors_per_bucket\t1024
dev.cache.first_sector\t1024
dev.cache.cache_sectors\t130048
dev.cache.total_sectors\t131072
dev.cache.ordered\tno
dev.cache.discard\tno
dev.cache.pos\t\t0
dev.cache.replacement\t0 [lru]

cset.uuid\t\t3f1c1b9e-1d2e-4a11-9c1d-2a1b3c4d5e6f
";

    #[test]
    fn parses_both_roles() {
        let b = parse_super_show(BACKING).expect("backing");
        assert_eq!(b.role, Role::Backing);
        assert_eq!(b.dev_uuid, "fe041ed5-9818-48fc-aa0e-0071d44369dc");
        assert_eq!(b.cset_uuid, "3f1c1b9e-1d2e-4a11-9c1d-2a1b3c4d5e6f");
        assert_eq!(b.cache_mode, Some(CacheMode::Writethrough));
        let c = parse_super_show(CACHE).expect("cache");
        assert_eq!(c.role, Role::Cache);
        assert_eq!(c.cset_uuid, b.cset_uuid);
        assert_eq!(c.cache_mode, None);
    }

    #[test]
    fn bad_magic_or_checksum_is_no_superblock() {
        assert_eq!(parse_super_show("sb.magic\t\tbad magic\n"), None);
        let bad = BACKING.replace("BBB400679917FAC5 [match]", "0 [expected 1]");
        assert_eq!(parse_super_show(&bad), None);
    }

    #[test]
    fn make_bcache_argv() {
        let cmd = make_bcache_cmd(
            "3f1c1b9e-1d2e-4a11-9c1d-2a1b3c4d5e6f",
            Some(Path::new("/dev/b")),
            Some((Path::new("/dev/c"), 1 << 30)),
            CacheMode::Writeback,
        );
        assert_eq!(
            cmd.line(),
            "make-bcache --cset-uuid 3f1c1b9e-1d2e-4a11-9c1d-2a1b3c4d5e6f --writeback -B /dev/b --bucket 512k -C /dev/c"
        );
        let only_cache = make_bcache_cmd(
            "u",
            None,
            Some((Path::new("/dev/c"), 64 << 20)),
            CacheMode::None,
        );
        assert_eq!(
            only_cache.line(),
            "make-bcache --cset-uuid u --bucket 64k -C /dev/c"
        );
        let only_backing = make_bcache_cmd("u", Some(Path::new("/dev/b")), None, CacheMode::None);
        assert_eq!(only_backing.line(), "make-bcache --cset-uuid u -B /dev/b");
    }

    #[test]
    fn small_caches_get_enough_buckets_for_the_kernel() {
        const MIB: u64 = 1 << 20;
        assert_eq!(bucket_bytes(1 << 30), 512 << 10, "the default");
        assert_eq!(bucket_bytes(512 * MIB), 512 << 10);
        assert_eq!(bucket_bytes(256 * MIB), 256 << 10);
        assert_eq!(bucket_bytes(128 * MIB), 128 << 10);
        assert_eq!(bucket_bytes(64 * MIB), 64 << 10, "the smallest cache");
        assert_eq!(bucket_bytes(MIB), 4 << 10, "never below a block");
        for mib in [64, 100, 200, 255, 256, 300, 1000] {
            let bytes = mib * MIB;
            assert!(bytes / bucket_bytes(bytes) >= MIN_BUCKETS, "{mib} MiB");
        }
    }

    #[test]
    fn uuids() {
        let u = new_uuid().expect("urandom");
        assert!(is_uuid(&u), "{u}");
        assert_ne!(u, new_uuid().expect("urandom"));
        assert!(is_uuid("3f1c1b9e-1d2e-4a11-9c1d-2a1b3c4d5e6f"));
        assert!(!is_uuid("3f1c1b9e-1d2e-4a11-9c1d"));
        assert!(!is_uuid("zf1c1b9e-1d2e-4a11-9c1d-2a1b3c4d5e6f"));
    }
}
