//! The console's pages and the actions their forms take.

pub(crate) mod backfills;
pub(crate) mod letters;
pub(crate) mod login;
pub(crate) mod overview;
pub(crate) mod pauses;
pub(crate) mod shards;

use axum::response::{IntoResponse, Redirect, Response};
use maud::{Markup, html};
use outbox_core::ShardKey;
use outbox_core::admin::ShardStatus;

use crate::error::PageError;
use crate::fields::Fields;
use crate::page::{Page, encode};

/// The link to a shard's page.
pub(crate) fn shard_link(page: &Page, shard: &ShardKey) -> Markup {
    let text = page.catalog().shard_text(shard);
    html! {
        a href={ (page.link("/shard")) "?key=" (encode(&text)) } { code { (text) } }
    }
}

/// A shard's status as a badge.
pub(crate) fn status_badge(status: ShardStatus) -> Markup {
    let class = match status {
        ShardStatus::Due => "due",
        ShardStatus::InFlight => "in-flight",
        ShardStatus::BackingOff => "backing-off",
        ShardStatus::Paused => "paused",
        ShardStatus::Parked => "parked",
    };
    html! { span class={ "status " (class) } { (status.label()) } }
}

/// An error chain, each cause on its own line.
pub(crate) fn error_chain(error: &str) -> Markup {
    html! {
        pre.error-chain { (error.replace(": ", ":\n  ")) }
    }
}

/// The shard a field names (`SCOPE:IDENTIFIER[:DESTINATION]`), or why not.
pub(crate) fn shard_field(page: &Page, fields: &Fields, name: &str) -> Result<ShardKey, PageError> {
    let text = fields
        .get(name)
        .ok_or_else(|| PageError::BadInput(format!("no shard given (`{name}`)")))?;
    page.catalog()
        .read_shard(text)
        .map_err(|error| PageError::BadInput(error.to_string()))
}

/// After an action: back to `path` with a notice of what was done.
pub(crate) fn done(page: &Page, path: &str, notice: &str) -> Response {
    let separator = if path.contains('?') { '&' } else { '?' };
    Redirect::to(&format!(
        "{}{separator}done={}",
        page.link(path),
        encode(notice)
    ))
    .into_response()
}

/// The notice an action left for the page it returned to.
pub(crate) fn notice(page: &Page) -> Markup {
    html! {
        @if let Some(done) = page.query.get("done") {
            p.notice role="status" { (done) }
        }
    }
}

/// A form for an action on this page: `fields` and a button, or a link to log in.
pub(crate) fn action(page: &Page, path: &str, label: &str, fields: &Markup) -> Markup {
    html! {
        @if page.actions() {
            @if page.session.is_some() {
                form.action method="post" action=(page.link(path)) {
                    (page.csrf_field())
                    (fields)
                    button type="submit" { (label) }
                }
            }
        }
    }
}
