//! Dead letters: the list by category, scope, shard and age; a letter's page; replay and purge
//! of a selection, each previewed ("replays 12 letters of 3 shards") and confirmed. A
//! confirmation names exactly the letters previewed: if one of them is gone meanwhile (replayed
//! or purged by someone else), it changes nothing.

use std::collections::BTreeSet;
use std::time::SystemTime;

use axum::body::Bytes;
use axum::response::Response;
use maud::{Markup, html};
use outbox_core::MessageId;
use outbox_core::admin::{DeadLetter, DeadLetterFilter};

use super::{done, error_chain, notice, shard_field, shard_link};
use crate::error::PageError;
use crate::fields::Fields;
use crate::format;
use crate::page::Page;

/// The most letters a list shows (and a selection holds).
const LIMIT: usize = 200;

pub(crate) async fn list(page: Page) -> Response {
    let body = list_body(&page).await;
    page.respond(body)
}

async fn list_body(page: &Page) -> Result<Markup, PageError> {
    let query = &page.query;
    let catalog = page.catalog();
    let mut filter = DeadLetterFilter::all().limit(LIMIT);
    if let Some(text) = query.get("category") {
        filter = filter.category(catalog.read_category(text).map_err(bad)?);
    }
    if let Some(text) = query.get("scope") {
        filter = filter.scope(catalog.read_scope(text).map_err(bad)?);
    }
    if query.get("shard").is_some() {
        filter = filter.shard(shard_field(page, query, "shard")?);
    }
    if let Some(text) = query.get("older_than") {
        let age = humantime::parse_duration(text).map_err(|error| {
            PageError::BadInput(format!(
                "`{text}` is not an age ({error}): write e.g. 30m, 2h, 1day"
            ))
        })?;
        filter = filter.older_than(age);
    }
    let letters = page.console.outbox.dead_letters(&filter).await?;
    let now = SystemTime::now();
    let field = |name: &str| query.get(name).map(str::to_owned);
    let body = html! {
        (notice(page))
        form.filters method="get" action=(page.link("/dead-letters")) {
            label for="category" { "Category" }
            input id="category" name="category" value=[field("category")] placeholder="any";
            label for="scope" { "Scope" }
            input id="scope" name="scope" value=[field("scope")] placeholder="any";
            label for="shard" { "Shard" }
            input id="shard" name="shard" value=[field("shard")] placeholder="SCOPE:ID";
            label for="older_than" { "Set aside at least" }
            input id="older_than" name="older_than" value=[field("older_than")] placeholder="e.g. 1h";
            button type="submit" { "Show" }
        }
        @if letters.is_empty() {
            p { "No dead letter matches." }
        } @else {
            form method="post" action=(page.link("/dead-letters/preview")) {
                (page.csrf_field())
                table {
                    thead { tr {
                        th scope="col" { span.visually-hidden { "Select" } }
                        th scope="col" { "Message" } th scope="col" { "Category" }
                        th scope="col" { "Shard" } th scope="col" { "Attempts" }
                        th scope="col" { "Set aside" } th scope="col" { "Error" }
                    } }
                    tbody {
                        @for letter in &letters {
                            @let id = letter.message_id.0;
                            tr {
                                td { input type="checkbox" name="id" value=(id)
                                    id={ "letter-" (id) } aria-label={ "Select message " (id) }; }
                                td { a href={ (page.link("/dead-letter")) "?id=" (id) } { (id) } }
                                td { (catalog.category_text(letter.category)) }
                                td { (shard_link(page, &letter.shard)) }
                                td { (letter.attempts) }
                                td { (format::ago(letter.dead_lettered_at, now)) }
                                td.last-error { (letter.error) }
                            }
                        }
                    }
                }
                @if letters.len() >= LIMIT {
                    p.note { "The oldest " (LIMIT) " matching letters are listed: narrow the filter for the others." }
                }
                @if page.actions() && page.session.is_some() {
                    div.actions {
                        button type="submit" name="action" value="replay" { "Replay selected…" }
                        button type="submit" name="action" value="purge" { "Purge selected…" }
                    }
                }
            }
        }
    };
    Ok(page.render("Dead letters", false, &body))
}

