//! Backfills of replicated models: each model's phase, versions, rows walked, low bound and
//! last error; a backfill started or paused.

use std::time::SystemTime;

use axum::body::Bytes;
use axum::response::Response;
use maud::{Markup, html};
use outbox_core::CategoryId;

use super::{action, done, notice};
use crate::error::PageError;
use crate::fields::Fields;
use crate::format;
use crate::page::Page;

pub(crate) async fn list(page: Page) -> Response {
    let body = list_body(&page).await;
    page.respond(body)
}

async fn list_body(page: &Page) -> Result<Markup, PageError> {
    let backfills = page.console.outbox.backfills().await?;
    let now = SystemTime::now();
    let catalog = page.catalog();
    let body = html! {
        (notice(page))
        @if backfills.is_empty() {
            p { "No replicated model has a backfill state yet: relays record their models' versions as they start." }
        } @else {
            table {
                thead { tr {
                    th scope="col" { "Model" } th scope="col" { "Phase" }
                    th scope="col" { "Version" } th scope="col" { "Rows walked" }
                    th scope="col" { "Low bound" } th scope="col" { "Updated" }
                    th scope="col" { "Last error" } th scope="col" { span.visually-hidden { "Actions" } }
                } }
                tbody {
                    @for state in &backfills {
                        @let model = catalog.category_text(state.category);
                        tr {
                            td { (model) }
                            td { (state.phase().to_string()) }
                            td { "target " (state.target_version) ", done " (state.done_version)
                                 ", code " (state.declared_version) }
                            td { (format::count(state.rows_walked)) }
                            td { @if let Some(low) = &state.low_bound { code { (low) } } @else { "—" } }
                            td { @if let Some(at) = state.updated_at { (format::ago(at, now)) } }
                            td.last-error { @if let Some(error) = &state.last_error { (error) } }
                            td {
                                (action(page, "/backfills/pause", "Pause", &html! {
                                    input type="hidden" name="model" value=(model);
                                }))
                            }
                        }
                    }
                }
            }
        }
        @if page.actions() && page.session.is_some() {
            h2 { "Start a backfill" }
            (action(page, "/backfills", "Start", &html! {
                label { "Model " input name="model" required placeholder="a replicated model's name or category number"; }
                label { "Version " input name="version" inputmode="numeric" placeholder="the code's"; }
            }))
        }
    };
    Ok(page.render("Backfills", true, &body))
}

pub(crate) async fn start(page: Page, body: Bytes) -> Response {
    let result = async {
        let (form, operator, category) = acting(&page, &body)?;
        let catalog = page.catalog();
        let version = match form.get("version") {
            Some(text) => Some(text.parse::<u32>().map_err(|_| {
                PageError::BadInput(format!("`{text}` is not a version: a whole number"))
            })?),
            None => None,
        };
        let outbox = &page.console.outbox;
        let start = outbox_core::admin::backfill_start(&**outbox, catalog, category, version)
            .await?
            .ok_or_else(|| {
                PageError::BadInput(format!(
                    "no version for model {}: this console does not know the model and no \
                     relay has recorded its version yet; give a version",
                    catalog.category_text(category)
                ))
            })?;
        start
            .check()
            .map_err(|error| PageError::BadInput(error.to_string()))?;
        let state = outbox.start_backfill(&start).await?;
        let model = catalog.category_text(category);
        tracing::info!(target: "outbox_web::audit", %operator, action = "start backfill", %model, version = start.version, "console action");
        Ok::<_, PageError>(done(
            &page,
            "/backfills",
            &format!(
                "Started the backfill of {model} to version {} ({}).",
                start.version,
                state.phase()
            ),
        ))
    }
    .await;
    page.respond(result)
}

pub(crate) async fn pause(page: Page, body: Bytes) -> Response {
    let result = async {
        let (_, operator, category) = acting(&page, &body)?;
        let catalog = page.catalog();
        let model = catalog.category_text(category);
        let paused = page.console.outbox.pause_backfill(category).await?;
        tracing::info!(target: "outbox_web::audit", %operator, action = "pause backfill", %model, paused, "console action");
        let notice = if paused {
            format!("Paused the backfill of {model}: starting it again goes on from where it stopped.")
        } else {
            format!("The backfill of {model} was not under way: nothing to pause.")
        };
        Ok::<_, PageError>(done(&page, "/backfills", &notice))
    }
    .await;
    page.respond(result)
}

/// The form of an action on a model's backfill, who acts, and the model it names.
fn acting(page: &Page, body: &Bytes) -> Result<(Fields, String, CategoryId), PageError> {
    let (form, operator) = page.action_form(body)?;
    let model = form
        .get("model")
        .ok_or_else(|| PageError::BadInput("no model given".to_owned()))?;
    let category = page
        .catalog()
        .read_category(model)
        .map_err(|error| PageError::BadInput(error.to_string()))?;
    Ok((form, operator, category))
}
