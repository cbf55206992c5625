-- Broken on purpose: no flow defines raw_events_missing.
CREATE MATERIALIZED VIEW key_counts AS
SELECT key, count(*) AS n FROM raw_events_missing GROUP BY key
