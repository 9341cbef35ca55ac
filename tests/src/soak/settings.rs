//! The length of a soak run and the time between its samples, from
//! `CARINA_SOAK_DURATION` (`90s`, `10m`, `1h`, `1h30m` or plain seconds).

use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};

/// The length of a run when `CARINA_SOAK_DURATION` is not set.
pub const DEFAULT_DURATION: Duration = Duration::from_secs(120);

/// A duration as `make soak DURATION=...` takes it: plain seconds (`120`)
/// or numbers with units `s`, `m`, `h` (`90s`, `10m`, `1h30m`).
pub fn parse_duration(text: &str) -> Result<Duration> {
    let text = text.trim();
    if let Ok(secs) = text.parse::<u64>() {
        ensure!(secs > 0, "duration {text:?}: zero");
        return Ok(Duration::from_secs(secs));
    }
    let (mut total, mut number) = (0u64, String::new());
    for c in text.chars() {
        if c.is_ascii_digit() {
            number.push(c);
            continue;
        }
        let unit = match c {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            _ => bail!("duration {text:?}: unknown unit {c:?} (use s, m or h)"),
        };
        let n: u64 = number
            .parse()
            .with_context(|| format!("duration {text:?}: no number before {c:?}"))?;
        total += n * unit;
        number.clear();
    }
    ensure!(number.is_empty(), "duration {text:?}: {number} has no unit");
    ensure!(total > 0, "duration {text:?}: zero");
    Ok(Duration::from_secs(total))
}

/// The run's length from the value of `CARINA_SOAK_DURATION` (unset: two
/// minutes); at least 4 s, one per sample.
pub fn soak_duration(value: Option<&str>) -> Result<Duration> {
    let d = value.map_or(Ok(DEFAULT_DURATION), parse_duration)?;
    ensure!(
        d >= Duration::from_secs(4),
        "a soak run of {d:?} is too short"
    );
    Ok(d)
}

/// Time between samples: a minute, or a quarter of a shorter run, so
/// there are at least four.
pub fn sample_interval(duration: Duration) -> Duration {
    (duration / 4).min(Duration::from_secs(60))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_in_seconds_minutes_and_hours() {
        let secs = |t: &str| parse_duration(t).map(|d| d.as_secs()).ok();
        assert_eq!(secs("120"), Some(120));
        assert_eq!(secs("90s"), Some(90));
        assert_eq!(secs("10m"), Some(600));
        assert_eq!(secs("1h"), Some(3600));
        assert_eq!(secs("1h30m"), Some(5400));
        for bad in ["", "0", "1d", "h", "10m5", "-1m", "0s"] {
            assert_eq!(secs(bad), None, "{bad:?}");
        }
        assert_eq!(soak_duration(None).ok(), Some(DEFAULT_DURATION));
        assert!(
            soak_duration(Some("2s")).is_err(),
            "fewer seconds than samples"
        );
    }

    #[test]
    fn at_least_four_samples_and_at_most_a_minute_apart() {
        let at = |s: u64| sample_interval(Duration::from_secs(s)).as_secs_f64();
        assert_eq!(at(120), 30.0);
        assert_eq!(at(90), 22.5);
        assert_eq!(at(3600), 60.0);
    }
}
