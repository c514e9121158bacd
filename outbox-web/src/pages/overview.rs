//! The overview: what is pending and how old, the shards by state, dead letters, backfills
//! and relays, and the last hour as a chart.

use std::time::SystemTime;

use axum::response::Response;
use maud::{Markup, html};
use outbox_core::backfill::BackfillPhase;

use super::{shard_link, status_badge};
use crate::chart;
use crate::error::PageError;
use crate::format;
use crate::page::Page;

/// How many of the deepest shards the overview lists.
const DEEPEST: usize = 10;

pub(crate) async fn page(page: Page) -> Response {
    let body = body(&page).await;
    page.respond(body)
}

async fn body(page: &Page) -> Result<Markup, PageError> {
    let outbox = &page.console.outbox;
    // A large backlog's figures are estimated, at a cost that does not grow with it; a small
    // one's are counted, with its deepest shards.
    let gauges = outbox.gauges().await?;
    let status = if gauges.estimated {
        gauges
    } else {
        outbox.status(DEEPEST).await?
    };
    let relays = outbox.relays().await?;
    let backfills = outbox.backfills().await?;
    let now = SystemTime::now();
    let walking = backfills
        .iter()
        .filter(|backfill| backfill.phase() == BackfillPhase::Walking)
        .count();
    let samples = page.console.samples.all();
    let oldest = status
        .oldest_pending_at
        .map_or_else(|| "none pending".to_owned(), |at| format::ago(at, now));
    let estimated = if status.estimated { " (estimated)" } else { "" };
    let states = [
        ("due", status.shards_due, "/shards"),
        ("in flight", status.shards_in_flight, "/shards"),
        (
            "backing off",
            status.shards_in_backoff,
            "/shards?filter=failing",
        ),
        ("paused", status.shards_paused, "/shards?filter=paused"),
        ("parked", status.shards_parked, "/shards?filter=parked"),
    ];
    let body = html! {
        section.cards aria-label="At a glance" {
            div.card {
                h2 { "Pending" }
                p.figure { (format::count(status.pending_messages)) (estimated) }
                p { "in " (format::counted(status.shards as usize, "shard", "shards")) }
            }
            div.card {
                h2 { "Oldest pending" }
                p.figure { (oldest) }
            }
            div.card {
                h2 { "Dead letters" }
                p.figure { a href=(page.link("/dead-letters")) { (format::count(status.dead_letters)) } }
                @if let Some(at) = status.oldest_dead_letter_at {
                    p { "oldest set aside " (format::ago(at, now)) }
                }
            }
            div.card {
                h2 { "Backfills" }
                p.figure { a href=(page.link("/backfills")) { (walking) " walking" } }
                p { "of " (backfills.len()) " models" }
            }
        }
        section aria-labelledby="states" {
            h2 id="states" { "Shards by state" }
            table.states {
                thead { tr { th scope="col" { "State" } th scope="col" { "Shards" } } }
                tbody {
                    @for (label, count, path) in states {
                        tr {
                            th scope="row" { a href=(page.link(path)) { (label) } }
                            td { (format::count(count)) }
                        }
                    }
                }
            }
        }
        section.charts aria-label="The last hour" {
            (chart::line("Pending messages", &samples, now, |sample| sample.pending as f64,
                |value| format::count(value as u64)))
            (chart::line("Oldest pending message's age", &samples, now,
                |sample| sample.oldest.as_secs_f64(),
                |value| format::duration(std::time::Duration::from_secs_f64(value))))
        }
        section aria-labelledby="deepest" {
            h2 id="deepest" { "Deepest shards" }
            @if status.estimated {
                p.note { "The backlog is too large to rank every shard by depth on each view: "
                    a href=(page.link("/shards")) { "the shards page" } " lists them." }
            } @else if status.deepest.is_empty() {
                p { "No shard has pending messages." }
            } @else {
                table {
                    thead { tr {
                        th scope="col" { "Shard" } th scope="col" { "State" }
                        th scope="col" { "Pending" } th scope="col" { "Oldest" }
                        th scope="col" { "Attempts" }
                    } }
                    tbody {
                        @for shard in &status.deepest {
                            tr {
                                td { (shard_link(page, &shard.shard)) }
                                td { (status_badge(shard.status)) }
                                td { (format::count(shard.pending)) }
                                td { @if let Some(at) = shard.oldest_pending_at { (format::ago(at, now)) } }
                                td { (shard.attempts) }
                            }
                        }
                    }
                }
            }
        }
        section aria-labelledby="relays" {
            h2 id="relays" { "Relays" }
            @if relays.is_empty() {
                p { "No relay has recorded a heartbeat: none is running, or none runs "
                    code { "Relay::run" } "." }
            } @else {
                table {
                    thead { tr {
                        th scope="col" { "Worker" } th scope="col" { "State" }
                        th scope="col" { "Last seen" } th scope="col" { "Shards in flight" }
                        th scope="col" { "Waiting on" }
                    } }
                    tbody {
                        @for relay in &relays {
                            tr {
                                td { code { (relay.worker) } }
                                td { @if relay.live { "running" } @else { "not answering" } }
                                td { (format::ago(relay.seen_at, now)) }
                                td { (relay.shards_in_flight) }
                                td { (relay.open_breakers.join(", ")) }
                            }
                        }
                    }
                }
            }
        }
    };
    Ok(page.render("Overview", true, &body))
}
