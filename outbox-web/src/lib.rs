//! A console for the outbox in the browser: the queue at a glance, the shards that fail and
//! why, dead letters to replay or purge, pauses and backfills. Server-rendered pages,
//! readable without JavaScript, refreshed live where it runs; nothing to build but the
//! crate.
//!
//! Mount [`router`] in a service's own [`axum`] application, or run the `outbox ui` verb of the
//! `outbox` command, which serves the same pages:
//!
//! ```no_run
//! use std::sync::Arc;
//!
//! use outbox_core::memory::MemoryStore;
//! use outbox_web::ConsoleOptions;
//!
//! # async fn serve() -> std::io::Result<()> {
//! // A backend's store (`PgStore`, `SqliteStore`); here the in-memory one.
//! let store = MemoryStore::new();
//! let console = outbox_web::router(Arc::new(store), ConsoleOptions::read_only());
//! let app = axum::Router::new().nest("/outbox", console);
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! axum::serve(listener, app).await
//! # }
//! ```
//!
//! # Security
//!
//! The console is read-only unless its options enable actions with a token
//! ([`ConsoleOptions::with_actions`]). An action (retry a shard, pause, resume, replay or
//! purge dead letters, start or pause a backfill) then needs the token: as a bearer header
//! (`Authorization: Bearer …`, for scripts), or entered once in the login form, which sets a
//! session cookie (`HttpOnly`, `SameSite=Strict`). Every form carries a token of its session
//! against cross-site requests. Every action is logged (target `outbox_web::audit`) with who
//! did it, what, and to how many. No page shows a database URL; errors show no password.

#![cfg_attr(docsrs, feature(doc_cfg))]

mod auth;
mod chart;
mod error;
mod fields;
mod format;
mod history;
mod options;
mod page;
mod pages;
mod router;
mod sampler;
mod state;

pub use crate::options::{ConsoleOptions, Outbox, WeakToken};
pub use crate::router::router;
