//! One delivery: a group's handler called under the shard's lease.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::{Duration, SystemTime};

use futures_util::FutureExt;
use tokio::time::Instant;
use tracing::{Instrument, debug, info_span, warn};

use super::Inner;
use super::config::RelayConfig;
use super::plan::Group;
use crate::error::{DeliveryError, error_chain};
use crate::handler::{HandlerContext, RawDelivery};
use crate::store::{HandlerMode, Lease, ShardSession, Store};

/// Delivers `group` in a span of its own (`outbox.deliver`: category, message, object, shard,
/// attempt, fencing token; related to the producer's trace with the `opentelemetry` feature),
/// reporting its duration, lag and outcome as metrics and events: success at debug, failure at
/// warn with the error's chain.
pub(super) async fn deliver<S: ShardSession, St: Store>(
    session: &mut S,
    inner: &Inner<St>,
    lease: &Lease,
    group: &Group,
    attempt: u32,
) -> Result<(), DeliveryError> {
    let metrics = inner.metrics().category(group.info.id);
    let message = &group.newest;
    let span = info_span!(
        "outbox.deliver",
        category = group.info.name,
        message_id = message.id.0,
        object = %message.object_identifier,
        shard = %lease.shard,
        attempt,
        fencing_token = lease.token,
        rows = group.rows(),
    );
    #[cfg(feature = "opentelemetry")]
    if let Some(metadata) = message
        .metadata
        .as_deref()
        .and_then(|json| crate::Metadata::from_json(json).ok())
    {
        crate::trace::relate(&span, &metadata, inner.config.trace_relation);
    }
    let lag = SystemTime::now()
        .duration_since(message.created_at)
        .unwrap_or_default();
    async {
        let started = Instant::now();
        let result = call_handler(session, inner, lease, group, attempt).await;
        let took = started.elapsed();
        match &result {
            Ok(()) => {
                if let Some(metrics) = metrics {
                    metrics.delivered(group.rows(), lag, took);
                }
                debug!(?took, "delivered");
            }
            Err(error) => {
                if let Some(metrics) = metrics {
                    metrics.failed(error.kind(), lag, took);
                }
                if error.breaker().is_some() {
                    // The breaker logged the outage once; each shard it parks is a detail.
                    debug!(?took, kind = error.kind(), error = %error_chain(error), "delivery found its system unavailable");
                } else {
                    warn!(?took, kind = error.kind(), error = %error_chain(error), "delivery failed");
                }
            }
        }
        result
    }
    .instrument(span)
    .await
}

/// Calls `group`'s handler (reading its model's row first, for a replicated model), under the
/// handler timeout, with the lease kept alive beside it; a panic is a failed delivery.
async fn call_handler<S: ShardSession, St: Store>(
    session: &mut S,
    inner: &Inner<St>,
    lease: &Lease,
    group: &Group,
    attempt: u32,
) -> Result<(), DeliveryError> {
    let (store, config) = (&inner.store, &inner.config);
    let row = match &group.info.model {
        Some(table) => session
            .load_model(table, group.newest.object_identifier)
            .await
            .map_err(|source| DeliveryError::Lookup {
                model: group.info.name,
                table: table.table,
                object_identifier: group.newest.object_identifier,
                source: Box::new(source),
            })?,
        None => None,
    };
    let mut cx = HandlerContext::new(session.handler_connection(), inner.registry.state());
    let call = group.info.handler.call(
        RawDelivery {
            category: group.info.name,
            scope_name: group.info.scope_name,
            shard: &lease.shard,
            message: &group.newest,
            attempt,
            fencing_token: lease.token,
            row: row.as_ref(),
        },
        &mut cx,
    );
    let call = keeping_the_lease(AssertUnwindSafe(call).catch_unwind(), store, lease, config);
    let outcome = match config.handler_timeout {
        Some(timeout) => match tokio::time::timeout(timeout, call).await {
            Ok(outcome) => outcome,
            Err(_) => {
                return Err(DeliveryError::TimedOut {
                    category: group.info.name,
                    message_id: group.newest.id,
                    timeout,
                });
            }
        },
        None => call.await,
    };
    match outcome {
        Ok(result) => result,
        Err(panic) => Err(DeliveryError::Panicked {
            category: group.info.name,
            message_id: group.newest.id,
            panic: panic
                .downcast_ref::<&str>()
                .map(|text| (*text).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "non-string panic payload".to_owned()),
        }),
    }
}

/// Runs `call` (a handler) while extending the lease beside it, every third of the lease: a
/// live relay keeps its shard however long its handler takes, and only a dead one loses it
/// (S16, S17). In transaction mode the claiming transaction holds the shard, and there is
/// nothing to extend.
async fn keeping_the_lease<F: Future, St: Store>(
    call: F,
    store: &St,
    lease: &Lease,
    config: &RelayConfig,
) -> F::Output {
    if config.handler_mode == HandlerMode::InTransaction {
        return call.await;
    }
    tokio::pin!(call);
    // A handler that finishes at its first poll needs no heartbeat: no timer for it.
    let first = std::future::poll_fn(|cx| std::task::Poll::Ready(call.as_mut().poll(cx))).await;
    if let std::task::Poll::Ready(output) = first {
        return output;
    }
    let every = (config.lease / 3).max(Duration::from_millis(10));
    let heartbeat = async {
        let mut beats = tokio::time::interval_at(Instant::now() + every, every);
        loop {
            beats.tick().await;
            match store.extend_lease(lease, config.lease).await {
                Ok(true) => debug!(shard = %lease.shard, "lease extended while a handler runs"),
                Ok(false) => {
                    warn!(shard = %lease.shard, token = lease.token, "lease lost while a handler runs; another worker owns the shard");
                    return std::future::pending::<()>().await;
                }
                Err(error) => {
                    debug!(shard = %lease.shard, error = %error_chain(&error), "cannot extend the lease; trying again");
                }
            }
        }
    };
    tokio::select! {
        output = &mut call => output,
        () = heartbeat => unreachable!("the heartbeat never ends"),
    }
}
