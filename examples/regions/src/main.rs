//! # regions
//!
//! A hybrid-cloud service (in the manner of Sentry's regions and control silo) on SQLite or
//! PostgreSQL: two scopes (`Organization`, `User`), five categories (one of them
//! non-coalescing), a project model replicated from a region database to the control database,
//! and a membership model fanned out from control to every region. It writes, then prints what
//! the relays delivered.
//!
//! ```text
//! cargo run -p regions                                  # SQLite, in a temporary directory
//! cargo run -p regions -- --database-url postgres://postgres@127.0.0.1:5432/postgres
//! ```
//!
//! The modules: [`declarations`] (scopes, categories, models), [`handlers`], [`story`] (the
//! writes and the relays) are written once; [`backend`] is all that differs between SQLite
//! and PostgreSQL.

// An example program reports what it does on stdout.
#![allow(clippy::print_stdout)]

mod backend;
mod declarations;
mod handlers;
mod story;
#[cfg(test)]
mod tests;

use clap::Parser;
use outbox::BoxError;

use crate::backend::Backend;

/// The command line.
#[derive(Debug, Parser)]
#[command(
    name = "regions",
    about = "The outbox regions example: prints what the relays deliver"
)]
struct Args {
    /// A PostgreSQL server to run on (postgres://user@host:port/database): the example creates
    /// databases of its own there and drops them at the end. Without it, SQLite files in a
    /// temporary directory.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true, value_parser = postgres_url)]
    database_url: Option<String>,
}

/// Accepts `postgres://` and `postgresql://` URLs only.
fn postgres_url(url: &str) -> Result<String, String> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(url.to_owned())
    } else {
        Err("expected a postgres:// URL (without one, the example runs on SQLite)".to_owned())
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args = Args::parse();
    let backend = match &args.database_url {
        Some(url) => Backend::postgres(url).await?,
        None => Backend::sqlite()?,
    };
    let outcome = story::run(backend).await?;
    println!("control: projects {:?}", outcome.control_projects);
    println!(
        "regions: {} handler calls; the databases are removed",
        outcome.delivered.len()
    );
    Ok(())
}
