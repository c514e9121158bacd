//! `outbox migrate`: applying the migrations, or printing their SQL for a migration tool of
//! the user's own, on whichever backend the URL names.

use std::io::Write;

use outbox_core::admin::{Backend, Open};

use crate::CliError;
use crate::output::{Migrated, Printer};

/// `outbox migrate [--print]`.
pub(crate) async fn run(
    url: &str,
    print: bool,
    printer: &Printer<'_>,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let backend = Backend::for_url(url)?;
    if print {
        return printer.sql(out, &(backend.migration_script)());
    }
    let database = (backend.open)(url.to_owned(), Open::OrCreate).await?;
    let result = async {
        let before = database.applied_migrations().await?;
        database.migrate().await?;
        let after = database.applied_migrations().await?;
        Ok::<_, CliError>(Migrated { before, after })
    }
    .await;
    database.close().await;
    printer.migrated(out, &result?)
}
