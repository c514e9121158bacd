//! # outbox-rs-cli
//!
//! The `outbox` command: what an operator does to an outbox on PostgreSQL, MariaDB or SQLite
//! without writing code. See the queue, the shards that fail and why, the dead letters; reschedule a
//! shard; pause and resume a shard, a category or a scope; replay or purge dead letters; start,
//! pause and follow the backfills of replicated models; apply the migrations or print their
//! SQL.
//!
//! ```text
//! cargo install outbox-rs-cli          # --features tls-rustls for a PostgreSQL that requires TLS
//! export DATABASE_URL=postgres://app@db/app
//! outbox status
//! outbox shards --failing
//! outbox messages organization:42
//! outbox retry organization:42
//! outbox dead-letters set-aside --id 1234 --reason "ticket 7: a payload that cannot succeed"
//! outbox pause --category webhook --reason "receiver down"
//! outbox dead-letters list --category webhook
//! outbox dead-letters replay --category webhook --dry-run
//! outbox migrate --print > outbox.sql
//! outbox backfill start project --version 2
//! outbox backfill status
//! ```
//!
//! ## Databases
//!
//! The command names no database. It opens a URL through the backend registered for its
//! scheme ([`outbox_core::admin::Backend`]), and works on it through the operations every
//! backend's store has. The installed binary links PostgreSQL (`postgres://`,
//! `postgresql://`), MariaDB (`mysql://`, `mariadb://`) and SQLite (`sqlite:`). Built into a service's binary, it opens the
//! databases of the backends the service links. A backend of your own registers its scheme
//! and opens its URLs with every verb, without a change here.
//!
//! Every command prints a table, or JSON with `--json`. Exit codes: 0 done; 1 the database
//! failed (unreachable, not migrated); 2 the command line is wrong; 3 refused, nothing
//! changed (an unknown name, a dead letter that no longer exists, a shard with nothing to
//! retry, a replay of a category this binary does not know).
//!
//! ## Names
//!
//! The installed binary knows no scope or category names: it shows ids, and takes ids on its
//! command line. Built into a service's own binary, it knows the names of everything the
//! service declares with the outbox macros, and refuses to replay dead letters of categories
//! the service does not know (a replayed message of an unknown category would park its shard):
//!
//! ```no_run
//! // src/bin/outbox.rs of your service
//! // use my_service as _; // links the crate whose categories the command should know
//! fn main() -> std::process::ExitCode {
//!     outbox_cli::main()
//! }
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

mod migrate;
mod names;
mod output;
mod ui;

pub use crate::ui::TOKEN_VARIABLE;

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use outbox_core::admin::{Backend, Open, Operations};
use outbox_core::admin::{
    Catalog, DeadLetter, DeadLetterFilter, PauseTarget, ShardFilter, ShardQuery,
};
use outbox_core::{CategoryId, Destination, Error, MessageId};

use crate::output::Printer;

