-- Metadata carried from a message's writer to its handler: the producer's W3C trace context
-- (`traceparent`, `tracestate`) and entries of the caller's own, as a JSON object of strings.
-- NULL when there is none, which costs nothing. A nullable column without a default is added
-- without rewriting the table; binaries from before it write NULL and never read it.
ALTER TABLE outbox_messages ADD COLUMN metadata JSONB;

-- A dead letter keeps its message's metadata, and a replay writes it back.
ALTER TABLE outbox_dead_letters ADD COLUMN metadata JSONB;
