//! `ceems lb`: a proxy in front of the Prometheus-API stores (and Pyroscope servers, on a
//! second address) of each cluster that lets a user's query through only when every compute
//! unit it can read is theirs (or their projects'), checked against the stats-server's
//! database or API, and only for the time those units were theirs (`window.rs`). Admins pass
//! unchecked; every path but the query, series and label APIs (Pyroscope's three querier
//! calls) is refused.

pub mod access;
pub mod backend;
pub mod owners;
pub mod pyroscope;
pub mod query;
pub mod window;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderName, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};

use crate::web::Body;
use access::Access;
use backend::Pool;

/// The header that picks the cluster when several are served.
pub const CLUSTER_HEADER: &str = "x-ceems-cluster-id";

/// CEEMS's answer (v0.12 and later) to a path a user may not call.
pub const PATH_FORBIDDEN: &str = "user do not have permissions to access this resource";

/// As CEEMS: an admin may also read the stores' other API paths (`status/config`, `targets`,
/// `rules`), never their admin API, and never write through them.
fn admin_may_read(method: &Method, path: &str) -> bool {
    method == Method::GET && path.starts_with("/api/v1/") && !path.starts_with("/api/v1/admin/")
}

/// CEEMS's answer (v0.12 and later) to a query of a unit that is not the user's.
pub const UNIT_FORBIDDEN: &str = "user do not have permissions to view metrics of this job/pod/vm";

/// Largest form body read (a query is at most [`query::MAX_QUERY_BYTES`]).
const MAX_BODY_BYTES: usize = 4 * query::MAX_QUERY_BYTES;

/// Request headers passed on to the stores; the rest (the user's, admin-looking headers,
/// credentials, cookies) stays here.
const FORWARDED_REQUEST_HEADERS: &[&str] =
    &["accept", "accept-encoding", "content-type", "user-agent"];
/// Request headers passed on to Pyroscope: Connect's own too.
const PYROSCOPE_REQUEST_HEADERS: &[&str] = &[
    "accept",
    "accept-encoding",
    "content-type",
    "user-agent",
    "connect-protocol-version",
    "connect-timeout-ms",
];
/// Answer headers passed back.
const FORWARDED_RESPONSE_HEADERS: &[&str] = &["content-type", "content-encoding", "vary"];

/// What a path of the Prometheus API reads units through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `query` parameters: PromQL expressions.
    Query,
    /// `match[]` parameters: series selectors.
    Series,
}

/// The API paths relayed; every other one is refused.
pub fn endpoint(path: &str) -> Option<Endpoint> {
    match path {
        "/api/v1/query" | "/api/v1/query_range" => Some(Endpoint::Query),
        "/api/v1/series" | "/api/v1/labels" => Some(Endpoint::Series),
        _ => {
            let name = path
                .strip_prefix("/api/v1/label/")?
                .strip_suffix("/values")?;
            // A label name, not a path in disguise (`..%2F`).
            let label = name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            label.then_some(Endpoint::Series)
        }
    }
}

/// Why a request is not relayed: the answer's status and message.
#[derive(Debug, PartialEq)]
pub struct Refusal {
    pub status: StatusCode,
    pub message: String,
}

impl Refusal {
    fn new(status: StatusCode, message: impl Into<String>) -> Refusal {
        Refusal {
            status,
            message: message.into(),
        }
    }

    fn forbidden(message: impl Into<String>) -> Refusal {
        Refusal::new(StatusCode::FORBIDDEN, message)
    }

    /// CEEMS's answer to a cluster it does not serve (`bad_data`, as every 400).
    fn unknown_cluster(id: &str) -> Refusal {
        tracing::info!(cluster = id, "refused: no such cluster here");
        Refusal::new(StatusCode::BAD_REQUEST, CLUSTER_INVALID)
    }
}

/// CEEMS's words (v0.12 and later) for a cluster that is not served.
pub const CLUSTER_INVALID: &str = "invalid ceems cluster id";

