-- Jobs (compute units) from Slurm accounting, one row per (cluster, job id, start time): job
-- ids wrap around, and a pending job (start 0) becomes a started one.
CREATE TABLE units (
    id INTEGER PRIMARY KEY,
    cluster_id TEXT NOT NULL,
    uuid TEXT NOT NULL,
    started_at INTEGER NOT NULL DEFAULT 0,
    name TEXT NOT NULL DEFAULT '',
    project TEXT NOT NULL DEFAULT '',
    grp TEXT NOT NULL DEFAULT '',
    gid INTEGER,
    usr TEXT NOT NULL DEFAULT '',
    uid INTEGER,
    partition TEXT NOT NULL DEFAULT '',
    qos TEXT NOT NULL DEFAULT '',
    submitted_at INTEGER,
    ended_at INTEGER,
    elapsed_seconds INTEGER NOT NULL DEFAULT 0,
    state TEXT NOT NULL DEFAULT '',
    exit_code TEXT NOT NULL DEFAULT '',
    alloc_cpus INTEGER NOT NULL DEFAULT 0,
    alloc_mem_bytes INTEGER NOT NULL DEFAULT 0,
    alloc_gpus INTEGER NOT NULL DEFAULT 0,
    billing INTEGER NOT NULL DEFAULT 0,
    nodes TEXT NOT NULL DEFAULT '',
    workdir TEXT NOT NULL DEFAULT '',
    last_updated_at INTEGER NOT NULL,
    UNIQUE (cluster_id, uuid, started_at)
);

CREATE INDEX units_by_user ON units (cluster_id, usr, started_at);
CREATE INDEX units_by_project ON units (cluster_id, project, started_at);

-- Where the next sacct window starts, per cluster.
CREATE TABLE ingest_state (
    cluster_id TEXT PRIMARY KEY,
    window_start INTEGER NOT NULL
);
