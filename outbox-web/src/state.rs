//! What the console's pages share.

use crate::auth::Sessions;
use crate::history::Samples;
use crate::options::{ConsoleOptions, Outbox};

/// What the console's pages share.
pub(crate) struct Console {
    pub(crate) outbox: Outbox,
    pub(crate) options: ConsoleOptions,
    pub(crate) sessions: Sessions,
    pub(crate) samples: Samples,
}
