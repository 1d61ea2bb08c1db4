-- Pending jobs (not started yet) are few: a small partial index finds the row a job had while
-- pending when it starts, without probing the whole unique index for every ingested job.
CREATE INDEX units_pending ON units (cluster_id, uuid) WHERE started_at = 0;
