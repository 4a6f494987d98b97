//! Parsing the times a user types: `now`, relative (`-30s`, `-5m`, `-1h30m`, `-250ms`),
//! unix seconds with a fraction (`1795000923.25`) and RFC 3339 (`2026-11-21T10:02:03.250Z`).
//! Everything becomes nanoseconds since the unix epoch (UTC).

use std::time::{SystemTime, UNIX_EPOCH};

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum TimeError {
    #[error(
        "cannot read '{0}' as a time: use RFC 3339 (2026-11-21T10:02:03.250Z), unix seconds (1795000923.25), `now`, or a relative time such as -30s, -5m, -1h30m"
    )]
    Unparsable(String),
    #[error("'{0}' is before 1970 or too far in the future")]
    OutOfRange(String),
}

/// Nanoseconds since the unix epoch, now.
pub fn now_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
}

/// Parses `input` relative to `now_ns`.
pub fn parse(input: &str, now_ns: u64) -> Result<u64, TimeError> {
    let s = input.trim();
    let unparsable = || TimeError::Unparsable(input.to_string());
    if s.eq_ignore_ascii_case("now") {
        return Ok(now_ns);
    }
    if let Some(rest) = s.strip_prefix('-') {
        let ago = parse_duration_ns(rest).ok_or_else(unparsable)?;
        return now_ns.checked_sub(ago).ok_or_else(|| TimeError::OutOfRange(input.to_string()));
    }
    if s.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        // Integer and fraction apart, so 1795000923.25 is exactly .250 000 000, not a float's guess.
        let (int, frac) = s.split_once('.').unwrap_or((s, ""));
        if int.is_empty() || frac.contains('.') {
            return Err(unparsable());
        }
        let secs: u64 = int.parse().map_err(|_| TimeError::OutOfRange(input.to_string()))?;
        let mut nanos = 0u64;
        for (i, d) in frac.bytes().take(9).enumerate() {
            nanos += u64::from(d - b'0') * 10u64.pow(8 - i as u32);
        }
        return secs
            .checked_mul(1_000_000_000)
            .and_then(|ns| ns.checked_add(nanos))
            .filter(|&ns| ns < 4_000_000_000 * 1_000_000_000)
            .ok_or_else(|| TimeError::OutOfRange(input.to_string()));
    }
    let ts: jiff::Timestamp = s.parse().map_err(|_| unparsable())?;
    u64::try_from(ts.as_nanosecond()).map_err(|_| TimeError::OutOfRange(input.to_string()))
}

/// `30s`, `5m`, `1h30m`, `250ms`, `1.5s`, `2d`: a sequence of number+unit pairs.
pub fn parse_duration_ns(s: &str) -> Option<u64> {
    let mut total = 0f64;
    let mut rest = s.trim();
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let num_len = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        if num_len == 0 {
            return None;
        }
        let value: f64 = rest[..num_len].parse().ok()?;
        rest = &rest[num_len..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ns" => 1.0,
            "us" | "µs" => 1e3,
            "ms" => 1e6,
            "s" | "sec" => 1e9,
            "m" | "min" => 60e9,
            "h" => 3600e9,
            "d" => 86400e9,
            _ => return None,
        };
        rest = &rest[unit_len..];
        total += value * scale;
    }
    (total.is_finite() && total < 1e19).then_some(total.round() as u64)
}

/// RFC 3339 in UTC with milliseconds, the way every message shows a time.
pub fn format(ns: u64) -> String {
    match jiff::Timestamp::from_nanosecond(ns as i128) {
        Ok(ts) => format!("{ts:.3}"),
        Err(_) => format!("{ns} ns"),
    }
}

/// A short human duration: `1.250s`, `2m 5s`, `3h 2m`.
pub fn format_duration(ns: u64) -> String {
    let secs = ns / 1_000_000_000;
    match secs {
        0..60 => format!("{:.3}s", ns as f64 / 1e9),
        60..3600 => format!("{}m {}s", secs / 60, secs % 60),
        _ => format!("{}h {}m", secs / 3600, (secs % 3600) / 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_795_000_000_000_000_000;

    #[test]
    fn now_and_relative() {
        assert_eq!(parse("now", NOW), Ok(NOW));
        assert_eq!(parse("-30s", NOW), Ok(NOW - 30_000_000_000));
        assert_eq!(parse("-5m", NOW), Ok(NOW - 300_000_000_000));
        assert_eq!(parse("-1h30m", NOW), Ok(NOW - 5_400_000_000_000));
        assert_eq!(parse("-250ms", NOW), Ok(NOW - 250_000_000));
        assert_eq!(parse("-1.5s", NOW), Ok(NOW - 1_500_000_000));
    }

    #[test]
    fn unix_seconds_with_fraction() {
        assert_eq!(parse("1795000923.25", NOW), Ok(1_795_000_923_250_000_000));
        assert_eq!(parse("1795000923", NOW), Ok(1_795_000_923_000_000_000));
    }

    #[test]
    fn rfc3339() {
        let t = parse("2026-11-21T10:02:03.250Z", NOW).unwrap();
        assert_eq!(format(t), "2026-11-21T10:02:03.250Z");
        let with_offset = parse("2026-11-21T11:02:03.250+01:00", NOW).unwrap();
        assert_eq!(t, with_offset);
    }

    #[test]
    fn garbage_is_a_clear_error() {
        for bad in ["", "yesterday", "-", "-5x", "-s", "10:02", "1.2.3"] {
            let err = parse(bad, NOW).unwrap_err();
            assert!(err.to_string().contains("cannot read") || matches!(err, TimeError::OutOfRange(_)), "{bad}: {err}");
        }
        assert!(matches!(parse("-100000d", NOW), Err(TimeError::OutOfRange(_))));
    }

    #[test]
    fn durations_format() {
        assert_eq!(format_duration(1_250_000_000), "1.250s");
        assert_eq!(format_duration(125_000_000_000), "2m 5s");
    }
}
