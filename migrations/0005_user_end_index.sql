-- The API's per-user window, `coalesce(ended_at, max) >= from`, searched as one range: with
-- the plain column, a running job's NULL end forced an OR that read every job of the user.
DROP INDEX units_by_user_end;
CREATE INDEX units_by_user_end ON units (usr, coalesce(ended_at, 9223372036854775807));
