//! `ceems lb`: a proxy in front of the Prometheus-API stores of each cluster that lets a
//! user's query through only when every compute unit it can read is theirs (or their
//! projects'), checked against the stats-server's database. Admins pass unchecked; every path
//! but the query, series and label APIs is refused.

pub mod backend;
pub mod query;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderName, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};

use crate::store::db::Store;
use crate::web::Body;
use backend::Pool;

/// The header that picks the cluster when several are served.
pub const CLUSTER_HEADER: &str = "x-ceems-cluster-id";

/// Longest user name accepted, as the stats-server's.
const MAX_USER_BYTES: usize = 256;

/// Largest form body read (a query is at most [`query::MAX_QUERY_BYTES`]).
const MAX_BODY_BYTES: usize = 4 * query::MAX_QUERY_BYTES;

/// Request headers passed on to the stores; the rest (the user's, admin-looking headers,
/// credentials, cookies) stays here.
const FORWARDED_REQUEST_HEADERS: &[&str] =
    &["accept", "accept-encoding", "content-type", "user-agent"];
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
            (!name.is_empty() && !name.contains('/')).then_some(Endpoint::Series)
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
}

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

/// What finds the units of one parameter's value.
type Analyser = fn(&str) -> Result<BTreeSet<String>, query::ScopeError>;

/// Every unit the request can read, from every value of its `query` or `match[]`
/// parameters; a request that names none is refused.
pub fn requested_units(
    endpoint: Endpoint,
    params: &[(String, String)],
) -> Result<BTreeSet<String>, Refusal> {
    let (name, analyse): (&str, Analyser) = match endpoint {
        Endpoint::Query => ("query", query::units_of_query),
        Endpoint::Series => ("match[]", query::units_of_selector),
    };
    let mut units = BTreeSet::new();
    for (_, value) in params.iter().filter(|(k, _)| k == name) {
        match analyse(value) {
            Ok(u) => units.extend(u),
            Err(e @ query::ScopeError::Parse(_)) => {
                return Err(Refusal::new(StatusCode::BAD_REQUEST, e.to_string()))
            }
            Err(e) => return Err(Refusal::forbidden(e.to_string())),
        }
    }
    if units.is_empty() {
        return Err(Refusal::forbidden(format!(
            "the request names no unit: only admins may query without {}=\"<job id>\"",
            query::UNIT_LABEL
        )));
    }
    Ok(units)
}

/// The proxy: the stores of each cluster, the database that says who owns what, and who the
/// admins are.
pub struct Lb {
    pools: BTreeMap<String, Arc<Pool>>,
    store: Arc<Store>,
    user_header: HeaderName,
    admins: BTreeSet<String>,
}

