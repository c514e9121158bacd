//! Shards: the list by state and scope, a shard's page with its pending messages, and the
//! actions on a shard (retry now, pause, resume).

use std::time::SystemTime;

use axum::body::Bytes;
use axum::response::Response;
use maud::{Markup, html};
use outbox_core::admin::{NextRetry, PauseTarget, ShardFilter, ShardInfo, ShardQuery};

use super::{action, done, error_chain, notice, shard_field, shard_link, status_badge};
use crate::error::PageError;
use crate::format;
use crate::page::{Page, encode};

/// The most shards a list shows.
const LIMIT: usize = 100;
/// The most pending messages a shard's page shows.
const MESSAGES: usize = 50;

pub(crate) async fn list(page: Page) -> Response {
    let body = list_body(&page).await;
    page.respond(body)
}

async fn list_body(page: &Page) -> Result<Markup, PageError> {
    let (filter, filter_name) = match page.query.get("filter") {
        None | Some("pending") => (ShardFilter::Pending, "pending"),
        Some("failing") => (ShardFilter::Failing, "failing"),
        Some("paused") => (ShardFilter::Paused, "paused"),
        Some("parked") => (ShardFilter::Parked, "parked"),
        Some(other) => {
            return Err(PageError::BadInput(format!(
                "`{other}` is not a shard filter: pending, failing, paused or parked"
            )));
        }
    };
    let mut query = ShardQuery::new(filter, LIMIT);
    if let Some(text) = page.query.get("scope").filter(|text| !text.is_empty()) {
        let scope = page
            .catalog()
            .read_scope(text)
            .map_err(|error| PageError::BadInput(error.to_string()))?;
        query = query.scope(scope);
    }
    if let Some(text) = page.query.get("category").filter(|text| !text.is_empty()) {
        let category = page
            .catalog()
            .read_category(text)
            .map_err(|error| PageError::BadInput(error.to_string()))?;
        query = query.category(category);
    }
    let list = page.console.outbox.shards(&query).await?;
    let shards = &list.shards;
    let now = SystemTime::now();
    let filters = [
        ("pending", "With pending messages, deepest first"),
        ("failing", "Failing"),
        ("paused", "Paused"),
        ("parked", "Parked"),
    ];
    let body = html! {
        (notice(page))
        form.filters method="get" action=(page.link("/shards")) {
            label for="filter" { "Shards" }
            select id="filter" name="filter" {
                @for (value, label) in filters {
                    option value=(value) selected[value == filter_name] { (label) }
                }
            }
            label for="scope" { "Scope" }
            input id="scope" name="scope" value=[page.query.get("scope")] placeholder="any";
            label for="category" { "Category" }
            input id="category" name="category" value=[page.query.get("category")] placeholder="any";
            button type="submit" { "Show" }
        }
        @if shards.is_empty() {
            p { "No shard matches." }
        } @else {
            table {
                thead { tr {
                    th scope="col" { "Shard" } th scope="col" { "State" }
                    th scope="col" { "Pending" } th scope="col" { "Oldest" }
                    th scope="col" { "Attempts" } th scope="col" { "Next retry" }
                    th scope="col" { "Held by" } th scope="col" { "Last error" }
                } }
                tbody {
                    @for info in shards {
                        tr {
                            td { (shard_link(page, &info.shard)) }
                            td { (status_badge(info.status)) }
                            td { @if info.pending_estimated { "≈ " } (format::count(info.pending)) }
                            td { @if let Some(at) = info.oldest_pending_at { (format::ago(at, now)) } }
                            td { (info.attempts) }
                            td { (next_retry(info, now)) }
                            td { @if let Some(owner) = &info.lease_owner { code { (owner) } } }
                            td.last-error { @if let Some(error) = &info.last_error { (error) } }
                        }
                    }
                }
            }
            @if shards.len() >= LIMIT {
                p.note { "The " (LIMIT) " deepest shards are listed." }
            }
        }
        @if let Some(messages) = list.sampled {
            p.note { "The backlog is large: these shards are ranked from a sample of "
                (format::count(messages)) " pending messages, so the order is approximate, a "
                "count marked ≈ is an estimate, and a shard the sample missed is not listed "
                "(the first shards of a scope given, and paused, failing and parked shards, are "
                "found from their own rows)." }
        }
    };
    Ok(page.render("Shards", true, &body))
}

pub(crate) async fn page(page: Page) -> Response {
    let body = shard_body(&page).await;
    page.respond(body)
}

