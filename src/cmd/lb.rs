//! `ceems lb`: lets users query the Prometheus-API stores for their own jobs only (:9030).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::{ArgMatches, Command};
use serde::Deserialize;

use crate::config::{self, Kind, LogConfig, Opt};
use crate::lb::access::Access;
use crate::lb::backend::{Pool, StoreAccess, StoreSpec, Strategy};
use crate::lb::owners::{ApiOwners, Owners};
use crate::lb::{Api, Lb};
use crate::store::db::{self, Readers, Store};
use crate::web;

pub fn opts() -> Vec<Opt> {
    let mut opts = web::server_opts(":9030");
    opts.extend(web::munge_opts());
    // As CEEMS's lb: a second address when Pyroscope is relayed too.
    if let Some(listen) = opts.iter_mut().find(|o| o.key == "web.listen-address") {
        *listen = Opt::new(
            "web.listen-address",
            Kind::List,
            "Address to listen on, host:port or :port (repeatable): the first serves the Prometheus API, the second Pyroscope's; with only Pyroscope stores, the first serves it",
        )
        .default(":9030,:9040");
    }
    opts.extend([
        Opt::new(
            "web.max-requests",
            Kind::Int,
            "Queries relayed at once; more get 503 (0: no limit)",
        )
        .default("256"),
        Opt::new(
            "web.admin-users",
            Kind::List,
            "User whose queries are relayed unchecked (repeatable); the stats-server's admins, read from its database, are admins here too",
        )
        .default(""),
        web::user_header_opt(),
        Opt::new(
            "lb.backend",
            Kind::List,
            "Prometheus-API store of a cluster, as CLUSTER=http://host:port[/path] (repeatable; several per cluster share its queries)",
        )
        .key("lb.backends"),
        Opt::new(
            "lb.filter-label",
            Kind::List,
            "Label removed from every answer of a cluster's stores, as CLUSTER=LABEL (repeatable; CEEMS's filter_labels)",
        )
        .key("lb.filter-labels"),
        Opt::new(
            "lb.stores",
            Kind::FileOnly,
            "Stores reached with credentials, TLS or headers: [[lb.stores]] with cluster, url, basic-auth-user, basic-auth-password or basic-auth-password-file, bearer-token or bearer-token-file, ca-file, cert-file, key-file, insecure-skip-verify, headers (CEEMS's tsdb web settings)",
        ),
        Opt::new(
            "lb.pyroscope-backend",
            Kind::List,
            "Pyroscope server of a cluster, as CLUSTER=http://host:4040 (repeatable; CEEMS's pyroscope backends), served on the second --web.listen-address",
        )
        .key("lb.pyroscope-backends"),
        Opt::new(
            "lb.pyroscope-stores",
            Kind::FileOnly,
            "Pyroscope servers reached with credentials, TLS or headers: [[lb.pyroscope-stores]] with the keys of [[lb.stores]]",
        ),
        Opt::new(
            "lb.strategy",
            Kind::Str,
            "How a cluster's next store is chosen: round-robin or least-connection",
        )
        .possible(&["round-robin", "least-connection"])
        .default("round-robin"),
        Opt::new(
            "lb.health-check-interval",
            Kind::Duration,
            "How often each store is checked to be reachable (a TCP connection, as CEEMS checks); one that is not is left out until it is",
        )
        .default("10s"),
        Opt::new(
            "lb.timeout",
            Kind::Duration,
            "Longest a store may take to answer one query; then the client gets 502",
        )
        .default("2m"),
        Opt::new(
            "lb.scrape-interval",
            Kind::Duration,
            "The stores' scrape interval: a user reads a job's series from its start to its end (as the stats-server's database says) widened by this much on each side, never beyond, since a job id comes back as another user's job once the ids wrap",
        )
        .default("30s"),
        Opt::flag(
            "lb.owner-only",
            "Only the user who ran a job (and admins) may read its series; without it, as CEEMS, the members of the job's project (Slurm account, Kubernetes namespace, ...) may too. Needs the database, not --lb.ceems-api-url",
        ),
        Opt::new(
            "lb.ceems-api-url",
            Kind::Str,
            "The stats-server's URL (CEEMS's ceems_api_server.web.url): who owns which job and who the admins are asked of its API instead of read from its database (empty: the database)",
        )
        .default(""),
        Opt::new(
            "lb.ceems-api-client",
            Kind::FileOnly,
            "How the stats-server's API of --lb.ceems-api-url is reached: [lb.lb.ceems-api-client] with a store's keys but cluster and url (credentials, TLS, headers; CEEMS's ceems_api_server.web)",
        ),
        Opt::new(
            "storage.data.path",
            Kind::Str,
            "Directory of the stats-server's SQLite database (ceems.db), read for who owns which job",
        )
        .default("/var/lib/ceems"),
        Opt::new(
            "storage.database-url",
            Kind::Str,
            "The stats-server's PostgreSQL database instead of SQLite (empty: SQLite)",
        )
        .default(""),
    ]);
    opts.extend(crate::security::opts());
    opts.extend(config::log_opts());
    opts.extend(config::runtime::opts("0"));
    opts
}

