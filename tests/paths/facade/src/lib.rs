//! A service's declarations, written against the `outbox` crate alone.

use outbox::{BoxError, Delivery, outbox_category, outbox_handler, outbox_scope};
use serde::{Deserialize, Serialize};

include!("../../declarations.rs");