fn bad(error: impl std::fmt::Display) -> PageError {
    PageError::BadInput(error.to_string())
}

pub(crate) async fn page(page: Page) -> Response {
    let body = letter_body(&page).await;
    page.respond(body)
}

async fn letter_body(page: &Page) -> Result<Markup, PageError> {
    let id = message_id(page.query.get("id").unwrap_or_default())?;
    let letter = find(page, &[id])
        .await?
        .pop()
        .ok_or_else(|| PageError::NotFound(format!("message {} is not a dead letter", id.0)))?;
    let now = SystemTime::now();
    let catalog = page.catalog();
    let body = html! {
        dl.facts {
            dt { "Category" } dd { (catalog.category_text(letter.category)) }
            dt { "Shard" } dd { (shard_link(page, &letter.shard)) }
            dt { "Object" } dd { code { (letter.object_identifier) } }
            dt { "Written" } dd { (format::timestamp(letter.created_at)) }
            dt { "Attempts" } dd { (letter.attempts) }
            dt { "First failed" } dd { (format::ago(letter.first_failed_at, now)) " ("
                (format::timestamp(letter.first_failed_at)) ")" }
            dt { "Set aside" } dd { (format::ago(letter.dead_lettered_at, now)) " ("
                (format::timestamp(letter.dead_lettered_at)) ")" }
        }
        h2 { "Error" }
        (error_chain(&letter.error))
        h2 { "Payload" }
        pre.payload { (format::pretty_json(&letter.payload)) }
        @if let Some(metadata) = &letter.metadata {
            h2 { "Metadata" }
            pre { (format::pretty_json(metadata)) }
        }
        @if page.actions() && page.session.is_some() {
            form.actions method="post" action=(page.link("/dead-letters/preview")) {
                (page.csrf_field())
                input type="hidden" name="id" value=(id.0);
                button type="submit" name="action" value="replay" { "Replay…" }
                button type="submit" name="action" value="purge" { "Purge…" }
            }
        }
    };
    Ok(page.render(&format!("Dead letter {}", id.0), false, &body))
}

/// What a selection's form asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Act {
    Replay,
    Purge,
}

impl Act {
    fn read(form: &Fields) -> Result<Self, PageError> {
        match form.get("action") {
            Some("replay") => Ok(Self::Replay),
            Some("purge") => Ok(Self::Purge),
            Some(other) => Err(PageError::BadInput(format!(
                "`{other}` is not an action on dead letters: replay or purge"
            ))),
            None => Err(PageError::BadInput(
                "no action given: replay or purge".to_owned(),
            )),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Replay => "replay",
            Self::Purge => "purge",
        }
    }
}

/// A message id as a form gives it.
fn message_id(text: &str) -> Result<MessageId, PageError> {
    text.parse::<i64>()
        .map(MessageId)
        .map_err(|_| PageError::BadInput(format!("`{text}` is not a message id: a whole number")))
}

/// The ids a selection's form names, each once, in order.
fn selection(form: &Fields) -> Result<Vec<MessageId>, PageError> {
    let ids: BTreeSet<i64> = form
        .all("id")
        .map(|text| message_id(text).map(|id| id.0))
        .collect::<Result<_, _>>()?;
    if ids.is_empty() {
        return Err(PageError::BadInput("no dead letter selected".to_owned()));
    }
    if ids.len() > LIMIT {
        return Err(PageError::BadInput(format!(
            "{} letters selected: at most {LIMIT} at once",
            ids.len()
        )));
    }
    Ok(ids.into_iter().map(MessageId).collect())
}

