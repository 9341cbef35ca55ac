//! The measuring side of the soak run (`tests/tests/soak_node.rs`): its
//! length and sampling interval ([`soak_duration`], [`sample_interval`]),
//! the samples taken at rest and the rules they keep ([`Sample`],
//! [`check`], [`rss_verdict`]), and the probes of mounts and partitions
//! ([`mountinfo`], [`gpt_partitions`]).

mod probes;
mod samples;
mod settings;

pub use probes::{Mount, gpt_partitions, mountinfo};
pub use samples::{
    Cycles, RSS_SLACK_MIB, RSS_TREND_INTERVALS, RSS_TREND_MIB, Sample, check, header, row,
    rss_verdict,
};
pub use settings::{DEFAULT_DURATION, parse_duration, sample_interval, soak_duration};
