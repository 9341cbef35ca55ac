//! A stand-in for the kernel's bcache driver, for machines without it: a
//! sysfs layout in a temporary folder (the files and links the kernel's
//! bcache documentation describes) and a thread that answers writes to it
//! the way the driver does.
//!
//! What it proves: the engine's sysfs module writes the right values to
//! the right files in the right order (register, attach, cache_mode,
//! detach, stop, unregister), waits for the answers, parses what the
//! driver shows (state, cache_mode, dirty_data, hit ratio, the bcache
//! device's numbers), and re-assembles after a "reboot". Superblocks are
//! real: the stand-in reads them with the real `bcache-super-show` from
//! the devices the engine registers (formatted by the real
//! `make-bcache`). What it does not prove: that a real kernel accepts
//! those devices, makes `/dev/bcacheN`, moves data, or refuses a write
//! with an error code (the stand-in cannot fail a `write(2)`; it ignores
//! a refused write, so the engine sees a timeout instead of `EINVAL`).
//! With `CARINA_TEST_BCACHE_KERNEL=1`, fixtures made by
//! [`BcacheFixture::new`] run the same flow against `/sys` on a machine
//! that has the driver; [`BcacheFixture::with_stand_in`] keeps the
//! stand-in.
//!
//! One file per job: `standin` is the stand-in's handle (the folder, the
//! thread, what a test asks of it), `driver` answers the writes as the
//! driver does, `files` reads and writes the sysfs files and superblocks,
//! `fixture` is the engine over two loop-disk groups that tests start from.

mod driver;
mod files;
mod fixture;
mod standin;

pub use fixture::{BcacheFixture, real_kernel, superblock_of};
pub use standin::KernelStandIn;
