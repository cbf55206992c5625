-- Materialized view over the streaming table: recomputed by every run.
CREATE MATERIALIZED VIEW key_counts AS
SELECT key, count(*) AS n, min(id) AS min_id, max(id) AS max_id
FROM raw_events
GROUP BY key
