//! Durations as people write them: `250ms`, `1.5s`, `1m30s`, `2h`, `1d`.
//!
//! humantime reads each part; what is kept here is the narrower grammar `--help` promises (the
//! units `ms`, `s`, `m`, `h` and `d`, no spaces, no weeks or months) and the messages in its terms.

use std::time::Duration;

/// The units a part may have.
const UNITS: [&str; 5] = ["ms", "s", "m", "h", "d"];

/// The largest number of milliseconds humantime keeps (it counts them in `u64` nanoseconds).
const MAX_MS: u64 = u64::MAX / 1_000_000;

/// Parses one or more `<number><unit>` parts (`250ms`, `1.5s`, `1m30s`, `2d`); each number may
/// have a fraction, which must come out exact (to the nanosecond; for `h` and `d`, to the
/// second). No floating point.
pub fn parse(text: &str) -> Result<Duration, String> {
    if text.is_empty() {
        return Err("an empty duration (write e.g. 10s, 1.5s, 1m30s, 250ms, 2h or 1d)".into());
    }
    let mut total = Duration::ZERO;
    for part in parts(text) {
        let unit = part.trim_start_matches(is_number);
        if unit.is_empty() {
            return Err(format!("`{text}` needs a unit: ms, s, m, h or d"));
        }
        if !UNITS.contains(&unit) {
            return Err(format!("`{text}`: unknown unit `{unit}` (ms, s, m, h, d)"));
        }
        let number = &part[..part.len() - unit.len()];
        total = total
            .checked_add(parse_part(text, number, unit)?)
            .ok_or_else(|| format!("`{text}` is too long"))?;
    }
    Ok(total)
}

/// Whether `c` belongs to a part's number rather than to its unit.
fn is_number(c: char) -> bool {
    c.is_ascii_digit() || c == '.'
}

/// `text` cut where a unit ends and the next number begins: `1m30s` is `1m` and `30s`.
fn parts(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let unit = rest.find(|c: char| !is_number(c)).unwrap_or(rest.len());
        let end = rest[unit..]
            .find(is_number)
            .map_or(rest.len(), |at| unit + at);
        let (part, next) = rest.split_at(end);
        rest = next;
        Some(part)
    })
}

/// One part, read by humantime. Each part is read alone and the parts are added here, so that
/// a total past `Duration::MAX` is refused as too long, never wrapped.
fn parse_part(text: &str, number: &str, unit: &str) -> Result<Duration, String> {
    let not_a_duration = || format!("`{text}` is not a duration");
    if !number.contains(|c: char| c.is_ascii_digit()) {
        return Err(not_a_duration());
    }
    // humantime wants a digit on both sides of the point: `.5s` is `0.5s`, `1.s` is `1s`.
    let number = number.strip_suffix('.').unwrap_or(number);
    let lead = if number.starts_with('.') { "0" } else { "" };
    match humantime::parse_duration(&format!("{lead}{number}{unit}")) {
        Ok(d) => Ok(d),
        Err(humantime::DurationError::NumberOverflow) => {
            let (whole, _) = number.split_once('.').unwrap_or((number, ""));
            let whole = if whole.is_empty() { "0" } else { whole };
            if humantime::parse_duration(&format!("{whole}{unit}")).is_ok() {
                // The whole part fits, so the fraction is what cannot be kept exactly.
                Err(format!(
                    "`{text}`: the fraction of `{number}{unit}` is finer than a duration keeps \
                     (a nanosecond; a second for h and d): write the rest in a smaller unit"
                ))
            } else if unit == "ms" {
                Err(format!(
                    "`{text}` is too long in ms (at most {MAX_MS}ms): write it in s, m, h or d"
                ))
            } else {
                Err(format!("`{text}` is too long"))
            }
        }
        Err(_) => Err(not_a_duration()),
    }
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

    /// What humantime reads but the documented grammar does not have is refused, each with a
    /// message in the grammar's terms.
    #[test]
    fn refuses_outside_the_grammar_and_says_why() {
        for (bad, says) in [
            ("", "empty"),
            ("10", "needs a unit"),
            ("1m30", "needs a unit"),
            ("1.", "needs a unit"),
            ("10w", "unknown unit `w`"),
            ("1sec", "unknown unit `sec`"),
            ("2 hours", "unknown unit ` hours`"),
            ("1h 30m", "unknown unit `h `"),
            ("1us", "unknown unit `us`"),
            ("1µs", "unknown unit `µs`"),
            ("1M", "unknown unit `M`"),
            ("-1s", "unknown unit `-`"),
            ("s", "not a duration"),
            (".s", "not a duration"),
            ("1..5s", "not a duration"),
            ("99999999999999999999d", "too long"),
            ("18446744073709551615s1s", "too long"),
            ("18446744073709551615s1000ms", "too long"),
            ("18446744073710ms", "too long in ms"),
            ("1.0001h", "fraction"),
            ("1.0000000001s", "fraction"),
        ] {
            match parse(bad) {
                Ok(d) => panic!("`{bad}` was read as {d:?}"),
                Err(e) => assert!(e.contains(says), "`{bad}`: {e}"),
            }
        }
        assert_eq!(parse("1.s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse("1m.5s"), Ok(Duration::from_millis(60_500)));
        assert_eq!(parse("18446744073709ms"), Ok(Duration::from_millis(MAX_MS)));
        assert_eq!(
            parse("18446744073709551615s999ms"),
            Ok(Duration::new(u64::MAX, 999_000_000))
        );
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
                    let again = parse(&human(d)).map_err(|e| {
                        TestCaseError::fail(format!("parsing the printed duration back: {e}"))
                    })?;
                    prop_assert_eq!(again.as_micros(), d.as_micros());
                }
            }

            /// Whole numbers of each unit are exact, and too long is refused, not wrapped.
            #[test]
            fn whole_units_are_exact_and_overflow_is_refused(n in any::<u64>()) {
                prop_assert_eq!(parse(&format!("{n}s")), Ok(Duration::from_secs(n)));
                // humantime counts milliseconds in u64 nanoseconds: about 584 years of them.
                match parse(&format!("{n}ms")) {
                    Ok(d) => prop_assert_eq!(d, Duration::from_millis(n)),
                    Err(e) => {
                        prop_assert!(n > MAX_MS);
                        prop_assert!(e.contains("too long"), "{}", e);
                    }
                }
                let small = n % (MAX_MS + 1);
                prop_assert_eq!(parse(&format!("{small}ms")), Ok(Duration::from_millis(small)));
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
