//! Times and sizes as a page shows them.

use std::time::{Duration, SystemTime};

/// A duration rounded to what a person reads: `0 s`, `42 s`, `3 min 12 s`, `2 h 5 min`,
/// `3 days 4 h`.
pub(crate) fn duration(duration: Duration) -> String {
    let seconds = duration.as_secs();
    match seconds {
        0..60 => format!("{seconds} s"),
        60..3_600 => format!("{} min {} s", seconds / 60, seconds % 60),
        3_600..86_400 => format!("{} h {} min", seconds / 3_600, seconds % 3_600 / 60),
        _ => format!("{} days {} h", seconds / 86_400, seconds % 86_400 / 3_600),
    }
}

/// How long ago `at` was (`just now` for a time ahead of this clock).
pub(crate) fn ago(at: SystemTime, now: SystemTime) -> String {
    match now.duration_since(at) {
        Ok(since) => format!("{} ago", duration(since)),
        Err(_) => "just now".to_owned(),
    }
}

/// How long until `at` (`now` for a time already past).
pub(crate) fn until(at: SystemTime, now: SystemTime) -> String {
    match at.duration_since(now) {
        Ok(left) if left >= Duration::from_secs(1) => format!("in {}", duration(left)),
        _ => "now".to_owned(),
    }
}

/// `at` as a UTC timestamp to the second: `2026-11-28T13:15:30Z`.
pub(crate) fn timestamp(at: SystemTime) -> String {
    humantime::format_rfc3339_seconds(at).to_string()
}

/// A count with thousands separated: `10,000,000`.
pub(crate) fn count(count: u64) -> String {
    let digits = count.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// `count` and the noun, singular or plural: `1 letter`, `12 letters`.
pub(crate) fn counted(count: usize, singular: &str, plural: &str) -> String {
    if count == 1 {
        format!("1 {singular}")
    } else {
        format!("{} {plural}", self::count(count as u64))
    }
}

/// A JSON text pretty-printed (as it is, if it is not JSON).
pub(crate) fn pretty_json(text: &str) -> String {
    serde_json::from_str::<serde_json::Value>(text)
        .ok()
        .and_then(|value| serde_json::to_string_pretty(&value).ok())
        .unwrap_or_else(|| text.to_owned())
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    #[test]
    fn durations_counts_and_times_read_as_a_person_reads_them() {
        assert_eq!(duration(Duration::from_secs(42)), "42 s");
        assert_eq!(duration(Duration::from_secs(192)), "3 min 12 s");
        assert_eq!(duration(Duration::from_secs(7_500)), "2 h 5 min");
        assert_eq!(duration(Duration::from_secs(273_600)), "3 days 4 h");
        assert_eq!(count(0), "0");
        assert_eq!(count(999), "999");
        assert_eq!(count(10_000_000), "10,000,000");
        assert_eq!(counted(1, "letter", "letters"), "1 letter");
        assert_eq!(counted(1_200, "letter", "letters"), "1,200 letters");
        let now = UNIX_EPOCH + Duration::from_secs(1_000);
        assert_eq!(ago(UNIX_EPOCH + Duration::from_secs(958), now), "42 s ago");
        assert_eq!(
            until(UNIX_EPOCH + Duration::from_secs(1_060), now),
            "in 1 min 0 s"
        );
        assert_eq!(until(UNIX_EPOCH, now), "now");
        assert_eq!(timestamp(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        assert_eq!(pretty_json("{\"a\":1}"), "{\n  \"a\": 1\n}");
        assert_eq!(pretty_json("not json"), "not json");
    }
}
