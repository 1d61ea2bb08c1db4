//! `ceems stats-server`: jobs from Slurm's accounting into SQLite, their energy, emissions and
//! usage from Prometheus, and a JSON API for Grafana (:9020).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::{ArgMatches, Command};
use hyper::{Method, StatusCode};
use serde::Deserialize;

use crate::config::{self, Kind, Layered, LogConfig, Opt};
use crate::metrics::{Labels, MetricSet, TEXT_CONTENT_TYPE};
use crate::notify::outbox::Notifier;
use crate::notify::smtp::Delivery;
use crate::store::aggregate::{self, Limits, Queries};
use crate::store::api::Api;
use crate::store::api_yield::{ApiActivity, YieldTo};
use crate::store::db::{self, Store};
use crate::store::findings::Thresholds;
use crate::store::ingest::{self, Cluster};
use crate::store::prometheus::{HttpPrometheus, Prometheus, RangeQuery};
use crate::store::refresh::{JobRefresh, RefreshSource};
use crate::store::report::Reports;
use crate::web;

mod campaigns;
mod loops;
mod memory;
mod policies;
mod settings;
mod site_rules;
mod startup;

/// The longest a report waits for its job to be pulled and aggregated on demand.
const REFRESH_TIMEOUT: Duration = Duration::from_secs(30);

use loops::*;
use settings::*;
pub use settings::{cluster_entries, needed_capabilities};
pub use startup::test_data_dir;

