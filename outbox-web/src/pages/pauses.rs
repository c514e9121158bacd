//! Pauses: those in force, a pause added with its reason, a pause removed.

use std::time::SystemTime;

use axum::body::Bytes;
use axum::response::Response;
use maud::{Markup, html};
use outbox_core::admin::PauseTarget;

use super::{action, done, notice};
use crate::error::PageError;
use crate::fields::Fields;
use crate::format;
use crate::page::Page;

pub(crate) async fn list(page: Page) -> Response {
    let body = list_body(&page).await;
    page.respond(body)
}

/// A pause's target as its form fields say it: `kind` (shard, category, scope) and `what`.
fn target_fields(page: &Page, target: &PauseTarget) -> (&'static str, String) {
    let catalog = page.catalog();
    match target {
        PauseTarget::Shard(shard) => ("shard", catalog.shard_text(shard)),
        PauseTarget::Category(category) => ("category", catalog.category_text(*category)),
        PauseTarget::Scope(scope) => ("scope", catalog.scope_text(*scope)),
    }
}

/// The target a form names.
fn target(page: &Page, form: &Fields) -> Result<PauseTarget, PageError> {
    let catalog = page.catalog();
    let what = form
        .get("what")
        .ok_or_else(|| PageError::BadInput("no shard, category or scope given".to_owned()))?;
    let bad = |error: outbox_core::admin::NameError| PageError::BadInput(error.to_string());
    match form.get("kind") {
        Some("shard") => catalog
            .read_shard(what)
            .map(PauseTarget::Shard)
            .map_err(bad),
        Some("category") => catalog
            .read_category(what)
            .map(PauseTarget::Category)
            .map_err(bad),
        Some("scope") => catalog
            .read_scope(what)
            .map(PauseTarget::Scope)
            .map_err(bad),
        Some(other) => Err(PageError::BadInput(format!(
            "`{other}` is not what a pause holds: a shard, a category or a scope"
        ))),
        None => Err(PageError::BadInput(
            "say what to pause: a shard, a category or a scope".to_owned(),
        )),
    }
}

async fn list_body(page: &Page) -> Result<Markup, PageError> {
    let pauses = page.console.outbox.pauses().await?;
    let now = SystemTime::now();
    let body = html! {
        (notice(page))
        @if pauses.is_empty() {
            p { "No pause is in force." }
        } @else {
            table {
                thead { tr {
                    th scope="col" { "Paused" } th scope="col" { "Reason" }
                    th scope="col" { "Since" } th scope="col" { span.visually-hidden { "Actions" } }
                } }
                tbody {
                    @for pause in &pauses {
                        @let (kind, what) = target_fields(page, &pause.target);
                        tr {
                            td { (kind) " " code { (what) } }
                            td { @if let Some(reason) = &pause.reason { (reason) } }
                            td { (format::ago(pause.paused_at, now)) }
                            td { (action(page, "/pauses/remove", "Resume", &html! {
                                input type="hidden" name="kind" value=(kind);
                                input type="hidden" name="what" value=(what);
                            })) }
                        }
                    }
                }
            }
        }
        @if page.actions() && page.session.is_some() {
            h2 { "Pause" }
            (action(page, "/pauses", "Pause", &html! {
                label { "What "
                    select name="kind" {
                        option value="scope" { "Scope" }
                        option value="category" { "Category" }
                        option value="shard" { "Shard" }
                    }
                }
                label { "Name or number " input name="what" required placeholder="organization, 3, or 1:42"; }
                label { "Reason " input name="reason" placeholder="why, for the other operators"; }
            }))
        }
    };
    Ok(page.render("Pauses", false, &body))
}

pub(crate) async fn add(page: Page, body: Bytes) -> Response {
    change(page, body, true).await
}

pub(crate) async fn remove(page: Page, body: Bytes) -> Response {
    change(page, body, false).await
}

async fn change(page: Page, body: Bytes, pause: bool) -> Response {
    let result = async {
        let (form, operator) = page.action_form(&body)?;
        let target = target(&page, &form)?;
        let notice = apply(&page, &form, &operator, &target, pause).await?;
        Ok::<_, PageError>(done(&page, "/pauses", &notice))
    }
    .await;
    page.respond(result)
}

/// Pauses `target` (for the form's reason) or resumes it, for `operator`, and logs it;
/// returns what was done, in words.
pub(crate) async fn apply(
    page: &Page,
    form: &Fields,
    operator: &str,
    target: &PauseTarget,
    pause: bool,
) -> Result<String, PageError> {
    let (kind, what) = target_fields(page, target);
    let outbox = &page.console.outbox;
    let changed = if pause {
        outbox.pause(target, form.get("reason")).await?
    } else {
        outbox.resume(target).await?
    };
    let action = if pause { "pause" } else { "resume" };
    tracing::info!(target: "outbox_web::audit", %operator, action, %kind, %what, changed, "console action");
    Ok(match (pause, changed) {
        (true, true) => {
            format!("Paused {kind} {what}: relays deliver nothing of it until it is resumed.")
        }
        (true, false) => format!("{kind} {what} was paused already."),
        (false, true) => format!("Resumed {kind} {what}."),
        (false, false) => format!(
            "{kind} {what} has no pause of its own to resume (a pause of its scope or of a \
             category may hold it: see the pauses)."
        ),
    })
}
