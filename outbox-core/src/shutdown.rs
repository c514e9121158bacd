//! The process's request to stop, as a future for [`Relay::run`](crate::Relay::run).

use std::future::Future;

use tracing::info;

/// Resolves when the process is asked to stop: on SIGTERM (what Kubernetes, systemd and
/// `docker stop` send) or SIGINT (Ctrl-C) on Unix; on Ctrl-C elsewhere. Give it to
/// [`Relay::run`](crate::Relay::run) for a graceful stop: the relay stops claiming, lets the
/// shards in flight finish their current delivery within the
/// [shutdown deadline](crate::RelayConfigBuilder::shutdown_deadline), releases them and
/// returns its [`RunReport`](crate::RunReport).
///
/// ```no_run
/// # use outbox_core::{memory::MemoryStore, Registry, Relay};
/// # #[tokio::main]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let (store, registry) = (MemoryStore::new(), Registry::builder().build()?);
/// let relay = Relay::new(store, registry);
/// let report = relay.run(outbox_core::shutdown_signal()).await?; // once signalled
/// println!("stopped after {} deliveries", report.deliveries);
/// # Ok(())
/// # }
/// ```
///
/// The Unix handlers are installed when this function is called, not when the future is
/// first polled: a signal that arrives in between is not lost, and, once installed, SIGTERM
/// and SIGINT no longer end the process at once (for the rest of its life, as with any Tokio
/// signal handler): they are the relay's to act on. Every future it returns resolves on a
/// signal that arrives after the call, so several relays of one process can each take one.
///
/// # Panics
///
/// If called outside a Tokio runtime with its I/O driver enabled (`#[tokio::main]` enables
/// it).
pub fn shutdown_signal() -> impl Future<Output = ()> + Send + 'static {
    imp::shutdown_signal()
}

#[cfg(unix)]
mod imp {
    use std::future::Future;

    use tokio::signal::unix::{Signal, SignalKind, signal};
    use tracing::warn;

    pub(super) fn shutdown_signal() -> impl Future<Output = ()> + Send + 'static {
        let mut terminate = listen(SignalKind::terminate(), "SIGTERM");
        let mut interrupt = listen(SignalKind::interrupt(), "SIGINT");
        async move {
            let name = tokio::select! {
                () = received(terminate.as_mut()) => "SIGTERM",
                () = received(interrupt.as_mut()) => "SIGINT",
            };
            super::announce(name);
        }
    }

    /// A listener for `kind`, or `None` (after a warning) if it cannot be installed.
    fn listen(kind: SignalKind, name: &str) -> Option<Signal> {
        signal(kind)
            .inspect_err(
                |error| warn!(%error, "cannot listen for {name}; it will not stop the relay"),
            )
            .ok()
    }

    /// The next signal of `listener`; never, without one.
    async fn received(listener: Option<&mut Signal>) {
        match listener {
            Some(listener) => {
                // `None`: the runtime is shutting down, and nothing will be received any more.
                if listener.recv().await.is_none() {
                    std::future::pending::<()>().await;
                }
            }
            None => std::future::pending().await,
        }
    }
}

#[cfg(not(unix))]
mod imp {
    use std::future::Future;

    use tracing::warn;

    pub(super) fn shutdown_signal() -> impl Future<Output = ()> + Send + 'static {
        async {
            match tokio::signal::ctrl_c().await {
                Ok(()) => super::announce("Ctrl-C"),
                Err(error) => {
                    warn!(%error, "cannot listen for Ctrl-C; it will not stop the relay");
                    std::future::pending::<()>().await;
                }
            }
        }
    }
}

fn announce(signal: &str) {
    info!(signal, "shutdown requested; stopping");
}
