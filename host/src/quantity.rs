//! Kubernetes quantities (`10Gi`, `500m`, `1.5`) as plain numbers for plugins.

/// The value of `quantity` scaled by `scale` (1 for bytes, 1000 for CPU millis),
/// rounded up; `None` when it is not a valid quantity.
pub fn parse_scaled(quantity: &str, scale: u128) -> Option<u64> {
    let q = quantity.trim();
    let split = q.find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-')).unwrap_or(q.len());
    let (number, suffix) = q.split_at(split);
    let (numerator, denominator): (u128, u128) = match suffix {
        "" => (1, 1),
        "m" => (1, 1000),
        "k" => (1000, 1),
        "M" => (1_000_000, 1),
        "G" => (1_000_000_000, 1),
        "T" => (1_000_000_000_000, 1),
        "P" => (1_000_000_000_000_000, 1),
        "Ki" => (1 << 10, 1),
        "Mi" => (1 << 20, 1),
        "Gi" => (1 << 30, 1),
        "Ti" => (1 << 40, 1),
        "Pi" => (1 << 50, 1),
        _ => return None,
    };
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.starts_with('-') || (whole.is_empty() && fraction.is_empty()) {
        return None;
    }
    let whole = whole.trim_start_matches('+');
    let digits = format!("{whole}{fraction}");
    let mantissa: u128 = if digits.is_empty() { 0 } else { digits.parse().ok()? };
    let fraction_scale = 10u128.checked_pow(fraction.len() as u32)?;
    let top = mantissa.checked_mul(numerator)?.checked_mul(scale)?;
    let bottom = denominator.checked_mul(fraction_scale)?;
    u64::try_from(top.div_ceil(bottom)).ok()
}

/// Bytes in a memory or storage quantity.
pub fn bytes(quantity: &str) -> Option<u64> {
    parse_scaled(quantity, 1)
}

/// Thousandths of a CPU in a CPU quantity.
pub fn millis(quantity: &str) -> Option<u64> {
    parse_scaled(quantity, 1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_forms_users_write() {
        assert_eq!(bytes("10Gi"), Some(10 << 30));
        assert_eq!(bytes("512Mi"), Some(512 << 20));
        assert_eq!(bytes("1G"), Some(1_000_000_000));
        assert_eq!(bytes("1.5Gi"), Some(3 << 29));
        assert_eq!(bytes("1024"), Some(1024));
        assert_eq!(millis("500m"), Some(500));
        assert_eq!(millis("2"), Some(2000));
        assert_eq!(millis("0.25"), Some(250));
        assert_eq!(millis("1.5"), Some(1500));
    }

    #[test]
    fn refuses_what_is_not_a_quantity() {
        for bad in ["", "ten", "10Gb", "-1Gi", "1..2", "Gi", "1e3x"] {
            assert_eq!(bytes(bad), None, "{bad}");
        }
    }
}
