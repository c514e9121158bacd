//! What the commands show: a table for people, JSON for scripts (`--json`).

use std::io::Write;
use std::time::{Duration, SystemTime};

use comfy_table::{Table, presets};
use outbox_core::admin::{
    Catalog, DeadLetter, NextRetry, OutboxStatus, Pause, PauseTarget, RelayInfo, ShardInfo,
    ShardList,
};
use outbox_core::backfill::{BackfillPhase, BackfillState};
use outbox_core::inbox::StoredInboxDeadLetter;
use outbox_core::store::PendingMessage;
use outbox_core::{MessageId, ShardKey};
use serde::Serialize;
use serde_json::{Value, json};

use crate::CliError;

/// A cleanup horizon held for less than this is any transaction's: `outbox status` shows
/// the holder only from then (`--json` always does).
const HORIZON_WORTH_SAYING: Duration = Duration::from_secs(10);

/// Writes what the commands show, with the names the catalog knows.
#[derive(Debug)]
pub(crate) struct Printer<'a> {
    catalog: &'a Catalog,
    json: bool,
    now: SystemTime,
}

/// A time for JSON: RFC 3339, to the second.
fn rfc3339(at: Option<SystemTime>) -> Value {
    at.map_or(Value::Null, |at| {
        Value::String(humantime::format_rfc3339_seconds(at).to_string())
    })
}

fn table(header: &[&str]) -> Table {
    let mut table = Table::new();
    table
        .load_preset(presets::NOTHING)
        .set_header(header.to_vec());
    for column in table.column_iter_mut() {
        column.set_padding((0, 2));
    }
    table
}

/// A table's lines without the padding at their ends.
fn render(table: &Table) -> String {
    table
        .lines()
        .map(|line| line.trim_end().to_owned())
        .collect::<Vec<_>>()
        .join("\n")
}

/// A span of time in its two largest units, as people read it: `45s`, `3m 12s`, `2h 5m`,
/// `10d 0h`.
/// The relays at a glance: how many run, and how many stopped answering.
fn relays_summary(relays: &[RelayInfo]) -> String {
    let running = relays.iter().filter(|relay| relay.live).count();
    let silent = relays.len() - running;
    let mut summary = match running {
        0 => "none running: nothing is delivered".to_owned(),
        _ => format!("{running} running"),
    };
    if silent > 0 {
        summary.push_str(&format!(", {silent} stopped answering"));
    }
    summary
}

/// The breakers the running relays found open (the systems that do not answer them), and
/// how many shards wait on them; `None` if there is none.
fn breakers_summary(relays: &[RelayInfo]) -> Option<String> {
    let live = relays.iter().filter(|relay| relay.live);
    let breakers: std::collections::BTreeSet<&str> = live
        .clone()
        .flat_map(|relay| relay.open_breakers.iter().map(String::as_str))
        .collect();
    let waiting: u64 = live.map(|relay| relay.shards_waiting).sum();
    (!breakers.is_empty()).then(|| {
        let names: Vec<&str> = breakers.into_iter().collect();
        format!("{}: {waiting} shards waiting", names.join(", "))
    })
}

fn span(duration: Duration) -> String {
    let seconds = duration.as_secs();
    let (minutes, hours, days) = (seconds / 60, seconds / 3600, seconds / 86_400);
    if days > 0 {
        format!("{days}d {}h", hours % 24)
    } else if hours > 0 {
        format!("{hours}h {}m", minutes % 60)
    } else if minutes > 0 {
        format!("{minutes}m {}s", seconds % 60)
    } else {
        format!("{seconds}s")
    }
}

/// At most `chars` characters of `text` on one line.
fn clip(text: &str, chars: usize) -> String {
    let line = text.replace('\n', " ");
    if line.chars().count() <= chars {
        line
    } else {
        let mut clipped: String = line.chars().take(chars.saturating_sub(1)).collect();
        clipped.push('…');
        clipped
    }
}

impl<'a> Printer<'a> {
    pub(crate) fn new(catalog: &'a Catalog, json: bool) -> Self {
        Self {
            catalog,
            json,
            now: SystemTime::now(),
        }
    }

    /// How long before now `at` was, as people read it ("3m 12s ago"); "-" for none.
    fn ago(&self, at: Option<SystemTime>) -> String {
        at.map_or_else(
            || "-".to_owned(),
            |at| {
                format!(
                    "{} ago",
                    span(self.now.duration_since(at).unwrap_or_default())
                )
            },
        )
    }

