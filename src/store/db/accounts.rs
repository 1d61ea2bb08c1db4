//! Users, projects, their associations and the admins.

use std::collections::BTreeSet;

use super::{Schema, Store, StoreError};
use crate::manager::Associations;
use crate::store::sql::{Backend, Sql};

/// The user CEEMS's own tools (its load balancer, `cacct`) call the API as: an admin on
/// every CEEMS server, so on this one too.
pub const SERVICE_ACCOUNT: &str = "ceems-int-svc";

impl Store {
    /// Replaces the users, projects and associations of `cluster` in one transaction.
    pub async fn replace_associations(
        &self,
        cluster: &str,
        a: &Associations,
        now: i64,
    ) -> Result<(), StoreError> {
        let mut tx = self.write_tx().await?;
        for table in ["users", "projects", "associations"] {
            tx.execute(
                &Sql::new(&format!("DELETE FROM {table} WHERE cluster_id = $1")).arg(cluster),
            )
            .await?;
        }
        let uid = |ids: &std::collections::BTreeMap<String, String>, name: &str| {
            ids.get(name).cloned().unwrap_or_default()
        };
        for p in &a.projects {
            tx.execute(
                &Sql::new(
                    "INSERT INTO projects (cluster_id, name, uid, last_updated_at)
                     VALUES ($1, $2, $3, $4)",
                )
                .arg(cluster)
                .arg(p)
                .arg(uid(&a.project_uids, p))
                .arg(now),
            )
            .await?;
        }
        for (user, project) in &a.members {
            tx.execute(
                &Sql::new(
                    "INSERT INTO users (cluster_id, name, uid, last_updated_at)
                     VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
                )
                .arg(cluster)
                .arg(user)
                .arg(uid(&a.user_uids, user))
                .arg(now),
            )
            .await?;
            tx.execute(
                &Sql::new(
                    "INSERT INTO associations (cluster_id, usr, project) VALUES ($1, $2, $3)
                     ON CONFLICT DO NOTHING",
                )
                .arg(cluster)
                .arg(user)
                .arg(project),
            )
            .await?;
        }
        // Each project's users as CEEMS keeps them, for CEEMS's load balancer.
        let users = match self.backend() {
            Backend::Sqlite => {
                "SELECT json_group_array(usr) FROM (SELECT a.usr FROM associations a
                 WHERE a.cluster_id = projects.cluster_id AND a.project = projects.name
                 ORDER BY a.usr)"
            }
            Backend::Postgres => {
                "SELECT json_agg(a.usr ORDER BY a.usr)::text FROM associations a
                 WHERE a.cluster_id = projects.cluster_id AND a.project = projects.name"
            }
        };
        tx.execute(
            &Sql::new(&format!(
                "UPDATE projects SET users = coalesce(({users}), '[]') WHERE cluster_id = $1"
            ))
            .arg(cluster),
        )
        .await?;
        tx.commit().await?;
        self.written();
        Ok(())
    }

    /// Replaces the admin users that came from `source` (the configuration).
    pub async fn set_admins(&self, source: &str, names: &[String]) -> Result<(), StoreError> {
        let mut tx = self.write_tx().await?;
        tx.execute(&Sql::new("DELETE FROM admin_users WHERE source = $1").arg(source))
            .await?;
        for n in names {
            tx.execute(
                &Sql::new(
                    "INSERT INTO admin_users (name, source, tags) VALUES ($1, $2, $3)
                     ON CONFLICT DO NOTHING",
                )
                .arg(n)
                .arg(source)
                // CEEMS's tags of an admin: where it came from.
                .arg(serde_json::json!([source]).to_string()),
            )
            .await?;
        }
        tx.commit().await?;
        self.written();
        Ok(())
    }

    /// `(…)`: whether a unit of `cluster` is `user`'s to read: they ran it, or, with
    /// [`Readers::OwnerAndProjects`], it is a project's they are a member of (as CEEMS's load
    /// balancer decides; in CEEMS's schema, the projects whose users list them).
    fn push_readable_by(&self, q: &mut Sql, cluster: &str, user: &str, readers: Readers) {
        let owner = match self.schema {
            Schema::Ours => "usr",
            Schema::Ceems => "username",
        };
        q.push("(").push(owner).push(" = ").bind(user);
        if readers == Readers::Owner {
            q.push(")");
            return;
        }
        match self.schema {
            Schema::Ours => {
                q.push(" OR project IN (SELECT project FROM associations WHERE cluster_id = ")
                    .bind(cluster)
                    .push(" AND usr = ")
                    .bind(user)
                    .push("))");
            }
            Schema::Ceems => {
                q.push(" OR project IN (SELECT name FROM projects WHERE cluster_id = ")
                    .bind(cluster)
                    .push(" AND EXISTS (SELECT 1 FROM json_each(users) WHERE value = ")
                    .bind(user)
                    .push(")))");
            }
        }
    }

    /// Of `uuids` on `cluster`, those `user` may read: units they ran, and units of the
    /// projects they are a member of.
    pub async fn units_readable_by(
        &self,
        cluster: &str,
        user: &str,
        uuids: &[String],
    ) -> Result<BTreeSet<String>, StoreError> {
        if uuids.is_empty() {
            return Ok(BTreeSet::new());
        }
        let mut q = Sql::new("SELECT DISTINCT uuid FROM units WHERE cluster_id = ");
        q.bind(cluster).push(" AND ");
        self.push_readable_by(&mut q, cluster, user, Readers::OwnerAndProjects);
        q.push_in("uuid", uuids);
        let mut readable = BTreeSet::new();
        for row in self.fetch_all(&q).await? {
            readable.insert(row.get::<String>(0)?);
        }
        Ok(readable)
    }

    /// Every unit on `cluster` that holds one of `uuids` (a job id comes back after its
    /// manager's ids wrap): when it ran (seconds; a pending one has no start) and whether
    /// `user` may read it, as `readers` says.
    pub async fn unit_tenures(
        &self,
        cluster: &str,
        user: &str,
        uuids: &[String],
        readers: Readers,
    ) -> Result<Vec<Tenure>, StoreError> {
        if uuids.is_empty() {
            return Ok(Vec::new());
        }
        let mut q = Sql::new(match self.schema {
            Schema::Ours => "SELECT uuid, started_at, ended_at, ",
            // CEEMS's times are milliseconds; a running unit ends at 0.
            Schema::Ceems => "SELECT uuid, started_at_ts / 1000, NULLIF(ended_at_ts, 0) / 1000, ",
        });
        self.push_readable_by(&mut q, cluster, user, readers);
        q.push(" FROM units WHERE cluster_id = ").bind(cluster);
        q.push_in("uuid", uuids);
        let mut tenures = Vec::new();
        for row in self.fetch_all(&q).await? {
            let start: Option<i64> = row.get(1)?;
            tenures.push(Tenure {
                uuid: row.get(0)?,
                start: start.filter(|s| *s > 0),
                end: row.get::<Option<i64>>(2)?.filter(|e| *e > 0),
                theirs: row.get::<bool>(3)?,
            });
        }
        Ok(tenures)
    }

    /// The clusters the database holds units of (ours and CEEMS's schema alike).
    pub async fn unit_cluster_ids(&self) -> Result<Vec<String>, StoreError> {
        let rows = self
            .fetch_all(&Sql::new(
                "SELECT DISTINCT cluster_id FROM units ORDER BY cluster_id",
            ))
            .await?;
        rows.iter()
            .map(|r| r.get::<String>(0).map_err(StoreError::from))
            .collect()
    }

    /// The configured admins, and CEEMS's service account, which is always one.
    pub async fn is_admin(&self, name: &str) -> Result<bool, StoreError> {
        if name == SERVICE_ACCOUNT {
            return Ok(true);
        }
        let q = Sql::new("SELECT 1 FROM admin_users WHERE name = $1").arg(name);
        Ok(self.fetch_optional(&q).await?.is_some())
    }
}

/// Who may read a unit's series besides admins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readers {
    /// The user who ran it and the members of its project, as CEEMS decides.
    OwnerAndProjects,
    /// The user who ran it only.
    Owner,
}

/// One unit holding a job id: when it ran, and whether the asking user may read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenure {
    pub uuid: String,
    /// Seconds; none while pending.
    pub start: Option<i64>,
    /// Seconds; none while running.
    pub end: Option<i64>,
    pub theirs: bool,
}
