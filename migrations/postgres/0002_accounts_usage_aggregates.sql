-- PostgreSQL's spelling of ../0002_accounts_usage_aggregates.sql: 64-bit integers and doubles
-- where SQLite's INTEGER and REAL hold them, identity columns for its row ids.
-- Per-job aggregates from Prometheus. Totals add up over the update windows; means are
-- time-weighted over aggregated_seconds. aggregates_until is where the next window starts, so
-- a run that failed is retried from there and nothing is counted twice.
ALTER TABLE units ADD COLUMN cpu_seconds DOUBLE PRECISION NOT NULL DEFAULT 0;
ALTER TABLE units ADD COLUMN cpu_energy_joules DOUBLE PRECISION NOT NULL DEFAULT 0;
ALTER TABLE units ADD COLUMN host_energy_joules DOUBLE PRECISION NOT NULL DEFAULT 0;
ALTER TABLE units ADD COLUMN gpu_energy_joules DOUBLE PRECISION NOT NULL DEFAULT 0;
ALTER TABLE units ADD COLUMN emissions_grams DOUBLE PRECISION NOT NULL DEFAULT 0;
ALTER TABLE units ADD COLUMN mean_memory_bytes DOUBLE PRECISION NOT NULL DEFAULT 0;
ALTER TABLE units ADD COLUMN mean_gpu_utilization DOUBLE PRECISION NOT NULL DEFAULT 0;
ALTER TABLE units ADD COLUMN io_read_bytes DOUBLE PRECISION NOT NULL DEFAULT 0;
ALTER TABLE units ADD COLUMN io_write_bytes DOUBLE PRECISION NOT NULL DEFAULT 0;
ALTER TABLE units ADD COLUMN aggregated_seconds BIGINT NOT NULL DEFAULT 0;
ALTER TABLE units ADD COLUMN aggregates_until BIGINT;
ALTER TABLE units ADD COLUMN aggregates_updated_at BIGINT;
-- pending, partial (running), done, too_short
ALTER TABLE units ADD COLUMN aggregates_status TEXT NOT NULL DEFAULT 'pending';


-- Users and projects (Slurm accounts) from `sacctmgr list associations`.
CREATE TABLE users (
    cluster_id TEXT NOT NULL,
    name TEXT NOT NULL,
    last_updated_at BIGINT NOT NULL,
    PRIMARY KEY (cluster_id, name)
);

CREATE TABLE projects (
    cluster_id TEXT NOT NULL,
    name TEXT NOT NULL,
    last_updated_at BIGINT NOT NULL,
    PRIMARY KEY (cluster_id, name)
);

CREATE TABLE associations (
    cluster_id TEXT NOT NULL,
    usr TEXT NOT NULL,
    project TEXT NOT NULL,
    PRIMARY KEY (cluster_id, usr, project)
);

-- Users who see every job: from the configuration, replaced at each start.
CREATE TABLE admin_users (
    name TEXT PRIMARY KEY,
    source TEXT NOT NULL
);

-- Usage per cluster, project and user over all stored jobs, rebuilt after each update.
CREATE TABLE usage (
    cluster_id TEXT NOT NULL,
    project TEXT NOT NULL,
    usr TEXT NOT NULL,
    num_units BIGINT NOT NULL,
    elapsed_seconds BIGINT NOT NULL,
    cpu_seconds DOUBLE PRECISION NOT NULL,
    alloc_cpu_seconds DOUBLE PRECISION NOT NULL,
    cpu_energy_joules DOUBLE PRECISION NOT NULL,
    host_energy_joules DOUBLE PRECISION NOT NULL,
    gpu_energy_joules DOUBLE PRECISION NOT NULL,
    emissions_grams DOUBLE PRECISION NOT NULL,
    io_read_bytes DOUBLE PRECISION NOT NULL,
    io_write_bytes DOUBLE PRECISION NOT NULL,
    last_updated_at BIGINT NOT NULL,
    PRIMARY KEY (cluster_id, project, usr)
);

-- The API's per-user listing: jobs that ended after `from`, and those still running. It
-- replaces the index by cluster and user: fewer indexes keep ingestion fast.
CREATE INDEX units_by_user_end ON units (usr, ended_at);
DROP INDEX units_by_user;
-- No query starts with the cluster and the project; the index only slowed ingestion.
DROP INDEX units_by_project;