    /// How long after now `at` is ("in 40s"), or "now" if it has passed; "-" for none.
    fn until(&self, at: Option<SystemTime>) -> String {
        at.map_or_else(
            || "-".to_owned(),
            |at| match at.duration_since(self.now) {
                Ok(wait) if wait.as_secs() > 0 => format!("in {}", span(wait)),
                _ => "now".to_owned(),
            },
        )
    }

    fn age_seconds(&self, at: Option<SystemTime>) -> Value {
        at.map_or(Value::Null, |at| {
            json!(self.now.duration_since(at).unwrap_or_default().as_secs())
        })
    }

    fn shard(&self, shard: &ShardKey) -> String {
        self.catalog.shard_text(shard)
    }

    fn category(&self, category: outbox_core::CategoryId) -> String {
        self.catalog.category_text(category)
    }

    /// What a pause target names, as people read it.
    pub(crate) fn target(&self, target: &PauseTarget) -> String {
        match target {
            PauseTarget::Shard(shard) => format!("shard {}", self.shard(shard)),
            PauseTarget::Category(category) => format!("category {}", self.category(*category)),
            PauseTarget::Scope(scope) => {
                format!("scope {}", self.catalog.scope_text(*scope))
            }
        }
    }

    fn emit(&self, out: &mut dyn Write, value: &impl Serialize) -> Result<(), CliError> {
        serde_json::to_writer_pretty(&mut *out, value).map_err(std::io::Error::from)?;
        writeln!(out)?;
        Ok(())
    }

    /// When a shard is next tried, as its status has it ([`ShardInfo::next_retry`]): a retry
    /// time only while it backs off ("now" for a failed shard that is due again, by its time
    /// or a newer message).
    fn next_retry(&self, info: &ShardInfo) -> String {
        match info.next_retry() {
            Some(NextRetry::At(at)) => self.until(Some(at)),
            Some(NextRetry::Now) => "now".to_owned(),
            None => "-".to_owned(),
        }
    }

    fn next_retry_at(info: &ShardInfo) -> Value {
        match info.next_retry() {
            Some(NextRetry::At(at)) => rfc3339(Some(at)),
            _ => Value::Null,
        }
    }

    fn shard_json(&self, info: &ShardInfo) -> Value {
        json!({
            "shard": self.shard(&info.shard),
            "scope": info.shard.scope.0,
            "identifier": info.shard.shard_identifier.to_string(),
            "destination": info.shard.destination.as_ref().map(outbox_core::Destination::as_str),
            "state": info.status.label(),
            "pending": info.pending,
            "pending_estimated": info.pending_estimated,
            "oldest_pending_at": rfc3339(info.oldest_pending_at),
            "oldest_pending_age_seconds": self.age_seconds(info.oldest_pending_at),
            "attempts": info.attempts,
            "next_retry_at": Self::next_retry_at(info),
            "last_error": info.last_error,
            "parked_category": info.parked_category.map(|category| self.category(category)),
            "lease_owner": info.lease_owner,
            "paused": info.paused,
        })
    }

    fn shard_table(&self, shards: &[ShardInfo]) -> Table {
        let mut table = table(&[
            "SHARD",
            "STATE",
            "PENDING",
            "OLDEST",
            "ATTEMPTS",
            "NEXT RETRY",
            "LAST ERROR",
        ]);
        for info in shards {
            table.add_row(vec![
                self.shard(&info.shard),
                info.status.label().to_owned(),
                if info.pending_estimated {
                    format!("~{}", info.pending)
                } else {
                    info.pending.to_string()
                },
                self.ago(info.oldest_pending_at),
                info.attempts.to_string(),
                self.next_retry(info),
                info.last_error
                    .as_deref()
                    .map_or_else(|| "-".to_owned(), |error| clip(error, 60)),
            ]);
        }
        table
    }

