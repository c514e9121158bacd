//! Logging in with the console's token (a session, kept in a cookie) and out.

use axum::body::Bytes;
use axum::http::header::SET_COOKIE;
use axum::response::{IntoResponse, Redirect, Response};
use maud::html;

use crate::auth::{COOKIE_NAME, same};
use crate::error::PageError;
use crate::fields::Fields;
use crate::page::Page;

/// Where to go after logging in: a page of this console, never another site.
fn next(page: &Page, fields: &Fields) -> String {
    match fields.get("next") {
        Some(next) if next.starts_with('/') && !next.starts_with("//") && !next.contains('\\') => {
            page.link(next)
        }
        _ => page.link("/"),
    }
}

/// The session cookie: `value` for the console's pages, or cleared.
fn cookie(page: &Page, value: Option<&str>) -> String {
    let path = if page.base.is_empty() {
        "/"
    } else {
        &page.base
    };
    let secure = if page.console.options.secure_cookies {
        "; Secure"
    } else {
        ""
    };
    match value {
        Some(value) => {
            format!("{COOKIE_NAME}={value}; Path={path}; HttpOnly; SameSite=Strict{secure}")
        }
        None => {
            format!("{COOKIE_NAME}=; Path={path}; HttpOnly; SameSite=Strict; Max-Age=0{secure}")
        }
    }
}

pub(crate) async fn form(page: Page) -> Response {
    if !page.actions() {
        return page.error(&PageError::ReadOnly);
    }
    let next = page.query.get("next").unwrap_or("/").to_owned();
    let body = html! {
        form.login method="post" action=(page.link("/login")) {
            input type="hidden" name="next" value=(next);
            label for="operator" { "Your name (for the log of actions)" }
            input id="operator" name="operator" autocomplete="username" required;
            label for="token" { "The console's token" }
            input id="token" name="token" type="password" autocomplete="current-password" required;
            button type="submit" { "Log in" }
        }
    };
    page.render("Log in", false, &body).into_response()
}

pub(crate) async fn log_in(page: Page, body: Bytes) -> Response {
    let Some(token) = page.console.options.token.clone() else {
        return page.error(&PageError::ReadOnly);
    };
    let fields = Fields::parse(&body);
    if !fields.get("token").is_some_and(|given| same(given, &token)) {
        tracing::warn!(target: "outbox_web::audit", "a login to the console with a wrong token");
        return page.error(&PageError::Unauthorized(
            "that is not the console's token".to_owned(),
        ));
    }
    let operator = fields.get("operator").unwrap_or("operator");
    let session = page.console.sessions.open(operator);
    tracing::info!(target: "outbox_web::audit", operator = %session.operator, action = "log in", "console action");
    (
        [(SET_COOKIE, cookie(&page, Some(&session.id)))],
        Redirect::to(&next(&page, &fields)),
    )
        .into_response()
}

pub(crate) async fn log_out(page: Page, body: Bytes) -> Response {
    if let Err(error) = page.action_form(&body) {
        return page.error(&error);
    }
    if let Some(session) = &page.session {
        page.console.sessions.close(&session.id);
        tracing::info!(target: "outbox_web::audit", operator = %session.operator, action = "log out", "console action");
    }
    (
        [(SET_COOKIE, cookie(&page, None))],
        Redirect::to(&page.link("/")),
    )
        .into_response()
}