pub fn opts() -> Vec<Opt> {
    let mut opts = web::server_opts(":9020");
    opts.extend(web::munge_opts());
    opts.extend([
        Opt::new(
            "web.admin-users",
            Kind::List,
            "User who sees every user's jobs and the /admin routes (repeatable)",
        )
        .default(""),
        web::user_header_opt(),
        Opt::new(
            "web.cors.origin",
            Kind::Str,
            "Regex of the origins a browser may call the API from (anchored at both ends)",
        )
        .default(".*"),
        Opt::new(
            "storage.data.path",
            Kind::Str,
            "Directory of the SQLite database (ceems.db)",
        )
        .default("/var/lib/ceems"),
        Opt::new(
            "storage.database-url",
            Kind::Str,
            "PostgreSQL database instead of SQLite (postgres://user@host:5432/db; the password from PGPASSWORD or ~/.pgpass; empty: SQLite)",
        )
        .default(""),
        Opt::new(
            "storage.data.time-zone",
            Kind::Str,
            "Time zone of the times the API writes as text (created_at, started_at, ended_at) when a request names none (timezone=), and of sacct's times printed without an offset; empty: this host's",
        )
        .default(""),
        Opt::flag(
            "storage.data.skip.delete.old.units",
            "Keep jobs past the retention period (CEEMS's test flag)",
        )
        .hidden(),
        Opt::flag(
            "test.disable.checks",
            "Accepted for CEEMS's e2e scripts; ceems has no checks to skip",
        )
        .hidden(),
    ]);
    opts.extend(retention_opts());
    opts.extend([
        Opt::new(
            "storage.update-interval",
            Kind::Duration,
            "How often jobs are pulled from sacct and their aggregates updated",
        )
        .default("15m"),
        Opt::new(
            "storage.first-window",
            Kind::Duration,
            "How far back the first pull of an empty database looks",
        )
        .default("1d"),
        Opt::new(
            "slurm.source",
            Kind::Str,
            "Where jobs, users and projects come from: sacct (sacct and sacctmgr) or slurmrestd",
        )
        .default("sacct"),
        Opt::new(
            "slurm.slurmrestd.url",
            Kind::Str,
            "slurmrestd with --slurm.source=slurmrestd: unix:/path/to/socket (rest_auth/local: slurmrestd must run as this server's user) or http(s)://host:port (with a JWT)",
        )
        .default(""),
        Opt::new(
            "slurm.slurmrestd.api-version",
            Kind::Str,
            "OpenAPI data version asked for: v0.0.38 (Slurm 22.05; its v0.0.36 and v0.0.37 give the eligible time as the start time)",
        )
        .default("v0.0.38"),
        Opt::new(
            "slurm.slurmrestd.token-file",
            Kind::Str,
            "File holding a JWT for slurmrestd (auth/jwt), read at each call (empty: none)",
        )
        .default(""),
        Opt::new(
            "slurm.slurmrestd.user",
            Kind::Str,
            "User the JWT was issued to (X-SLURM-USER-NAME)",
        )
        .default(""),
        Opt::new(
            "slurm.slurmrestd.timeout",
            Kind::Duration,
            "Give up on a slurmrestd answer after this long",
        )
        .default("5m"),
        Opt::new("slurm.sacct.path", Kind::Str, "sacct command").default("sacct"),
        Opt::new(
            "slurm.sacctmgr.path",
            Kind::Str,
            "sacctmgr command, for users and projects (empty: none)",
        )
        .default("sacctmgr"),
        Opt::new(
            "slurm.sacct.timeout",
            Kind::Duration,
            "Kill sacct or sacctmgr after this long",
        )
        .default("5m"),
        Opt::new(
            "slurm.run-as-user",
            Kind::Str,
            "Run sacct and sacctmgr as this user when CAP_SETUID/CAP_SETGID allow (else sudo -n, else natively; empty: natively)",
        )
        .default("slurm"),
        Opt::new(
            "slurm.cluster-id",
            Kind::Str,
            "Name of the cluster in the database (when no `clusters` are configured; empty: slurm.conf's ClusterName, else slurm-0)",
        )
        .default(""),
        Opt::new(
            "clusters",
            Kind::FileOnly,
            "Clusters in one database: [[stats-server.clusters]] with id, manager (slurm, lsf, k8s, openpbs or openstack), prometheus-url, series-queries (CEEMS's updater queries) and the manager's own keys: sacct-path, sacctmgr-path, slurm-env, slurm-cluster-name, slurmrestd-url; lsf-bin-dir, lsf-env, lsf-projects-from-jobs; openpbs-accounting-dir, openpbs-bin-dir, openpbs-env; kubeconfig, k8s-user-annotations, k8s-project-annotations, k8s-gpu-resources, k8s-ns-users-file; openstack-compute-url, openstack-identity-url, openstack-auth, openstack-http-headers, openstack-ca-file, openstack-cert-file, openstack-key-file, openstack-insecure-skip-verify, openstack-gpu-aliases, openstack-timeout",
        ),
        Opt::new(
            "prometheus.url",
            Kind::Str,
            "Prometheus that holds the exporters' series, for per-job aggregates (empty: none)",
        )
        .default(""),
        Opt::new(
            "prometheus.timeout",
            Kind::Duration,
            "Timeout of one Prometheus query",
        )
        .default("1m"),
        Opt::new(
            "prometheus.cutoff",
            Kind::Duration,
            "Jobs shorter than this get no aggregates",
        )
        .default("1m"),
        Opt::new(
            "prometheus.max-batch",
            Kind::Int,
            "Most jobs in one Prometheus query",
        )
        .default("1000"),
        Opt::new(
            "prometheus.parallel-queries",
            Kind::Int,
            "Queries of one batch of jobs sent to Prometheus at once",
        )
        .default("4"),
        Opt::new(
            "prometheus.update-budget",
            Kind::Duration,
            "Longest an update asks Prometheus for aggregates (at most --storage.update-interval): the jobs left, the longest windows (an outage's backlog), wait for the next update; new jobs go first",
        )
        .default("15m"),
        Opt::new(
            "prometheus.yield-to-api",
            Kind::Duration,
            "Most each query for aggregates waits while the API is answering (the store's work takes the cores its answers need): a dashboard's burst delays the update a little, a flood slows it; 0s: never wait",
        )
        .default("1s"),
        Opt::new(
            "prometheus.max-samples",
            Kind::Int,
            "Prometheus's --query.max-samples; batches stay under half of it",
        )
        .default("50000000"),
        Opt::new(
            "prometheus.scrape-interval",
            Kind::Duration,
            "The exporters' scrape interval, to size batches",
        )
        .default("15s"),
        Opt::new(
            "prometheus.query-delay",
            Kind::Duration,
            "Aggregates stop this long before now: the lag of a remote-write store (VictoriaMetrics, Mimir, Thanos) before new samples answer; 0 for Prometheus itself",
        )
        .default("0s"),
        Opt::new(
            "prometheus.emissions-provider",
            Kind::Str,
            "Provider of the emission factor the emissions query reads (the rules' ceems_emissions_gCo2_kWh{provider=...}): the API answers emissions as <provider>_total",
        )
        .default("owid"),
        Opt::new(
            "findings",
            Kind::FileOnly,
            "Thresholds of the efficiency findings; see examples/ceems.toml",
        ),
        Opt::new(
            "prometheus.queries",
            Kind::FileOnly,
            "PromQL templates of the aggregates ($uuids, $range); see examples/ceems.toml",
        ),
        Opt::new(
            "web.max-requests",
            Kind::Int,
            "Requests a minute from one client address; more get 429 (0: no limit)",
        )
        .default("0"),
        Opt::new(
            "web.trusted-ip-prefix",
            Kind::List,
            "Client addresses (CIDR, repeatable, e.g. Grafana's) that --web.max-requests does not count",
        )
        .key("web.trusted-ip-prefixes")
        .default(""),
        Opt::new(
            "web.external-url",
            Kind::Str,
            "URL users reach this server at, for the report links in mails (empty: http://<this host>:<port>)",
        )
        .default(""),
        Opt::new(
            "notify.period",
            Kind::Duration,
            "Time between two digests of findings mailed to users",
        )
        .default("1d"),
        Opt::new(
            "notify.min-severity",
            Kind::Str,
            "Jobs are mailed about when a finding is at least this severe: info, warning or critical",
        )
        .default("warning"),
        Opt::new(
            "notify.opt-out",
            Kind::List,
            "User who gets no digest (repeatable)",
        )
        .default(""),
        Opt::new(
            "notify.eml-dir",
            Kind::Str,
            "Dry run: write each digest as an .eml file into this directory instead of sending it",
        )
        .default(""),
    ]);
    opts.extend(policies::opts());
    opts.extend(campaigns::opts());
    opts.extend(site_rules::opts());
    opts.extend(memory::opts());
    opts.extend(super::mail_opts::opts("notify."));
    opts.extend(crate::security::opts());
    opts.extend(config::log_opts());
    opts.extend(config::runtime::opts("0"));
    opts
}