async fn shard_body(page: &Page) -> Result<Markup, PageError> {
    let shard = shard_field(page, &page.query, "key")?;
    let outbox = &page.console.outbox;
    let text = page.catalog().shard_text(&shard);
    let info = outbox.shard(&shard).await?;
    let messages = outbox.shard_messages(&shard, MESSAGES).await?;
    let now = SystemTime::now();
    let Some(info) = info else {
        return Err(PageError::NotFound(format!(
            "shard {text} has no pending message and no recorded state"
        )));
    };
    let key = html! { input type="hidden" name="shard" value=(text); };
    let body = html! {
        (notice(page))
        dl.facts {
            dt { "State" } dd { (status_badge(info.status)) }
            dt { "Pending" } dd { (format::count(info.pending)) }
            dt { "Oldest" } dd { @if let Some(at) = info.oldest_pending_at {
                (format::ago(at, now)) " (" (format::timestamp(at)) ")" } }
            dt { "Attempts" } dd { (info.attempts) }
            dt { "Next retry" } dd { @match info.next_retry() {
                Some(NextRetry::At(at)) => { (format::until(at, now)) " (" (format::timestamp(at)) ")" }
                Some(NextRetry::Now) => { "now" }
                None => { "—" }
            } }
            dt { "Held by" } dd { @if let Some(owner) = &info.lease_owner { code { (owner) } } @else { "no relay" } }
            @if let Some(category) = info.parked_category {
                dt { "Parked on" } dd { "category " (page.catalog().category_text(category))
                    ", which no running binary knows" }
            }
        }
        @if let Some(error) = &info.last_error {
            h2 { "Last error" }
            (error_chain(error))
        }
        div.actions {
            (action(page, "/shard/retry", "Retry now", &key))
            @if info.paused {
                (action(page, "/shard/resume", "Resume", &key))
            } @else {
                (action(page, "/shard/pause", "Pause", &html! {
                    (key)
                    label { "Reason " input name="reason" placeholder="why, for the other operators"; }
                }))
            }
        }
        h2 { "Pending messages" }
        @if messages.is_empty() {
            p { "None." }
        } @else {
            @for message in &messages {
                article.message {
                    h3 { "Message " (message.id.0) }
                    dl.facts {
                        dt { "Category" } dd { (page.catalog().category_text(message.category)) }
                        dt { "Object" } dd { code { (message.object_identifier) } }
                        dt { "Written" } dd { (format::ago(message.created_at, now)) " ("
                            (format::timestamp(message.created_at)) ")" }
                        @if let Some(trace) = trace_id(message.metadata.as_deref()) {
                            dt { "Trace" } dd { code { (trace) } }
                        }
                    }
                    pre.payload { (format::pretty_json(&message.payload)) }
                    @if let Some(metadata) = &message.metadata {
                        details { summary { "Metadata" } pre { (format::pretty_json(metadata)) } }
                    }
                }
            }
            @if messages.len() >= MESSAGES {
                p.note { "The oldest " (MESSAGES) " of " (format::count(info.pending)) " are shown." }
            }
        }
    };
    Ok(page.render(&format!("Shard {text}"), false, &body))
}

/// The trace id in a message's metadata (a W3C `traceparent`'s), if it carries one.
/// When a listed shard is tried again, as its state has it: nothing for a shard with no
/// failure to retry.
fn next_retry(info: &ShardInfo, now: SystemTime) -> String {
    match info.next_retry() {
        Some(NextRetry::At(at)) => format::until(at, now),
        Some(NextRetry::Now) => "now".to_owned(),
        None => String::new(),
    }
}

fn trace_id(metadata: Option<&str>) -> Option<String> {
    let value: serde_json::Value = serde_json::from_str(metadata?).ok()?;
    let parent = value.get("traceparent")?.as_str()?;
    parent.split('-').nth(1).map(str::to_owned)
}

pub(crate) async fn retry(page: Page, body: Bytes) -> Response {
    let result = async {
        let (form, operator) = page.action_form(&body)?;
        let shard = shard_field(&page, &form, "shard")?;
        let text = page.catalog().shard_text(&shard);
        let rescheduled = page.console.outbox.reschedule(&shard).await?;
        tracing::info!(target: "outbox_web::audit", %operator, action = "retry", shard = %text, rescheduled, "console action");
        let notice = if rescheduled {
            format!("Shard {text} is due now.")
        } else {
            format!("Shard {text} was not backing off: nothing to retry.")
        };
        Ok::<_, PageError>(done(&page, &format!("/shard?key={}", encode(&text)), &notice))
    }
    .await;
    page.respond(result)
}

pub(crate) async fn pause(page: Page, body: Bytes) -> Response {
    pause_or_resume(page, body, true).await
}

pub(crate) async fn resume(page: Page, body: Bytes) -> Response {
    pause_or_resume(page, body, false).await
}

async fn pause_or_resume(page: Page, body: Bytes, pause: bool) -> Response {
    let result = async {
        let (form, operator) = page.action_form(&body)?;
        let shard = shard_field(&page, &form, "shard")?;
        let text = page.catalog().shard_text(&shard);
        let target = PauseTarget::Shard(shard);
        let notice = super::pauses::apply(&page, &form, &operator, &target, pause).await?;
        Ok::<_, PageError>(done(
            &page,
            &format!("/shard?key={}", encode(&text)),
            &notice,
        ))
    }
    .await;
    page.respond(result)
}
