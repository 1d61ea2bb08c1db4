-- What efficiency findings need: the requested time limit, peak memory, out-of-memory events
-- and the highest GPU use (NULL: no series), and the findings themselves (a JSON array).
ALTER TABLE units ADD COLUMN time_limit_seconds INTEGER;
ALTER TABLE units ADD COLUMN memory_peak_bytes REAL;
ALTER TABLE units ADD COLUMN memory_fail_count REAL;
ALTER TABLE units ADD COLUMN gpu_utilization_max REAL;
ALTER TABLE units ADD COLUMN findings TEXT;
ALTER TABLE units ADD COLUMN findings_updated_at INTEGER;
