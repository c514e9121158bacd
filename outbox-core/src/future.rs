//! Boxed futures: how this crate's trait objects (handlers, sinks, operators' databases)
//! return their work.

use std::future::Future;
use std::pin::Pin;

/// A boxed, sendable future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;
