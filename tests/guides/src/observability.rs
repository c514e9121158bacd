//! `docs/observability.md`: metrics.

use outbox::BoxError;

/// The relay's metrics, exported to Prometheus.
fn metrics() -> Result<(), BoxError> {
    let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new().install_recorder()?;
    outbox::telemetry::describe();
    // serve prometheus.render() on /metrics
    drop(prometheus);
    Ok(())
}
