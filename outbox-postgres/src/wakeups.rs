//! Wake-ups on commit: the outbox trigger's notifications, through `LISTEN`.

use outbox_core::Error;
use outbox_core::store::{Wakeup, WakeupStream};
use outbox_sqlx::error::database;
use sqlx::PgPool;
use sqlx::postgres::PgListener;

use crate::dialect::{PgDialect, shard_from_stored};

/// The channel on which the outbox trigger notifies relays of committed messages.
pub const NOTIFY_CHANNEL: &str = "outbox_messages";

/// Commit notifications from the outbox trigger, through `LISTEN`.
#[derive(Debug)]
pub struct PgWakeups {
    listener: PgListener,
}

impl PgWakeups {
    /// Listens on [`NOTIFY_CHANNEL`] with a connection of its own.
    pub(crate) async fn listen(pool: &PgPool) -> Result<Self, Error> {
        let mut listener = PgListener::connect_with(pool)
            .await
            .map_err(database::<PgDialect>("listening for commits"))?;
        listener
            .listen(NOTIFY_CHANNEL)
            .await
            .map_err(database::<PgDialect>("listening for commits"))?;
        Ok(Self { listener })
    }
}

impl WakeupStream for PgWakeups {
    async fn next(&mut self) -> Result<Wakeup, Error> {
        match self.listener.try_recv().await {
            Ok(Some(notification)) => Ok(parse_wakeup(notification.payload())),
            // The connection was lost and has been re-established (listening again):
            // commits in between went unannounced, so the relay should look for itself.
            Ok(None) => Ok(Wakeup::Any),
            Err(error) => Err(database::<PgDialect>("listening for commits")(error)),
        }
    }
}

/// Parses the trigger's payload: one `scope:shard:destination` per line, or `*`.
fn parse_wakeup(payload: &str) -> Wakeup {
    let mut shards = Vec::new();
    for line in payload.lines() {
        let mut parts = line.splitn(3, ':');
        let parsed = match (parts.next(), parts.next(), parts.next()) {
            (Some(scope), Some(shard), Some(destination)) => scope
                .parse::<i16>()
                .ok()
                .zip(shard.parse::<i64>().ok())
                .and_then(|(scope, shard)| {
                    shard_from_stored(scope, shard, destination.to_owned()).ok()
                }),
            _ => None,
        };
        match parsed {
            Some(key) => shards.push(key),
            None => return Wakeup::Any,
        }
    }
    if shards.is_empty() {
        Wakeup::Any
    } else {
        Wakeup::Shards(shards)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_core::{Destination, Id, ScopeId, ShardKey};

    #[test]
    fn parses_notification_payloads() {
        assert_eq!(parse_wakeup("*"), Wakeup::Any);
        assert_eq!(parse_wakeup(""), Wakeup::Any);
        assert_eq!(
            parse_wakeup(
                "1:42:\n2:-7:eu:west\n3:9223372036854775807:\u{1}000000000000000000000000000000ffus"
            ),
            Wakeup::Shards(vec![
                ShardKey::local(ScopeId(1), 42),
                ShardKey::fan_out(ScopeId(2), -7, Destination::new("eu:west").unwrap()),
                ShardKey::fan_out(ScopeId(3), Id::wide(255), Destination::new("us").unwrap()),
            ])
        );
        assert_eq!(
            parse_wakeup("1:9223372036854775807:\u{1}00ff"),
            Wakeup::Any,
            "a wide shard's destination cut short"
        );
        assert_eq!(parse_wakeup("1:not-a-number:"), Wakeup::Any);
    }
}
