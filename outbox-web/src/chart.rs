//! A line chart of the last hour as inline SVG: no script, no image to fetch.

use std::time::SystemTime;

use maud::{Markup, html};

use crate::history::{Sample, WINDOW};

const WIDTH: f64 = 600.0;
const HEIGHT: f64 = 120.0;
/// Room above the highest value, so that a line at the top is drawn whole.
const TOP: f64 = 4.0;

/// A chart of `value` over the samples of the last hour (up to `now`), titled `title`, its
/// scale's top shown with `label`.
pub(crate) fn line(
    title: &str,
    samples: &[Sample],
    now: SystemTime,
    value: impl Fn(&Sample) -> f64,
    label: impl Fn(f64) -> String,
) -> Markup {
    let top = samples.iter().map(&value).fold(0.0_f64, f64::max);
    let scale = if top > 0.0 { top } else { 1.0 };
    let points: Vec<String> = samples
        .iter()
        .filter_map(|sample| {
            let before = now.duration_since(sample.at).unwrap_or_default();
            (before <= WINDOW).then(|| {
                let x = WIDTH * (1.0 - before.as_secs_f64() / WINDOW.as_secs_f64());
                let y = HEIGHT - (HEIGHT - TOP) * value(sample) / scale;
                format!("{x:.1},{y:.1}")
            })
        })
        .collect();
    let summary = match samples.last() {
        Some(last) => format!(
            "{title}: now {}, highest {}",
            label(value(last)),
            label(top)
        ),
        None => format!("{title}: no samples yet"),
    };
    html! {
        figure.chart {
            figcaption { (summary) }
            svg viewBox={ "0 0 " (WIDTH) " " (HEIGHT + 16.0) } role="img" aria-label=(summary) {
                line.axis x1="0" y1=(HEIGHT) x2=(WIDTH) y2=(HEIGHT) {}
                text x="2" y="12" { (label(top)) }
                text x="2" y=(HEIGHT + 14.0) { "1 h ago" }
                text x=(WIDTH - 2.0) y=(HEIGHT + 14.0) text-anchor="end" { "now" }
                @if points.len() == 1 {
                    @let point = points[0].split_once(',').unwrap_or(("0", "0"));
                    circle.value cx=(point.0) cy=(point.1) r="3" {}
                } @else if !points.is_empty() {
                    polyline.value points=(points.join(" ")) {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    #[test]
    fn the_last_hour_spans_the_width_and_the_highest_value_the_height() {
        let now = UNIX_EPOCH + Duration::from_secs(10_000);
        let sample = |before: u64, pending: u64| Sample {
            at: now - Duration::from_secs(before),
            pending,
            oldest: Duration::ZERO,
        };
        let samples = [sample(3_600, 0), sample(1_800, 50), sample(0, 100)];
        let chart = line(
            "pending",
            &samples,
            now,
            |s| s.pending as f64,
            |v| format!("{v}"),
        )
        .into_string();
        assert!(
            chart.contains(r#"points="0.0,120.0 300.0,62.0 600.0,4.0""#),
            "{chart}"
        );
        assert!(chart.contains("pending: now 100, highest 100"), "{chart}");
        let empty = line(
            "pending",
            &[],
            now,
            |s| s.pending as f64,
            |v| format!("{v}"),
        );
        assert!(empty.into_string().contains("no samples yet"));
    }
}
