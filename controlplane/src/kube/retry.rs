//! How the bridge side waits before trying again: [`Backoff`], shared by
//! the bridge (per-object retries), the capacity publisher (stream
//! reconnects) and the config push (unreachable nodes).

use std::time::Duration;

/// Exponential backoff: `min`, doubled per attempt, at most `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub min: Duration,
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            min: Duration::from_millis(500),
            max: Duration::from_secs(30),
        }
    }
}

impl Backoff {
    /// The wait before retry number `attempt` (0 = the first retry).
    pub fn delay(&self, attempt: u32) -> Duration {
        let factor = 1u32.checked_shl(attempt.min(31)).unwrap_or(u32::MAX);
        self.min.saturating_mul(factor).min(self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let b = Backoff {
            min: Duration::from_millis(100),
            max: Duration::from_secs(1),
        };
        let delays: Vec<_> = (0..6).map(|a| b.delay(a).as_millis()).collect();
        assert_eq!(delays, [100, 200, 400, 800, 1000, 1000]);
        assert_eq!(b.delay(u32::MAX), Duration::from_secs(1));
    }
}
