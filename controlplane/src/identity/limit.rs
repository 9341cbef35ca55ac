//! How often one node and one pod may be issued a certificate.
//!
//! A token bucket per key: `burst` certificates at once, then one more
//! every `interval`. The issuer charges the node name's and the pod uid's
//! bucket together (all or nothing), and only for a request that passed
//! every check, so an unauthenticated caller cannot use up a node's
//! allowance; a request over either answers `RESOURCE_EXHAUSTED` with the
//! wait.
//!
//! A node renews at two thirds of its certificate's lifetime, so the
//! default interval, a third of the lifetime capped at
//! [`DEFAULT_MAX_INTERVAL`], refills twice as fast as renewals use it: the
//! limit only bites a caller asking far more often than renewal does (a
//! stolen token replayed, a restart loop).
//!
//! Full buckets carry no information and are dropped, so the table holds
//! only keys that asked within the last `burst × interval`.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Certificates one key may get at once.
pub const DEFAULT_BURST: u32 = 5;
/// The longest default refill interval.
pub const DEFAULT_MAX_INTERVAL: Duration = Duration::from_secs(60);

/// The limit's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateSettings {
    pub burst: u32,
    pub interval: Duration,
}

impl RateSettings {
    /// The defaults for certificates valid `ttl`: [`DEFAULT_BURST`], and
    /// one more every third of `ttl`, at most [`DEFAULT_MAX_INTERVAL`].
    pub fn for_ttl(ttl: Duration) -> RateSettings {
        RateSettings {
            burst: DEFAULT_BURST,
            interval: (ttl / 3).min(DEFAULT_MAX_INTERVAL),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    /// Certificates left, fractions included.
    tokens: f64,
    at: Instant,
}

/// Token buckets keyed by a string.
#[derive(Debug)]
pub struct RateLimit {
    settings: RateSettings,
    buckets: Mutex<HashMap<String, Bucket>>,
}

impl RateLimit {
    pub fn new(settings: RateSettings) -> RateLimit {
        RateLimit {
            settings: RateSettings {
                burst: settings.burst.max(1),
                interval: settings.interval,
            },
            buckets: Mutex::new(HashMap::new()),
        }
    }

    pub fn settings(&self) -> RateSettings {
        self.settings
    }

    fn refilled(&self, bucket: Bucket, now: Instant) -> f64 {
        let burst = f64::from(self.settings.burst);
        if self.settings.interval.is_zero() {
            return burst;
        }
        let gained = now.saturating_duration_since(bucket.at).as_secs_f64()
            / self.settings.interval.as_secs_f64();
        (bucket.tokens + gained).min(burst)
    }

    /// Takes one from the bucket of each of `keys` if every one has one
    /// (all or nothing, under one lock); otherwise the index of the first
    /// key that has none and how long until it has. Buckets that are full
    /// again are dropped.
    pub fn try_take(&self, keys: &[&str], now: Instant) -> Result<(), (usize, Duration)> {
        let burst = f64::from(self.settings.burst);
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        let mut left = Vec::with_capacity(keys.len());
        for (i, key) in keys.iter().enumerate() {
            let tokens = buckets.get(*key).map_or(burst, |b| self.refilled(*b, now));
            if tokens < 1.0 {
                return Err((i, self.settings.interval.mul_f64(1.0 - tokens)));
            }
            left.push(tokens - 1.0);
        }
        for (key, tokens) in keys.iter().zip(left) {
            buckets.insert((*key).to_string(), Bucket { tokens, at: now });
        }
        buckets.retain(|_, b| self.refilled(*b, now) < burst);
        Ok(())
    }

    /// How many keys have a bucket that is not full.
    pub fn tracked(&self) -> usize {
        self.buckets.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_one_per_interval() {
        let limit = RateLimit::new(RateSettings {
            burst: 3,
            interval: Duration::from_secs(10),
        });
        let t0 = Instant::now();
        for _ in 0..3 {
            assert_eq!(limit.try_take(&["node-a"], t0), Ok(()));
        }
        assert_eq!(
            limit.try_take(&["node-b", "node-a"], t0),
            Err((1, Duration::from_secs(10)))
        );
        // All or nothing: node-b was not charged by the refused call.
        for _ in 0..3 {
            assert_eq!(limit.try_take(&["node-b"], t0), Ok(()));
        }
        assert!(limit.try_take(&["node-b"], t0).is_err());
        let t4 = t0 + Duration::from_secs(4);
        let (_, left) = limit.try_take(&["node-a"], t4).expect_err("still limited");
        assert!(
            left > Duration::from_millis(5_900) && left <= Duration::from_secs(6),
            "{left:?}"
        );
        let t10 = t0 + Duration::from_secs(10);
        assert_eq!(limit.try_take(&["node-a"], t10), Ok(()));
        assert!(limit.try_take(&["node-a"], t10).is_err());
        // Refilled completely: forgotten.
        assert_eq!(limit.tracked(), 2);
        assert_eq!(
            limit.try_take(&["node-c"], t0 + Duration::from_secs(100)),
            Ok(())
        );
        assert_eq!(
            limit.tracked(),
            1,
            "node-a and node-b are full again and dropped"
        );
    }

    #[test]
    fn renewal_at_two_thirds_never_runs_dry() {
        for ttl in [3, 12, 90, 3600, 86_400] {
            let ttl = Duration::from_secs(ttl);
            let limit = RateLimit::new(RateSettings::for_ttl(ttl));
            let mut now = Instant::now();
            for round in 0..100 {
                assert_eq!(
                    limit.try_take(&["node-a"], now),
                    Ok(()),
                    "ttl {ttl:?} round {round}"
                );
                now += ttl.mul_f64(2.0 / 3.0);
            }
        }
        assert_eq!(
            RateSettings::for_ttl(Duration::from_secs(86_400)).interval,
            DEFAULT_MAX_INTERVAL
        );
    }
}
