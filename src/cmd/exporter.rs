//! `ceems exporter`: per-node metrics of jobs and host on `/metrics` (:9010).

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::{ArgMatches, Command};
use hyper::{Method, Request, StatusCode};
use serde::Deserialize;

use crate::collect;
use crate::config::{self, Kind, Layered, LogConfig, Opt};
use crate::metrics::{Labels, MetricSet, TEXT_CONTENT_TYPE};
use crate::registry::{self, Registry};
use crate::web;

/// Header in which Prometheus sends its scrape timeout.
const SCRAPE_TIMEOUT_HEADER: &str = "x-prometheus-scrape-timeout-seconds";
/// Time kept back from Prometheus's timeout for encoding and sending the answer.
const SCRAPE_TIMEOUT_MARGIN: Duration = Duration::from_millis(250);

pub fn opts() -> Vec<Opt> {
    let mut opts = vec![
        Opt::new(
            "web.listen-address",
            Kind::Str,
            "Address on which to expose metrics, host:port or :port for every interface",
        )
        .default(":9010"),
        Opt::new(
            "web.telemetry-path",
            Kind::Str,
            "Path under which to expose metrics",
        )
        .default("/metrics"),
        Opt::new(
            "web.max-requests",
            Kind::Int,
            "Maximum number of requests served at once; more get 503 (0 = no limit)",
        )
        .default("40"),
        Opt::flag(
            "web.disable-exporter-metrics",
            "Exclude metrics about the exporter itself (process_*)",
        ),
        Opt::new(
            "web.trace-path",
            Kind::Str,
            "Accept job trace samples (POST, JSON) on this path, e.g. /trace; off when unset",
        ),
        Opt::new(
            "web.trace-ttl",
            Kind::Duration,
            "A traced job's samples are dropped this long after its last report",
        )
        .default("5m"),
        Opt::new(
            "web.trace-max-jobs",
            Kind::Int,
            "Jobs traced at once; reports of more get 429",
        )
        .default("100"),
        Opt::new(
            "web.config.file",
            Kind::Str,
            "Web config file (exporter-toolkit YAML): TLS, client certificates, basic auth, headers",
        )
        .env("CEEMS_EXPORTER_WEB_CONFIG_FILE"),
        Opt::new("path.sysfs", Kind::Str, "sysfs mountpoint").default("/sys"),
        Opt::new("path.procfs", Kind::Str, "procfs mountpoint").default("/proc"),
        Opt::new("path.cgroupfs", Kind::Str, "cgroupfs mountpoint").default("/sys/fs/cgroup"),
    ];
    opts.extend(registry::options());
    opts.extend(collect::alloy_targets::options());
    opts.extend(crate::security::opts());
    opts.extend(config::log_opts());
    // Two threads: a node's cores are its jobs'.
    opts.extend(config::runtime::opts("2"));
    opts
}

pub fn command() -> Command {
    config::build_command(
        Command::new("exporter")
            .about("Export metrics of jobs (cgroups), CPUs, memory and energy of this node")
            .after_help(
                "Collectors are switched with --collector.<name> and --no-collector.<name>; \
                 every flag can also be set in the [exporter] table of --config.file.",
            ),
        &opts(),
    )
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct WebSettings {
    listen_address: String,
    telemetry_path: String,
    max_requests: i64,
    disable_exporter_metrics: bool,
    targets_path: String,
    #[serde(default)]
    trace_path: Option<String>,
    #[serde(deserialize_with = "config::de_duration")]
    trace_ttl: Duration,
    trace_max_jobs: i64,
    /// `--web.config.file`, read by [`web::toolkit::WebSecurity::from_settings`].
    #[serde(default)]
    #[allow(dead_code)]
    config: toml::Table,
}

/// The top level of `[exporter]`: only these tables exist.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct Tables {
    web: toml::Table,
    path: toml::Table,
    log: toml::Table,
    collector: toml::Table,
    security: toml::Table,
    compat: toml::Table,
    discoverer: toml::Table,
    runtime: toml::Table,
}

