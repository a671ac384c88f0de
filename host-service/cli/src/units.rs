//! Durations and sizes as people type them (`10s`, `1m30s`, `32mb`), and
//! as the CLI prints them.

use std::fmt;
use std::time::Duration;

use thiserror::Error;

/// A duration or size that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("invalid {what} {input:?}: {reason}")]
pub struct UnitError {
    what: &'static str,
    input: String,
    reason: &'static str,
}

/// Parses a duration: one or more `<integer><unit>` parts with units `ms`,
/// `s`, `m`, `h` (`10s`, `500ms`, `1m30s`); a bare integer is seconds.
pub fn parse_duration(input: &str) -> Result<Duration, UnitError> {
    let err = |reason| UnitError {
        what: "duration",
        input: input.to_owned(),
        reason,
    };
    let text = input.trim().to_ascii_lowercase();
    if text.is_empty() {
        return Err(err("empty"));
    }
    if let Ok(secs) = text.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    let mut total_ms: u64 = 0;
    let mut rest = text.as_str();
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(err("expected a number, e.g. 10s, 500ms, 2m, 1h"));
        }
        let value: u64 = rest[..digits]
            .parse()
            .map_err(|_| err("number too large"))?;
        rest = &rest[digits..];
        if rest.starts_with(['.', ',']) {
            return Err(err("whole numbers only: 1500ms, not 1.5s"));
        }
        let unit_len = rest.bytes().take_while(u8::is_ascii_alphabetic).count();
        let factor_ms = match &rest[..unit_len] {
            "ms" => 1,
            "s" => 1000,
            "m" | "min" => 60_000,
            "h" => 3_600_000,
            "" => return Err(err("a unit is needed after each number (ms, s, m, h)")),
            _ => return Err(err("unknown unit (use ms, s, m or h)")),
        };
        rest = &rest[unit_len..];
        total_ms = value
            .checked_mul(factor_ms)
            .and_then(|ms| total_ms.checked_add(ms))
            .ok_or_else(|| err("too long"))?;
    }
    Ok(Duration::from_millis(total_ms))
}

/// Parses a size into KiB: `<integer>[unit]` with units `kb`, `mb`, `gb`
/// (powers of 1024, also written `k`, `m`, `g`, `kib`, `mib`, `gib`); a bare
/// integer is KiB, as Perfetto's `-b` takes it.
pub fn parse_size_kb(input: &str) -> Result<u32, UnitError> {
    let err = |reason| UnitError {
        what: "size",
        input: input.to_owned(),
        reason,
    };
    let text = input.trim().to_ascii_lowercase();
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return Err(err("expected a number, e.g. 32mb, 512kb, 1gb"));
    }
    let value: u64 = text[..digits]
        .parse()
        .map_err(|_| err("number too large"))?;
    if text[digits..].starts_with(['.', ',']) {
        return Err(err("whole numbers only: 1536mb, not 1.5gb"));
    }
    let factor = match text[digits..].trim() {
        "" | "k" | "kb" | "kib" => 1,
        "m" | "mb" | "mib" => 1024,
        "g" | "gb" | "gib" => 1024 * 1024,
        _ => return Err(err("unknown unit (use kb, mb or gb)")),
    };
    let kb = value.checked_mul(factor).ok_or_else(|| err("too large"))?;
    if kb == 0 {
        return Err(err("must not be zero"));
    }
    u32::try_from(kb).map_err(|_| err("larger than 4 TiB"))
}

/// A byte count for people: `812 B`, `1.5 KiB`, `32.0 MiB`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bytes(pub u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
        if self.0 < 1024 {
            return write!(f, "{} B", self.0);
        }
        let mut value = self.0 as f64 / 1024.0;
        let mut unit = 0;
        while value >= 1024.0 && unit + 1 < UNITS.len() {
            value /= 1024.0;
            unit += 1;
        }
        write!(f, "{value:.1} {}", UNITS[unit])
    }
}

/// A duration for people: `850 ms`, `12.3 s`, `4m05s`, `1h02m`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Elapsed(pub Duration);

