//! A service's declarations, with the engine renamed `engine` in its `Cargo.toml`.

use engine::{BoxError, Delivery, outbox_category, outbox_handler, outbox_scope};
use serde::{Deserialize, Serialize};

include!("../../declarations.rs");