/// What the HTTP handler needs.
pub struct Exporter {
    registry: Registry,
    timeout: Duration,
    telemetry_path: String,
    process_metrics: Option<prometheus::Registry>,
    /// `--web.trace-path`: its path and the samples received.
    trace: Option<(String, collect::trace::TraceStore)>,
    /// `--discoverer.alloy-targets`: its path and the discoverer.
    alloy_targets: Option<(String, Arc<collect::alloy_targets::AlloyTargets>)>,
    build_info: Labels,
    /// The last scrape's body buffer, reused by the next.
    body: web::spare::SpareBuffer,
}

impl Exporter {
    /// Builds the exporter from layered settings; errors name the key or the collector.
    pub fn from_settings(settings: &Layered) -> anyhow::Result<(Exporter, WebOptions)> {
        settings.get::<Tables>("")?;
        let web: WebSettings = settings.get("web")?;
        let hostname = nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok())
            .unwrap_or_default();
        let registry = Registry::build(settings, &hostname)?;
        let timeout = registry.timeout();
        let process_metrics = if web.disable_exporter_metrics {
            None
        } else {
            let r = prometheus::Registry::new();
            r.register(Box::new(
                prometheus::process_collector::ProcessCollector::for_self(),
            ))
            .context("cannot register process metrics")?;
            Some(r)
        };
        let max_requests = usize::try_from(web.max_requests).map_err(|_| {
            anyhow::anyhow!(
                "web.max-requests must be 0 or more, not {}",
                web.max_requests
            )
        })?;
        let alloy_targets = registry::alloy_targets(settings)
            .context("Alloy targets discoverer")?
            .map(|d| (web.targets_path.clone(), Arc::new(d)));
        let label = registry::hostname_label(&registry::select(settings)?.common, &hostname);
        let trace = web.trace_path.clone().filter(|p| !p.is_empty()).map(|p| {
            (
                p,
                collect::trace::TraceStore::new(
                    web.trace_ttl,
                    usize::try_from(web.trace_max_jobs).unwrap_or(0),
                    &label,
                ),
            )
        });
        let exporter = Exporter {
            trace,
            alloy_targets,
            registry,
            timeout,
            telemetry_path: web.telemetry_path,
            process_metrics,
            build_info: Labels::new(&[
                ("version", env!("CARGO_PKG_VERSION")),
                ("revision", super::REVISION),
                ("branch", super::BRANCH),
                ("rustversion", super::RUST_VERSION),
                ("goos", std::env::consts::OS),
                ("goarch", std::env::consts::ARCH),
            ]),
            body: web::spare::SpareBuffer::default(),
        };
        Ok((
            exporter,
            WebOptions {
                listen_address: web.listen_address,
                max_requests,
                security: web::toolkit::WebSecurity::from_settings(settings)?,
            },
        ))
    }

    /// The per-collector timeout: ours, or less when Prometheus gives a shorter scrape timeout.
    fn scrape_timeout<B>(&self, req: &Request<B>) -> Duration {
        let header = req
            .headers()
            .get(SCRAPE_TIMEOUT_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s > 0.0)
            .map(Duration::from_secs_f64);
        match header {
            Some(h) => {
                let budget = h.saturating_sub(SCRAPE_TIMEOUT_MARGIN).max(h / 2);
                budget.min(self.timeout)
            }
            None => self.timeout,
        }
    }

    /// One scrape, encoded in the text format.
    pub async fn render(&self, timeout: Duration) -> String {
        let mut set: MetricSet = self.registry.scrape(timeout).await;
        set.gauge(
            "ceems_exporter_build_info",
            "A metric with a constant '1' value labeled by version, revision, branch, rustversion from which ceems_exporter was built, and the goos and goarch for the build.",
            self.build_info.clone(),
            1.0,
        );
        if let Some((_, store)) = &self.trace {
            store.emit(&mut set);
        }
        let mut body = self.body.take(set.encoded_len_hint() + 4096);
        set.encode_text(&mut body);
        if let Some(r) = &self.process_metrics {
            match prometheus::TextEncoder::new().encode_to_string(&r.gather()) {
                Ok(text) => body.push_str(&text),
                Err(e) => tracing::warn!(error = %e, "cannot encode process metrics"),
            }
        }
        body
    }

    /// Job tracing: POST stores a report, GET shows the current entries.
    async fn serve_trace(&self, req: Request<hyper::body::Incoming>) -> hyper::Response<web::Body> {
        use collect::trace::{self, TraceError};
        use http_body_util::BodyExt as _;
        let Some((_, store)) = &self.trace else {
            return web::text_response(StatusCode::NOT_FOUND, "not found\n");
        };
        match *req.method() {
            Method::GET | Method::HEAD => match serde_json::to_string(&store.entries()) {
                Ok(json) => web::body_response(json + "\n", "application/json", false),
                Err(e) => web::text_response(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
            },
            Method::POST => {
                let limited = http_body_util::Limited::new(req.into_body(), trace::MAX_BODY);
                let body =
                    match tokio::time::timeout(Duration::from_secs(10), limited.collect()).await {
                        Ok(Ok(b)) => b.to_bytes(),
                        Ok(Err(_)) => {
                            return web::text_response(
                                StatusCode::BAD_REQUEST,
                                format!("{}\n", TraceError::TooLarge),
                            )
                        }
                        Err(_) => {
                            return web::text_response(
                                StatusCode::REQUEST_TIMEOUT,
                                "body not received in time\n",
                            )
                        }
                    };
                match trace::parse_report(&body).and_then(|r| store.record(r)) {
                    Ok(()) => web::text_response(StatusCode::NO_CONTENT, ""),
                    Err(e @ TraceError::TooManyJobs(_)) => {
                        web::text_response(StatusCode::TOO_MANY_REQUESTS, format!("{e}\n"))
                    }
                    Err(e) => web::text_response(StatusCode::BAD_REQUEST, format!("{e}\n")),
                }
            }
            _ => web::text_response(StatusCode::METHOD_NOT_ALLOWED, "GET or POST\n"),
        }
    }

    /// The Alloy targets as JSON.
    async fn serve_targets(&self) -> hyper::Response<web::Body> {
        let Some((_, discoverer)) = &self.alloy_targets else {
            return web::text_response(StatusCode::NOT_FOUND, "not found\n");
        };
        let d = Arc::clone(discoverer);
        match tokio::task::spawn_blocking(move || d.targets()).await {
            Ok(Ok(targets)) => match serde_json::to_string(&targets) {
                Ok(json) => web::body_response(json + "\n", "application/json", false),
                Err(e) => web::text_response(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
            },
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "cannot discover Alloy targets");
                web::text_response(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n"))
            }
            Err(e) => web::text_response(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        }
    }

    async fn handle(
        self: Arc<Self>,
        req: Request<hyper::body::Incoming>,
    ) -> hyper::Response<web::Body> {
        if self
            .trace
            .as_ref()
            .is_some_and(|(path, _)| path == req.uri().path())
        {
            return self.serve_trace(req).await;
        }
        if req.method() != Method::GET && req.method() != Method::HEAD {
            return web::text_response(StatusCode::METHOD_NOT_ALLOWED, "only GET\n");
        }
        match req.uri().path() {
            p if p == self.telemetry_path => {
                let timeout = self.scrape_timeout(&req);
                let gzip = web::accepts_gzip(&req);
                let body = self.render(timeout).await;
                web::body_response(self.body.body(body), TEXT_CONTENT_TYPE, gzip)
            }
            p if self
                .alloy_targets
                .as_ref()
                .is_some_and(|(path, _)| path == p) =>
            {
                self.serve_targets().await
            }
            "/health" => web::text_response(StatusCode::OK, "OK\n"),
            "/" => {
                let mut resp =
                    web::text_response(StatusCode::OK, landing_page(&self.telemetry_path));
                resp.headers_mut().insert(
                    hyper::header::CONTENT_TYPE,
                    hyper::header::HeaderValue::from_static("text/html; charset=utf-8"),
                );
                resp
            }
            _ => web::text_response(StatusCode::NOT_FOUND, "not found\n"),
        }
    }
}

fn landing_page(telemetry: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html><head><title>CEEMS exporter</title></head><body>\n\
         <h1>CEEMS exporter</h1>\n<p>Version {}</p>\n\
         <ul><li><a href=\"{telemetry}\">Metrics</a></li><li><a href=\"/health\">Health</a></li></ul>\n\
         </body></html>\n",
        env!("CARGO_PKG_VERSION")
    )
}