pub fn command() -> Command {
    config::build_command(
        Command::new("lb")
            .about("Let users query Prometheus for their own jobs only (:9030)")
            .long_about(
                "Let users query Prometheus for their own jobs only (:9030).\n\n\
                 Grafana's Prometheus datasource points here instead of at Prometheus. A query \
                 (/api/v1/query, query_range, series, labels, label values; GET or POST) is relayed \
                 only when every selector in it names its jobs with uuid=\"…\" or uuid=~\"a|b\" and \
                 every job named is the user's or one of their projects', as the stats-server's \
                 database says, and only for the time those jobs ran (job ids wrap); admins pass \
                 unchecked; every other path gets 403. Pyroscope servers (--lb.pyroscope-backend) \
                 are served alike on the second --web.listen-address: SelectMergeStacktraces, \
                 LabelNames and LabelValues whose selectors name the user's jobs with \
                 service_name=\"…\".",
            ),
        &opts(),
    )
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct LbSettings {
    #[serde(default)]
    backends: Vec<String>,
    #[serde(default)]
    filter_labels: Vec<String>,
    #[serde(default)]
    pyroscope_backends: Vec<String>,
    #[serde(default)]
    pyroscope_stores: Vec<StoreSettings>,
    strategy: Strategy,
    #[serde(deserialize_with = "config::de_duration")]
    health_check_interval: Duration,
    #[serde(deserialize_with = "config::de_duration")]
    timeout: Duration,
    #[serde(deserialize_with = "config::de_duration")]
    scrape_interval: Duration,
    #[serde(default)]
    owner_only: bool,
    #[serde(default)]
    ceems_api_url: String,
    /// Stores reached with credentials, TLS settings or headers (TOML only).
    #[serde(default)]
    stores: Vec<StoreSettings>,
    /// How the stats-server's API is reached: the keys of a store but its cluster and URL.
    #[serde(default)]
    ceems_api_client: Option<StoreSettings>,
}

/// One `[[lb.stores]]` entry: a store of a cluster and how it is reached (CEEMS's `web` of a
/// backend's `tsdb`). Paths are as written (CEEMS's YAML ones are made absolute from its
/// file's directory).
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct StoreSettings {
    #[serde(default)]
    cluster: String,
    #[serde(default)]
    url: String,
    #[serde(default)]
    basic_auth_user: String,
    #[serde(default)]
    basic_auth_password: String,
    #[serde(default)]
    basic_auth_password_file: Option<PathBuf>,
    #[serde(default)]
    bearer_token: String,
    #[serde(default)]
    bearer_token_file: Option<PathBuf>,
    #[serde(default)]
    ca_file: Option<PathBuf>,
    #[serde(default)]
    cert_file: Option<PathBuf>,
    #[serde(default)]
    key_file: Option<PathBuf>,
    #[serde(default)]
    insecure_skip_verify: bool,
    #[serde(default)]
    headers: BTreeMap<String, String>,
}

impl std::fmt::Debug for StoreSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreSettings")
            .field("cluster", &self.cluster)
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl StoreSettings {
    /// The store, its secrets and certificates read from their files.
    fn spec(&self) -> anyhow::Result<StoreSpec> {
        let at = || format!("lb.stores: {} of cluster {}", self.url, self.cluster);
        let read = |path: &Option<PathBuf>| -> anyhow::Result<Option<Vec<u8>>> {
            path.as_ref()
                .map(|p| std::fs::read(p).with_context(|| format!("{}: {}", at(), p.display())))
                .transpose()
        };
        let text = |path: &Option<PathBuf>, inline: &str| -> anyhow::Result<Option<String>> {
            Ok(match read(path)? {
                Some(bytes) => Some(String::from_utf8_lossy(&bytes).trim().to_owned()),
                None => (!inline.is_empty()).then(|| inline.to_owned()),
            })
        };
        let password = text(&self.basic_auth_password_file, &self.basic_auth_password)?;
        let basic_auth = match (self.basic_auth_user.is_empty(), password) {
            (true, None) => None,
            (false, password) => Some((self.basic_auth_user.clone(), password.unwrap_or_default())),
            (true, Some(_)) => anyhow::bail!("{}: a basic-auth password without a user", at()),
        };
        let bearer_token = text(&self.bearer_token_file, &self.bearer_token)?;
        anyhow::ensure!(
            basic_auth.is_none() || bearer_token.is_none(),
            "{}: basic auth and a bearer token are one or the other",
            at()
        );
        let identity = match (read(&self.cert_file)?, read(&self.key_file)?) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            _ => anyhow::bail!("{}: cert-file and key-file go together", at()),
        };
        Ok(StoreSpec {
            url: self.url.clone(),
            access: StoreAccess {
                basic_auth,
                bearer_token,
                headers: self.headers.clone().into_iter().collect(),
                tls: crate::web::client::ClientTls {
                    roots_pem: read(&self.ca_file)?.unwrap_or_default(),
                    identity_pem: identity,
                    insecure_skip_verify: self.insecure_skip_verify,
                },
            },
        })
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct StorageSettings {
    data: DataSettings,
    database_url: String,
}

#[derive(Debug, Deserialize)]
struct DataSettings {
    path: PathBuf,
}

/// `CLUSTER=VALUE` entries of `flag`, grouped by cluster.
fn group_by_cluster(
    flag: &str,
    entries: &[String],
) -> anyhow::Result<BTreeMap<String, Vec<String>>> {
    let mut by_cluster: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for e in entries.iter().map(|e| e.trim()).filter(|e| !e.is_empty()) {
        let (cluster, url) = e
            .split_once('=')
            .filter(|(c, u)| !c.trim().is_empty() && !u.trim().is_empty())
            .with_context(|| format!("--{flag} `{e}`: expected CLUSTER=…"))?;
        by_cluster
            .entry(cluster.trim().to_owned())
            .or_default()
            .push(url.trim().to_owned());
    }
    Ok(by_cluster)
}

/// `CLUSTER=URL` entries of `flag` and the stores of `table`, grouped by cluster.
fn backends(
    flag: &str,
    entries: &[String],
    table: &str,
    stores: &[StoreSettings],
) -> anyhow::Result<BTreeMap<String, Vec<StoreSpec>>> {
    let mut by_cluster: BTreeMap<String, Vec<StoreSpec>> = group_by_cluster(flag, entries)?
        .into_iter()
        .map(|(c, urls)| (c, urls.iter().map(|u| StoreSpec::plain(u)).collect()))
        .collect();
    for s in stores {
        anyhow::ensure!(
            !s.cluster.trim().is_empty() && !s.url.trim().is_empty(),
            "{table}: each needs a cluster and a url ({s:?})"
        );
        by_cluster
            .entry(s.cluster.trim().to_owned())
            .or_default()
            .push(s.spec()?);
    }
    Ok(by_cluster)
}

/// The addresses of the frontends: Prometheus's first, then Pyroscope's, of those relayed.
fn frontends(
    listen: &[String],
    prometheus: bool,
    pyroscope: bool,
) -> anyhow::Result<Vec<(Api, String)>> {
    let apis: Vec<Api> = [(Api::Prometheus, prometheus), (Api::Pyroscope, pyroscope)]
        .into_iter()
        .filter(|(_, relayed)| *relayed)
        .map(|(api, _)| api)
        .collect();
    anyhow::ensure!(
        !apis.is_empty(),
        "no store to relay to: add --lb.backend=CLUSTER=http://prometheus:9090 (repeatable; `backends` in [lb.lb] of the config file) or --lb.pyroscope-backend=CLUSTER=http://pyroscope:4040"
    );
    let listen: Vec<&String> = listen.iter().filter(|a| !a.trim().is_empty()).collect();
    anyhow::ensure!(
        listen.len() >= apis.len(),
        "Prometheus and Pyroscope stores are both relayed, each on its own address: give --web.listen-address twice (the Prometheus API's, then Pyroscope's)"
    );
    Ok(apis
        .into_iter()
        .zip(listen)
        .map(|(api, a)| (api, a.trim().to_owned()))
        .collect())
}

pub fn run(matches: &ArgMatches) -> anyhow::Result<ExitCode> {
    let settings = config::load("lb", &opts(), matches)?;
    let log: LogConfig = settings.get("log")?;
    crate::log::init(&log)?;
    settings.log_deprecated();
    let listen: Vec<String> = settings.get("web.listen-address")?;
    let max_requests: i64 = settings.get("web.max-requests")?;
    let admins: Vec<String> = settings.get("web.admin-users")?;
    let user_header: String = settings.get("web.user-header-name")?;
    let user_header = hyper::header::HeaderName::from_bytes(user_header.as_bytes())
        .with_context(|| format!("--web.user-header-name `{user_header}` is not a header name"))?;
    let lb: LbSettings = settings.get("lb")?;
    let storage: StorageSettings = settings.get("storage")?;
    let prometheus_stores = backends("lb.backend", &lb.backends, "lb.stores", &lb.stores)?;
    let pyroscope_stores = backends(
        "lb.pyroscope-backend",
        &lb.pyroscope_backends,
        "lb.pyroscope-stores",
        &lb.pyroscope_stores,
    )?;
    let frontends = frontends(
        &listen,
        !prometheus_stores.is_empty(),
        !pyroscope_stores.is_empty(),
    )?;
    let mut filters = group_by_cluster("lb.filter-label", &lb.filter_labels)?;
    if let Some(unknown) = filters.keys().find(|c| !prometheus_stores.contains_key(*c)) {
        anyhow::bail!("--lb.filter-label names cluster {unknown}, which has no --lb.backend");
    }
    let database_url = storage.database_url.trim().to_owned();
    let db_url = if database_url.is_empty() {
        storage.data.path.join("ceems.db").display().to_string()
    } else {
        anyhow::ensure!(
            db::is_postgres_url(&database_url),
            "--storage.database-url `{database_url}`: expected postgres://… (empty: SQLite in --storage.data.path)"
        );
        database_url
    };
    let listeners = frontends
        .iter()
        .map(|(api, address)| Ok((*api, address.clone(), web::bind_std(address)?)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let security: crate::security::SecuritySettings = settings.get("security")?;
    crate::security::drop_privileges(&security, &[])
        .context("cannot drop privileges (--security.drop-privileges=false to run as started)")?
        .log("lb");
    let options = web::ServeOptions::new(usize::try_from(max_requests).unwrap_or(0))
        .with_security(web::toolkit::WebSecurity::from_settings(&settings)?)
        .with_munge(web::munge_auth(&settings, &user_header)?);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(config::runtime::worker_threads(&settings)?)
        .thread_name("ceems-lb")
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let api_url = lb.ceems_api_url.trim().to_owned();
    runtime.block_on(async move {
        let readers = match lb.owner_only {
            true => Readers::Owner,
            false => Readers::OwnerAndProjects,
        };
        let owners = match api_url.is_empty() {
            true => Owners::Database(
                Arc::new(Store::open_read_only(&db_url).await.with_context(|| {
                    format!("cannot open the stats-server's database {db_url}")
                })?),
                readers,
            ),
            false => {
                // The API's /units/verify lets a project's members through, as CEEMS's does.
                anyhow::ensure!(
                    !lb.owner_only,
                    "--lb.owner-only needs ownership read from the database: the stats-server's /units/verify (--lb.ceems-api-url) lets a project's members read its jobs"
                );
                anyhow::ensure!(
                    api_url.starts_with("http://") || api_url.starts_with("https://"),
                    "--lb.ceems-api-url `{api_url}`: expected http(s)://host:port"
                );
                tracing::info!(url = %api_url, "ownership and admins asked of the stats-server's API");
                let access = match &lb.ceems_api_client {
                    Some(c) => {
                        anyhow::ensure!(
                            c.cluster.is_empty() && c.url.is_empty(),
                            "lb.ceems-api-client takes no cluster or url: the URL is --lb.ceems-api-url"
                        );
                        c.spec()?.access
                    }
                    None => StoreAccess::default(),
                };
                Owners::Api(ApiOwners::new(&api_url, user_header.as_str(), lb.timeout, &access)?)
            }
        };
        let admins: BTreeSet<String> = admins.into_iter().filter(|a| !a.is_empty()).collect();
        let access = Arc::new(Access::new(
            owners,
            user_header,
            admins,
            lb.scrape_interval,
        ));
        let served: Vec<String> = prometheus_stores
            .keys()
            .chain(pyroscope_stores.keys())
            .cloned()
            .collect::<BTreeSet<String>>()
            .into_iter()
            .collect();
        tokio::spawn({
            let access = Arc::clone(&access);
            async move { access.warn_unknown_clusters(&served).await }
        });
        let mut servers = Vec::new();
        for (api, address, listener) in listeners {
            let stores = match api {
                Api::Prometheus => &prometheus_stores,
                Api::Pyroscope => &pyroscope_stores,
            };
            let mut pools = BTreeMap::new();
            for (cluster, stores) in stores {
                let mut pool = Pool::of_stores(cluster, stores, lb.strategy, lb.timeout)
                    .with_context(|| format!("the {api:?} stores of cluster {cluster}"))?;
                if api == Api::Prometheus {
                    pool = pool.with_filter_labels(filters.remove(cluster).unwrap_or_default());
                }
                let pool = Arc::new(pool);
                pool.spawn_health_checks(lb.health_check_interval);
                pools.insert(cluster.clone(), pool);
            }
            let clusters: Vec<String> = pools.keys().cloned().collect();
            let frontend = Arc::new(Lb::new(api, pools, Arc::clone(&access)));
            let listener = web::into_async(listener)
                .with_context(|| format!("cannot listen on {address}"))?;
            tracing::info!(%address, api = ?api, ?clusters, "lb listening");
            let handler: web::Handler = Arc::new(move |req| {
                let frontend = Arc::clone(&frontend);
                Box::pin(frontend.handle(req))
            });
            servers.push(web::serve(
                listener,
                options.clone(),
                handler,
                web::shutdown_signal(),
            ));
        }
        futures_util::future::join_all(servers).await;
        Ok::<_, anyhow::Error>(())
    })?;
    Ok(ExitCode::SUCCESS)
}

/// Whether this process, privileges dropped as the daemon drops them, can read the database
/// and its WAL files (`check-privileges lb`).
pub fn test_database_readable(db: &std::path::Path) -> crate::security::check::OperationTest {
    use crate::security::check::{OperationTest, TestOutcome};
    let wal = |suffix: &str| PathBuf::from(format!("{}{suffix}", db.display()));
    let unreadable = [db.to_owned(), wal("-wal"), wal("-shm")]
        .into_iter()
        .filter(|p| p == db || p.exists())
        .find_map(|p| std::fs::File::open(&p).err().map(|e| (p, e)));
    let operation = format!("read {}", db.display());
    match unreadable {
        None => OperationTest {
            operation,
            outcome: TestOutcome::Ok,
            error: None,
        },
        Some((path, e)) => OperationTest {
            operation,
            outcome: if e.kind() == std::io::ErrorKind::PermissionDenied {
                TestOutcome::Denied
            } else {
                TestOutcome::Error
            },
            error: Some(format!(
                "{}: {e}; the user lb runs as needs read access to the stats-server's database and its -wal and -shm files (the same user, or its group with mode 0640)",
                path.display()
            )),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backends_group_by_cluster() {
        let b = backends(
            "lb.backend",
            &[
                "a=http://p1:9090".into(),
                "a=http://p2:9090".into(),
                " b = http://vm:8428/prometheus ".into(),
            ],
            "lb.stores",
            &[],
        )
        .unwrap();
        let urls = |c: &str| b[c].iter().map(|s| s.url.as_str()).collect::<Vec<_>>();
        assert_eq!(urls("a"), ["http://p1:9090", "http://p2:9090"]);
        assert_eq!(urls("b"), ["http://vm:8428/prometheus"]);
        assert!(backends("lb.backend", &[], "lb.stores", &[])
            .unwrap()
            .is_empty());
        assert!(backends("lb.backend", &["http://p1:9090".into()], "lb.stores", &[]).is_err());
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("password");
        std::fs::write(&secret, "s3cret\n").unwrap();
        let store: StoreSettings = toml::from_str(&format!(
            "cluster = \"a\"\nurl = \"https://p3:9090\"\nbasic-auth-user = \"prometheus\"\nbasic-auth-password-file = \"{}\"\n",
            secret.display()
        ))
        .unwrap();
        let b = backends(
            "lb.backend",
            &["a=http://p1:9090".into()],
            "lb.stores",
            &[store],
        )
        .unwrap();
        assert_eq!(
            b["a"][1].access.basic_auth,
            Some(("prometheus".to_owned(), "s3cret".to_owned()))
        );
        let f = group_by_cluster("lb.filter-label", &["a=hostname".into()]).unwrap();
        assert_eq!(f["a"], ["hostname"]);
    }

    /// As CEEMS's lb: Prometheus on the first address, Pyroscope on the second, or on the
    /// first when it is the only one relayed.
    #[test]
    fn each_api_gets_its_address() {
        let two = [":9030".to_owned(), ":9040".to_owned()];
        let apis = |p, q| frontends(&two, p, q).unwrap();
        assert_eq!(
            apis(true, true),
            [
                (Api::Prometheus, ":9030".to_owned()),
                (Api::Pyroscope, ":9040".to_owned())
            ]
        );
        assert_eq!(apis(false, true), [(Api::Pyroscope, ":9030".to_owned())]);
        assert_eq!(apis(true, false), [(Api::Prometheus, ":9030".to_owned())]);
        let e = frontends(&two[..1], true, true).unwrap_err().to_string();
        assert!(e.contains("twice"), "{e}");
        assert!(frontends(&two, false, false).is_err());
    }
}