/// The parameters of a request, from its URL and its form body, in order. Prometheus reads
/// both (the body first), so both are checked. A raw `;`, which Go's form parser treats
/// unlike ours, is refused rather than guessed at.
pub fn parameters(
    url_query: Option<&str>,
    content_type: Option<&str>,
    body: &[u8],
) -> Result<Vec<(String, String)>, Refusal> {
    let mut params = Vec::new();
    let mut add = |raw: &[u8]| {
        if raw.contains(&b';') {
            return Err(Refusal::new(
                StatusCode::BAD_REQUEST,
                "parameters separated by `;` are not accepted; use `&`",
            ));
        }
        params.extend(form_urlencoded::parse(raw).map(|(k, v)| (k.into_owned(), v.into_owned())));
        Ok(())
    };
    add(url_query.unwrap_or("").as_bytes())?;
    if !body.is_empty() {
        let form = content_type
            .and_then(|c| c.split(';').next())
            .is_some_and(|c| {
                c.trim()
                    .eq_ignore_ascii_case("application/x-www-form-urlencoded")
            });
        if !form {
            return Err(Refusal::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "a request body must be application/x-www-form-urlencoded",
            ));
        }
        add(body)?;
    }
    Ok(params)
}

/// What finds the scope of one parameter's value.
type Analyser = fn(&str) -> Result<query::Scope, query::ScopeError>;

/// What the request can read, from every value of its `query` or `match[]` parameters; a
/// request that names no unit is refused.
pub fn requested_scope(
    endpoint: Endpoint,
    params: &[(String, String)],
) -> Result<query::Scope, Refusal> {
    let (name, analyse): (&str, Analyser) = match endpoint {
        Endpoint::Query => ("query", query::scope_of_query),
        Endpoint::Series => ("match[]", query::scope_of_selector),
    };
    let mut scope = query::Scope::default();
    for (_, value) in params.iter().filter(|(k, _)| k == name) {
        match analyse(value) {
            Ok(s) => scope.extend(s),
            Err(e @ query::ScopeError::Parse(_)) => {
                return Err(Refusal::new(StatusCode::BAD_REQUEST, e.to_string()))
            }
            Err(e) => return Err(Refusal::forbidden(e.to_string())),
        }
    }
    if scope.units.is_empty() {
        return Err(Refusal::forbidden(format!(
            "the request names no unit: only admins may query without {}=\"<job id>\"",
            query::UNIT_LABEL
        )));
    }
    Ok(scope)
}

/// Which API a frontend relays: CEEMS's lb listens for each on its own address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    Prometheus,
    Pyroscope,
}

/// One frontend: the stores of each cluster for its API, and who may read what.
pub struct Lb {
    api: Api,
    pools: BTreeMap<String, Arc<Pool>>,
    access: Arc<Access>,
}

impl Lb {
    pub fn new(api: Api, pools: BTreeMap<String, Arc<Pool>>, access: Arc<Access>) -> Lb {
        Lb { api, pools, access }
    }

    pub async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Response<Body> {
        if req.uri().path() == "/health" {
            return crate::web::text_response(StatusCode::OK, "OK\n");
        }
        match self.relay(req).await {
            Ok(resp) => resp,
            Err(refusal) => {
                if refusal.status.is_server_error() {
                    tracing::warn!(error = %refusal.message, "query not answered");
                }
                api_error(refusal)
            }
        }
    }

