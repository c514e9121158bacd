//! `shutdown_signal`: SIGTERM and SIGINT stop a running relay gracefully, instead of ending
//! the process.
//!
//! A test binary of its own: the signals are sent to this whole process, and would stop the
//! relays of any other test running beside them. One test, so that its two rounds never
//! overlap.
#![cfg(unix)]

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use outbox_core::memory::MemoryStore;
use outbox_core::{
    BoxError, Category, CategoryId, Delivery, Message, Registry, Relay, RelayConfig, RunReport,
    Scope, ScopeId, shutdown_signal,
};
use tokio::sync::{Notify, Semaphore};

struct Org;
impl Scope for Org {
    const ID: ScopeId = ScopeId(1);
    const NAME: &'static str = "org";
}

struct Renamed;
impl Category for Renamed {
    type Scope = Org;
    type Payload = String;
    const ID: CategoryId = CategoryId(1);
    const NAME: &'static str = "renamed";
}

/// Sends `signal` (a name `kill` knows: `TERM`, `INT`) to this process, as an orchestrator
/// would, through the system's `kill` (this workspace forbids the `unsafe` a direct call
/// needs).
fn send_to_self(signal: &str) {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(std::process::id().to_string())
        .status()
        .expect("`kill` runs");
    assert!(status.success(), "kill -{signal} failed: {status}");
}

/// Runs a relay with `shutdown_signal()` whose handler is held inside its delivery, sends
/// `signal` to the process, and returns the relay's report once it stopped; the delivery in
/// flight is let through only after the signal arrived.
async fn stop_a_running_relay_with(signal: &str) -> (RunReport, MemoryStore) {
    let store = MemoryStore::new();
    let entered = Arc::new(Notify::new());
    let gate = Arc::new(Semaphore::new(0));
    let handler = {
        let (entered, gate) = (Arc::clone(&entered), Arc::clone(&gate));
        move |_: Delivery<Renamed>| {
            let (entered, gate) = (Arc::clone(&entered), Arc::clone(&gate));
            async move {
                entered.notify_one();
                let _open = gate.acquire().await.expect("never closed");
                Ok::<(), BoxError>(())
            }
        }
    };
    let registry = Registry::builder()
        .handle::<Renamed>(handler)
        .build()
        .expect("a registry");
    let config = RelayConfig::builder()
        .poll_interval(Duration::from_millis(20))
        .shutdown_deadline(Duration::from_secs(20))
        .build()
        .expect("a valid configuration");
    let relay = Relay::with_config(store.clone(), registry, config);

    // Installed here, before any signal is sent: from now on the process survives them.
    let stop = shutdown_signal();
    let witness = shutdown_signal();
    let mut running = tokio::spawn(async move { relay.run(stop).await });

    store.write(&Message::new::<Renamed>(7, 7, &"Acme".to_owned()).expect("a message"));
    tokio::time::timeout(Duration::from_secs(10), entered.notified())
        .await
        .expect("the relay delivers: its handler entered");

    send_to_self(signal);
    tokio::time::timeout(Duration::from_secs(10), witness)
        .await
        .expect("the signal arrives, and the process is still alive");
    assert!(
        tokio::time::timeout(Duration::from_millis(200), &mut running)
            .await
            .is_err(),
        "a graceful stop waits for the delivery in flight"
    );

    gate.add_permits(Semaphore::MAX_PERMITS);
    let report = tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .expect("the relay stops once its delivery is done")
        .expect("the relay's task")
        .expect("run ends without an error");
    (report, store)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_and_sigint_stop_a_running_relay_gracefully() {
    for signal in ["TERM", "INT"] {
        let (report, store) = stop_a_running_relay_with(signal).await;
        assert_eq!(
            (
                report.deliveries,
                report.rows_acknowledged,
                report.abandoned
            ),
            (1, 1, 0),
            "SIG{signal}: the delivery in flight finished and was acknowledged: {report:?}"
        );
        assert!(store.pending().is_empty(), "SIG{signal}: nothing left");
    }
}
