//! Kubernetes quantities as byte counts, the one parser the control plane
//! and the scheduler use (LogicVolume sizes, NodeStorageResource figures).

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// Errors of parsing a Kubernetes quantity as a byte count.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error("{0:?} is not a Kubernetes quantity")]
    Syntax(String),
    #[error("{0:?} is negative")]
    Negative(String),
    #[error("{0:?} is more bytes than a volume can have (2^63-1)")]
    TooLarge(String),
}

/// A quantity (`10Gi`, `1073741824`, `1.5G`, `5e9`, `100m`) as whole
/// bytes, rounded up as Kubernetes rounds storage requests. At most
/// `2^63-1`, like a Kubernetes int64 quantity.
pub fn quantity_bytes(q: &Quantity) -> Result<u64, QuantityError> {
    let text = q.0.trim();
    let syntax = || QuantityError::Syntax(q.0.clone());
    let too_large = || QuantityError::TooLarge(q.0.clone());
    let (negative, unsigned) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let split = unsigned
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(unsigned.len());
    let (number, suffix) = unsigned.split_at(split);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if (whole.is_empty() && fraction.is_empty()) || fraction.contains('.') {
        return Err(syntax());
    }
    let mut mantissa: u128 = 0;
    for digit in whole.bytes().chain(fraction.bytes()) {
        mantissa = mantissa
            .checked_mul(10)
            .and_then(|m| m.checked_add(u128::from(digit - b'0')))
            .ok_or_else(too_large)?;
    }
    let (binary_shift, decimal_exp): (u32, i64) = match suffix {
        "" => (0, 0),
        "Ki" => (10, 0),
        "Mi" => (20, 0),
        "Gi" => (30, 0),
        "Ti" => (40, 0),
        "Pi" => (50, 0),
        "Ei" => (60, 0),
        "n" => (0, -9),
        "u" => (0, -6),
        "m" => (0, -3),
        "k" => (0, 3),
        "M" => (0, 6),
        "G" => (0, 9),
        "T" => (0, 12),
        "P" => (0, 15),
        "E" => (0, 18),
        exp if exp.starts_with(['e', 'E']) => {
            let e: i64 = exp[1..].parse().map_err(|_| syntax())?;
            (0, e)
        }
        _ => return Err(syntax()),
    };
    if negative && mantissa != 0 {
        return Err(QuantityError::Negative(q.0.clone()));
    }
    let value = mantissa
        .checked_mul(1u128 << binary_shift)
        .ok_or_else(too_large)?;
    // Saturating: the exponent may be any i64 (`1.5e-9223372036854775808`);
    // past the ends it means "below a byte" or "too large" all the same.
    let exp = decimal_exp.saturating_sub(i64::try_from(fraction.len()).map_err(|_| syntax())?);
    let bytes = if exp >= 0 {
        let scale = u32::try_from(exp)
            .ok()
            .and_then(|e| 10u128.checked_pow(e))
            .ok_or_else(too_large)?;
        if value == 0 {
            0
        } else {
            value.checked_mul(scale).ok_or_else(too_large)?
        }
    } else {
        match u32::try_from(exp.unsigned_abs())
            .ok()
            .and_then(|e| 10u128.checked_pow(e))
        {
            Some(scale) => value.div_ceil(scale),
            // Smaller than any byte count but zero.
            None => u128::from(value != 0),
        }
    };
    let max = u128::from(i64::MAX.unsigned_abs());
    if bytes > max {
        return Err(too_large());
    }
    u64::try_from(bytes).map_err(|_| too_large())
}

/// `bytes` as a quantity, with the largest binary suffix that is exact
/// (`1Gi`, `1536Mi`, `4097`).
pub fn bytes_quantity(bytes: u64) -> Quantity {
    for (shift, suffix) in [
        (60, "Ei"),
        (50, "Pi"),
        (40, "Ti"),
        (30, "Gi"),
        (20, "Mi"),
        (10, "Ki"),
    ] {
        if bytes != 0 && bytes.is_multiple_of(1u64 << shift) {
            return Quantity(format!("{}{suffix}", bytes >> shift));
        }
    }
    Quantity(bytes.to_string())
}

#[cfg(test)]
mod tests {