    pub(crate) fn status(
        &self,
        out: &mut dyn Write,
        status: &OutboxStatus,
        relays: &[RelayInfo],
        backfills: &[BackfillState],
    ) -> Result<(), CliError> {
        if self.json {
            return self.emit(
                out,
                &json!({
                    "pending_messages": status.pending_messages,
                    "oldest_pending_at": rfc3339(status.oldest_pending_at),
                    "oldest_pending_age_seconds": self.age_seconds(status.oldest_pending_at),
                    "shards": status.shards,
                    "shards_due": status.shards_due,
                    "shards_in_flight": status.shards_in_flight,
                    "shards_in_backoff": status.shards_in_backoff,
                    "shards_parked": status.shards_parked,
                    "shards_paused": status.shards_paused,
                    "dead_letters": status.dead_letters,
                    "oldest_dead_letter_at": rfc3339(status.oldest_dead_letter_at),
                    "horizon": status.horizon.as_ref().map(|horizon| json!({
                        "holder": horizon.holder,
                        "since": rfc3339(horizon.since),
                        "held_seconds": self.age_seconds(horizon.since),
                        "behind": horizon.behind,
                    })),
                    "deepest": status.deepest.iter().map(|info| self.shard_json(info)).collect::<Vec<_>>(),
                    "relays": relays.iter().map(|relay| self.relay_json(relay)).collect::<Vec<_>>(),
                    "backfills": backfills.iter().map(|state| self.backfill_json(state)).collect::<Vec<_>>(),
                }),
            );
        }
        writeln!(
            out,
            "pending messages  {} (oldest {})",
            status.pending_messages,
            self.ago(status.oldest_pending_at)
        )?;
        writeln!(
            out,
            "shards            {}: {} due, {} in flight, {} backing off, {} parked, {} paused",
            status.shards,
            status.shards_due,
            status.shards_in_flight,
            status.shards_in_backoff,
            status.shards_parked,
            status.shards_paused
        )?;
        writeln!(
            out,
            "dead letters      {} (oldest set aside {})",
            status.dead_letters,
            self.ago(status.oldest_dead_letter_at)
        )?;
        if let Some(horizon) = status.horizon.as_ref().filter(|horizon| {
            horizon
                .held_for(self.now)
                .is_none_or(|held| held >= HORIZON_WORTH_SAYING)
        }) {
            let behind = horizon
                .behind
                .map(|behind| format!(", {behind} behind"))
                .unwrap_or_default();
            writeln!(
                out,
                "cleanup horizon   held since {} by {}{behind}: rows deleted since then stay behind",
                self.ago(horizon.since),
                horizon.holder
            )?;
        }
        writeln!(out, "relays            {}", relays_summary(relays))?;
        if let Some(breakers) = breakers_summary(relays) {
            writeln!(out, "open breakers     {breakers}")?;
        }
        if !relays.is_empty() {
            writeln!(out, "\nrelays\n{}", render(&self.relay_table(relays)))?;
        }
        if !status.deepest.is_empty() {
            writeln!(
                out,
                "\ndeepest shards\n{}",
                render(&self.shard_table(&status.deepest))
            )?;
        }
        let started: Vec<&BackfillState> = backfills
            .iter()
            .filter(|state| state.phase() != BackfillPhase::NotStarted)
            .collect();
        if !started.is_empty() {
            writeln!(
                out,
                "\nbackfills\n{}",
                render(&self.backfill_table(&started))
            )?;
        }
        Ok(())
    }

    fn relay_json(&self, relay: &RelayInfo) -> Value {
        json!({
            "worker": relay.worker,
            "running": relay.live,
            "started_at": rfc3339(Some(relay.started_at)),
            "seen_at": rfc3339(Some(relay.seen_at)),
            "seen_age_seconds": self.age_seconds(Some(relay.seen_at)),
            "shards_in_flight": relay.shards_in_flight,
            "shards_waiting": relay.shards_waiting,
            "open_breakers": relay.open_breakers,
        })
    }

    fn relay_table(&self, relays: &[RelayInfo]) -> Table {
        let mut table = table(&[
            "WORKER",
            "STATE",
            "STARTED",
            "SEEN",
            "IN FLIGHT",
            "WAITING",
            "OPEN BREAKERS",
        ]);
        for relay in relays {
            let running = relay.live;
            table.add_row(vec![
                relay.worker.clone(),
                if running {
                    "running"
                } else {
                    "stopped answering"
                }
                .to_owned(),
                self.ago(Some(relay.started_at)),
                self.ago(Some(relay.seen_at)),
                relay.shards_in_flight.to_string(),
                relay.shards_waiting.to_string(),
                if relay.open_breakers.is_empty() {
                    "-".to_owned()
                } else {
                    relay.open_breakers.join(", ")
                },
            ]);
        }
        table
    }

    /// A model by its category: its name where known, else its number.
    pub(crate) fn model(&self, category: outbox_core::CategoryId) -> String {
        self.category(category)
    }

