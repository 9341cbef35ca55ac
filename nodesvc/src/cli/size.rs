//! Sizes on the command line: parsing what people type (`10Gi`, `512Mi`,
//! `1G`, `1.5GiB`, `1048576`) and printing bytes for people (`10 GiB`).
//!
//! Binary suffixes (`Ki`, `Mi`, `Gi`, `Ti`, `Pi`, `Ei`, optionally followed
//! by `B`) are powers of 1024; decimal ones (`k`, `M`, `G`, `T`, `P`, `E`,
//! optionally followed by `B`) powers of 1000; a bare number or one ending
//! in `B` is bytes. Suffixes are case-insensitive (there is no milli-byte).
//! A fraction is allowed and rounded up to a whole byte, as the node rounds
//! up anyway.

use std::fmt;

/// Why a size could not be parsed. The message says what is accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid size {input:?}: {reason} (examples: 10Gi, 512Mi, 1G, 1048576)")]
pub struct SizeError {
    pub input: String,
    pub reason: &'static str,
}

const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];

/// Parses a size in bytes. Zero is refused: no volume has it.
pub fn parse_size(input: &str) -> Result<u64, SizeError> {
    let err = |reason| SizeError {
        input: input.to_string(),
        reason,
    };
    let s = input.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(split);
    let multiplier = multiplier(suffix.trim_start()).ok_or_else(|| err("unknown unit"))?;
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() {
        return Err(err("no number"));
    }
    if fraction.contains('.') || fraction.len() > 18 {
        return Err(err("malformed number"));
    }
    let whole: u128 = if whole.is_empty() {
        0
    } else {
        whole.parse().map_err(|_| err("number too large"))?
    };
    let mut bytes = whole
        .checked_mul(u128::from(multiplier))
        .ok_or_else(|| err("larger than 2^64-1 bytes"))?;
    if !fraction.is_empty() {
        // At most 18 digits: fits u64, and × a u64 multiplier fits u128.
        let digits: u128 = fraction.parse().map_err(|_| err("malformed number"))?;
        let scale = 10u128.pow(fraction.len() as u32);
        bytes += (digits * u128::from(multiplier)).div_ceil(scale);
    }
    let bytes = u64::try_from(bytes).map_err(|_| err("larger than 2^64-1 bytes"))?;
    if bytes == 0 {
        return Err(err("must be greater than zero"));
    }
    Ok(bytes)
}

fn multiplier(suffix: &str) -> Option<u64> {
    let lower = suffix.to_ascii_lowercase();
    let unit = lower.strip_suffix('b').unwrap_or(&lower);
    let (prefix, binary) = match unit.strip_suffix('i') {
        Some(p) => (p, true),
        None => (unit, false),
    };
    let power = match prefix {
        "" if !binary => 0,
        "k" => 1,
        "m" => 2,
        "g" => 3,
        "t" => 4,
        "p" => 5,
        "e" => 6,
        _ => return None,
    };
    let base: u64 = if binary { 1024 } else { 1000 };
    Some(base.pow(power))
}

/// Bytes for people: the largest binary unit that keeps the number at
/// least 1, as a whole number when exact (`10 GiB`) and with one decimal
/// otherwise (`1.5 GiB`, `1.0 GiB` for "slightly more than one"). Exact
/// byte counts are in the JSON output.
pub fn format_size(bytes: u64) -> String {
    HumanSize(bytes).to_string()
}

/// [`format_size`] as a `Display` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HumanSize(pub u64);

impl fmt::Display for HumanSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bytes = self.0;
        let mut exp = 0;
        while exp + 1 < UNITS.len() && bytes >> (10 * (exp + 1)) > 0 {
            exp += 1;
        }
        if exp == 0 {
            return write!(f, "{bytes} B");
        }
        let unit = 1u64 << (10 * exp);
        let whole = bytes / unit;
        let rest = bytes % unit;
        if rest == 0 {
            return write!(f, "{whole} {}", UNITS[exp]);
        }
        // Tenths, rounded half up, in integers (no float rounding surprises).
        let tenths = (u128::from(rest) * 10 + u128::from(unit) / 2) / u128::from(unit);
        let (whole, tenths) = if tenths == 10 {
            (whole + 1, 0)
        } else {
            (whole, tenths)
        };
        if whole == 1024 && exp + 1 < UNITS.len() {
            return write!(f, "1.0 {}", UNITS[exp + 1]);
        }
        write!(f, "{whole}.{tenths} {}", UNITS[exp])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_people_type() {
        let cases = [
            ("1048576", 1 << 20),
            ("10Gi", 10 << 30),
            ("512Mi", 512 << 20),
            ("512MiB", 512 << 20),
            ("1G", 1_000_000_000),
            ("1GB", 1_000_000_000),
            ("1g", 1_000_000_000),
            ("4k", 4000),
            ("4Ki", 4096),
            ("4KiB", 4096),
            ("100B", 100),
            ("1 Gi", 1 << 30),
            (" 2Ti ", 2 << 40),
            ("1.5Gi", 3 << 29),
            (".5Ki", 512),
            ("1.", 1),
            ("0.1Ki", 103), // 102.4 rounded up
            ("15Ei", 15 << 60),
            ("18446744073709551615", u64::MAX),
        ];
        for (input, want) in cases {
            assert_eq!(parse_size(input), Ok(want), "{input}");
        }
    }

    #[test]
    fn refuses_what_is_not_a_size() {
        for bad in [
            "",
            "Gi",
            "10Xi",
            "10i",
            "10 GiBs",
            "-1Gi",
            "1.2.3G",
            "0",
            "0Gi",
            "16Ei",
            "18446744073709551616",
            "99999999999999999999999999999999999999999",
            "1e9",
            "Ten",
        ] {
            let err = parse_size(bad).expect_err(bad);
            assert_eq!(err.input, bad);
            assert!(err.to_string().contains("10Gi"), "{err}");
        }
    }

    #[test]
    fn prints_for_people() {
        let cases = [
            (0, "0 B"),
            (1, "1 B"),
            (1023, "1023 B"),
            (1024, "1 KiB"),
            (1536, "1.5 KiB"),
            (256 << 20, "256 MiB"),
            (10 << 30, "10 GiB"),
            ((1 << 30) + 1, "1.0 GiB"),
            (3 << 29, "1.5 GiB"),
            ((1 << 30) - 1, "1.0 GiB"),
            ((1 << 20) - 1, "1.0 MiB"),
            (1_000_000_000, "953.7 MiB"),
            (2 << 40, "2 TiB"),
            (u64::MAX, "16.0 EiB"),
        ];
        for (bytes, want) in cases {
            assert_eq!(format_size(bytes), want, "{bytes}");
        }
    }

    #[test]
    fn printed_exact_sizes_parse_back() {
        for bytes in [1u64, 4096, 512 << 20, 10 << 30, 3 << 40] {
            let printed = format_size(bytes).replace(' ', "");
            assert_eq!(parse_size(&printed), Ok(bytes), "{printed}");
        }
    }
}
