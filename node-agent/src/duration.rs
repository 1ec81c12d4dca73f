//! Durations as flags and specs write them: number-unit pairs such as `30s`, `1m30s`, `250ms`.

use std::time::Duration;

/// Parses a duration written as number-unit pairs, e.g. `30s`, `1m30s`, `250ms`, `0ms`
/// (units: ms, s, m, h).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("invalid duration {text:?}: expected e.g. 30s, 1m30s, 250ms");
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err(bad());
    }
    let mut total = Duration::ZERO;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let letters = rest[digits..]
            .bytes()
            .take_while(u8::is_ascii_alphabetic)
            .count();
        if digits == 0 || letters == 0 {
            return Err(bad());
        }
        let n: u64 = rest[..digits].parse().map_err(|_| bad())?;
        let unit = match &rest[digits..digits + letters] {
            "ms" => Duration::from_millis(1),
            "s" => Duration::from_secs(1),
            "m" => Duration::from_secs(60),
            "h" => Duration::from_secs(3600),
            _ => return Err(bad()),
        };
        let part = u32::try_from(n)
            .ok()
            .and_then(|n| unit.checked_mul(n))
            .ok_or_else(bad)?;
        total = total.checked_add(part).ok_or_else(bad)?;
        rest = &rest[digits + letters..];
    }
    Ok(total)
}

/// Like [`parse_duration`], but refuses zero.
pub fn parse_nonzero_duration(text: &str) -> Result<Duration, String> {
    let d = parse_duration(text)?;
    if d.is_zero() {
        return Err(format!("duration {text:?} must be greater than zero"));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        let table: &[(&str, Option<Duration>)] = &[
            ("30s", Some(Duration::from_secs(30))),
            ("0ms", Some(Duration::ZERO)),
            ("250ms", Some(Duration::from_millis(250))),
            ("1m30s", Some(Duration::from_secs(90))),
            ("2h", Some(Duration::from_secs(7200))),
            ("", None),
            ("30", None),
            ("s", None),
            ("3d", None),
            ("-1s", None),
            ("1.5s", None),
        ];
        for (text, want) in table {
            assert_eq!(parse_duration(text).ok(), *want, "{text:?}");
        }
        assert!(parse_nonzero_duration("0s").is_err());
    }
}
