-- What CEEMS's `ceems_lb` reads when it opens the database file itself: each unit's manager
-- (`SELECT DISTINCT cluster_id, resource_manager FROM units`), the admins with CEEMS's
-- columns (`SELECT cluster_id, name, tags FROM admin_users`) and each project's users as a
-- JSON list (`... FROM projects WHERE EXISTS (SELECT 1 FROM json_each(users) ...)`).
ALTER TABLE units ADD COLUMN resource_manager TEXT NOT NULL DEFAULT '';
UPDATE units SET resource_manager =
    coalesce((SELECT c.manager FROM clusters c WHERE c.id = units.cluster_id), '');
ALTER TABLE admin_users ADD COLUMN cluster_id TEXT NOT NULL DEFAULT 'all';
ALTER TABLE admin_users ADD COLUMN tags TEXT NOT NULL DEFAULT '[]';
UPDATE admin_users SET tags = json_array(source);
ALTER TABLE projects ADD COLUMN users TEXT NOT NULL DEFAULT '[]';
UPDATE projects SET users = coalesce(
    (SELECT json_group_array(usr) FROM (SELECT a.usr FROM associations a
        WHERE a.cluster_id = projects.cluster_id AND a.project = projects.name ORDER BY a.usr)),
    '[]');
