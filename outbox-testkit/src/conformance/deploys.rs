//! Deploys and errors: an older binary on a newer schema, and error chains that print each
//! cause once.

use std::io;
use std::sync::{Arc, Mutex, PoisonError};

use outbox_core::{DeliveryError, ModelBatch, Registry, Relay};

use outbox_core::error::error_chain;
use tracing_subscriber::fmt::MakeWriter;

use super::{config, pending, state_of, write};
use crate::backend::{ModelWrite, TestBackend};
use crate::fixtures::{MODEL_TABLES, ModelRecorder, OrgUpdate, Project, Recorder, note, org_shard};

/// A migration of a newer binary, as far as an older one can tell: a row in
/// `_outbox_migrations` with a version above its own, and the additive change it made.
const FUTURE_VERSION: i64 = 9_001;

/// An older binary keeps working on a schema a newer binary migrated (a rolling deploy): its
/// `migrate` succeeds and applies nothing, its relay starts and delivers, and each says once,
/// in a log line, which versions it knows and which the database has.
pub async fn older_binary_runs_on_a_newer_schema<B: TestBackend>() {
    let backend = B::create().await;
    // What a newer binary's migration left: its record (the checksum does not matter to an
    // older binary, which does not know the migration) and an additive change.
    backend
        .execute(&format!(
            "INSERT INTO _outbox_migrations \
                (version, description, success, checksum, execution_time) \
             SELECT {FUTURE_VERSION}, 'a newer binary''s migration', TRUE, checksum, 0 \
             FROM _outbox_migrations WHERE version = 1"
        ))
        .await;
    backend
        .execute("ALTER TABLE outbox_messages ADD COLUMN added_later TEXT")
        .await;
    backend
        .execute("CREATE TABLE outbox_added_later (id BIGINT PRIMARY KEY)")
        .await;

    let logs = Logs::capture();
    backend
        .migrate()
        .await
        .expect("an older binary's migrate accepts a newer schema");
    let noted = logs.lines_with("newer than this binary");
    assert_eq!(noted.len(), 1, "one line says so: {noted:?}");
    assert!(
        noted[0].contains("WARN") && noted[0].contains(&FUTURE_VERSION.to_string()),
        "it names the database's versions: {}",
        noted[0]
    );

    let recorder = Recorder::new();
    let relay = Relay::with_config(backend.store(), recorder.registry(), config("older"));
    write(&backend, &[note::<OrgUpdate>(1, 1, 1)]).await;
    relay
        .drain()
        .await
        .expect("the relay runs on the newer schema");
    write(&backend, &[note::<OrgUpdate>(1, 2, 2)]).await;
    relay.drain().await.expect("and keeps running");
    assert_eq!(
        recorder.triples(),
        [("org_update", 1, 1), ("org_update", 2, 2)]
    );
    assert!(pending(&backend).await.is_empty());
    assert_eq!(
        logs.lines_with("newer than this binary").len(),
        2,
        "the relay's start-up check says so once, however many drains"
    );
}

/// A failure whose cause is a driver's error (here: a model's table gone) reads each cause
/// once, in the report and in the shard's recorded error, although the driver's errors print
/// their causes in their own messages too.
pub async fn error_chains_print_each_cause_once<B: TestBackend>() {
    let backend = B::create().await;
    for ddl in MODEL_TABLES {
        backend.execute(ddl).await;
    }
    let recorder = ModelRecorder::default();
    let registry = recorder
        .register(Registry::builder())
        .build()
        .expect("the test models do not conflict");
    let relay = Relay::with_config(backend.store(), registry, config("chains"));
    backend
        .write_models(
            ModelWrite::Insert,
            ModelBatch::local(&Project::new(1, 7, "api")),
            true,
        )
        .await
        .expect("insert a project");
    backend.execute("DROP TABLE projects").await;

    let report = relay.drain().await.expect("a failed lookup is the shard's");
    assert_eq!(report.failures.len(), 1, "{report:?}");
    let error = &report.failures[0].error;
    assert!(matches!(error, DeliveryError::Lookup { .. }), "{error:?}");
    // The driver's own message, at the end of the chain.
    let mut innermost: &dyn std::error::Error = error;
    while let Some(cause) = innermost.source() {
        innermost = cause;
    }
    let database_message = innermost.to_string();
    assert!(
        database_message.contains("projects"),
        "the driver names the table: {database_message}"
    );
    let chain = error_chain(error);
    assert_eq!(
        chain.matches(&database_message).count(),
        1,
        "each cause once: {chain}"
    );
    let recorded = state_of(&backend.store(), &org_shard(7))
        .await
        .and_then(|state| state.last_error)
        .expect("the failure is recorded");
    assert_eq!(recorded.matches(&database_message).count(), 1, "{recorded}");
}

/// What the `tracing` events of this thread print, while it lives.
struct Logs {
    buffer: Buffer,
    _guard: tracing::subscriber::DefaultGuard,
}

impl Logs {
    fn capture() -> Self {
        let buffer = Buffer::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(buffer.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .finish();
        Self {
            _guard: tracing::subscriber::set_default(subscriber),
            buffer,
        }
    }

    /// The lines printed so far that contain `text`.
    fn lines_with(&self, text: &str) -> Vec<String> {
        let bytes = self.buffer.0.lock().unwrap_or_else(PoisonError::into_inner);
        String::from_utf8_lossy(&bytes)
            .lines()
            .filter(|line| line.contains(text))
            .map(str::to_owned)
            .collect()
    }
}

#[derive(Debug, Clone, Default)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl io::Write for Buffer {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl MakeWriter<'_> for Buffer {
    type Writer = Self;

    fn make_writer(&self) -> Self {
        self.clone()
    }
}
