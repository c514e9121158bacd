//! The consumer's side: a Redis Streams consumer group whose entries run through an outbox
//! [`Consumer`] (its inbox and handlers), acknowledged with `XACK` only once settled.

use std::future::Future;
use std::time::Duration;

use outbox_core::inbox::{ConsumeReport, Consumer, Incoming};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::streams::{
    StreamAutoClaimOptions, StreamAutoClaimReply, StreamId, StreamInfoGroupsReply,
    StreamPendingCountReply, StreamReadOptions, StreamReadReply,
};
use redis::{AsyncCommands, RedisError, Value};
use tracing::{debug, warn};

use crate::PAYLOAD_FIELD;

/// How long an entry another consumer of the group was delivered stays unacknowledged before
/// this consumer claims it, by default: that consumer is taken for dead.
pub const DEFAULT_CLAIM_AFTER: Duration = Duration::from_secs(60);

/// How many entries one read takes, by default.
pub const DEFAULT_BATCH: usize = 100;

/// How long a read waits for new entries before it looks for entries to claim.
const BLOCK: Duration = Duration::from_secs(1);

/// How long the consumer waits after Redis failed before it tries again.
const RETRY_AFTER: Duration = Duration::from_millis(500);

/// A member of a Redis Streams consumer group that applies each entry through an outbox
/// [`Consumer`]: the handler's effect and the inbox record commit in one transaction of the
/// consumer's database, and the entry is acknowledged (`XACK`) only after that commit. A
/// crash in between leaves the entry pending: this consumer reads it again when it starts
/// again under the same name, or another member of the group claims it once it has been
/// pending for [`claim_after`](Self::claim_after); the inbox finds it applied.
///
/// Entries are applied one at a time, in stream order (a failing entry is retried in place,
/// its successors wait; its idle time is reset meanwhile, so that no other member claims
/// it). An entry claimed from a dead member is applied when claimed, after newer ones.
///
/// ```no_run
/// # async fn example(consumer: outbox_core::inbox::Consumer) -> Result<(), Box<dyn std::error::Error>> {
/// use outbox_redis::RedisConsumer;
///
/// let client = redis::Client::open("redis://127.0.0.1:6379")?;
/// let report = RedisConsumer::new(consumer, "orders:order_placed", "billing", "billing-1")
///     .run(client, outbox_core::shutdown_signal())
///     .await?;
/// println!("applied {} entries", report.applied);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct RedisConsumer {
    consumer: Consumer,
    key: String,
    group: String,
    name: String,
    batch: usize,
    claim_after: Duration,
}

impl RedisConsumer {
    /// Reads stream `key` as member `name` of consumer group `group` (created, from the
    /// stream's first entry, if missing; the stream too). Give each running process a name
    /// of its own, the same across its restarts.
    pub fn new(
        consumer: Consumer,
        key: impl Into<String>,
        group: impl Into<String>,
        name: impl Into<String>,
    ) -> Self {
        Self {
            consumer,
            key: key.into(),
            group: group.into(),
            name: name.into(),
            batch: DEFAULT_BATCH,
            claim_after: DEFAULT_CLAIM_AFTER,
        }
    }

    /// Takes up to `entries` at a time (default [`DEFAULT_BATCH`]).
    pub fn batch(mut self, entries: usize) -> Self {
        self.batch = entries.max(1);
        self
    }

    /// Claims the entries another member has left unacknowledged this long (default
    /// [`DEFAULT_CLAIM_AFTER`]): longer than a handler's slowest transaction.
    pub fn claim_after(mut self, idle: Duration) -> Self {
        self.claim_after = idle;
        self
    }

