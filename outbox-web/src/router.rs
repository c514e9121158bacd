//! The console's routes.

use std::sync::Arc;

use axum::Router;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use crate::auth::Sessions;
use crate::error::PageError;
use crate::history::Samples;
use crate::options::{ConsoleOptions, Outbox};
use crate::page::Page;
use crate::pages;
use crate::sampler;
use crate::state::Console;

/// The console's pages and actions over `outbox`, as a router to serve or to nest in a
/// service's own (`Router::new().nest("/outbox", router(...))`): its links follow where it
/// is mounted.
///
/// Built inside a Tokio runtime, it samples the outbox for the overview's chart (every
/// [`ConsoleOptions::sample_every`]) until the router and its clones are dropped.
pub fn router(outbox: Outbox, options: ConsoleOptions) -> Router {
    let every = options.sample_every;
    let console = Arc::new(Console {
        outbox,
        options,
        sessions: Sessions::default(),
        samples: Samples::default(),
    });
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(sampler::sample(Arc::downgrade(&console), every));
    }
    Router::new()
        .route("/", get(pages::overview::page))
        .route("/shards", get(pages::shards::list))
        .route("/shard", get(pages::shards::page))
        .route("/shard/retry", post(pages::shards::retry))
        .route("/shard/pause", post(pages::shards::pause))
        .route("/shard/resume", post(pages::shards::resume))
        .route("/dead-letters", get(pages::letters::list))
        .route("/dead-letter", get(pages::letters::page))
        .route("/dead-letters/preview", post(pages::letters::preview))
        .route("/dead-letters/confirm", post(pages::letters::confirm))
        .route("/pauses", get(pages::pauses::list).post(pages::pauses::add))
        .route("/pauses/remove", post(pages::pauses::remove))
        .route(
            "/backfills",
            get(pages::backfills::list).post(pages::backfills::start),
        )
        .route("/backfills/pause", post(pages::backfills::pause))
        .route("/login", get(pages::login::form).post(pages::login::log_in))
        .route("/logout", post(pages::login::log_out))
        .route("/assets/console.css", get(stylesheet))
        .route("/assets/console.js", get(script))
        .fallback(not_found)
        .with_state(console)
}

async fn stylesheet() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/css; charset=utf-8"),
            (header::CACHE_CONTROL, "max-age=3600"),
        ],
        include_str!("../assets/console.css"),
    )
        .into_response()
}

async fn script() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/javascript; charset=utf-8"),
            (header::CACHE_CONTROL, "max-age=3600"),
        ],
        include_str!("../assets/console.js"),
    )
        .into_response()
}

async fn not_found(page: Page) -> Response {
    page.error(&PageError::NotFound("no such page".to_owned()))
}