    fn backfill_json(&self, state: &BackfillState) -> Value {
        json!({
            "model": self.backfill_name(state),
            "category": state.category.0,
            "phase": state.phase().to_string(),
            "declared_version": state.declared_version,
            "target_version": state.target_version,
            "walking_version": state.walking_version,
            "done_version": state.done_version,
            "low_bound": state.low_bound.map(|key| key.to_string()),
            "rows_walked": state.rows_walked,
            "rows_per_second": state.rows_per_second(),
            "destinations": state.destinations.as_ref().map(|destinations| {
                destinations.iter().map(|d| d.as_str().to_owned()).collect::<Vec<_>>()
            }),
            "worker": state.worker,
            "started_at": rfc3339(state.started_at),
            "updated_at": rfc3339(state.updated_at),
            "completed_at": rfc3339(state.completed_at),
            "last_error": state.last_error,
        })
    }

    /// The model's name as the catalog knows it, or as the watermark recorded it.
    fn backfill_name(&self, state: &BackfillState) -> String {
        match self.catalog.category(state.category) {
            Some(_) => self.category(state.category),
            None if !state.model.is_empty() => state.model.clone(),
            None => self.category(state.category),
        }
    }

    fn backfill_table(&self, states: &[&BackfillState]) -> Table {
        let mut table = table(&[
            "MODEL",
            "PHASE",
            "TARGET",
            "DONE",
            "LOW BOUND",
            "ROWS",
            "RATE",
            "UPDATED",
            "LAST ERROR",
        ]);
        for state in states {
            let version = |version: u32| {
                if version == 0 {
                    "-".to_owned()
                } else {
                    version.to_string()
                }
            };
            table.add_row(vec![
                self.backfill_name(state),
                state.phase().to_string(),
                version(state.target_version),
                version(state.done_version),
                state
                    .low_bound
                    .map_or_else(|| "-".to_owned(), |key| key.to_string()),
                state.rows_walked.to_string(),
                state
                    .rows_per_second()
                    .map_or_else(|| "-".to_owned(), |rate| format!("{rate:.0}/s")),
                self.ago(state.updated_at),
                state
                    .last_error
                    .as_deref()
                    .map_or_else(|| "-".to_owned(), |error| clip(error, 60)),
            ]);
        }
        table
    }

    pub(crate) fn backfills(
        &self,
        out: &mut dyn Write,
        states: &[BackfillState],
    ) -> Result<(), CliError> {
        if self.json {
            let listed: Vec<Value> = states.iter().map(|s| self.backfill_json(s)).collect();
            return self.emit(out, &listed);
        }
        if states.is_empty() {
            writeln!(
                out,
                "no backfills: relays record each replicated model at their first tick"
            )?;
            return Ok(());
        }
        let all: Vec<&BackfillState> = states.iter().collect();
        writeln!(out, "{}", render(&self.backfill_table(&all)))?;
        Ok(())
    }

    pub(crate) fn backfill_started(
        &self,
        out: &mut dyn Write,
        state: &BackfillState,
    ) -> Result<(), CliError> {
        if self.json {
            return self.emit(out, &self.backfill_json(state));
        }
        let model = self.backfill_name(state);
        let what = match state.phase() {
            BackfillPhase::Done => format!(
                "the backfill of model {model} to version {} is done already",
                state.target_version
            ),
            BackfillPhase::WaitingForCode => format!(
                "started the backfill of model {model} to version {}: no relay's code declares \
                 that version yet (the highest recorded is {}); it starts when one does",
                state.target_version, state.declared_version
            ),
            _ => format!(
                "started the backfill of model {model} to version {}",
                state.target_version
            ),
        };
        writeln!(out, "{what}")?;
        Ok(())
    }

    pub(crate) fn shards(&self, out: &mut dyn Write, list: &ShardList) -> Result<(), CliError> {
        let shards = &list.shards;
        if self.json {
            let listed: Vec<Value> = shards.iter().map(|info| self.shard_json(info)).collect();
            return self.emit(out, &listed);
        }
        if shards.is_empty() {
            writeln!(out, "no shards")?;
        } else {
            writeln!(out, "{}", render(&self.shard_table(shards)))?;
        }
        if let Some(messages) = list.sampled {
            writeln!(
                out,
                "ranked from a sample of {messages} pending messages: the order is approximate, \
                 counts marked ~ are estimates, and a shard the sample missed is not listed"
            )?;
        }
        Ok(())
    }

