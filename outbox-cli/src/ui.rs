//! `outbox ui`: the operator console (`outbox-rs-web`) over the database the command opened,
//! until Ctrl-C or SIGTERM.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;

use outbox_core::admin::{Catalog, Database, Operations};
use outbox_web::ConsoleOptions;

use crate::CliError;

/// The environment variable that holds the console's token when actions are enabled: never
/// an argument, which other users of the machine could read.
pub const TOKEN_VARIABLE: &str = "OUTBOX_CONSOLE_TOKEN";

/// The console's options: read-only, or with actions for the token in [`TOKEN_VARIABLE`]
/// (read before the database is opened: a usage error comes first); its cookie `Secure` if
/// `secure_cookies`.
pub(crate) fn options(
    actions: bool,
    secure_cookies: bool,
    catalog: &Catalog,
) -> Result<ConsoleOptions, CliError> {
    let options = if actions {
        let token = std::env::var(TOKEN_VARIABLE).map_err(|_| {
            CliError::Usage(format!(
                "--actions needs the console's token in {TOKEN_VARIABLE} (a long random string, \
                 at least {} characters)",
                ConsoleOptions::MIN_TOKEN
            ))
        })?;
        ConsoleOptions::with_actions(token)
            .map_err(|error| CliError::Usage(format!("{error} (in {TOKEN_VARIABLE})")))?
    } else {
        ConsoleOptions::read_only()
    };
    let options = options.catalog(catalog.clone());
    Ok(if secure_cookies {
        options.secure_cookies()
    } else {
        options
    })
}

/// Serves the console of `database` on `listen` with `options`.
pub(crate) async fn serve(
    database: Box<dyn Database>,
    listen: SocketAddr,
    options: ConsoleOptions,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let actions = options.actions_enabled();
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|error| CliError::Refused(format!("cannot listen on {listen}: {error}")))?;
    let address = listener
        .local_addr()
        .map_err(|error| CliError::Refused(format!("cannot listen on {listen}: {error}")))?;
    let database: Arc<dyn Database> = Arc::from(database);
    let outbox: Arc<dyn Operations> = database.clone();
    let app = outbox_web::router(outbox, options);
    let mode = if actions {
        format!("actions enabled: log in with the token in {TOKEN_VARIABLE}")
    } else {
        "read-only".to_owned()
    };
    let _ = writeln!(
        out,
        "the outbox console serves http://{address}/ ({mode}); Ctrl-C stops it"
    );
    let _ = out.flush();
    let served = axum::serve(listener, app)
        .with_graceful_shutdown(outbox_core::shutdown_signal())
        .await;
    database.close().await;
    served.map_err(|error| CliError::Refused(format!("the console stopped: {error}")))
}