    async fn relay(&self, req: Request<Incoming>) -> Result<Response<Body>, Refusal> {
        let (parts, body) = req.into_parts();
        // CEEMS's datasources name the cluster as the path's first segment.
        let (path_cluster, api_path) = split_cluster(&self.pools, parts.uri.path());
        if parts.method != Method::GET && parts.method != Method::POST {
            return Err(Refusal::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "only GET and POST are relayed",
            ));
        }
        let header_cluster = match parts.headers.get(CLUSTER_HEADER).map(|v| v.to_str()) {
            Some(Ok(id)) => Some(id.trim()),
            Some(Err(_)) => {
                return Err(Refusal::new(
                    StatusCode::BAD_REQUEST,
                    "X-Ceems-Cluster-Id is not text",
                ))
            }
            None => None,
        };
        if let Some(id) = path_cluster
            .is_none()
            .then(|| unknown_path_cluster(parts.uri.path()))
            .flatten()
        {
            let served: Vec<&str> = self.pools.keys().map(String::as_str).collect();
            tracing::info!(cluster = id, ?served, "refused: no such cluster here");
            return Err(Refusal::new(
                StatusCode::NOT_FOUND,
                format!(
                    "no cluster `{id}` here: this lb serves {}",
                    served.join(", ")
                ),
            ));
        }
        // As CEEMS: a cluster this frontend does not serve is named before anything else.
        if let Some(id) = header_cluster.filter(|id| !self.pools.contains_key(*id)) {
            return Err(Refusal::unknown_cluster(id));
        }
        let user = self.access.user(&parts.headers)?;
        let limit = match self.api {
            Api::Prometheus => MAX_BODY_BYTES,
            Api::Pyroscope => pyroscope::MAX_BODY_BYTES,
        };
        let body = Limited::new(body, limit)
            .collect()
            .await
            .map_err(|e| Refusal::new(StatusCode::PAYLOAD_TOO_LARGE, format!("request body: {e}")))?
            .to_bytes();
        let admin = self.access.is_admin(&user).await;
        let asked = match self.api {
            Api::Prometheus => prometheus_scope(&parts, api_path, &body, &user, admin)?,
            Api::Pyroscope => pyroscope_scope(&parts, api_path, &body, &user, admin)?,
        };
        let pool = choose_pool(
            &self.pools,
            path_cluster,
            header_cluster,
            &asked.scope.clusters,
        )?;
        let mut url_query = parts.uri.query().map(str::to_owned);
        let mut body = body;
        if !admin {
            let window = self
                .access
                .check_units(&pool.cluster, &user, &asked.scope.units)
                .await?;
            if let Some(window) = window {
                let fitted = fit_to_window(&window, api_path, &asked.times, url_query.as_deref(), &body)
                    .map_err(|e| {
                        tracing::info!(%user, cluster = %pool.cluster, error = %e, "refused: outside the user's time");
                        let status = match e {
                            window::WindowError::Repeated(_) | window::WindowError::BadTime(..) => {
                                StatusCode::BAD_REQUEST
                            }
                            _ => StatusCode::FORBIDDEN,
                        };
                        Refusal::new(status, e.to_string())
                    })?;
                if let Some((query, new_body)) = fitted {
                    url_query = Some(query).filter(|q| !q.is_empty());
                    body = Bytes::from(new_body);
                }
            }
        }
        let filtering = self.api == Api::Prometheus && !pool.filter_labels.is_empty();
        let forwarded = match self.api {
            Api::Prometheus => FORWARDED_REQUEST_HEADERS,
            Api::Pyroscope => PYROSCOPE_REQUEST_HEADERS,
        };
        let headers: Vec<(HeaderName, HeaderValue)> = parts
            .headers
            .iter()
            .filter(|(k, _)| forwarded.contains(&k.as_str()))
            // An answer to filter must come uncompressed.
            .filter(|(k, _)| !(filtering && *k == hyper::header::ACCEPT_ENCODING))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let path_and_query = match &url_query {
            Some(q) => format!("{api_path}?{q}"),
            None => api_path.to_owned(),
        };
        let answer = pool
            .forward(parts.method.clone(), &path_and_query, &headers, body)
            .await
            .map_err(|e| Refusal::new(StatusCode::BAD_GATEWAY, e.to_string()))?;
        let (from, mut body) = answer.into_parts();
        if filtering && from.status == StatusCode::OK {
            let raw = body
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            body = Full::new(filter_answer(api_path, &raw, &pool.filter_labels).unwrap_or(raw));
        }
        let mut resp = Response::new(body);
        *resp.status_mut() = from.status;
        for (k, v) in from.headers.iter() {
            if FORWARDED_RESPONSE_HEADERS.contains(&k.as_str()) {
                resp.headers_mut().insert(k.clone(), v.clone());
            }
        }
        Ok(resp)
    }
}