    pub(crate) fn messages(
        &self,
        out: &mut dyn Write,
        shard: &ShardKey,
        info: Option<&ShardInfo>,
        messages: &[PendingMessage],
    ) -> Result<(), CliError> {
        let attempts = info.map_or(0, |info| info.attempts);
        let last_error = info.and_then(|info| info.last_error.clone());
        if self.json {
            let listed: Vec<Value> = messages
                .iter()
                .map(|message| {
                    json!({
                        "id": message.id.0,
                        "category": self.category(message.category),
                        "object": message.object_identifier.to_string(),
                        "created_at": rfc3339(Some(message.created_at)),
                        "payload": message.payload_value(),
                    })
                })
                .collect();
            return self.emit(
                out,
                &json!({
                    "shard": self.shard(shard),
                    "state": info.map(|info| info.status.label()),
                    "attempts": attempts,
                    "next_retry_at": info.map_or(Value::Null, Self::next_retry_at),
                    "last_error": last_error,
                    "messages": listed,
                }),
            );
        }
        writeln!(
            out,
            "shard {}: {}, {} attempt(s), next retry {}, last error: {}",
            self.shard(shard),
            info.map_or("no pending messages", |info| info.status.label()),
            attempts,
            info.map_or_else(|| "-".to_owned(), |info| self.next_retry(info)),
            last_error.as_deref().unwrap_or("-")
        )?;
        if messages.is_empty() {
            writeln!(out, "no pending messages")?;
            return Ok(());
        }
        let mut table = table(&["ID", "CATEGORY", "OBJECT", "WRITTEN", "PAYLOAD"]);
        for message in messages {
            table.add_row(vec![
                message.id.0.to_string(),
                self.category(message.category),
                message.object_identifier.to_string(),
                self.ago(Some(message.created_at)),
                clip(&message.payload, 60),
            ]);
        }
        writeln!(out, "{}", render(&table))?;
        Ok(())
    }

    /// A change made.
    pub(crate) fn done(&self, out: &mut dyn Write, what: &str) -> Result<(), CliError> {
        if self.json {
            return self.emit(out, &json!({ "done": what }));
        }
        writeln!(out, "{what}")?;
        Ok(())
    }

    /// A remark beside what a command did (tables only: JSON stays one document).
    pub(crate) fn note(&self, out: &mut dyn Write, note: &str) -> Result<(), CliError> {
        if !self.json {
            writeln!(out, "note: {note}")?;
        }
        Ok(())
    }

    /// A change that may have been made already.
    pub(crate) fn changed(
        &self,
        out: &mut dyn Write,
        changed: bool,
        done: &str,
        already: &str,
    ) -> Result<(), CliError> {
        if self.json {
            let what = if changed { done } else { already };
            return self.emit(out, &json!({ "changed": changed, "done": what }));
        }
        writeln!(out, "{}", if changed { done } else { already })?;
        Ok(())
    }

    pub(crate) fn pauses(&self, out: &mut dyn Write, pauses: &[Pause]) -> Result<(), CliError> {
        if self.json {
            let listed: Vec<Value> = pauses
                .iter()
                .map(|pause| {
                    json!({
                        "target": self.target(&pause.target),
                        "reason": pause.reason,
                        "paused_at": rfc3339(Some(pause.paused_at)),
                    })
                })
                .collect();
            return self.emit(out, &listed);
        }
        if pauses.is_empty() {
            writeln!(out, "nothing is paused")?;
            return Ok(());
        }
        let mut table = table(&["PAUSED", "SINCE", "REASON"]);
        for pause in pauses {
            table.add_row(vec![
                self.target(&pause.target),
                self.ago(Some(pause.paused_at)),
                pause.reason.clone().unwrap_or_else(|| "-".to_owned()),
            ]);
        }
        writeln!(out, "{}", render(&table))?;
        Ok(())
    }

    fn letter_json(&self, letter: &DeadLetter) -> Value {
        json!({
            "message_id": letter.message_id.0,
            "shard": self.shard(&letter.shard),
            "category": self.category(letter.category),
            "object": letter.object_identifier.to_string(),
            "attempts": letter.attempts,
            "error": letter.error,
            "created_at": rfc3339(Some(letter.created_at)),
            "first_failed_at": rfc3339(Some(letter.first_failed_at)),
            "dead_lettered_at": rfc3339(Some(letter.dead_lettered_at)),
            "lease_token": letter.lease_token,
            "payload": serde_json::from_str::<Value>(&letter.payload).unwrap_or(Value::Null),
        })
    }

