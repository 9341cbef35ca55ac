//! Named points where the process kills itself with SIGKILL, when its
//! environment asks for it: how tests stop a node at an exact step of a
//! change (after the LV is made and before it is wiped, ...) and then
//! check what the next start finds and repairs.
//!
//! `CARINA_TEST_KILL_AT=<point>` kills at the first time any volume
//! reaches `<point>`; `CARINA_TEST_KILL_AT=<point>:<volume>` only when
//! `<volume>` does. Without the variable every point is a no-op (one
//! comparison against a value read once). SIGKILL, unlike an exit or an
//! abort, runs no code of ours: what is on disk is what a crash, an
//! OOM kill or a power cut of the process would leave.
//!
//! Only a build with the cargo feature `crashpoints` honours the variable
//! (the fault tests build `carina-node-crashpoints` so); in every other
//! build, release binaries and images among them, [`reach`] is empty, so a
//! variable in a node's environment cannot stop it.

#[cfg(feature = "crashpoints")]
use std::sync::OnceLock;

/// The environment variable naming the point (and optionally the volume).
pub const ENV: &str = "CARINA_TEST_KILL_AT";

/// The point and volume the environment asks for, read once.
#[cfg(feature = "crashpoints")]
fn target() -> Option<&'static (String, Option<String>)> {
    static TARGET: OnceLock<Option<(String, Option<String>)>> = OnceLock::new();
    TARGET
        .get_or_init(|| std::env::var(ENV).ok().as_deref().and_then(parse))
        .as_ref()
}

/// `point` or `point:volume`; empty parts ask for nothing.
#[cfg_attr(not(feature = "crashpoints"), allow(dead_code))]
fn parse(value: &str) -> Option<(String, Option<String>)> {
    let (point, volume) = match value.split_once(':') {
        Some((p, v)) => (p, (!v.is_empty()).then(|| v.to_string())),
        None => (value, None),
    };
    (!point.is_empty()).then(|| (point.to_string(), volume))
}

#[cfg_attr(not(feature = "crashpoints"), allow(dead_code))]
fn matches(target: &(String, Option<String>), point: &str, volume: &str) -> bool {
    target.0 == point && target.1.as_deref().is_none_or(|v| v == volume)
}

/// Kills this process with SIGKILL if the environment names `point` (and
/// `volume`, when it names one); otherwise returns at once.
#[cfg(feature = "crashpoints")]
pub fn reach(point: &str, volume: &str) {
    let Some(target) = target() else {
        return;
    };
    if matches(target, point, volume) {
        tracing::warn!(
            point,
            carina.volume.name = volume,
            "{ENV} asks for SIGKILL here"
        );
        let _ =
            rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL);
        // SIGKILL cannot be caught; nothing after it runs.
        std::process::abort();
    }
}

/// Without the feature `crashpoints`: nothing, whatever the environment
/// says.
#[cfg(not(feature = "crashpoints"))]
#[inline(always)]
pub fn reach(_point: &str, _volume: &str) {}

/// Whether this build honours [`ENV`] (the feature `crashpoints`).
pub const ENABLED: bool = cfg!(feature = "crashpoints");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variable_names_a_point_and_optionally_a_volume() {
        assert_eq!(parse(""), None);
        assert_eq!(parse(":v"), None);
        let any = parse("lvm.create.allocated").expect("a point");
        assert!(matches(&any, "lvm.create.allocated", "a"));
        assert!(!matches(&any, "lvm.create", "a"));
        let one = parse("delete.begun:v1").expect("a point");
        assert!(matches(&one, "delete.begun", "v1"));
        assert!(!matches(&one, "delete.begun", "v2"));
        assert_eq!(parse("p:"), Some(("p".into(), None)));
    }
}
