//! Durations as people write them: `250ms`, `1.5s`, `1m30s`, `2h`, `1d`.

use std::time::Duration;

/// The units, longest first, with their length in nanoseconds.
const UNITS: [(&str, u128); 5] = [
    ("d", 86_400_000_000_000),
    ("h", 3_600_000_000_000),
    ("m", 60_000_000_000),
    ("s", 1_000_000_000),
    ("ms", 1_000_000),
];

/// Parses one or more `<number><unit>` parts (`250ms`, `1.5s`, `1m30s`, `2d`); each number may
/// have a fraction. Exact to the nanosecond: no floating point.
pub fn parse(text: &str) -> Result<Duration, String> {
    if text.is_empty() {
        return Err("an empty duration (write e.g. 10s, 1.5s, 1m30s, 250ms, 2h or 1d)".into());
    }
    let mut total: u128 = 0;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| format!("`{text}` needs a unit: ms, s, m, h or d"))?;
        let (number, after) = rest.split_at(digits);
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_len);
        let scale = UNITS
            .iter()
            .find(|(name, _)| *name == unit)
            .map(|(_, nanos)| *nanos)
            .ok_or_else(|| format!("`{text}`: unknown unit `{unit}` (ms, s, m, h, d)"))?;
        let nanos = scaled(number, scale).ok_or_else(|| format!("`{text}` is not a duration"))?;
        total = total
            .checked_add(nanos)
            .ok_or_else(|| format!("`{text}` is too long"))?;
        rest = next;
    }
    let secs = u64::try_from(total / 1_000_000_000).map_err(|_| format!("`{text}` is too long"))?;
    // The remainder is below 10^9, so it fits.
    let nanos =
        u32::try_from(total % 1_000_000_000).map_err(|_| format!("`{text}` is too long"))?;
    Ok(Duration::new(secs, nanos))
}

/// `number` (digits, optionally a `.` and more digits) times `scale` nanoseconds, rounded down
/// to the nanosecond.
fn scaled(number: &str, scale: u128) -> Option<u128> {
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() {
        return None;
    }
    if !whole
        .chars()
        .chain(fraction.chars())
        .all(|c| c.is_ascii_digit())
    {
        return None;
    }
    let whole: u128 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    let mut nanos = whole.checked_mul(scale)?;
    // At most 18 fraction digits matter (a day is under 10^14 ns); more are dropped.
    let fraction = &fraction[..fraction.len().min(18)];
    if !fraction.is_empty() {
        let digits: u128 = fraction.parse().ok()?;
        let divisor = 10u128.checked_pow(u32::try_from(fraction.len()).ok()?)?;
        nanos = nanos.checked_add(digits.checked_mul(scale)? / divisor)?;
    }
    Some(nanos)
}

/// The duration as people write it: `1m30s`, `1.5s`, `250ms`, `2d3h`, `0s`. [`parse`] reads it
/// back to the same value (to the microsecond).
pub fn human(d: Duration) -> String {
    if d.is_zero() {
        return "0s".into();
    }
    if d < Duration::from_millis(1) {
        return format!("{}µs", d.as_micros());
    }
    if d < Duration::from_secs(1) {
        return with_fraction(u128::from(d.subsec_micros()), 1000, "ms");
    }
    let secs = d.as_secs();
    let (days, hours, minutes, seconds) = (
        secs / 86_400,
        secs % 86_400 / 3_600,
        secs % 3_600 / 60,
        secs % 60,
    );
    let mut out = String::new();
    for (n, unit) in [(days, "d"), (hours, "h"), (minutes, "m")] {
        if n > 0 {
            out.push_str(&format!("{n}{unit}"));
        }
    }
    let micros = u128::from(seconds) * 1_000_000 + u128::from(d.subsec_micros());
    if micros > 0 {
        out.push_str(&with_fraction(micros, 1_000_000, "s"));
    }
    out
}