/// What a request reads: its units, and the times it names.
struct Asked {
    scope: query::Scope,
    times: Times,
}

/// Where a request's times are.
enum Times {
    /// An admin's, or a path that reads no series.
    Unread,
    /// Prometheus's parameters (URL and form body), and how far back its queries read.
    Prometheus(Vec<(String, String)>, query::Reach),
    /// A Pyroscope message's.
    Pyroscope(pyroscope::Call, pyroscope::Encoding, pyroscope::Asked),
}

/// What a request to the Prometheus API reads; refused when a user may not call its path.
fn prometheus_scope(
    parts: &hyper::http::request::Parts,
    api_path: &str,
    body: &[u8],
    user: &str,
    admin: bool,
) -> Result<Asked, Refusal> {
    let content_type = parts
        .headers
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    let params = parameters(parts.uri.query(), content_type, body)?;
    let endpoint = endpoint(api_path);
    if endpoint.is_none() && !(admin && admin_may_read(&parts.method, api_path)) {
        tracing::info!(%user, path = %parts.uri.path(), "refused: not a query path");
        return Err(Refusal::forbidden(PATH_FORBIDDEN));
    }
    // Admins' queries are not judged, but may still name their cluster with ceems_id.
    let mut scope = match endpoint.map(|e| requested_scope(e, &params)) {
        Some(Ok(scope)) => scope,
        None => query::Scope::default(),
        Some(Err(_)) if admin => query::Scope::default(),
        Some(Err(refusal)) => return Err(refusal),
    };
    let times = match endpoint {
        Some(_) => Times::Prometheus(params, std::mem::take(&mut scope.reach)),
        None => Times::Unread,
    };
    Ok(Asked { scope, times })
}

/// What a call of Pyroscope's querier reads; refused when a user may not call it.
fn pyroscope_scope(
    parts: &hyper::http::request::Parts,
    api_path: &str,
    body: &[u8],
    user: &str,
    admin: bool,
) -> Result<Asked, Refusal> {
    let call = pyroscope::call(api_path).filter(|_| parts.method == Method::POST);
    if admin && pyroscope::admin_may_call(&parts.method, api_path) {
        return Ok(Asked {
            scope: query::Scope::default(),
            times: Times::Unread,
        });
    }
    let Some(call) = call else {
        tracing::info!(%user, path = %parts.uri.path(), "refused: not a querier method a user may call");
        return Err(Refusal::forbidden(PATH_FORBIDDEN));
    };
    let header = |name: &str| parts.headers.get(name).and_then(|v| v.to_str().ok());
    let read = || -> Result<Asked, pyroscope::PyroError> {
        for name in ["content-encoding", "connect-content-encoding"] {
            if let Some(e) = header(name).filter(|e| !e.eq_ignore_ascii_case("identity")) {
                return Err(pyroscope::PyroError::Compressed(format!("{name}: {e}")));
            }
        }
        let encoding = pyroscope::encoding(header("content-type"))?;
        let asked = pyroscope::asked(call, encoding, body)?;
        Ok(Asked {
            scope: pyroscope::scope(&asked)?,
            times: Times::Pyroscope(call, encoding, asked),
        })
    };
    use pyroscope::PyroError as E;
    read().map_err(|e| {
        let status = match &e {
            E::Unsupported(_) | E::Compressed(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            E::Malformed { .. } | E::Scope(query::ScopeError::Parse(_)) => StatusCode::BAD_REQUEST,
            E::Scope(_) => StatusCode::FORBIDDEN,
        };
        Refusal::new(status, e.to_string())
    })
}

/// The request's URL query and body fitted to the user's window (None: as they are).
fn fit_to_window(
    window: &window::Window,
    api_path: &str,
    times: &Times,
    url_query: Option<&str>,
    body: &[u8],
) -> Result<Option<(String, Vec<u8>)>, window::WindowError> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    match times {
        Times::Unread => Ok(None),
        Times::Prometheus(params, reach) => {
            let replace = window::fit_prometheus(window, api_path, params, reach, now)?;
            Ok((!replace.is_empty()).then(|| window::rewrite(url_query, body, &replace)))
        }
        Times::Pyroscope(call, encoding, asked) => {
            let seconds = |ms: i64| (ms != 0).then_some(ms as f64 / 1000.0);
            let from = seconds(asked.start_ms).unwrap_or(f64::MIN);
            let to = seconds(asked.end_ms).unwrap_or(now);
            if from > to {
                return Ok(None);
            }
            let (start, end) = window.fit(from, to, &query::Reach::default())?;
            if (start, end) == (from, to) {
                return Ok(None);
            }
            let ms = |s: f64| (s * 1000.0).round() as i64;
            let patched = pyroscope::with_times(*call, *encoding, body, ms(start), ms(end))
                .map_err(|e| window::WindowError::BadTime("start", e.to_string()))?;
            Ok(Some((url_query.unwrap_or("").to_owned(), patched)))
        }
    }
}

