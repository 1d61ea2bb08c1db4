-- The series of CEEMS's updater queries (`updaters[].extra_config.queries` of its config
-- file): per job, and per usage group, a JSON object of series and their values
-- (`{"avg_cpu_usage": {"global": 21.2}, "total_io_read_stats": {"bytes": 1e6}}`), as CEEMS's
-- own database keeps them.
ALTER TABLE units ADD COLUMN series TEXT NOT NULL DEFAULT '{}';
ALTER TABLE usage ADD COLUMN series TEXT NOT NULL DEFAULT '{}';