    /// Consumes until `stop` resolves, then returns what it settled. An entry being retried
    /// when `stop` resolves is left pending (this member, or another, applies it later); an
    /// entry being applied is finished first.
    ///
    /// Redis may go away and come back meanwhile (or be away at the start): the connection
    /// reconnects, and the consumer goes on from its pending entries. Fails only if the
    /// first connection is refused for a reason other than an outage (a bad address or
    /// credentials).
    pub async fn run(
        &self,
        client: redis::Client,
        stop: impl Future<Output = ()>,
    ) -> Result<ConsumeReport, RedisError> {
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(BLOCK + crate::DEFAULT_RESPONSE_TIMEOUT))
            .set_connection_timeout(Some(crate::DEFAULT_RESPONSE_TIMEOUT))
            .set_max_delay(Duration::from_millis(200));
        let mut report = ConsumeReport::default();
        let mut stop = std::pin::pin!(stop);
        // Redis away at the start (or the connection cut as it is made) is waited out as it
        // is later; a refusal that is not an outage (a bad address, a wrong password) ends
        // the run.
        let mut connection = loop {
            let error =
                match ConnectionManager::new_with_config(client.clone(), config.clone()).await {
                    Ok(connection) => break connection,
                    Err(error) => error,
                };
            if !crate::connection_lost(&error) {
                return Err(error);
            }
            warn!(key = %self.key, group = %self.group, %error, "connecting to Redis failed; trying again");
            tokio::select! {
                biased;
                () = stop.as_mut() => return Ok(report),
                () = tokio::time::sleep(RETRY_AFTER) => {}
            }
        };
        let mut group_ready = false;
        // Its own pending entries first (a restart under the same name), from this id.
        let mut own_pending = Some("0".to_owned());
        let mut next_claim = tokio::time::Instant::now();
        loop {
            let read = async {
                if !group_ready {
                    self.create_group(&mut connection).await?;
                }
                if tokio::time::Instant::now() >= next_claim {
                    let claimed = self.claim(&mut connection).await?;
                    if !claimed.is_empty() {
                        return Ok::<_, RedisError>((claimed, true));
                    }
                }
                match &own_pending {
                    Some(after) => Ok((self.read(&mut connection, after, false).await?, true)),
                    None => Ok((self.read(&mut connection, ">", true).await?, false)),
                }
            };
            let (entries, redelivered) = tokio::select! {
                biased;
                () = stop.as_mut() => return Ok(report),
                read = read => match read {
                    Ok(read) => {
                        group_ready = true;
                        read
                    }
                    Err(error) => {
                        warn!(key = %self.key, group = %self.group, %error, "reading the stream failed; trying again");
                        tokio::select! {
                            biased;
                            () = stop.as_mut() => return Ok(report),
                            () = tokio::time::sleep(RETRY_AFTER) => continue,
                        }
                    }
                }
            };
            if tokio::time::Instant::now() >= next_claim {
                next_claim = tokio::time::Instant::now() + self.claim_after / 2;
            }
            if own_pending.is_some() && entries.is_empty() {
                own_pending = None;
                continue;
            }
            for stream_id in entries {
                let id = stream_id.id.clone();
                if let Some(after) = own_pending.as_mut() {
                    after.clone_from(&id);
                }
                let delivered = if redelivered {
                    self.delivered(&mut connection, &id).await
                } else {
                    1
                };
                let incoming = incoming(stream_id, delivered);
                let keep_alive = || {
                    let mut connection = connection.clone();
                    let id = id.clone();
                    async move { self.keep_alive(&mut connection, &id).await }
                };
                let Some(settled) = self
                    .consumer
                    .process(&incoming, keep_alive, stop.as_mut())
                    .await
                else {
                    return Ok(report);
                };
                report.count(settled);
                if let Err(error) = connection
                    .xack::<_, _, _, ()>(&self.key, &self.group, &[&id])
                    .await
                {
                    // Settled in the database: the entry is read again (or claimed), and
                    // the inbox finds it applied.
                    warn!(key = %self.key, %error, "acknowledging a settled entry failed; it will be a duplicate");
                }
            }
            self.record_lag(&mut connection).await;
        }
    }

    /// Creates the group (and the stream) unless it exists.
    async fn create_group(&self, connection: &mut ConnectionManager) -> Result<(), RedisError> {
        match connection
            .xgroup_create_mkstream::<_, _, _, ()>(&self.key, &self.group, "0")
            .await
        {
            Err(error) if error.code() == Some("BUSYGROUP") => Ok(()),
            other => other,
        }
    }

    /// Entries after `after`: new ones (`>`, waiting up to [`BLOCK`]), or this member's
    /// pending ones.
    async fn read(
        &self,
        connection: &mut ConnectionManager,
        after: &str,
        block: bool,
    ) -> Result<Vec<StreamId>, RedisError> {
        let mut options = StreamReadOptions::default()
            .group(&self.group, &self.name)
            .count(self.batch);
        if block {
            options = options.block(usize::try_from(BLOCK.as_millis()).unwrap_or(usize::MAX));
        }
        let reply: Option<StreamReadReply> = connection
            .xread_options(&[&self.key], &[after], &options)
            .await?;
        Ok(reply
            .into_iter()
            .flat_map(|reply| reply.keys)
            .flat_map(|key| key.ids)
            .collect())
    }

    /// Entries other members left pending for [`claim_after`](Self::claim_after), now this
    /// member's.
    async fn claim(&self, connection: &mut ConnectionManager) -> Result<Vec<StreamId>, RedisError> {
        let idle = u64::try_from(self.claim_after.as_millis()).unwrap_or(u64::MAX);
        let reply: StreamAutoClaimReply = connection
            .xautoclaim_options(
                &self.key,
                &self.group,
                &self.name,
                idle,
                "0-0",
                StreamAutoClaimOptions::default().count(self.batch),
            )
            .await?;
        if !reply.claimed.is_empty() {
            debug!(key = %self.key, claimed = reply.claimed.len(), "claimed entries a silent member left pending");
        }
        Ok(reply.claimed)
    }

    /// How many times the group delivered entry `id` (1 if Redis does not say).
    async fn delivered(&self, connection: &mut ConnectionManager, id: &str) -> u32 {
        let reply: Result<StreamPendingCountReply, _> = connection
            .xpending_count(&self.key, &self.group, id, id, 1)
            .await;
        reply
            .ok()
            .and_then(|reply| reply.ids.first().map(|pending| pending.times_delivered))
            .map_or(1, |times| u32::try_from(times).unwrap_or(u32::MAX))
    }

    /// Resets entry `id`'s idle time, so that no other member claims it while it is retried.
    async fn keep_alive(&self, connection: &mut ConnectionManager, id: &str) {
        let claimed: Result<Value, _> = redis::cmd("XCLAIM")
            .arg(&self.key)
            .arg(&self.group)
            .arg(&self.name)
            .arg(0)
            .arg(id)
            .arg("JUSTID")
            .query_async(connection)
            .await;
        if let Err(error) = claimed {
            debug!(%error, "resetting an entry's idle time failed");
        }
    }

    /// Records the group's lag, where Redis says it (7.0 and later).
    async fn record_lag(&self, connection: &mut ConnectionManager) {
        let groups: Result<StreamInfoGroupsReply, _> = connection.xinfo_groups(&self.key).await;
        if let Some(lag) = groups.ok().and_then(|groups| {
            groups
                .groups
                .into_iter()
                .find(|group| group.name == self.group)
                .and_then(|group| group.lag)
        }) {
            self.consumer.record_lag(lag as u64);
        }
    }
}

/// An entry as the outbox consumer reads it: its fields but the payload as headers.
fn incoming(entry: StreamId, delivered: u32) -> Incoming {
    let mut payload = Vec::new();
    let mut headers = Vec::new();
    for (field, value) in entry.map {
        let bytes = match value {
            Value::BulkString(bytes) => bytes,
            Value::SimpleString(text) => text.into_bytes(),
            _ => continue,
        };
        if field == PAYLOAD_FIELD {
            payload = bytes;
        } else {
            headers.push((field, String::from_utf8_lossy(&bytes).into_owned()));
        }
    }
    let mut incoming = Incoming::new(payload, delivered);
    incoming.headers = headers;
    incoming
}