pub fn command() -> Command {
    config::build_command(
        Command::new("stats-server")
            .about("Pull jobs from Slurm (sacct or slurmrestd), LSF (bacct/bjobs), Kubernetes (the API server's pods) or OpenPBS (its accounting log, qstat) into SQLite or PostgreSQL; per-job energy and usage from Prometheus; JSON API for Grafana (:9020)")
            .after_help(settings::clusters_help()),
        &opts(),
    )
}

pub fn run(matches: &ArgMatches) -> anyhow::Result<ExitCode> {
    let settings = config::load("stats-server", &opts(), matches)?;
    let log: LogConfig = settings.get("log")?;
    crate::log::init(&log)?;
    settings.log_deprecated();
    let listen: String = settings.get("web.listen-address")?;
    let storage: Storage = settings.get("storage")?;
    let prom: PrometheusSettings = settings.get("prometheus")?;
    prom.queries.validate().map_err(anyhow::Error::msg)?;
    let admins: Vec<String> = settings.get("web.admin-users")?;
    let (thresholds, rules) = site_rules::load(&settings)?;
    let budgets = memory::Budgets::of(&settings)?;
    let user_header: String = settings.get("web.user-header-name")?;
    let time_zone = match settings.get::<String>("storage.data.time-zone")?.as_str() {
        "" => jiff::tz::TimeZone::system(),
        name => jiff::tz::TimeZone::get(name)
            .with_context(|| format!("--storage.data.time-zone `{name}`"))?,
    };
    let emissions_provider: String = settings.get("prometheus.emissions-provider")?;
    let keep_old_units: bool = settings.get("storage.data.skip.delete.old.units")?;
    let cors = web::cors::Cors::new(&settings.get::<String>("web.cors.origin")?, &user_header)
        .map_err(anyhow::Error::msg)?;
    let cors = Arc::new(cors);
    hyper::header::HeaderName::from_bytes(user_header.as_bytes())
        .with_context(|| format!("--web.user-header-name `{user_header}` is not a header name"))?;
    let cluster_list = clusters(&settings)?;
    anyhow::ensure!(
        storage.data.backup.keep >= 1,
        "--storage.data.backup.keep must be at least 1"
    );
    let database_url = storage.database_url.trim();
    let postgres = !database_url.is_empty();
    if postgres {
        anyhow::ensure!(
            db::is_postgres_url(database_url),
            "--storage.database-url `{}`: expected postgres://… or postgresql://… (empty: SQLite in --storage.data.path)",
            database_url
        );
        anyhow::ensure!(
            storage.data.backup.path.is_empty(),
            "--storage.data.backup.path backs up the SQLite file; with --storage.database-url, back PostgreSQL up with its own tools (pg_dump, base backups)"
        );
    }

    startup::check_prometheus_urls(&cluster_list, &prom.url)?;

    let notify: NotifySettings = settings.get("notify")?;
    let external: String = settings.get("web.external-url")?;
    let notifier = notify
        .notifier(
            external_url(&external, &listen),
            cluster_list
                .iter()
                .filter(|c| !c.prometheus_url.as_deref().unwrap_or(&prom.url).is_empty())
                .map(|c| c.id.clone())
                .collect(),
            thresholds.clone(),
        )
        .context("[stats-server.notify]")?;

    let engine = policies::engine(&settings, &notify, external_url(&external, &listen), &prom)?;
    let policy_interval = policies::interval(&settings)?;
    let campaigns = campaigns::campaigns(&settings, &notify, external_url(&external, &listen))?;
    let listener = web::bind_std(&listen)?;
    let security: crate::security::SecuritySettings = settings.get("security")?;
    let backup_dir = PathBuf::from(&storage.data.backup.path);
    let mut own_dirs = Vec::new();
    if !postgres {
        own_dirs.push(storage.data.path.as_path());
    }
    if !storage.data.backup.path.is_empty() {
        own_dirs.push(&backup_dir);
    }
    startup::refuse_files(&own_dirs)?;
    for dir in crate::security::create_dirs_for_run_as_user(&security, &own_dirs)? {
        tracing::info!(dir = %dir.display(), "created for the user the server runs as");
    }
    crate::security::drop_privileges(&security, &needed_capabilities(&settings)?)
        .context("cannot drop privileges (--security.drop-privileges=false to run as started)")?
        .log("stats-server");
    let header_name = hyper::header::HeaderName::from_bytes(user_header.as_bytes())?;
    let rate = match settings.get::<i64>("web.max-requests")? {
        n if n < 0 => anyhow::bail!("--web.max-requests must be 0 (no limit) or more, not {n}"),
        0 => None,
        n => {
            let prefixes: Vec<String> = settings.get("web.trusted-ip-prefixes")?;
            let exempt = prefixes
                .iter()
                .filter(|p| !p.is_empty())
                .map(|p| {
                    p.parse::<ipnet::IpNet>().with_context(|| {
                        format!("--web.trusted-ip-prefix `{p}`: expected CIDR, e.g. 192.168.1.0/24")
                    })
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            Some(web::rate::RateLimit::new(
                u32::try_from(n).unwrap_or(u32::MAX),
                exempt,
            ))
        }
    };
    let options = web::ServeOptions::new(256)
        .with_rate(rate)
        .with_security(web::toolkit::WebSecurity::from_settings(&settings)?)
        .with_munge(web::munge_auth(&settings, &header_name)?);
    let db_path = storage.data.path.join("ceems.db");
    let (db_url, db_name) = match postgres {
        true => (
            database_url.to_owned(),
            db::describe_postgres_url(database_url),
        ),
        false => {
            startup::check_data_dir(&storage.data.path)?;
            (db_path.display().to_string(), db_path.display().to_string())
        }
    };
    // One server per SQLite directory: a second would double every ingestion and update.
    // Held until this function returns; PostgreSQL serves several.
    let _one_server = match postgres {
        true => None,
        false => Some(startup::lock_data_dir(&storage.data.path)?),
    };
    let limits = Limits {
        cutoff: prom.cutoff,
        max_batch: usize::try_from(prom.max_batch.max(1)).unwrap_or(1),
        max_samples: u64::try_from(prom.max_samples.max(1)).unwrap_or(1),
        parallel_queries: usize::try_from(prom.parallel_queries.max(1)).unwrap_or(1),
        scrape_interval: prom.scrape_interval,
        query_delay: prom.query_delay,
        run_budget: prom.update_budget.min(storage.update_interval),
        yield_to: None,
    };
    let api_activity = Arc::new(ApiActivity::default());
    // The background updater yields to the API; a refresh that a request waits for does not.
    let update_limits = Limits {
        yield_to: (!prom.yield_to_api.is_zero()).then(|| YieldTo {
            api: Arc::clone(&api_activity),
            at_most: prom.yield_to_api,
        }),
        ..limits.clone()
    };
    let sources: Vec<Source> = cluster_list
        .into_iter()
        .map(|c| {
            let url = c.prometheus_url.clone().unwrap_or_else(|| prom.url.clone());
            let accounting = accounting(&c, &settings)?;
            Ok(Source {
                cluster: Cluster {
                    id: c.id.clone(),
                    accounting,
                },
                prometheus: (!url.is_empty())
                    .then(|| Arc::new(HttpPrometheus::new(&url, prom.timeout))),
                queries: match c.series_queries.is_empty() {
                    true => None,
                    false => {
                        let q = Queries::series_only(c.series_queries.clone());
                        q.validate()
                            .map_err(|e| anyhow::anyhow!("clusters: `{}`: {e}", c.id))?;
                        Some(q)
                    }
                },
                stats: Stats::default(),
            })
        })
        .collect::<anyhow::Result<_>>()?;
    let sources = Arc::new(sources);

    let workers = config::runtime::worker_threads(&settings)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .thread_name("ceems-stats-server")
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async move {
        let store = Arc::new(
            Store::open_url(&db_url, budgets.sqlite_page_cache)
                .await
                .context("cannot open the database")?,
        );
        store.judge_inserted_jobs(db::InsertJudge {
            thresholds: thresholds.clone(),
            rules: Arc::clone(&rules),
        });
        store.set_admins("config", &admins).await.context("saving the admin users")?;
        for s in sources.iter() {
            store
                .register_cluster(&s.cluster.id, s.cluster.accounting.manager())
                .await
                .with_context(|| format!("recording cluster `{}`", s.cluster.id))?;
        }
        tracing::info!(db = %db_name, clusters = sources.len(), admins = admins.len(), workers, "stats-server started");
        let refresh = Arc::new(JobRefresh::new(
            Arc::clone(&store),
            sources
                .iter()
                .map(|s| {
                    (
                        s.cluster.id.clone(),
                        RefreshSource {
                            accounting: Arc::clone(&s.cluster.accounting),
                            prometheus: s
                                .prometheus
                                .as_ref()
                                .map(|p| Arc::clone(p) as Arc<dyn Prometheus>),
                        },
                    )
                })
                .collect(),
            prom.queries.clone(),
            limits.clone(),
            thresholds.clone(),
            REFRESH_TIMEOUT,
        )
        .with_rules(Arc::clone(&rules)));
        tokio::spawn(site_rules::reload_on_sighup(Arc::clone(&rules), settings.file.clone()));
        tokio::spawn(update_loop(
            Arc::clone(&store),
            Arc::clone(&sources),
            UpdatePlan {
                queries: prom.queries,
                limits: update_limits,
                thresholds: thresholds.clone(),
                rules: Arc::clone(&rules),
                interval: storage.update_interval,
                first_window: storage.first_window,
                retention: match keep_old_units {
                    // A hundred years: nothing is old enough.
                    true => Duration::from_secs(100 * 365 * 86400),
                    false => storage.data.retention_period,
                },
            },
        ));
        let mail = Arc::new(MailStats::default());
        let policy_stats = Arc::new(policies::PolicyStats::default());
        if let Some((campaigns, every)) = campaigns {
            tokio::spawn(campaigns::campaign_loop(Arc::clone(&store), campaigns, every));
        }
        if let Some(engine) = engine {
            tokio::spawn(policies::policy_loop(
                Arc::clone(&store),
                Arc::clone(&sources),
                engine,
                policy_interval,
                Arc::clone(&policy_stats),
            ));
        }
        if let Some(notifier) = notifier {
            tokio::spawn(notify_loop(Arc::clone(&store), notifier, Arc::clone(&mail)));
        }
        if !storage.data.backup.path.is_empty() {
            tokio::spawn(backup_loop(
                Arc::clone(&store),
                PathBuf::from(&storage.data.backup.path),
                storage.data.backup.interval,
                usize::try_from(storage.data.backup.keep).unwrap_or(1),
            ));
        }
        let listener = web::into_async(listener)
            .with_context(|| format!("cannot listen on {listen}"))?;
        tracing::info!(address = %listen, "listening");
        let api = Arc::new(
            Api::new(Arc::clone(&store), &user_header)
                .with_cache_bytes(budgets.api_cache)
                .with_time_zone(time_zone)
                .with_emissions_provider(&emissions_provider)
                .with_on_demand_pull(Arc::clone(&refresh)),
        );
        let reports = Arc::new(Reports::new(
            Arc::clone(&api),
            sources
                .iter()
                .filter_map(|s| {
                    let p = s.prometheus.as_ref()?;
                    Some((s.cluster.id.clone(), Arc::clone(p) as Arc<dyn RangeQuery>))
                })
                .collect(),
            i64::try_from(prom.scrape_interval.as_secs()).unwrap_or(15),
        )
        .with_refresh(refresh));
        let handler: web::Handler = Arc::new(move |req| {
            let sources = Arc::clone(&sources);
            let mail = Arc::clone(&mail);
            let policy_stats = Arc::clone(&policy_stats);
            let api = Arc::clone(&api);
            let reports = Arc::clone(&reports);
            let cors = Arc::clone(&cors);
            let api_activity = Arc::clone(&api_activity);
            let (thresholds, rules) = (thresholds.clone(), Arc::clone(&rules));
            Box::pin(async move {
                if let Some(preflight) = cors.preflight(&req) {
                    return preflight;
                }
                if req.method() == Method::POST && req.uri().path() == site_rules::RERUN_PATH {
                    return site_rules::rerun(&req, &api, &sources, (&thresholds, &rules)).await;
                }
                if req.method() != Method::GET {
                    return web::text_response(StatusCode::METHOD_NOT_ALLOWED, "only GET\n");
                }
                let path = req.uri().path();
                // The updater waits while this is answered (a moment after, too).
                let _answering = (path.starts_with("/api/") || path.starts_with("/report/"))
                    .then(|| api_activity.request());
                let user = req
                    .headers()
                    .get(api.user_header.as_str())
                    .and_then(|v| v.to_str().ok());
                if path.starts_with("/report/") {
                    let page = reports.handle(path, user, unix_now()).await;
                    let mut resp =
                        web::body_response(page.body, page.content_type, web::accepts_gzip(&req));
                    *resp.status_mut() = page.status;
                    return resp;
                }
                if path.starts_with("/api/") {
                    let answer = api.handle(path, req.uri().query(), user, unix_now()).await;
                    let gzipped = if web::accepts_gzip(&req) {
                        answer.compressed(web::gzipped_once)
                    } else {
                        None
                    };
                    let mut resp =
                        web::encoded_response(answer.body, gzipped, "application/json");
                    *resp.status_mut() = answer.status;
                    cors.allow(&req, &mut resp);
                    return resp;
                }
                match path {
                    "/health" => {
                        let (status, text) = loops::health(&sources);
                        web::text_response(status, text)
                    }
                    "/metrics" => web::body_response(
                        metrics(&sources, &mail, &api_activity, &policy_stats),
                        TEXT_CONTENT_TYPE,
                        web::accepts_gzip(&req),
                    ),
                    _ => web::text_response(StatusCode::NOT_FOUND, "not found; the API is under /api/v1, job reports under /report/{cluster}/{jobid}\n"),
                }
            })
        });
        web::serve(listener, options, handler, web::shutdown_signal()).await;
        Ok::<_, anyhow::Error>(())
    })?;
    Ok(ExitCode::SUCCESS)
}