impl Lb {
    pub fn new(
        pools: BTreeMap<String, Arc<Pool>>,
        store: Arc<Store>,
        user_header: HeaderName,
        admins: BTreeSet<String>,
    ) -> Lb {
        Lb {
            pools,
            store,
            user_header,
            admins,
        }
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
        let endpoint = endpoint(parts.uri.path()).ok_or_else(|| {
            Refusal::forbidden(format!("{} is not relayed by ceems lb", parts.uri.path()))
        })?;
        if parts.method != Method::GET && parts.method != Method::POST {
            return Err(Refusal::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "only GET and POST are relayed",
            ));
        }
        let user = match parts
            .headers
            .get(&self.user_header)
            .map(|v| v.to_str().map(str::trim))
        {
            Some(Ok(u)) if u.len() > MAX_USER_BYTES => {
                return Err(Refusal::new(
                    StatusCode::BAD_REQUEST,
                    format!(
                        "the {} header is longer than {MAX_USER_BYTES} bytes",
                        self.user_header
                    ),
                ))
            }
            Some(Ok(u)) if !u.is_empty() => u.to_owned(),
            _ => {
                return Err(Refusal::new(
                    StatusCode::UNAUTHORIZED,
                    format!("no user: the request has no {} header", self.user_header),
                ))
            }
        };
        let pool = self.pool(&parts.headers)?;
        let body = Limited::new(body, MAX_BODY_BYTES)
            .collect()
            .await
            .map_err(|e| Refusal::new(StatusCode::PAYLOAD_TOO_LARGE, format!("request body: {e}")))?
            .to_bytes();
        let content_type = parts
            .headers
            .get(hyper::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok());
        let params = parameters(parts.uri.query(), content_type, &body)?;
        if !self.is_admin(&user).await {
            let units = requested_units(endpoint, &params)?;
            let wanted: Vec<String> = units.iter().cloned().collect();
            let readable = self
                .store
                .units_readable_by(&pool.cluster, &user, &wanted)
                .await
                .map_err(|e| {
                    Refusal::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!("ownership check: {e}"),
                    )
                })?;
            if let Some(other) = units.iter().find(|u| !readable.contains(*u)) {
                tracing::info!(%user, unit = %other, cluster = %pool.cluster, "query refused");
                return Err(Refusal::forbidden(format!(
                    "unit {other} of cluster {} is not {user}'s",
                    pool.cluster
                )));
            }
        }
        let headers: Vec<(HeaderName, HeaderValue)> = parts
            .headers
            .iter()
            .filter(|(k, _)| FORWARDED_REQUEST_HEADERS.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let path_and_query = parts
            .uri
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/");
        let answer = pool
            .forward(parts.method.clone(), path_and_query, &headers, body)
            .await
            .map_err(|e| Refusal::new(StatusCode::BAD_GATEWAY, e.to_string()))?;
        let (from, body) = answer.into_parts();
        let mut resp = Response::new(body);
        *resp.status_mut() = from.status;
        for (k, v) in from.headers.iter() {
            if FORWARDED_RESPONSE_HEADERS.contains(&k.as_str()) {
                resp.headers_mut().insert(k.clone(), v.clone());
            }
        }
        Ok(resp)
    }

    /// The cluster the request names, or the only one served.
    fn pool(&self, headers: &hyper::HeaderMap) -> Result<Arc<Pool>, Refusal> {
        match headers.get(CLUSTER_HEADER).map(|v| v.to_str()) {
            Some(Ok(id)) => self.pools.get(id.trim()).cloned().ok_or_else(|| {
                Refusal::new(
                    StatusCode::BAD_REQUEST,
                    format!("no cluster {} here", id.trim()),
                )
            }),
            Some(Err(_)) => Err(Refusal::new(
                StatusCode::BAD_REQUEST,
                "X-Ceems-Cluster-Id is not text",
            )),
            None if self.pools.len() == 1 => {
                Ok(self.pools.values().next().cloned().expect("one pool"))
            }
            None => Err(Refusal::new(
                StatusCode::BAD_REQUEST,
                format!(
                    "name the cluster with X-Ceems-Cluster-Id (one of {})",
                    self.pools.keys().cloned().collect::<Vec<_>>().join(", ")
                ),
            )),
        }
    }

    async fn is_admin(&self, user: &str) -> bool {
        self.admins.contains(user) || self.store.is_admin(user).await.unwrap_or(false)
    }
}

/// An error in the Prometheus API's own shape, so Grafana shows the message.
fn api_error(refusal: Refusal) -> Response<Body> {
    let kind = match refusal.status {
        StatusCode::BAD_REQUEST => "bad_data",
        StatusCode::FORBIDDEN | StatusCode::UNAUTHORIZED => "forbidden",
        s if s.is_server_error() => "unavailable",
        _ => "bad_data",
    };
    let body = serde_json::json!({
        "status": "error",
        "errorType": kind,
        "error": refusal.message,
    });
    let mut resp = Response::new(Full::new(Bytes::from(body.to_string())));
    *resp.status_mut() = refusal.status;
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(q: &str) -> Vec<(String, String)> {
        parameters(Some(q), None, b"").unwrap()
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
        let units = requested_units(Endpoint::Query, &params).unwrap();
        assert_eq!(units.into_iter().collect::<Vec<_>>(), ["1", "2"]);
        // A smuggled second query that names no unit spoils the request.
        let params = pairs("query=a%7Buuid%3D%221%22%7D&query=b");
        assert_eq!(
            requested_units(Endpoint::Query, &params)
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
            let r = requested_units(endpoint, &pairs(q)).unwrap_err();
            assert_eq!(r.status, StatusCode::FORBIDDEN, "{q}: {r:?}");
        }
        let r = requested_units(Endpoint::Query, &pairs("query=sum((")).unwrap_err();
        assert_eq!(r.status, StatusCode::BAD_REQUEST);
        assert_eq!(
            requested_units(Endpoint::Series, &pairs("match[]=%7Buuid%3D%227%22%7D"))
                .unwrap()
                .len(),
            1
        );
    }
}
