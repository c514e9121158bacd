//! Deploys and errors: error chains that print each cause once.

use outbox_core::{DeliveryError, ModelBatch, Registry, Relay, error_chain};

use super::{config, state_of};
use crate::backend::{ModelWrite, TestBackend};
use crate::fixtures::{MODEL_TABLES, ModelRecorder, Project, org_shard};

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