/// The command line.
#[derive(Debug, Parser)]
#[command(
    name = "outbox",
    version,
    about = "Inspect and operate a transactional outbox on PostgreSQL, MariaDB or SQLite",
    after_help = "Exit codes: 0 done; 1 the database failed; 2 wrong command line; 3 refused, \
                  nothing changed.\nShards are written SCOPE:IDENTIFIER[:DESTINATION], scopes \
                  and categories by name (where this binary knows them) or number."
)]
pub struct Cli {
    /// The database: `postgres://…`, `mysql://…` or `sqlite:PATH` (before or after the
    /// command).
    #[arg(long, env = "DATABASE_URL", hide_env_values = true, global = true)]
    pub database_url: Option<String>,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// What to do.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Pending messages, the oldest's age, shards by state, dead letters, the deepest shards.
    Status {
        /// How many of the deepest shards to show.
        #[arg(long, default_value_t = 10)]
        deepest: usize,
    },
    /// Shards with pending messages, deepest first, with attempts, next retry and last error.
    Shards {
        /// Only those whose head fails (backing off, or parked).
        #[arg(long, group = "which")]
        failing: bool,
        /// Only those a pause holds.
        #[arg(long, group = "which")]
        paused: bool,
        /// Only those parked on a category no running binary knows.
        #[arg(long, group = "which")]
        parked: bool,
        /// Only those of this scope (a name or a number).
        #[arg(long)]
        scope: Option<String>,
        /// Only those with a pending message of this category (a name or a number).
        #[arg(long)]
        category: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// A shard's pending messages, oldest first, with the shard's attempts and last error.
    Messages {
        /// The shard (also as `--shard`).
        #[command(flatten)]
        shard: ShardArg,
        /// At most this many.
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// Makes a shard that backs off after a failure due now (its attempts are kept).
    Retry {
        /// The shard.
        shard: String,
    },
    /// Pauses a shard, a category or a scope: their shards deliver nothing until resumed.
    Pause {
        /// What to pause.
        #[command(flatten)]
        target: TargetArgs,
        /// Why, for the other operators.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Resumes what a pause held.
    Resume {
        /// What to resume.
        #[command(flatten)]
        target: TargetArgs,
    },
    /// The pauses in force.
    Pauses,
    /// Dead letters: list, replay, purge.
    #[command(subcommand)]
    DeadLetters(DeadLetterCommand),
    /// Backfills of replicated models: start, pause, status.
    #[command(subcommand)]
    Backfill(BackfillCommand),
    /// A consumer's inbox (in the consumer's database): purge old records, list dead letters.
    #[command(subcommand)]
    Inbox(InboxCommand),
    /// Applies the outbox migrations (or prints their SQL, for a migration tool of your own).
    Migrate {
        /// Print the SQL instead of applying it: each migration, and the rows that record it
        /// in `_outbox_migrations` (the relay checks them at start-up).
        #[arg(long)]
        print: bool,
    },
    /// Serves the operator console in the browser until Ctrl-C: read-only, or with actions
    /// for whoever gives the token in `OUTBOX_CONSOLE_TOKEN`.
    Ui {
        /// Where to listen.
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: std::net::SocketAddr,
        /// Enables actions (retry, pause, resume, replay, purge, backfills) for whoever gives
        /// the token in `OUTBOX_CONSOLE_TOKEN`.
        #[arg(long)]
        actions: bool,
        /// Marks the login's cookie `Secure` (HTTPS only): for a console behind a proxy that
        /// serves it over TLS.
        #[arg(long)]
        secure_cookies: bool,
    },
}

/// A shard, given where it is read (`outbox messages 1:42`) or as `--shard 1:42`.
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
pub struct ShardArg {
    /// The shard.
    #[arg(value_name = "SHARD")]
    pub shard: Option<String>,
    /// The shard.
    #[arg(long = "shard", value_name = "SHARD")]
    pub flag: Option<String>,
}

impl ShardArg {
    fn text(&self) -> &str {
        self.shard
            .as_deref()
            .or(self.flag.as_deref())
            .unwrap_or_default()
    }
}

/// A shard, `--category C` or `--scope S`.
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
pub struct TargetArgs {
    /// The shard.
    pub shard: Option<String>,
    /// Every shard holding a message of this category.
    #[arg(long)]
    pub category: Option<String>,
    /// Every shard of this scope.
    #[arg(long)]
    pub scope: Option<String>,
}

/// What to do with dead letters.
#[derive(Debug, Subcommand)]
pub enum DeadLetterCommand {
    /// Lists them, oldest message first.
    List {
        /// Which.
        #[command(flatten)]
        select: Selection,
    },
    /// Writes them back to the outbox as new messages, in their original order, and removes
    /// them.
    Replay {
        /// Which.
        #[command(flatten)]
        select: Selection,
        /// Show what would be replayed; change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Replay categories this binary does not know (they park their shard until a binary
        /// that knows them runs).
        #[arg(long)]
        allow_unknown_categories: bool,
    },
    /// Sets one pending message aside as a dead letter, so that its shard goes on without it
    /// (a message that can never succeed, whatever its category's dead-letter policy).
    /// Refused while a relay holds its shard (pause the shard first if one keeps taking it).
    SetAside {
        /// The message's id (`outbox messages SHARD` lists a shard's messages).
        #[arg(long)]
        id: i64,
        /// Why, recorded as the letter's error.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Deletes them for good.
    Purge {
        /// Which.
        #[command(flatten)]
        select: Selection,
        /// Show what would be purged; change nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

/// What to do with a replicated model's backfill: the relays whose code declares the
/// version walk the model's rows, a batch per tick behind the live traffic, once started.
#[derive(Debug, Subcommand)]
pub enum BackfillCommand {
    /// Every model's backfill: its phase, versions, progress and last error.
    Status,
    /// Starts a model's backfill to a version, or resumes a paused one: relays whose code
    /// declares the version walk every row of the model's table, lowest key first (a version
    /// above the one done walks the whole table again).
    Start {
        /// The model (its category's name or number).
        model: String,
        /// The version to walk to; by default the one the model's code declares (as this
        /// binary knows it, or as the relays recorded it).
        #[arg(long)]
        version: Option<u32>,
        /// For a fan-out model: only these destinations (repeat the flag for more).
        #[arg(long = "destination")]
        destinations: Vec<String>,
    },
    /// Pauses a model's backfill where it is; `start` it again to go on.
    Pause {
        /// The model (its category's name or number).
        model: String,
    },
}

/// What to do with the inboxes of the consumers whose database this is.
#[derive(Debug, Subcommand)]
pub enum InboxCommand {
    /// Deletes the inbox records older than a window. A message delivered again after its
    /// record is gone is applied again: the window must exceed the longest redelivery.
    Purge {
        /// Records received at least this long ago (`12h`, `7d`).
        #[arg(long, value_parser = humantime::parse_duration)]
        older_than: Duration,
        /// Only this consumer's (every consumer's without it).
        #[arg(long)]
        consumer: Option<String>,
    },
    /// The messages a consumer set aside: its handler failed on them too many times, or they
    /// could not be decoded. Oldest first.
    DeadLetters {
        /// Only this consumer's.
        #[arg(long)]
        consumer: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
}

/// Which dead letters: by id, or by filter (`--all` for every one).
#[derive(Debug, Args)]
pub struct Selection {
    /// These message ids (repeat the flag for more).
    #[arg(long = "id")]
    pub ids: Vec<i64>,
    /// Of this category.
    #[arg(long)]
    pub category: Option<String>,
    /// In this scope.
    #[arg(long)]
    pub scope: Option<String>,
    /// In this shard.
    #[arg(long)]
    pub shard: Option<String>,
    /// Set aside at least this long ago (`90s`, `2h`, `7d`).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub older_than: Option<Duration>,
    /// At most this many.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Every dead letter (needed to replay or purge without another condition).
    #[arg(long)]
    pub all: bool,
}

/// Why a command did not do what it was asked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CliError {
    /// The outbox (its database) failed.
    #[error("{}", describe(.0))]
    Outbox(#[from] Error),
    /// The request was refused and nothing changed.
    #[error("{0}")]
    Refused(String),
    /// The command line is incomplete: it says what is missing.
    #[error("{0}")]
    Usage(String),
    /// Writing the output failed.
    #[error("writing the output failed: {0}")]
    Output(#[from] std::io::Error),
}

impl CliError {
    /// The process's exit code for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Outbox(
                Error::NoSuchDeadLetter { .. }
                | Error::NoSuchMessage { .. }
                | Error::ShardHeld { .. },
            )
            | Self::Refused(_) => EXIT_REFUSED,
            Self::Usage(_) => EXIT_USAGE,
            Self::Outbox(_) | Self::Output(_) => EXIT_FAILED,
        }
    }
}

/// Exit code: the database failed.
pub const EXIT_FAILED: u8 = 1;
/// Exit code: the command line is wrong.
pub const EXIT_USAGE: u8 = 2;
/// Exit code: refused, nothing changed.
pub const EXIT_REFUSED: u8 = 3;

/// One line saying what failed and what to do.
fn describe(error: &Error) -> String {
    match error {
        Error::MigrationMissing { detail } => format!(
            "the outbox tables are missing or out of date ({detail}): apply the migrations \
             with `outbox migrate`"
        ),
        Error::ShardHeld { shard, owner } => {
            let shard = Catalog::empty().shard_text(shard);
            format!(
                "shard {shard} is held by {}: its drain may be delivering the message; try again \
                 once it lets go, or pause the shard first (`outbox pause {shard}`); nothing was \
                 changed",
                owner.as_deref().unwrap_or("a relay")
            )
        }
        other => outbox_core::error::error_chain(other),
    }
}

/// Runs the command line of this process, knowing the names declared in this binary
/// ([`Catalog::discovered`]); returns its exit code. The whole of a `main`.
pub fn main() -> ExitCode {
    main_with(&Catalog::discovered())
}

/// Runs the command line of this process, knowing the names in `catalog`.
pub fn main_with(catalog: &Catalog) -> ExitCode {
    main_from(std::env::args_os(), catalog)
}

/// Runs the command line `args` (the first is the command's name, as people should type it:
/// `"outbox"`, or `"my-service outbox"` for a subcommand of a service), knowing the names in
/// `catalog`; returns its exit code. For a service whose binary takes `outbox …` as one of its
/// subcommands:
///
/// ```no_run
/// # fn serve() -> std::process::ExitCode { std::process::ExitCode::SUCCESS }
/// fn main() -> std::process::ExitCode {
///     let mut args = std::env::args_os();
///     match args.nth(1) {
///         Some(command) if command == "outbox" => outbox_cli::main_from(
///             std::iter::once("my-service outbox".into()).chain(args),
///             &outbox_core::admin::Catalog::discovered(),
///         ),
///         _ => serve(),
///     }
/// }
/// ```
///
/// Nothing it prints shows a password given on the command line or in `DATABASE_URL`: a
/// command-line error that would repeat an argument shows it redacted
/// ([`outbox_core::redact_url`]).
pub fn main_from<I, T>(args: I, catalog: &Catalog) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let args: Vec<std::ffi::OsString> = args.into_iter().map(Into::into).collect();
    let cli = match Cli::try_parse_from(&args) {
        Ok(cli) => cli,
        Err(error) => return usage_error(&error, &args),
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            let _ = writeln!(std::io::stderr(), "error: cannot start a runtime: {error}");
            return ExitCode::from(EXIT_FAILED);
        }
    };
    let mut stdout = std::io::stdout().lock();
    match runtime.block_on(run(cli, catalog, &mut stdout)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            let _ = stdout.flush();
            let _ = writeln!(std::io::stderr(), "error: {error}");
            ExitCode::from(error.exit_code())
        }
    }
}

/// Prints a command-line error (or the help or version asked for) with every argument that
/// could hold a password redacted; returns clap's exit code for it.
fn usage_error(error: &clap::Error, args: &[std::ffi::OsString]) -> ExitCode {
    let mut text = error.render().to_string();
    for arg in args.iter().skip(1) {
        let arg = arg.to_string_lossy();
        // Any argument that is (or holds) a URL, or names a password, is shown redacted.
        let value = arg.split_once('=').map_or(&*arg, |(_, value)| value);
        if value.contains(':') || value.to_ascii_lowercase().contains("password") {
            let shown = outbox_core::redact_url(value);
            if shown != value {
                text = text.replace(value, &shown);
            }
        }
    }
    let code = error.exit_code();
    let _ = if error.use_stderr() {
        write!(std::io::stderr(), "{text}")
    } else {
        write!(std::io::stdout(), "{text}")
    };
    ExitCode::from(u8::try_from(code).unwrap_or(EXIT_USAGE))
}

/// Runs `cli`, writing what it shows to `out`.
pub async fn run(cli: Cli, catalog: &Catalog, out: &mut dyn Write) -> Result<(), CliError> {
    let printer = Printer::new(catalog, cli.json);
    let url = cli.database_url.as_deref().ok_or_else(|| {
        CliError::Usage(
            "which database? give --database-url postgres://…, mysql://… or sqlite:PATH, or \
             set DATABASE_URL"
                .to_owned(),
        )
    })?;
    if let Command::Migrate { print } = cli.command {
        return migrate::run(url, print, &printer, out).await;
    }
    if let Command::Ui {
        listen,
        actions,
        secure_cookies,
    } = cli.command
    {
        let options = ui::options(actions, secure_cookies, catalog)?;
        let database = Backend::connect(url, Open::Existing).await?;
        database.check_schema().await?;
        return ui::serve(database, listen, options, out).await;
    }
    let database = Backend::connect(url, Open::Existing).await?;
    let result = match cli.command {
        Command::Inbox(command) => inbox(&*database, command, &printer, out).await,
        command => execute(&*database, command, catalog, &printer, out).await,
    };
    database.close().await;
    result
}

/// Runs an operation on a store.
async fn execute(
    store: &dyn Operations,
    command: Command,
    catalog: &Catalog,
    printer: &Printer<'_>,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    store.check_schema().await?;
    match command {
        Command::Status { deepest } => printer.status(
            out,
            &store.status(deepest).await?,
            &store.relays().await?,
            &store.backfills().await?,
        ),
        Command::Shards {
            failing,
            paused,
            parked,
            scope,
            category,
            limit,
        } => {
            let filter = match (failing, paused, parked) {
                (true, _, _) => ShardFilter::Failing,
                (_, true, _) => ShardFilter::Paused,
                (_, _, true) => ShardFilter::Parked,
                _ => ShardFilter::Pending,
            };
            let mut query = ShardQuery::new(filter, limit);
            if let Some(scope) = &scope {
                query = query.scope(names::scope(catalog, scope)?);
            }
            if let Some(category) = &category {
                query = query.category(names::category(catalog, category)?);
            }
            printer.shards(out, &store.shards(&query).await?)
        }
        Command::Messages { shard, limit } => {
            let shard = names::shard(catalog, shard.text())?;
            let info = store.shard(&shard).await?;
            let messages = store.shard_messages(&shard, limit).await?;
            printer.messages(out, &shard, info.as_ref(), &messages)
        }
        Command::Retry { shard } => {
            let shard = names::shard(catalog, &shard)?;
            if !store.reschedule(&shard).await? {
                return Err(CliError::Refused(format!(
                    "shard {} is not backing off: nothing to retry",
                    catalog.shard_text(&shard)
                )));
            }
            printer.done(
                out,
                &format!("shard {} is due now", catalog.shard_text(&shard)),
            )
        }
        Command::Pause { target, reason } => {
            let target = pause_target(catalog, target)?;
            let paused = store.pause(&target, reason.as_deref()).await?;
            let what = printer.target(&target);
            if let Some(unknown) = unknown_target(catalog, &target) {
                printer.note(out, &unknown)?;
            }
            printer.changed(
                out,
                paused,
                &format!("paused {what}"),
                &format!("{what} was paused already"),
            )
        }
        Command::Resume { target } => {
            let target = pause_target(catalog, target)?;
            let what = printer.target(&target);
            if !store.resume(&target).await? {
                return Err(CliError::Refused(format!(
                    "{what} is not paused (list the pauses with `outbox pauses`)"
                )));
            }
            printer.done(out, &format!("resumed {what}"))
        }
        Command::Pauses => printer.pauses(out, &store.pauses().await?),
        Command::DeadLetters(command) => dead_letters(store, command, catalog, printer, out).await,
        Command::Backfill(command) => backfill(store, command, catalog, printer, out).await,
        Command::Inbox(_) => unreachable!("the inbox's commands run on the database"),
        Command::Migrate { .. } | Command::Ui { .. } => {
            unreachable!("migrations and the console run before an operation")
        }
    }
}

async fn dead_letters(
    store: &dyn Operations,
    command: DeadLetterCommand,
    catalog: &Catalog,
    printer: &Printer<'_>,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    match command {
        DeadLetterCommand::List { select } => {
            let letters = selected(store, catalog, &select, false).await?;
            printer.dead_letters(out, &letters)
        }
        DeadLetterCommand::Replay {
            select,
            dry_run,
            allow_unknown_categories,
        } => {
            let letters = selected(store, catalog, &select, true).await?;
            if let Some(unknown) = unknown_categories(catalog, &letters) {
                // A dry run changes nothing: it says what a replay would be refused for.
                if dry_run {
                    printer.note(out, &unknown)?;
                } else if !allow_unknown_categories {
                    return Err(CliError::Refused(unknown));
                }
            }
            let ids: Vec<MessageId> = letters.iter().map(|letter| letter.message_id).collect();
            let replayed = if dry_run || ids.is_empty() {
                Vec::new()
            } else {
                store.replay_dead_letters(&ids).await?
            };
            printer.replayed(out, &letters, &replayed, dry_run)
        }
        DeadLetterCommand::SetAside { id, reason } => {
            let reason = match reason {
                Some(reason) => format!("set aside by an operator: {reason}"),
                None => "set aside by an operator".to_owned(),
            };
            let letter = store.set_aside(MessageId(id), &reason).await?;
            printer.set_aside(out, &letter)
        }
        DeadLetterCommand::Purge { select, dry_run } => {
            let letters = selected(store, catalog, &select, true).await?;
            let ids: Vec<MessageId> = letters.iter().map(|letter| letter.message_id).collect();
            let purged = if dry_run || ids.is_empty() {
                0
            } else {
                store.purge_dead_letters(&ids).await?
            };
            printer.purged(out, &letters, purged, dry_run)
        }
    }
}

async fn inbox(
    database: &dyn outbox_core::admin::Database,
    command: InboxCommand,
    printer: &Printer<'_>,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    database.check_schema().await?;
    let inbox = database
        .inbox()
        .ok_or_else(|| CliError::Refused("this database's backend keeps no inbox".to_owned()))?;
    match command {
        InboxCommand::Purge {
            older_than,
            consumer,
        } => {
            let purged = inbox.purge_inbox(consumer.as_deref(), older_than).await?;
            let whose = consumer.map_or_else(
                || "every consumer's".to_owned(),
                |consumer| format!("consumer `{consumer}`'s"),
            );
            printer.done(
                out,
                &format!(
                    "purged {purged} of {whose} inbox records older than {}",
                    humantime::format_duration(older_than)
                ),
            )
        }
        InboxCommand::DeadLetters { consumer, limit } => {
            let letters = inbox.dead_letters(consumer.as_deref(), limit).await?;
            printer.inbox_dead_letters(out, &letters)
        }
    }
}

async fn backfill(
    store: &dyn Operations,
    command: BackfillCommand,
    catalog: &Catalog,
    printer: &Printer<'_>,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    match command {
        BackfillCommand::Status => printer.backfills(out, &store.backfills().await?),
        BackfillCommand::Start {
            model,
            version,
            destinations,
        } => {
            let category = names::category(catalog, &model)?;
            let mut start = outbox_core::admin::backfill_start(store, catalog, category, version)
                .await?
                .ok_or_else(|| {
                    CliError::Refused(format!(
                        "no version for model {}: this binary does not know the model and no \
                         relay has recorded its version yet; give --version",
                        printer.model(category)
                    ))
                })?;
            if !destinations.is_empty() {
                let destinations = destinations
                    .into_iter()
                    .map(Destination::new)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|error| CliError::Refused(error.to_string()))?;
                start = start.destinations(destinations);
            }
            start
                .check()
                .map_err(|error| CliError::Refused(error.to_string()))?;
            let state = store.start_backfill(&start).await?;
            printer.backfill_started(out, &state)
        }
        BackfillCommand::Pause { model } => {
            let category = names::category(catalog, &model)?;
            if !store.pause_backfill(category).await? {
                return Err(CliError::Refused(format!(
                    "the backfill of model {} is not under way: nothing to pause (see \
                     `outbox backfill status`)",
                    printer.model(category)
                )));
            }
            printer.done(
                out,
                &format!(
                    "paused the backfill of model {}: `outbox backfill start` goes on from \
                     where it stopped",
                    printer.model(category)
                ),
            )
        }
    }
}