/// `value / per` with the fraction's trailing zeros dropped, then `unit`.
fn with_fraction(value: u128, per: u128, unit: &str) -> String {
    let (whole, fraction) = (value / per, value % per);
    if fraction == 0 {
        return format!("{whole}{unit}");
    }
    let width = per.ilog10() as usize;
    let digits = format!("{fraction:0width$}");
    format!("{whole}.{}{unit}", digits.trim_end_matches('0'))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn parses_units_fractions_and_compounds() {
        for (text, want) in [
            ("250ms", 250 * MS),
            ("10s", Duration::from_secs(10)),
            ("1.5s", 1500 * MS),
            (".5s", 500 * MS),
            ("2m", Duration::from_secs(120)),
            ("1m30s", Duration::from_secs(90)),
            ("1h", Duration::from_secs(3600)),
            ("1.5h", Duration::from_secs(5400)),
            ("1d", Duration::from_secs(86_400)),
            ("2d12h", Duration::from_secs(216_000)),
            ("1.25ms", Duration::from_micros(1250)),
            ("0s", Duration::ZERO),
        ] {
            assert_eq!(parse(text), Ok(want), "{text}");
        }
        for bad in [
            "", "10", "10w", "s", "1..5s", "1.5", "ms10", "1 s", "-1s", "1e3s",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        assert!(parse("99999999999999999999d").is_err());
    }

    #[test]
    fn prints_as_people_write_and_reads_back() {
        for (d, want) in [
            (Duration::ZERO, "0s"),
            (250 * MS, "250ms"),
            (Duration::from_micros(1250), "1.25ms"),
            (Duration::from_micros(7), "7µs"),
            (1500 * MS, "1.5s"),
            (Duration::from_secs(10), "10s"),
            (Duration::from_secs(90), "1m30s"),
            (Duration::from_secs(3600), "1h"),
            (Duration::from_secs(3661), "1h1m1s"),
            (Duration::from_secs(86_400 + 7200), "1d2h"),
            (90 * 1000 * MS + 500 * MS, "1m30.5s"),
        ] {
            assert_eq!(human(d), want, "{d:?}");
            if d >= MS || d.is_zero() {
                assert_eq!(parse(want), Ok(d), "{want}");
            }
        }
    }

    mod properties {
        use std::time::Duration;

        use proptest::prelude::*;
        use proptest::test_runner::{Config, RngSeed};

        use super::super::*;

        /// A fixed seed, so `./scripts/test` runs the same cases every time; `PROPTEST_CASES` and
        /// `PROPTEST_RNG_SEED` run more or others.
        fn config() -> Config {
            let mut config = Config {
                failure_persistence: None,
                ..Config::default()
            };
            if std::env::var_os("PROPTEST_RNG_SEED").is_none() {
                config.rng_seed = RngSeed::Fixed(2026);
            }
            config
        }

        proptest! {
            #![proptest_config(config())]

            /// What `human` prints, `parse` reads back to the same duration (to the
            /// microsecond, which is what `human` prints), for every duration up to the largest.
            #[test]
            fn printed_durations_read_back(secs in any::<u64>(), nanos in 0u32..1_000_000_000) {
                let d = Duration::new(secs, nanos);
                let micros = Duration::new(secs, nanos / 1000 * 1000);
                prop_assert_eq!(parse(&human(d)), Ok(micros));
            }

            /// Any text: a duration or a message, never a panic; and what parses is exact.
            #[test]
            fn any_text_parses_or_is_refused(text in "[0-9.a-z ]{0,24}|\\PC{0,24}") {
                if let Ok(d) = parse(&text) {
                    prop_assert!(!text.is_empty());
                    // Whatever was accepted prints and reads back (to the microsecond).
                    let again = parse(&human(d)).unwrap();
                    prop_assert_eq!(again.as_micros(), d.as_micros());
                }
            }

            /// Whole numbers of each unit are exact, and too long is refused, not wrapped.
            #[test]
            fn whole_units_are_exact_and_overflow_is_refused(n in any::<u64>()) {
                prop_assert_eq!(parse(&format!("{n}s")), Ok(Duration::from_secs(n)));
                prop_assert_eq!(parse(&format!("{n}ms")), Ok(Duration::from_millis(n)));
                let days = u128::from(n) * 86_400;
                match parse(&format!("{n}d")) {
                    Ok(d) => prop_assert_eq!(u128::from(d.as_secs()), days),
                    Err(e) => {
                        prop_assert!(days > u128::from(u64::MAX));
                        prop_assert!(e.contains("too long"), "{}", e);
                    }
                }
            }
        }
    }
}
