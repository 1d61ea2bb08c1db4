//! `ceems k8s-admission-controller` (CEEMS's `ceems_k8s_admission_controller`, :9000): the
//! Kubernetes admission webhook that writes who created each pod or workload into it
//! (`ceems.io/created-by`), so that the stats-server can give every pod to its person.

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use bytes::Bytes;
use clap::{ArgMatches, Command};
use http_body_util::{BodyExt as _, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use serde::Deserialize;

use crate::config::{self, Kind, LogConfig, Opt};
use crate::manager::k8s::admission::{self, AdmissionError, Hook};
use crate::web::{self, Body};

/// Where the API server posts its reviews (the webhook configurations' `path`).
pub const MUTATE_PATH: &str = "/ceems-admission-controller/mutate";
pub const VALIDATE_PATH: &str = "/ceems-admission-controller/validate";

/// A review's largest body: the API server sends objects of at most 3 MiB.
const MAX_BODY_BYTES: usize = 4 << 20;

pub fn opts() -> Vec<Opt> {
    let mut opts = web::server_opts(":9000");
    opts.push(
        Opt::new(
            "web.max-requests",
            Kind::Int,
            "Reviews answered at once; more get 503 (0: no limit)",
        )
        .default("64"),
    );
    opts.extend(crate::security::opts());
    opts.extend(config::log_opts());
    opts.extend(config::runtime::opts("2"));
    opts
}

pub fn command() -> Command {
    config::build_command(
        Command::new("k8s-admission-controller")
            .about("Kubernetes admission webhook: writes who created each pod into it (:9000)")
            .long_about(
                "Kubernetes admission webhook: writes who created each pod into it (:9000).\n\n\
                 POST /ceems-admission-controller/mutate answers an AdmissionReview (v1 or v1beta1) \
                 with a JSON patch adding ceems.io/created-by and ceems.io/created-by-uid to a Pod, \
                 or to the pod template of a Deployment, StatefulSet, DaemonSet, ReplicaSet, Job or \
                 CronJob; /ceems-admission-controller/validate admits everything and logs what lacks \
                 them. The API server calls webhooks over HTTPS only: give the certificate with \
                 --web.config.file (`ceems tool config create-web-config --tls`). \
                 examples/k8s/admission-controller.yaml deploys it.",
            ),
        &opts(),
    )
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct WebSettings {
    listen_address: String,
    max_requests: i64,
}

pub fn run(matches: &ArgMatches) -> anyhow::Result<ExitCode> {
    let settings = config::load("k8s-admission-controller", &opts(), matches)?;
    let log: LogConfig = settings.get("log")?;
    crate::log::init(&log)?;
    settings.log_deprecated();
    let web_settings: WebSettings = settings.get("web")?;
    let listener = web::bind_std(&web_settings.listen_address)?;
    // The key may be readable by root only: read before dropping privileges.
    let web_security = web::toolkit::WebSecurity::from_settings(&settings)?;
    let security: crate::security::SecuritySettings = settings.get("security")?;
    crate::security::drop_privileges(&security, &[])
        .context("cannot drop privileges (--security.drop-privileges=false to run as started)")?
        .log("k8s-admission-controller");
    if web_security.as_ref().is_none_or(|s| s.tls.is_none()) {
        tracing::warn!("no TLS (--web.config.file with tls_server_config): the Kubernetes API server calls webhooks over HTTPS only");
    }
    let options = web::ServeOptions::new(usize::try_from(web_settings.max_requests).unwrap_or(0))
        .with_security(web_security);
    tracing::info!(address = %web_settings.listen_address, "admission controller listening");
    let handler: web::Handler = Arc::new(|req| Box::pin(handle(req)));
    let workers = config::runtime::worker_threads(&settings)?;
    web::serve_until_signal("ceems-admission", workers, listener, options, handler)
        .with_context(|| format!("cannot serve on {}", web_settings.listen_address))?;
    Ok(ExitCode::SUCCESS)
}

async fn handle(req: Request<Incoming>) -> Response<Body> {
    let hook = match (req.method(), req.uri().path()) {
        (&Method::GET, "/health") => return web::text_response(StatusCode::OK, "OK\n"),
        (&Method::POST, MUTATE_PATH) => Hook::Mutate,
        (&Method::POST, VALIDATE_PATH) => Hook::Validate,
        (_, MUTATE_PATH | VALIDATE_PATH) => {
            return web::text_response(StatusCode::METHOD_NOT_ALLOWED, "only POST\n")
        }
        _ => return web::text_response(StatusCode::NOT_FOUND, "404 page not found\n"),
    };
    let json = req
        .headers()
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(';').next().unwrap_or("").trim() == "application/json");
    if !json {
        return web::text_response(
            StatusCode::BAD_REQUEST,
            "only content type 'application/json' is supported\n",
        );
    }
    let body: Bytes = match Limited::new(req.into_body(), MAX_BODY_BYTES)
        .collect()
        .await
    {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            tracing::warn!(error = %e, limit = MAX_BODY_BYTES, "admission review refused: body too large or unreadable");
            return web::text_response(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("could not read request body: {e}\n"),
            );
        }
    };
    match admission::review(&body, hook) {
        Ok(answer) => {
            match (hook, answer.patched) {
                (Hook::Validate, true) => {
                    tracing::warn!(creator = ?answer.creator, "object admitted without ceems.io/created-by")
                }
                (_, patched) => {
                    tracing::debug!(?hook, creator = ?answer.creator, patched, "admission review answered")
                }
            }
            web::body_response(answer.body.into_bytes(), "application/json", false)
        }
        Err(e) => {
            tracing::warn!(error = %e, "admission review refused");
            let status = match e {
                AdmissionError::NotHandled(_) => StatusCode::INTERNAL_SERVER_ERROR,
                _ => StatusCode::BAD_REQUEST,
            };
            web::text_response(status, format!("{e}\n"))
        }
    }
}