impl fmt::Display for Elapsed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0.as_millis();
        let secs = self.0.as_secs();
        if ms < 1000 {
            write!(f, "{ms} ms")
        } else if secs < 60 {
            write!(f, "{:.1} s", self.0.as_secs_f64())
        } else if secs < 3600 {
            write!(f, "{}m{:02}s", secs / 60, secs % 60)
        } else {
            write!(f, "{}h{:02}m", secs / 3600, secs % 3600 / 60)
        }
    }
}

/// A UTC calendar date and time, from seconds since the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UtcTime {
    /// Year.
    pub year: i64,
    /// Month, 1..=12.
    pub month: u32,
    /// Day, 1..=31.
    pub day: u32,
    /// Hour, minute, second.
    pub hms: (u32, u32, u32),
}

impl UtcTime {
    /// The calendar time of `secs` after the epoch (proleptic Gregorian).
    pub fn from_unix(secs: i64) -> Self {
        let days = secs.div_euclid(86_400);
        let rem = secs.rem_euclid(86_400) as u32;
        // Civil-from-days over 400-year eras (Howard Hinnant's method).
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
        let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
        let year = yoe + era * 400 + i64::from(month <= 2);
        UtcTime {
            year,
            month,
            day,
            hms: (rem / 3600, rem % 3600 / 60, rem % 60),
        }
    }

    /// Now.
    pub fn now() -> Self {
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Self::from_unix(i64::try_from(secs).unwrap_or(i64::MAX))
    }

    /// `20260121-093005`, for file names.
    pub fn compact(&self) -> String {
        let (h, m, s) = self.hms;
        format!(
            "{:04}{:02}{:02}-{h:02}{m:02}{s:02}",
            self.year, self.month, self.day
        )
    }
}

impl fmt::Display for UtcTime {
    /// `2026-01-21 09:30:05 UTC`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (h, m, s) = self.hms;
        write!(
            f,
            "{:04}-{:02}-{:02} {h:02}:{m:02}:{s:02} UTC",
            self.year, self.month, self.day
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("10"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("2H"), Ok(Duration::from_secs(7200)));
        for bad in ["", "s", "10x", "1.5s", "10 s x", "99999999999999999999h"] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
        let e = parse_duration("10x").unwrap_err().to_string();
        assert!(e.contains("\"10x\"") && e.contains("unknown unit"), "{e}");
        let e = parse_duration("0.5s").unwrap_err().to_string();
        assert!(e.contains("whole numbers only: 1500ms, not 1.5s"), "{e}");
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size_kb("32mb"), Ok(32 * 1024));
        assert_eq!(parse_size_kb("32MB"), Ok(32 * 1024));
        assert_eq!(parse_size_kb("512kb"), Ok(512));
        assert_eq!(parse_size_kb("512"), Ok(512));
        assert_eq!(parse_size_kb("1g"), Ok(1024 * 1024));
        for bad in ["", "mb", "0", "3tb", "-1mb", "5000000gb"] {
            assert!(parse_size_kb(bad).is_err(), "{bad:?}");
        }
        let e = parse_size_kb("1.5gb").unwrap_err().to_string();
        assert!(e.contains("whole numbers only: 1536mb, not 1.5gb"), "{e}");
    }

    #[test]
    fn display() {
        assert_eq!(Bytes(812).to_string(), "812 B");
        assert_eq!(Bytes(1536).to_string(), "1.5 KiB");
        assert_eq!(Bytes(32 << 20).to_string(), "32.0 MiB");
        assert_eq!(Elapsed(Duration::from_millis(850)).to_string(), "850 ms");
        assert_eq!(Elapsed(Duration::from_millis(12_340)).to_string(), "12.3 s");
        assert_eq!(Elapsed(Duration::from_secs(245)).to_string(), "4m05s");
        assert_eq!(Elapsed(Duration::from_secs(3720)).to_string(), "1h02m");
    }

    #[test]
    fn calendar() {
        assert_eq!(UtcTime::from_unix(0).to_string(), "1970-01-01 00:00:00 UTC");
        // 2000-02-29 12:34:56 (a leap day in a century leap year).
        assert_eq!(
            UtcTime::from_unix(951_827_696).to_string(),
            "2000-02-29 12:34:56 UTC"
        );
        assert_eq!(
            UtcTime::from_unix(1_795_245_541).compact(),
            "20261121-071901"
        );
        assert_eq!(
            UtcTime::from_unix(-1).to_string(),
            "1969-12-31 23:59:59 UTC"
        );
    }
}