    proptest::proptest! {
        /// Any quantity text converts or is refused; what converts is at
        /// most 2^63-1 and reads back from its own byte form.
        #[test]
        fn quantities_take_anything(
            text in proptest::prelude::prop_oneof![
                carina_sys::testkit::noisy_text(),
                "[+-]?[0-9]{0,22}(\\.[0-9]{0,6})?([eE][+-]?[0-9]{1,3})?(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?",
            ],
        ) {
            if let Ok(bytes) = super::quantity_bytes(&Quantity(text)) {
                proptest::prop_assert!(bytes <= i64::MAX as u64);
                proptest::prop_assert_eq!(super::quantity_bytes(&super::bytes_quantity(bytes)), Ok(bytes));
            }
        }

        /// Exponents of any size: a non-zero number far below a byte
        /// rounds up to one byte, far above the largest size is too large,
        /// never an overflow.
        #[test]
        fn quantities_with_any_exponent(
            whole in "[1-9][0-9]{0,5}",
            fraction in "[0-9]{0,3}",
            e in proptest::prelude::prop_oneof![
                proptest::prelude::any::<i64>(),
                proptest::prelude::Just(i64::MIN),
                proptest::prelude::Just(i64::MAX),
                -60i64..60,
            ],
            suffix in proptest::prelude::prop_oneof![
                proptest::prelude::Just("e"),
                proptest::prelude::Just("E"),
            ],
        ) {
            let text = if fraction.is_empty() { format!("{whole}{suffix}{e}") } else { format!("{whole}.{fraction}{suffix}{e}") };
            let got = super::quantity_bytes(&Quantity(text.clone()));
            if e < -40 {
                proptest::prop_assert_eq!(got, Ok(1), "{}", text);
            } else if e > 40 {
                proptest::prop_assert_eq!(got, Err(QuantityError::TooLarge(text.clone())), "{}", text);
            } else if let Ok(bytes) = got {
                proptest::prop_assert!(bytes >= 1 && bytes <= i64::MAX as u64);
            }
        }

        /// A number with any suffix is taken only with a suffix the module
        /// knows.
        #[test]
        fn quantities_with_any_suffix(number in "[0-9]{1,4}(\\.[0-9]{1,2})?", suffix in ".{0,3}") {
            let text = format!("{number}{suffix}");
            if super::quantity_bytes(&Quantity(text.clone())).is_ok() {
                let known = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "n", "u", "m", "k", "M", "G", "T", "P", "E"];
                // The suffix may go on with the number: more digits ("0"
                // and "0m" is "00m"), and a fraction where the number has
                // none ("0" and ".k" is "0.k", the number "0." as
                // Kubernetes reads it); what follows is the real suffix.
                let digits = |t: &str| t.trim_start_matches(|c: char| c.is_ascii_digit()).len();
                let mut rest = &suffix[suffix.len() - digits(&suffix)..];
                if !number.contains('.') && let Some(fraction) = rest.strip_prefix('.') {
                    rest = &fraction[fraction.len() - digits(fraction)..];
                }
                let rest = rest.trim_end();
                let exponent = rest.starts_with(['e', 'E']) && rest[1..].parse::<i64>().is_ok();
                proptest::prop_assert!(
                    known.contains(&rest) || exponent || suffix.chars().all(|c| c.is_ascii_digit() || c == '.' || c.is_whitespace()),
                    "{:?}", text
                );
            }
        }
    }
    use super::*;

    fn q(s: &str) -> Result<u64, QuantityError> {
        quantity_bytes(&Quantity(s.into()))
    }

    #[test]
    fn quantities_in_bytes() {
        let cases = [
            ("10Gi", 10 << 30),
            ("1073741824", 1 << 30),
            ("1Ki", 1024),
            ("1.5Gi", 3 << 29),
            ("1G", 1_000_000_000),
            ("1.5k", 1500),
            ("5e3", 5000),
            ("5E3", 5000),
            ("1E", 1_000_000_000_000_000_000),
            ("0.1", 1),
            ("1500m", 2),
            ("1m", 1),
            ("0", 0),
            ("-0", 0),
            ("+7", 7),
            (".5Ki", 512),
            ("7Ei", 7 << 60),
            (" 3Mi ", 3 << 20),
            ("1e-40", 1),
            ("1500n", 1),
            ("2u", 1),
        ];
        for (text, want) in cases {
            assert_eq!(q(text), Ok(want), "{text}");
        }
    }

    /// Found by `quantities_with_any_exponent`: these overflowed the
    /// exponent arithmetic (a panic in a debug build).
    #[test]
    fn exponents_at_the_ends_of_i64() {
        assert_eq!(q("1e-9223372036854775808"), Ok(1));
        assert_eq!(q("1.5e-9223372036854775808"), Ok(1));
        assert_eq!(q("0e-9223372036854775808"), Ok(0));
        assert!(matches!(
            q("1e9223372036854775807"),
            Err(QuantityError::TooLarge(_))
        ));
    }

    #[test]
    fn bad_quantities() {
        for text in ["", "Gi", "1.2.3", "1Gib", "1gi", "1e", "1x", "--1", "."] {
            assert!(matches!(q(text), Err(QuantityError::Syntax(_))), "{text}");
        }
        assert!(matches!(q("-1Gi"), Err(QuantityError::Negative(_))));
        for text in ["8Ei", "1e19", "99999999999999999999999999999999999999999"] {
            assert!(matches!(q(text), Err(QuantityError::TooLarge(_))), "{text}");
        }
    }

    /// The scheduler's storage requests: malformed, negative and too
    /// large quantities are all refused.
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
            assert_eq!(q(text).ok(), want, "{text:?}");
        }
        assert_eq!(quantity_bytes(&Quantity("4Mi".into())), Ok(4 << 20));
    }

    #[test]
    fn byte_counts_as_quantities_round_trip() {
        for (bytes, text) in [
            (0, "0"),
            (4097, "4097"),
            (1024, "1Ki"),
            (10 << 30, "10Gi"),
            (1536 << 20, "1536Mi"),
            (1 << 60, "1Ei"),
        ] {
            let quantity = bytes_quantity(bytes);
            assert_eq!(quantity.0, text);
            assert_eq!(quantity_bytes(&quantity), Ok(bytes));
        }
    }
}