/// `/<cluster>/api/…` → (the cluster, `/api/…`) when the first segment is a served
/// cluster; the path unchanged otherwise.
fn split_cluster<'a>(
    pools: &BTreeMap<String, Arc<Pool>>,
    path: &'a str,
) -> (Option<&'a str>, &'a str) {
    let Some(rest) = path.strip_prefix('/') else {
        return (None, path);
    };
    match rest.split_once('/') {
        Some((first, _)) if pools.contains_key(first) => (Some(first), &rest[first.len()..]),
        _ => (None, path),
    }
}

/// The first segment of a path that names a cluster before an API path (`/jz/api/v1/query`)
/// when it is not one served here; a datasource pointing at a wrong cluster gets a 404 that
/// names the served ones rather than a 403.
fn unknown_path_cluster(path: &str) -> Option<&str> {
    let (first, _) = path.strip_prefix('/')?.split_once('/')?;
    let rest = &path[1 + first.len()..];
    let api = rest.starts_with("/api/v1/") || rest.starts_with(pyroscope::QUERIER);
    (!first.is_empty() && first != "api" && api).then_some(first)
}

/// The cluster named by the path, the header and the query's `ceems_id`, which must agree;
/// the only one served when none is named.
fn choose_pool(
    pools: &BTreeMap<String, Arc<Pool>>,
    path: Option<&str>,
    header: Option<&str>,
    labels: &BTreeSet<String>,
) -> Result<Arc<Pool>, Refusal> {
    let named: BTreeSet<&str> = path
        .into_iter()
        .chain(header)
        .chain(labels.iter().map(String::as_str))
        .collect();
    let id = match named.len() {
        0 if pools.len() == 1 => pools.keys().next().map(String::as_str),
        0 => None,
        1 => named.into_iter().next(),
        _ => {
            return Err(Refusal::new(
                StatusCode::BAD_REQUEST,
                format!(
                    "the request names several clusters ({}); one query reads one cluster",
                    named.into_iter().collect::<Vec<_>>().join(", ")
                ),
            ))
        }
    };
    let Some(id) = id else {
        return Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            format!(
                "name the cluster: /<cluster>/api/v1/…, X-Ceems-Cluster-Id or ceems_id=\"…\" (one of {})",
                pools.keys().cloned().collect::<Vec<_>>().join(", ")
            ),
        ));
    };
    pools
        .get(id)
        .cloned()
        .ok_or_else(|| Refusal::unknown_cluster(id))
}

/// The answer of `api_path` without the labels named in `hidden` (CEEMS's `filter_labels`:
/// labels a site keeps from its users, such as the node a job ran on). `None` when the body
/// is not a JSON answer of the API.
pub fn filter_answer(api_path: &str, body: &[u8], hidden: &[String]) -> Option<Bytes> {
    let mut answer: serde_json::Value = serde_json::from_slice(body).ok()?;
    let data = answer.get_mut("data")?;
    let strip = |metric: &mut serde_json::Value| {
        if let Some(m) = metric.as_object_mut() {
            m.retain(|k, _| !hidden.contains(k));
        }
    };
    match api_path {
        "/api/v1/query" | "/api/v1/query_range" => {
            for series in data.get_mut("result")?.as_array_mut()? {
                if let Some(metric) = series.get_mut("metric") {
                    strip(metric);
                }
            }
        }
        "/api/v1/series" => data.as_array_mut()?.iter_mut().for_each(strip),
        "/api/v1/labels" => data
            .as_array_mut()?
            .retain(|l| !l.as_str().is_some_and(|l| hidden.iter().any(|h| h == l))),
        path => {
            let name = path
                .strip_prefix("/api/v1/label/")?
                .strip_suffix("/values")?;
            if hidden.iter().any(|h| h == name) {
                *data = serde_json::Value::Array(Vec::new());
            }
        }
    }
    serde_json::to_vec(&answer).ok().map(Bytes::from)
}

