-- PostgreSQL's spelling of ../0003_findings.sql: 64-bit integers and doubles
-- where SQLite's INTEGER and REAL hold them, identity columns for its row ids.
-- What efficiency findings need: the requested time limit, peak memory, out-of-memory events
-- and the highest GPU use (NULL: no series), and the findings themselves (a JSON array).
ALTER TABLE units ADD COLUMN time_limit_seconds BIGINT;
ALTER TABLE units ADD COLUMN memory_peak_bytes DOUBLE PRECISION;
ALTER TABLE units ADD COLUMN memory_fail_count DOUBLE PRECISION;
ALTER TABLE units ADD COLUMN gpu_utilization_max DOUBLE PRECISION;
ALTER TABLE units ADD COLUMN findings TEXT;
ALTER TABLE units ADD COLUMN findings_updated_at BIGINT;
