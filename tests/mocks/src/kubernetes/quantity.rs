//! Resource quantities (`500m`, `1.5`, `128Mi`, `1G`, `2e3`) as the API
//! writes them, turned into what the engine takes: CPUs in billionths
//! (`NanoCpus`) and memory in bytes.

/// A quantity that is not one.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
)]
pub struct QuantityError;

/// The value of a quantity, in its base unit (cores, bytes).
pub fn parse(text: &str) -> Result<f64, QuantityError> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || matches!(c, '.' | '+' | '-')))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    if number.is_empty() || number.chars().filter(|c| *c == '.').count() > 1 {
        return Err(QuantityError);
    }
    let value: f64 = number.parse().map_err(|_| QuantityError)?;
    let factor = match suffix {
        "" => 1.0,
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        "Pi" => 1024.0 * 1024.0 * 1024.0 * 1024.0 * 1024.0,
        "Ei" => 1024.0 * 1024.0 * 1024.0 * 1024.0 * 1024.0 * 1024.0,
        exponent if exponent.starts_with(['e', 'E']) => {
            let power: i32 = exponent[1..].parse().map_err(|_| QuantityError)?;
            10f64.powi(power)
        }
        _ => return Err(QuantityError),
    };
    let result = value * factor;
    if result.is_finite() && result >= 0.0 {
        Ok(result)
    } else {
        Err(QuantityError)
    }
}

/// A CPU quantity as billionths of a CPU (Docker's `NanoCpus`).
pub fn nano_cpus(text: &str) -> Result<i64, QuantityError> {
    let cores = parse(text)?;
    // Rounded up as the API rounds CPU to millicores.
    let nanos = (cores * 1e9).ceil();
    if nanos > i64::MAX as f64 {
        return Err(QuantityError);
    }
    Ok(nanos as i64)
}

/// A memory quantity in bytes.
pub fn bytes(text: &str) -> Result<i64, QuantityError> {
    let value = parse(text)?.ceil();
    if value > i64::MAX as f64 {
        return Err(QuantityError);
    }
    Ok(value as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_read_as_the_api_writes_them() {
        assert_eq!(nano_cpus("500m"), Ok(500_000_000));
        assert_eq!(nano_cpus("1.5"), Ok(1_500_000_000));
        assert_eq!(nano_cpus("2"), Ok(2_000_000_000));
        assert_eq!(bytes("128Mi"), Ok(128 * 1024 * 1024));
        assert_eq!(bytes("1G"), Ok(1_000_000_000));
        assert_eq!(bytes("2e3"), Ok(2000));
        assert_eq!(bytes("64Ki"), Ok(65536));
        assert_eq!(bytes("12ab"), Err(QuantityError));
        assert_eq!(bytes(""), Err(QuantityError));
        assert_eq!(bytes("1.2.3"), Err(QuantityError));
    }
}
