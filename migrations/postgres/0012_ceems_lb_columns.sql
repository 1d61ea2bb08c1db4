-- What CEEMS's `ceems_lb` reads of a database (the SQLite twin of this migration says why);
-- kept on PostgreSQL too so that both schemas stay one.
ALTER TABLE units ADD COLUMN resource_manager TEXT NOT NULL DEFAULT '';
UPDATE units SET resource_manager =
    coalesce((SELECT c.manager FROM clusters c WHERE c.id = units.cluster_id), '');
ALTER TABLE admin_users ADD COLUMN cluster_id TEXT NOT NULL DEFAULT 'all';
ALTER TABLE admin_users ADD COLUMN tags TEXT NOT NULL DEFAULT '[]';
UPDATE admin_users SET tags = json_build_array(source)::text;
ALTER TABLE projects ADD COLUMN users TEXT NOT NULL DEFAULT '[]';
UPDATE projects SET users = coalesce(
    (SELECT json_agg(a.usr ORDER BY a.usr)::text FROM associations a
        WHERE a.cluster_id = projects.cluster_id AND a.project = projects.name),
    '[]');
