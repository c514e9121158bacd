//! The sampling of the outbox for the overview's history ([`crate::history`]).

use std::sync::Weak;
use std::time::{Duration, SystemTime};

use tracing::debug;

use crate::history::Sample;
use crate::state::Console;

/// Samples the console's outbox every `every` until the console is dropped.
pub(crate) async fn sample(console: Weak<Console>, every: Duration) {
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let Some(console) = console.upgrade() else {
            return;
        };
        match console.outbox.gauges().await {
            Ok(status) => {
                let at = SystemTime::now();
                let oldest = status
                    .oldest_pending_at
                    .and_then(|oldest| at.duration_since(oldest).ok())
                    .unwrap_or_default();
                console.samples.push(Sample {
                    at,
                    pending: status.pending_messages,
                    oldest,
                });
            }
            Err(error) => {
                debug!(error = %outbox_core::error::error_chain(&error), "the console cannot sample the outbox");
            }
        }
    }
}