/// The dead letters a selection names. Ids that are not dead letters are refused (nothing is
/// done); a replay or purge needs a condition, or `--all`.
async fn selected(
    store: &dyn Operations,
    catalog: &Catalog,
    select: &Selection,
    changes: bool,
) -> Result<Vec<DeadLetter>, CliError> {
    let mut filter = DeadLetterFilter::all();
    if let Some(category) = &select.category {
        filter = filter.category(names::category(catalog, category)?);
    }
    if let Some(scope) = &select.scope {
        filter = filter.scope(names::scope(catalog, scope)?);
    }
    if let Some(shard) = &select.shard {
        filter = filter.shard(names::shard(catalog, shard)?);
    }
    if let Some(age) = select.older_than {
        filter = filter.older_than(age);
    }
    let conditions = filter != DeadLetterFilter::all() || !select.ids.is_empty();
    if changes && !conditions && !select.all {
        return Err(CliError::Refused(
            "say which dead letters: --id, --category, --scope, --shard or --older-than, or \
             --all for every one"
                .into(),
        ));
    }
    if let Some(limit) = select.limit {
        filter = filter.limit(limit);
    }
    if select.ids.is_empty() {
        return Ok(store.dead_letters(&filter).await?);
    }
    let wanted: Vec<MessageId> = select.ids.iter().copied().map(MessageId).collect();
    let letters = store.dead_letters(&filter.ids(wanted.clone())).await?;
    let missing: Vec<MessageId> = wanted
        .iter()
        .filter(|id| !letters.iter().any(|letter| letter.message_id == **id))
        .copied()
        .collect();
    if !missing.is_empty() {
        return Err(Error::NoSuchDeadLetter { ids: missing }.into());
    }
    Ok(letters)
}

