//! `docs/console.md`: the console in a service's axum application.

async fn health() -> &'static str {
    "ok"
}

/// The console, nested under `/outbox` in the service's router.
fn app(store: &outbox::postgres::PgStore) -> axum::Router {
    use std::sync::Arc;

    use outbox::web::ConsoleOptions;

    let console = outbox::web::router(Arc::new(store.clone()), ConsoleOptions::read_only());
    let app = axum::Router::new()
        .route("/health", axum::routing::get(health))
        .nest("/outbox", console);
    app.route("/ready", axum::routing::get(health))
}