/// An error in the Prometheus API's own shape, so Grafana shows the message.
fn api_error(refusal: Refusal) -> Response<Body> {
    let kind = match refusal.status {
        StatusCode::FORBIDDEN => "forbidden",
        StatusCode::UNAUTHORIZED => "unauthorized",
        s if s.is_server_error() => "unavailable",
        _ => "bad_data",
    };
    // CEEMS's bytes: its fields in this order, and the newline Go's encoder ends with.
    #[derive(serde::Serialize)]
    #[serde(rename_all = "camelCase")]
    struct ApiError<'a> {
        status: &'a str,
        data: Option<()>,
        error_type: &'a str,
        error: &'a str,
    }
    let mut body = serde_json::to_vec(&ApiError {
        status: "error",
        data: None,
        error_type: kind,
        error: &refusal.message,
    })
    .unwrap_or_default();
    body.push(b'\n');
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = refusal.status;
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn pairs(q: &str) -> Vec<(String, String)> {
        parameters(Some(q), None, b"").unwrap()
    }

    #[test]
    fn the_cluster_comes_from_the_path_the_header_or_ceems_id_and_must_agree() {
        let pool = |id: &str| {
            let urls = ["http://127.0.0.1:1".to_owned()];
            let p = Pool::new(
                id,
                &urls,
                backend::Strategy::RoundRobin,
                Duration::from_secs(1),
            );
            (id.to_owned(), Arc::new(p.unwrap()))
        };
        let one: BTreeMap<_, _> = [pool("a")].into();
        let two: BTreeMap<_, _> = [pool("a"), pool("b")].into();
        assert_eq!(
            split_cluster(&two, "/b/api/v1/query"),
            (Some("b"), "/api/v1/query")
        );
        assert_eq!(
            split_cluster(&two, "/api/v1/query"),
            (None, "/api/v1/query")
        );
        assert_eq!(
            split_cluster(&two, "/c/api/v1/query"),
            (None, "/c/api/v1/query")
        );
        let none = BTreeSet::new();
        let labels = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
        let id = |r: Result<Arc<Pool>, Refusal>| r.map(|p| p.cluster.clone()).map_err(|e| e.status);
        assert_eq!(id(choose_pool(&one, None, None, &none)), Ok("a".into()));
        assert_eq!(
            id(choose_pool(&two, None, None, &none)),
            Err(StatusCode::BAD_REQUEST)
        );
        assert_eq!(
            id(choose_pool(&two, Some("b"), None, &none)),
            Ok("b".into())
        );
        assert_eq!(
            id(choose_pool(&two, None, Some("b"), &none)),
            Ok("b".into())
        );
        assert_eq!(
            id(choose_pool(&two, None, None, &labels(&["b"]))),
            Ok("b".into())
        );
        assert_eq!(
            id(choose_pool(&two, Some("a"), None, &labels(&["b"]))),
            Err(StatusCode::BAD_REQUEST)
        );
        assert_eq!(
            id(choose_pool(&two, None, Some("c"), &none)),
            Err(StatusCode::BAD_REQUEST)
        );
    }

    #[test]
    fn hidden_labels_leave_every_kind_of_answer() {
        let hidden = ["hostname".to_owned()];
        let filtered = |path: &str, body: &str| {
            let out = filter_answer(path, body.as_bytes(), &hidden).unwrap();
            serde_json::from_slice::<serde_json::Value>(&out).unwrap()["data"].clone()
        };
        let q = r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"uuid":"1","hostname":"n1"},"value":[1,"2"]}]}}"#;
        assert_eq!(
            filtered("/api/v1/query", q)["result"][0]["metric"],
            serde_json::json!({"uuid": "1"})
        );
        let series = r#"{"status":"success","data":[{"uuid":"1","hostname":"n1"}]}"#;
        assert_eq!(
            filtered("/api/v1/series", series),
            serde_json::json!([{"uuid": "1"}])
        );
        let labels = r#"{"status":"success","data":["hostname","uuid"]}"#;
        assert_eq!(
            filtered("/api/v1/labels", labels),
            serde_json::json!(["uuid"])
        );
        let values = r#"{"status":"success","data":["n1","n2"]}"#;
        assert_eq!(
            filtered("/api/v1/label/hostname/values", values),
            serde_json::json!([])
        );
        assert_eq!(
            filtered("/api/v1/label/uuid/values", values),
            serde_json::json!(["n1", "n2"])
        );
        assert!(filter_answer("/api/v1/query", b"not json", &hidden).is_none());
    }

    #[test]
    fn only_the_query_series_and_label_apis_are_relayed() {
        assert_eq!(endpoint("/api/v1/query"), Some(Endpoint::Query));
        assert_eq!(endpoint("/api/v1/query_range"), Some(Endpoint::Query));
        assert_eq!(endpoint("/api/v1/series"), Some(Endpoint::Series));
        assert_eq!(
            endpoint("/api/v1/label/uuid/values"),
            Some(Endpoint::Series)
        );
        for p in [
            "/api/v1/admin/tsdb/delete_series",
            "/api/v1/label//values",
            "/api/v1/label/a/b/values",
            "/api/v1/label/..%2Fadmin/values",
            "/api/v1/label/1x/values",
            "/api/v1/status/config",
            "/federate",
            "/api/v1/query/",
        ] {
            assert_eq!(endpoint(p), None, "{p}");
        }
    }

    #[test]
    fn body_and_url_parameters_are_all_checked() {
        let params = parameters(
            Some("query=a%7Buuid%3D%221%22%7D"),
            Some("application/x-www-form-urlencoded; charset=utf-8"),
            b"query=b%7Buuid%3D%222%22%7D",
        )
        .unwrap();
        let units = requested_scope(Endpoint::Query, &params).unwrap().units;
        assert_eq!(units.into_iter().collect::<Vec<_>>(), ["1", "2"]);
        // A smuggled second query that names no unit spoils the request.
        let params = pairs("query=a%7Buuid%3D%221%22%7D&query=b");
        assert_eq!(
            requested_scope(Endpoint::Query, &params)
                .unwrap_err()
                .status,
            StatusCode::FORBIDDEN
        );
        assert_eq!(
            parameters(Some("query=a;query=b"), None, b"")
                .unwrap_err()
                .status,
            StatusCode::BAD_REQUEST
        );
        assert_eq!(
            parameters(None, Some("multipart/form-data; boundary=x"), b"--x")
                .unwrap_err()
                .status,
            StatusCode::UNSUPPORTED_MEDIA_TYPE
        );
    }

    #[test]
    fn requests_naming_no_unit_are_refused() {
        for (endpoint, q) in [
            (Endpoint::Query, ""),
            (Endpoint::Query, "query=time()"),
            (Endpoint::Series, ""),
            (Endpoint::Series, "match[]=up"),
        ] {
            let r = requested_scope(endpoint, &pairs(q)).unwrap_err();
            assert_eq!(r.status, StatusCode::FORBIDDEN, "{q}: {r:?}");
        }
        let r = requested_scope(Endpoint::Query, &pairs("query=sum((")).unwrap_err();
        assert_eq!(r.status, StatusCode::BAD_REQUEST);
        assert_eq!(
            requested_scope(Endpoint::Series, &pairs("match[]=%7Buuid%3D%227%22%7D"))
                .unwrap()
                .units
                .len(),
            1
        );
    }
}