pub struct WebOptions {
    pub listen_address: String,
    pub max_requests: usize,
    pub security: Option<web::toolkit::WebSecurity>,
}

/// One malloc arena for every thread, and a scrape's large buffers (its body is 1.4 MB at
/// 1,000 jobs) mapped apart and handed back when freed. By default glibc gives each thread
/// that allocates its own arena, and a collector runs on whichever blocking thread is free:
/// each arena kept its own high-water mark of a scrape, 8 MB over five threads. The
/// exporter's threads seldom allocate at once; the stats-server's do (two arenas cut its
/// ingestion from 104k to 61-75k rows/s), so it keeps glibc's defaults.
fn keep_heap_small() {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: mallopt only sets allocator parameters; called before any other thread
        // starts.
        unsafe {
            nix::libc::mallopt(nix::libc::M_ARENA_MAX, 1);
            nix::libc::mallopt(nix::libc::M_MMAP_THRESHOLD, 512 << 10);
        }
    }
}

/// Hands the binary's pages that start-up read (the flags of every subcommand, the
/// configuration loader) back to the kernel; those a scrape needs come back at its first use.
/// Only the file's owner may page out its cache (the kernel's rule), so this is done as root,
/// before privileges drop; elsewhere it does nothing.
fn release_startup_pages() {
    let (Ok(exe), Ok(maps)) = (
        std::fs::read_link("/proc/self/exe"),
        std::fs::read_to_string("/proc/self/maps"),
    ) else {
        return;
    };
    for line in maps.lines() {
        let mut fields = line.split_ascii_whitespace();
        let (Some(range), Some(perms)) = (fields.next(), fields.next()) else {
            continue;
        };
        if perms.contains('w') || fields.nth(3).map(std::path::Path::new) != Some(&*exe) {
            continue;
        }
        let Some((Ok(start), Ok(end))) = range
            .split_once('-')
            .map(|(a, b)| (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)))
        else {
            continue;
        };
        // SAFETY: MADV_PAGEOUT never changes what a mapping holds, only where it is kept:
        // the binary's pages are read from it again when touched (its relocated data, copied
        // on write, from swap, or left in place without swap).
        unsafe {
            nix::libc::madvise(
                start as *mut nix::libc::c_void,
                end.saturating_sub(start),
                nix::libc::MADV_PAGEOUT,
            );
        }
    }
}