    fn letter_table(&self, letters: &[DeadLetter]) -> Table {
        let mut table = table(&[
            "ID",
            "SHARD",
            "CATEGORY",
            "OBJECT",
            "ATTEMPTS",
            "SET ASIDE",
            "ERROR",
        ]);
        for letter in letters {
            table.add_row(vec![
                letter.message_id.0.to_string(),
                self.shard(&letter.shard),
                self.category(letter.category),
                letter.object_identifier.to_string(),
                letter.attempts.to_string(),
                self.ago(Some(letter.dead_lettered_at)),
                clip(&letter.error, 60),
            ]);
        }
        table
    }

    pub(crate) fn dead_letters(
        &self,
        out: &mut dyn Write,
        letters: &[DeadLetter],
    ) -> Result<(), CliError> {
        if self.json {
            let listed: Vec<Value> = letters
                .iter()
                .map(|letter| self.letter_json(letter))
                .collect();
            return self.emit(out, &listed);
        }
        if letters.is_empty() {
            writeln!(out, "no dead letters")?;
            return Ok(());
        }
        writeln!(out, "{}", render(&self.letter_table(letters)))?;
        Ok(())
    }

    pub(crate) fn inbox_dead_letters(
        &self,
        out: &mut dyn Write,
        letters: &[StoredInboxDeadLetter],
    ) -> Result<(), CliError> {
        if self.json {
            let listed: Vec<Value> = letters
                .iter()
                .map(|letter| {
                    json!({
                        "id": letter.id,
                        "consumer": letter.consumer,
                        "message_id": letter.message_id.map(|id| id.0),
                        "category": letter.category,
                        "attempts": letter.attempts,
                        "error": letter.error,
                        "failed_at": rfc3339(Some(letter.failed_at)),
                        "headers": serde_json::from_str::<Value>(&letter.headers)
                            .unwrap_or(Value::Null),
                        "payload": String::from_utf8_lossy(&letter.payload),
                    })
                })
                .collect();
            return self.emit(out, &listed);
        }
        if letters.is_empty() {
            writeln!(out, "no dead letters in the inbox")?;
            return Ok(());
        }
        let mut table = table(&[
            "ID", "CONSUMER", "MESSAGE", "CATEGORY", "ATTEMPTS", "FAILED", "ERROR",
        ]);
        for letter in letters {
            table.add_row(vec![
                letter.id.to_string(),
                letter.consumer.clone(),
                letter
                    .message_id
                    .map_or_else(|| "-".to_owned(), |id| id.0.to_string()),
                letter.category.clone().unwrap_or_else(|| "-".to_owned()),
                letter.attempts.to_string(),
                self.ago(Some(letter.failed_at)),
                clip(&letter.error, 60),
            ]);
        }
        writeln!(out, "{}", render(&table))?;
        Ok(())
    }

    pub(crate) fn set_aside(
        &self,
        out: &mut dyn Write,
        letter: &DeadLetter,
    ) -> Result<(), CliError> {
        if self.json {
            return self.emit(out, &self.letter_json(letter));
        }
        writeln!(
            out,
            "set aside message {} of shard {} as a dead letter: the shard goes on without it \
             (replay it with `outbox dead-letters replay --id {}`)",
            letter.message_id.0,
            self.shard(&letter.shard),
            letter.message_id.0
        )?;
        writeln!(
            out,
            "{}",
            render(&self.letter_table(std::slice::from_ref(letter)))
        )?;
        Ok(())
    }

