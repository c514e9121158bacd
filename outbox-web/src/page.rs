//! What every page is given: the console, where it is mounted, the query, who is logged in;
//! and the layout every page shares.

use std::sync::Arc;

use axum::extract::{FromRequestParts, OriginalUri};
use axum::http::HeaderMap;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use maud::{DOCTYPE, Markup, html};
use outbox_core::admin::Catalog;

use crate::auth::{self, Session};
use crate::error::PageError;
use crate::fields::Fields;
use crate::state::Console;

/// A request to a page: the console, where it is mounted, the query, who is logged in.
pub(crate) struct Page {
    pub(crate) console: Arc<Console>,
    /// The path the console is mounted at (`""` at the root, `/outbox` nested there).
    pub(crate) base: String,
    /// The request's own path and query, within the console (`/shards?filter=failing`).
    pub(crate) here: String,
    pub(crate) query: Fields,
    pub(crate) headers: HeaderMap,
    pub(crate) session: Option<Session>,
}

impl FromRequestParts<Arc<Console>> for Page {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        console: &Arc<Console>,
    ) -> Result<Self, Self::Rejection> {
        let inner = parts.uri.path();
        let full = parts
            .extensions
            .get::<OriginalUri>()
            .map_or(inner, |original| original.0.path());
        // Nested at `/outbox`, the console's `/` is `/outbox` itself.
        let base = if inner == "/" {
            full
        } else {
            full.strip_suffix(inner).unwrap_or_default()
        }
        .trim_end_matches('/')
        .to_owned();
        let here = match parts.uri.query() {
            Some(query) => format!("{inner}?{query}"),
            None => inner.to_owned(),
        };
        Ok(Self {
            console: Arc::clone(console),
            base,
            here,
            query: Fields::query(&parts.uri),
            session: console.sessions.of(&parts.headers),
            headers: parts.headers.clone(),
        })
    }
}

impl Page {
    /// The link to `path` (`/shards?filter=failing`) within the console.
    pub(crate) fn link(&self, path: &str) -> String {
        match path.strip_prefix('/') {
            // Nested, the console's root is its mount path, without a trailing slash.
            Some(query)
                if !self.base.is_empty() && (query.is_empty() || query.starts_with('?')) =>
            {
                format!("{}{query}", self.base)
            }
            _ => format!("{}{path}", self.base),
        }
    }

    /// The names the console shows.
    pub(crate) fn catalog(&self) -> &Catalog {
        &self.console.options.catalog
    }

    /// Whether actions are shown: the console allows them. Without a session, their forms
    /// lead to the login.
    pub(crate) fn actions(&self) -> bool {
        self.console.options.actions_enabled()
    }

    /// An action's form (its body, `body`) and who acts, if they may.
    pub(crate) fn action_form(&self, body: &[u8]) -> Result<(Fields, String), PageError> {
        let form = Fields::parse(body);
        let operator = auth::authorize(
            self.console.options.token.as_deref(),
            &self.console.sessions,
            &self.headers,
            form.get(auth::CSRF_FIELD),
        )?;
        Ok((form, operator))
    }

    /// The hidden field every action form carries (empty without a session: the action then
    /// asks to log in).
    pub(crate) fn csrf_field(&self) -> Markup {
        html! {
            @if let Some(session) = &self.session {
                input type="hidden" name=(auth::CSRF_FIELD) value=(session.csrf);
            }
        }
    }

    /// A whole page: the navigation, `title`, and `body`. A `live` page refreshes itself
    /// where JavaScript runs.
    pub(crate) fn render(&self, title: &str, live: bool, body: &Markup) -> Markup {
        let options = &self.console.options;
        let nav = [
            ("/", "Overview"),
            ("/shards", "Shards"),
            ("/dead-letters", "Dead letters"),
            ("/pauses", "Pauses"),
            ("/backfills", "Backfills"),
        ];
        let current = self.here.split('?').next().unwrap_or("/");
        html! {
            (DOCTYPE)
            html lang="en" {
                head {
                    meta charset="utf-8";
                    meta name="viewport" content="width=device-width, initial-scale=1";
                    title { (title) " · outbox" }
                    link rel="stylesheet" href=(self.link("/assets/console.css"));
                    script defer src=(self.link("/assets/console.js")) {}
                }
                body {
                    a.skip href="#main" { "Skip to the content" }
                    header {
                        nav aria-label="Console" {
                            span.brand { "outbox" }
                            @for (path, label) in nav {
                                @if current == path || (path != "/" && current.starts_with(path)) {
                                    a href=(self.link(path)) aria-current="page" { (label) }
                                } @else {
                                    a href=(self.link(path)) { (label) }
                                }
                            }
                        }
                        div.who {
                            @if !options.actions_enabled() {
                                span.badge { "read-only" }
                            } @else if let Some(session) = &self.session {
                                span { "Logged in as " strong { (session.operator) } }
                                form method="post" action=(self.link("/logout")) {
                                    (self.csrf_field())
                                    button type="submit" { "Log out" }
                                }
                            } @else {
                                a href={ (self.link("/login")) "?next=" (encode(&self.here)) } { "Log in to act" }
                            }
                        }
                    }
                    main id="main" tabindex="-1"
                        data-live=[live.then(|| options.refresh_every.as_millis().to_string())] {
                        h1 { (title) }
                        (body)
                    }
                }
            }
        }
    }

    /// The page of `error`, with its status.
    pub(crate) fn error(&self, error: &PageError) -> Response {
        let status = error.status();
        let (title, message) = error.explain();
        if status.is_server_error() {
            tracing::warn!(target: "outbox_web", path = %self.here, error = %message, "a console page failed");
        }
        let body = html! {
            p.error role="alert" { (message) }
            @if matches!(error, PageError::Unauthorized(_)) {
                p { a href={ (self.link("/login")) "?next=" (encode(&self.here)) } { "Log in" } }
            }
            p { a href=(self.link("/")) { "Back to the overview" } }
        };
        (status, self.render(title, false, &body)).into_response()
    }

    /// A page's (or an action's) response, or its error page.
    pub(crate) fn respond(&self, page: Result<impl IntoResponse, PageError>) -> Response {
        match page {
            Ok(response) => response.into_response(),
            Err(error) => self.error(&error),
        }
    }
}

/// `text` encoded for a query string.
pub(crate) fn encode(text: &str) -> String {
    form_urlencoded::byte_serialize(text.as_bytes()).collect()
}