/// The dead letters with `ids` (those that are dead letters).
async fn find(page: &Page, ids: &[MessageId]) -> Result<Vec<DeadLetter>, PageError> {
    let filter = DeadLetterFilter::all().ids(ids.iter().copied());
    Ok(page.console.outbox.dead_letters(&filter).await?)
}

/// "12 letters of 3 shards".
fn described(letters: &[DeadLetter]) -> String {
    let shards: BTreeSet<_> = letters.iter().map(|letter| &letter.shard).collect();
    format!(
        "{} of {}",
        format::counted(letters.len(), "letter", "letters"),
        format::counted(shards.len(), "shard", "shards")
    )
}

pub(crate) async fn preview(page: Page, body: Bytes) -> Response {
    let result = async {
        let (form, _) = page.action_form(&body)?;
        let act = Act::read(&form)?;
        let ids = selection(&form)?;
        let letters = find(&page, &ids).await?;
        let found: BTreeSet<i64> = letters.iter().map(|letter| letter.message_id.0).collect();
        let missing: Vec<String> = ids
            .iter()
            .filter(|id| !found.contains(&id.0))
            .map(|id| id.0.to_string())
            .collect();
        if !missing.is_empty() {
            return Err(PageError::NotFound(format!(
                "{} not dead letters: {}",
                if missing.len() == 1 { "this message is" } else { "these messages are" },
                missing.join(", ")
            )));
        }
        let what = described(&letters);
        let (title, consequence) = match act {
            Act::Replay => (
                format!("Replay {what}?"),
                "Each goes back to the outbox with its payload and metadata, and its shard \
                 delivers it again, in order.",
            ),
            Act::Purge => (
                format!("Purge {what}?"),
                "They are deleted for good: no handler will receive them.",
            ),
        };
        let catalog = page.catalog();
        let body = html! {
            p { (consequence) }
            table {
                thead { tr { th scope="col" { "Message" } th scope="col" { "Category" } th scope="col" { "Shard" } } }
                tbody {
                    @for letter in &letters {
                        tr {
                            td { (letter.message_id.0) }
                            td { (catalog.category_text(letter.category)) }
                            td { (shard_link(&page, &letter.shard)) }
                        }
                    }
                }
            }
            form.actions method="post" action=(page.link("/dead-letters/confirm")) {
                (page.csrf_field())
                input type="hidden" name="action" value=(act.name());
                @for letter in &letters {
                    input type="hidden" name="id" value=(letter.message_id.0);
                }
                button type="submit" autofocus { (title.trim_end_matches('?')) }
                " "
                a href=(page.link("/dead-letters")) { "Cancel" }
            }
        };
        Ok(page.render(&title, false, &body))
    }
    .await;
    page.respond(result)
}

pub(crate) async fn confirm(page: Page, body: Bytes) -> Response {
    let result = async {
        let (form, operator) = page.action_form(&body)?;
        let act = Act::read(&form)?;
        let ids = selection(&form)?;
        let letters = find(&page, &ids).await?;
        if letters.len() != ids.len() {
            let gone = ids.len() - letters.len();
            return Err(PageError::Stale(format!(
                "{} of the {} previewed {} no longer dead letters (replayed or purged \
                 meanwhile): preview the selection again",
                gone,
                ids.len(),
                if gone == 1 { "is" } else { "are" }
            )));
        }
        let what = described(&letters);
        let outbox = &page.console.outbox;
        let notice = match act {
            Act::Replay => {
                let replayed = outbox.replay_dead_letters(&ids).await?;
                format!("Replayed {what}: {} back in the outbox.", replayed.len())
            }
            Act::Purge => {
                let purged = outbox.purge_dead_letters(&ids).await?;
                format!("Purged {what}: {purged} deleted.")
            }
        };
        tracing::info!(target: "outbox_web::audit", %operator, action = act.name(), letters = ids.len(), selection = %what, "console action");
        Ok(done(&page, "/dead-letters", &notice))
    }
    .await;
    page.respond(result)
}
