//! [`TcpProxy`]: a TCP proxy a test controls, to cut the connection to a broker (or a
//! database) and restore it, while the client under test keeps its address.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::{AbortHandle, JoinHandle};

/// Forwards connections made to [`TcpProxy::addr`] to its target. [`TcpProxy::cut`] drops
/// every connection and refuses new ones (they are accepted and closed at once, as by a
/// server that is going away); [`TcpProxy::restore`] forwards again. Stops when dropped.
#[derive(Debug)]
pub struct TcpProxy {
    addr: SocketAddr,
    state: Arc<State>,
    accepting: JoinHandle<()>,
}

#[derive(Debug, Default)]
struct State {
    cut: AtomicBool,
    connections: Mutex<Vec<AbortHandle>>,
}

impl State {
    fn connections(&self) -> std::sync::MutexGuard<'_, Vec<AbortHandle>> {
        self.connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn drop_connections(&self) {
        for connection in self.connections().drain(..) {
            connection.abort();
        }
    }
}

impl TcpProxy {
    /// A proxy to `target` (`"127.0.0.1:4222"`), listening on a free local port.
    pub async fn start(target: impl Into<String>) -> std::io::Result<Self> {
        let target = target.into();
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(State::default());
        let shared = Arc::clone(&state);
        let accepting = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if shared.cut.load(Ordering::Acquire) {
                    drop(inbound);
                    continue;
                }
                let target = target.clone();
                let connection = tokio::spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(&target).await {
                        // No Nagle delays: a request and its reply cross the proxy as they
                        // would cross the network, not 40 ms later.
                        let _ = inbound.set_nodelay(true);
                        let _ = outbound.set_nodelay(true);
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                let mut connections = shared.connections();
                connections.retain(|connection| !connection.is_finished());
                connections.push(connection.abort_handle());
            }
        });
        Ok(Self {
            addr,
            state,
            accepting,
        })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Drops every connection, and closes new ones at once, until [`TcpProxy::restore`].
    pub fn cut(&self) {
        self.state.cut.store(true, Ordering::Release);
        self.state.drop_connections();
    }

    /// Forwards new connections again.
    pub fn restore(&self) {
        self.state.cut.store(false, Ordering::Release);
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.accepting.abort();
        self.state.drop_connections();
    }
}
