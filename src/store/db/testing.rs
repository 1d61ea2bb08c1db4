//! Stores for tests, on the backend the environment asks for: SQLite in a test's directory,
//! or, with `CEEMS_TEST_STORE=postgres`, a schema of its own in the database at
//! `CEEMS_TEST_POSTGRES_URL` (`scripts/postgres-lab.sh` prints one).

use std::path::Path;
use std::str::FromStr;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

use super::Store;

/// A new, empty store; `dir` holds the SQLite file.
pub async fn store(dir: &Path) -> Store {
    match std::env::var("CEEMS_TEST_STORE").as_deref() {
        Ok("postgres") => {
            let url = std::env::var("CEEMS_TEST_POSTGRES_URL")
                .expect("CEEMS_TEST_STORE=postgres needs CEEMS_TEST_POSTGRES_URL");
            postgres_schema(&url).await
        }
        _ => Store::open(&dir.join("ceems.db"))
            .await
            .expect("open the SQLite test store"),
    }
}

/// A store in a new schema of the PostgreSQL database at `url`.
pub async fn postgres_schema(url: &str) -> Store {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let schema = format!(
        "ceems_test_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    let opts = PgConnectOptions::from_str(url).expect("CEEMS_TEST_DATABASE_URL");
    let admin = PgPoolOptions::new()
        .max_connections(1)
        .connect_with(opts.clone())
        .await
        .expect("connect to the test database");
    static SWEPT: std::sync::Once = std::sync::Once::new();
    let mut sweep = false;
    SWEPT.call_once(|| sweep = true);
    if sweep {
        drop_schemas_of_finished_runs(&admin).await;
    }
    sqlx::query(&format!("CREATE SCHEMA {schema}"))
        .execute(&admin)
        .await
        .expect("create the test schema");
    admin.close().await;
    Store::connect_postgres_with(opts.options([("search_path", schema.as_str())]))
        .await
        .expect("open the PostgreSQL test store")
}

/// Drops the schemas that earlier test runs (processes no longer running) left: a run keeps
/// its own to the end, and hundreds of left tables would keep autovacuum busy.
async fn drop_schemas_of_finished_runs(admin: &PgPool) {
    let schemas: Vec<(String,)> = sqlx::query_as(
        "SELECT nspname::text FROM pg_namespace WHERE nspname LIKE 'ceems\\_test\\_%'",
    )
    .fetch_all(admin)
    .await
    .expect("list the test schemas");
    for (schema,) in schemas {
        let pid = schema.split('_').nth(2).and_then(|p| p.parse::<u32>().ok());
        let running = pid.is_some_and(|p| Path::new(&format!("/proc/{p}")).exists());
        if pid.is_some() && !running {
            sqlx::query(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
                .execute(admin)
                .await
                .expect("drop a finished run's test schema");
        }
    }
}
