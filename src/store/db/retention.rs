//! Keeping the database sound and small: retention, backups and integrity checks.

use std::path::Path;

use super::{Store, StoreError};
use crate::store::sql::{Backend, Sql};

impl Store {
    /// Deletes jobs that ended before `before`. Returns how many.
    pub async fn delete_ended_before(&self, before: i64) -> Result<u64, StoreError> {
        let n = self
            .execute(
                &Sql::new("DELETE FROM units WHERE ended_at IS NOT NULL AND ended_at < $1")
                    .arg(before),
            )
            .await?;
        self.written();
        Ok(n)
    }

    /// Writes a consistent copy of the database to `path` (`VACUUM INTO`) while it stays in use.
    pub async fn backup_to(&self, path: &Path) -> Result<(), StoreError> {
        if self.backend() != Backend::Sqlite {
            return Err(StoreError::SqliteOnly("a backup by the stats-server"));
        }
        self.execute(&Sql::new("VACUUM INTO $1").arg(path.display().to_string()))
            .await?;
        Ok(())
    }

    /// `PRAGMA integrity_check`: "ok" for a sound file.
    pub async fn integrity_check(&self) -> Result<String, StoreError> {
        if self.backend() != Backend::Sqlite {
            return Err(StoreError::SqliteOnly("an integrity check"));
        }
        Ok(self
            .fetch_one(&Sql::new("PRAGMA integrity_check"))
            .await?
            .get(0)?)
    }

    /// A trivial query: the database answers.
    pub async fn integrity_ping(&self) -> Result<(), StoreError> {
        self.fetch_one(&Sql::new("SELECT 1")).await?;
        Ok(())
    }
}

/// Name of a backup taken at `now`; they sort by time.
pub fn backup_name(now: i64) -> String {
    format!("ceems-{now:012}.db")
}

/// Deletes all but the newest `keep` backups in `dir`. Returns the deleted paths.
pub fn prune_backups(dir: &Path, keep: usize) -> std::io::Result<Vec<std::path::PathBuf>> {
    let mut found: Vec<std::path::PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("ceems-") && n.ends_with(".db"))
        })
        .collect();
    found.sort();
    let excess = found.len().saturating_sub(keep);
    let old: Vec<_> = found.drain(..excess).collect();
    for p in &old {
        std::fs::remove_file(p)?;
    }
    Ok(old)
}
