//! Kubernetes quantities (`10Gi`, `1G`, `1.5Mi`, `1e3`, `1073741824`) as
//! whole bytes, rounded up as Kubernetes rounds storage requests, and
//! bytes printed for people (`10 GiB`) in the reasons the extender gives.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// Bytes in `q`, rounded up to a whole byte. `None` for a malformed or
/// negative quantity, or one above `u64::MAX`.
pub fn bytes(q: &Quantity) -> Option<u64> {
    parse(&q.0)
}

fn parse(text: &str) -> Option<u64> {
    let s = text.trim();
    let s = s.strip_prefix('+').unwrap_or(s);
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(split);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if (whole.is_empty() && fraction.is_empty()) || fraction.contains('.') {
        return None;
    }
    let mut digits: u128 = 0;
    for c in whole.bytes().chain(fraction.bytes()) {
        digits = digits.checked_mul(10)?.checked_add(u128::from(c - b'0'))?;
    }
    let scale = fraction.len() as i32;
    // value = digits × 10^-scale × multiplier
    let (binary, decimal_exp): (u128, i32) = match suffix {
        "" => (1, 0),
        "Ki" => (1 << 10, 0),
        "Mi" => (1 << 20, 0),
        "Gi" => (1 << 30, 0),
        "Ti" => (1 << 40, 0),
        "Pi" => (1 << 50, 0),
        "Ei" => (1 << 60, 0),
        "n" => (1, -9),
        "u" => (1, -6),
        "m" => (1, -3),
        "k" => (1, 3),
        "M" => (1, 6),
        "G" => (1, 9),
        "T" => (1, 12),
        "P" => (1, 15),
        "E" => (1, 18),
        exp if exp.starts_with(['e', 'E']) => (1, exp[1..].parse::<i32>().ok()?),
        _ => return None,
    };
    let exp = decimal_exp - scale;
    let value = digits.checked_mul(binary)?;
    let bytes = if exp >= 0 {
        value.checked_mul(10u128.checked_pow(exp as u32)?)?
    } else {
        let div = 10u128.checked_pow(exp.unsigned_abs())?;
        value.div_ceil(div)
    };
    u64::try_from(bytes).ok()
}

/// `bytes` for a reason text: binary units with one decimal, exact bytes
/// below 1 KiB.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn storage_quantities() {
        let cases = [
            ("1073741824", Some(1 << 30)),
            ("10Gi", Some(10 << 30)),
            ("1G", Some(1_000_000_000)),
            ("1.5Mi", Some(3 << 19)),
            ("1e3", Some(1000)),
            ("1E3", Some(1000)),
            ("+2Ki", Some(2048)),
            ("100m", Some(1)),
            ("0", Some(0)),
            (" 5 ", Some(5)),
            ("0.1", Some(1)),
            ("", None),
            ("-1Gi", None),
            ("Gi", None),
            ("1.2.3", None),
            ("10GB", None),
            ("20Ei", None),
            ("1e30", None),
        ];
        for (text, want) in cases {
            assert_eq!(parse(text), want, "{text:?}");
        }
        assert_eq!(bytes(&Quantity("4Mi".into())), Some(4 << 20));
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human(0), "0 B");
        assert_eq!(human(1023), "1023 B");
        assert_eq!(human(10 << 30), "10.0 GiB");
        assert_eq!(human(3 << 19), "1.5 MiB");
    }
}
