-- What CEEMS's usage answers need beyond the sums of 0002: the group, the allocated times
-- (CPU, memory in MiB, GPU × wall time, the wall time from start to end or to the last
-- update, as CEEMS counts it) and the time-weighted means of memory and GPU use.
-- The table is rebuilt from the jobs after every update; it is rebuilt here so that the
-- first answers after the upgrade already hold them.
ALTER TABLE usage ADD COLUMN grp TEXT NOT NULL DEFAULT '';
ALTER TABLE usage ADD COLUMN aggregated_seconds REAL NOT NULL DEFAULT 0;
ALTER TABLE usage ADD COLUMN wall_seconds REAL NOT NULL DEFAULT 0;
ALTER TABLE usage ADD COLUMN alloc_cpu_wall_seconds REAL NOT NULL DEFAULT 0;
ALTER TABLE usage ADD COLUMN alloc_mem_mib_wall_seconds REAL NOT NULL DEFAULT 0;
ALTER TABLE usage ADD COLUMN alloc_gpu_wall_seconds REAL NOT NULL DEFAULT 0;
ALTER TABLE usage ADD COLUMN gpu_wall_seconds REAL NOT NULL DEFAULT 0;
ALTER TABLE usage ADD COLUMN memory_byte_seconds REAL NOT NULL DEFAULT 0;
ALTER TABLE usage ADD COLUMN alloc_memory_byte_seconds REAL NOT NULL DEFAULT 0;
ALTER TABLE usage ADD COLUMN gpu_utilization_seconds REAL NOT NULL DEFAULT 0;
ALTER TABLE usage ADD COLUMN alloc_gpu_seconds REAL NOT NULL DEFAULT 0;

DELETE FROM usage;
INSERT INTO usage (cluster_id, project, usr, grp, num_units, elapsed_seconds, cpu_seconds,
    alloc_cpu_seconds, cpu_energy_joules, host_energy_joules, gpu_energy_joules,
    emissions_grams, io_read_bytes, io_write_bytes, aggregated_seconds, wall_seconds,
    alloc_cpu_wall_seconds,
    alloc_mem_mib_wall_seconds, alloc_gpu_wall_seconds, gpu_wall_seconds, memory_byte_seconds,
    alloc_memory_byte_seconds, gpu_utilization_seconds, alloc_gpu_seconds, last_updated_at)
SELECT cluster_id, project, usr, max(grp), count(*), sum(elapsed_seconds), sum(cpu_seconds),
    sum(1.0 * alloc_cpus * aggregated_seconds), sum(cpu_energy_joules), sum(host_energy_joules),
    sum(gpu_energy_joules), sum(emissions_grams), sum(io_read_bytes), sum(io_write_bytes),
    sum(aggregated_seconds), sum(CASE WHEN started_at > 0 THEN coalesce(ended_at, last_updated_at) - started_at ELSE 0 END),
    sum(1.0 * alloc_cpus * (CASE WHEN started_at > 0 THEN coalesce(ended_at, last_updated_at) - started_at ELSE 0 END)),
    sum(alloc_mem_bytes / 1048576.0 * (CASE WHEN started_at > 0 THEN coalesce(ended_at, last_updated_at) - started_at ELSE 0 END)),
    sum(1.0 * alloc_gpus * (CASE WHEN started_at > 0 THEN coalesce(ended_at, last_updated_at) - started_at ELSE 0 END)),
    sum(CASE WHEN alloc_gpus > 0 THEN CASE WHEN started_at > 0 THEN coalesce(ended_at, last_updated_at) - started_at ELSE 0 END ELSE 0 END),
    sum(mean_memory_bytes * aggregated_seconds), sum(1.0 * alloc_mem_bytes * aggregated_seconds),
    sum(mean_gpu_utilization * alloc_gpus * aggregated_seconds),
    sum(1.0 * alloc_gpus * aggregated_seconds), max(last_updated_at)
FROM units WHERE started_at > 0
GROUP BY cluster_id, project, usr;
