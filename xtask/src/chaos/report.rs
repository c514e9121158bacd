//! The table a chaos run prints, one per database.

use std::fmt::Write;

use super::Outcome;

/// The outcome as a plain-text table, its verdict last.
pub(crate) fn render(outcome: &Outcome, seed: u64) -> String {
    let figures = &outcome.figures;
    let downtime = if outcome.downtime.is_empty() {
        String::new()
    } else {
        let away: Vec<String> = outcome
            .downtime
            .iter()
            .map(|away| format!("{:.1} s", away.as_secs_f64()))
            .collect();
        format!(" (server away {})", away.join(", "))
    };
    let rows: Vec<(&str, String)> = vec![
        (
            "messages",
            format!(
                "{} sequenced over {} shards, {} coalescing rows in {} groups",
                figures.sequenced_written,
                outcome.shards,
                figures.coalesced_written,
                figures.groups
            ),
        ),
        (
            "deliveries",
            format!(
                "{} handler calls by {} relays at once",
                figures.deliveries, outcome.relays
            ),
        ),
        ("kills", format!("{} (SIGKILL)", outcome.kills)),
        (
            "handler stalls",
            match outcome.stall_every {
                0 => "none".to_owned(),
                every => format!("1 call in {every} stalls a second past the lease"),
            },
        ),
        ("restarts", format!("{}{downtime}", outcome.restarts)),
        (
            "cleanup horizon",
            match outcome.horizon {
                None => "not held (SQLite)".to_owned(),
                Some(held) => format!(
                    "held {:.1} s by a snapshot that read the outbox (opened again after each \
                     restart)",
                    held.as_secs_f64()
                ),
            },
        ),
        (
            "lost",
            format!(
                "{} ({} sequenced, {} coalescing)",
                figures.lost(),
                figures.lost_sequenced,
                figures.lost_coalesced
            ),
        ),
        (
            "duplicates",
            format!(
                "{} ({} of them with attempt = 1)",
                figures.duplicates, figures.duplicates_attempt_one
            ),
        ),
        ("order violations", figures.order_violations.to_string()),
        ("overlapping holders", figures.overlaps.to_string()),
        ("leases lapsed", {
            let lapses = outcome.lapses();
            if lapses.is_empty() {
                "none".to_owned()
            } else {
                lapses.join("; ")
            }
        }),
        ("phantoms", figures.phantoms.to_string()),
        ("recovery after a kill", figures.recovery_kill.to_string()),
        (
            "recovery after a restart",
            figures.recovery_restart.to_string(),
        ),
        (
            "shards resumed after a kill",
            figures.resume_kill.to_string(),
        ),
        (
            "shards resumed after a restart",
            figures.resume_restart.to_string(),
        ),
        (
            "outbox warnings",
            format!(
                "{} (at most {} \"database unavailable\" from one relay; one per restart \
                 is the limit)",
                outcome.warnings.len(),
                outcome.outage_warnings_per_relay()
            ),
        ),
        (
            "drain",
            format!(
                "{:.1} s from the relays' start",
                outcome.drain.as_secs_f64()
            ),
        ),
    ];
    let width = rows.iter().map(|(label, _)| label.len()).max().unwrap_or(0);
    let mut out = format!("chaos: {}, seed {seed}\n", outcome.backend.name());
    for (label, value) in rows {
        let _ = writeln!(out, "  {label:<width$}  {value}");
    }
    if figures.torn_records > 0 {
        let _ = writeln!(
            out,
            "  ({} record lines did not read)",
            figures.torn_records
        );
    }
    if let Some(remaining) = outcome.remaining {
        let _ = writeln!(
            out,
            "  the outbox still held {remaining} rows at the deadline"
        );
    }
    for warning in &outcome.warnings {
        let _ = writeln!(out, "  {warning}");
    }
    for crash in &outcome.crashes {
        let _ = writeln!(out, "  crash: {crash}");
    }
    if let Some(logs) = &outcome.logs {
        let _ = writeln!(
            out,
            "  each relay's whole log, and its records, kept in {}",
            logs.display()
        );
    }
    for example in &figures.examples {
        let _ = writeln!(out, "  {example}");
    }
    let failures = outcome.failures();
    let verdict = if failures.is_empty() {
        "PASSED: nothing lost, every shard in order, no shard held twice, every redelivery \
         marked, one warning per outage"
            .to_owned()
    } else {
        format!(
            "FAILED: {} (replay with --seed {seed})",
            failures.join(", ")
        )
    };
    let _ = write!(out, "  {verdict}");
    out
}