pub fn run(matches: &ArgMatches) -> anyhow::Result<ExitCode> {
    keep_heap_small();
    let opts = opts();
    let settings = config::load("exporter", &opts, matches)?;
    let log: LogConfig = settings.get("log")?;
    crate::log::init(&log)?;
    settings.log_deprecated();
    // Job cgroup files stay open between scrapes, within a share of this limit.
    match crate::host::cgroup::kept::raise_nofile_limit() {
        Ok((old, new)) if old != new => {
            tracing::info!(
                from = old,
                to = new,
                "raised the open-file limit to its hard limit"
            )
        }
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "cannot raise the open-file limit"),
    }
    // Bind first (a port below 1024 needs root), then drop privileges before any collector
    // or thread starts.
    let web_settings: WebSettings = settings.get("web")?;
    let listener = web::bind_std(&web_settings.listen_address)?;
    let needed = registry::needed_capabilities(&settings)?;
    let security: crate::security::SecuritySettings = settings.get("security")?;
    release_startup_pages();
    let outcome = crate::security::drop_privileges(&security, &needed)
        .context("cannot drop privileges (--security.drop-privileges=false to run as started)")?;
    outcome.log("exporter");
    let (exporter, web_opts) = Exporter::from_settings(&settings)?;
    let exporter = Arc::new(exporter);
    tracing::info!(collectors = ?exporter.registry.names(), "starting ceems exporter");

    // Collectors block on files on their own threads; two workers serve HTTP.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(config::runtime::worker_threads(&settings)?)
        .max_blocking_threads(64)
        .thread_name("ceems-exporter")
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async move {
        let listener = web::into_async(listener)
            .with_context(|| format!("cannot listen on {}", web_opts.listen_address))?;
        tracing::info!(address = %web_opts.listen_address, "listening");
        let handler: web::Handler = Arc::new(move |req| {
            let exporter = Arc::clone(&exporter);
            Box::pin(exporter.handle(req))
        });
        web::serve(
            listener,
            web::ServeOptions::new(web_opts.max_requests).with_security(web_opts.security),
            handler,
            web::shutdown_signal(),
        )
        .await;
        Ok::<_, anyhow::Error>(())
    })?;
    Ok(ExitCode::SUCCESS)
}