    pub(crate) fn replayed(
        &self,
        out: &mut dyn Write,
        letters: &[DeadLetter],
        replayed: &[MessageId],
        dry_run: bool,
    ) -> Result<(), CliError> {
        if self.json {
            let listed: Vec<Value> = letters
                .iter()
                .map(|letter| self.letter_json(letter))
                .collect();
            let ids: Vec<i64> = replayed.iter().map(|id| id.0).collect();
            return self.emit(
                out,
                &json!({ "dry_run": dry_run, "dead_letters": listed, "replayed_as": ids }),
            );
        }
        if dry_run {
            writeln!(out, "would replay {} dead letter(s):", letters.len())?;
        } else {
            writeln!(
                out,
                "replayed {} dead letter(s) as messages {}",
                replayed.len(),
                replayed
                    .iter()
                    .map(|id| id.0.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )?;
        }
        if !letters.is_empty() {
            writeln!(out, "{}", render(&self.letter_table(letters)))?;
        }
        Ok(())
    }

    pub(crate) fn purged(
        &self,
        out: &mut dyn Write,
        letters: &[DeadLetter],
        purged: u64,
        dry_run: bool,
    ) -> Result<(), CliError> {
        if self.json {
            let listed: Vec<Value> = letters
                .iter()
                .map(|letter| self.letter_json(letter))
                .collect();
            return self.emit(
                out,
                &json!({ "dry_run": dry_run, "dead_letters": listed, "purged": purged }),
            );
        }
        if dry_run {
            writeln!(out, "would purge {} dead letter(s):", letters.len())?;
            if !letters.is_empty() {
                writeln!(out, "{}", render(&self.letter_table(letters)))?;
            }
        } else {
            writeln!(out, "purged {purged} dead letter(s)")?;
        }
        Ok(())
    }

    pub(crate) fn sql(&self, out: &mut dyn Write, sql: &str) -> Result<(), CliError> {
        if self.json {
            return self.emit(out, &json!({ "sql": sql }));
        }
        write!(out, "{sql}")?;
        Ok(())
    }

    pub(crate) fn migrated(
        &self,
        out: &mut dyn Write,
        migrated: &Migrated,
    ) -> Result<(), CliError> {
        if self.json {
            return self.emit(out, migrated);
        }
        let applied: Vec<i64> = migrated
            .after
            .iter()
            .filter(|version| !migrated.before.contains(version))
            .copied()
            .collect();
        if applied.is_empty() {
            writeln!(
                out,
                "up to date: migrations {:?} applied before",
                migrated.after
            )?;
        } else {
            writeln!(
                out,
                "applied migrations {applied:?}; the database has {:?}",
                migrated.after
            )?;
        }
        Ok(())
    }
}

/// What `outbox migrate` did.
#[derive(Debug, serde::Serialize)]
pub(crate) struct Migrated {
    /// The versions applied before.
    pub(crate) before: Vec<i64>,
    /// The versions applied after.
    pub(crate) after: Vec<i64>,
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use outbox_core::admin::{Catalog, Horizon, OutboxStatus};

    use super::{Printer, span};

    /// What `outbox status` says of a status whose horizon `since` ago.
    fn status_text(since: Duration, json: bool) -> String {
        let mut status = OutboxStatus::default();
        status.horizon = Some(Horizon::new(
            "session 4711 (nightly-report, idle in transaction)".to_owned(),
            Some(SystemTime::now() - since),
            Some(1_893_402),
        ));
        let catalog = Catalog::default();
        let printer = Printer::new(&catalog, json);
        let mut out = Vec::new();
        printer
            .status(&mut out, &status, &[], &[])
            .expect("the status");
        String::from_utf8(out).expect("text")
    }

    #[test]
    fn status_names_a_horizon_held_long_enough_to_matter() {
        let held = status_text(Duration::from_secs(192), false);
        assert!(
            held.contains(
                "cleanup horizon   held since 3m 12s ago by session 4711 (nightly-report, \
                 idle in transaction), 1893402 behind"
            ),
            "{held}"
        );
        // Any transaction holds it for a moment: not worth a line.
        let moment = status_text(Duration::from_secs(1), false);
        assert!(!moment.contains("cleanup horizon"), "{moment}");
        // Scripts always have it.
        let json: serde_json::Value =
            serde_json::from_str(&status_text(Duration::from_secs(1), true)).expect("json");
        assert_eq!(json["horizon"]["behind"], 1_893_402);
        assert_eq!(json["horizon"]["held_seconds"], 1);
        assert!(
            json["horizon"]["holder"]
                .as_str()
                .is_some_and(|holder| holder.starts_with("session 4711"))
        );
    }

    #[test]
    fn spans_read_in_their_two_largest_units() {
        for (seconds, shown) in [
            (0, "0s"),
            (45, "45s"),
            (192, "3m 12s"),
            (3_600, "1h 0m"),
            (7_500, "2h 5m"),
            (864_001, "10d 0h"),
            (90_061, "1d 1h"),
        ] {
            assert_eq!(span(Duration::from_secs(seconds)), shown);
        }
    }
}