/// Why a replay of `letters` is refused: categories this binary does not know.
fn unknown_categories(catalog: &Catalog, letters: &[DeadLetter]) -> Option<String> {
    let mut unknown: Vec<CategoryId> = letters
        .iter()
        .map(|letter| letter.category)
        .filter(|category| catalog.category(*category).is_none())
        .collect();
    unknown.sort_unstable();
    unknown.dedup();
    if unknown.is_empty() {
        return None;
    }
    let list: Vec<String> = unknown.iter().map(|id| id.0.to_string()).collect();
    Some(format!(
        "this binary does not know categor{} {}: a replayed message of an unknown category parks \
         its shard until a binary that knows it runs; run the `outbox` command built into your \
         service, or pass --allow-unknown-categories",
        if unknown.len() == 1 { "y" } else { "ies" },
        list.join(", ")
    ))
}

/// A word for a pause of a scope or category this binary does not know (a mistyped number
/// pauses nothing anyone writes).
fn unknown_target(catalog: &Catalog, target: &PauseTarget) -> Option<String> {
    let (what, known) = match target {
        PauseTarget::Shard(shard) => (
            format!("scope {}", shard.scope.0),
            catalog.scope_name(shard.scope).is_some(),
        ),
        PauseTarget::Scope(scope) => (
            format!("scope {}", scope.0),
            catalog.scope_name(*scope).is_some(),
        ),
        PauseTarget::Category(category) => (
            format!("category {}", category.0),
            catalog.category(*category).is_some(),
        ),
    };
    (!known).then(|| {
        format!(
            "this binary does not know {what}: if no service writes it, the pause holds \
             nothing (check the number; the `outbox` command built into your service knows \
             its names)"
        )
    })
}

fn pause_target(catalog: &Catalog, target: TargetArgs) -> Result<PauseTarget, CliError> {
    match (target.shard, target.category, target.scope) {
        (Some(shard), _, _) => Ok(PauseTarget::Shard(names::shard(catalog, &shard)?)),
        (_, Some(category), _) => Ok(PauseTarget::Category(names::category(catalog, &category)?)),
        (_, _, Some(scope)) => Ok(PauseTarget::Scope(names::scope(catalog, &scope)?)),
        (None, None, None) => Err(CliError::Refused(
            "say what: a shard, --category or --scope".into(),
        )),
    }
}
