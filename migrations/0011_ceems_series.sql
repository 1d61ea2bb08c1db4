-- The series of CEEMS's updater queries (`updaters[].extra_config.queries` of its config
-- file): per job, and per usage group, a JSON object of series and their values
-- (`{"avg_cpu_usage": {"global": 21.2}, "total_io_read_stats": {"bytes": 1e6}}`), as CEEMS's
-- own database keeps them.
ALTER TABLE units ADD COLUMN series TEXT NOT NULL DEFAULT '{}';
-- What the manager said in its own words (`{"state": "CANCELLED by 1002", "elapsed":
-- "00:08:17", "nodelist": "compute-[0-2]"}`), which CEEMS answers with.
ALTER TABLE units ADD COLUMN reported TEXT NOT NULL DEFAULT '{}';
ALTER TABLE usage ADD COLUMN series TEXT NOT NULL DEFAULT '{}';
