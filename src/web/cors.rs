//! Cross-origin requests as CEEMS's API server answers them (`--web.cors.origin`): a browser's
//! preflight from a matching origin gets 200 and the headers that allow it, and every answer
//! to a matching origin names that origin back.

use hyper::header::{HeaderValue, ORIGIN, VARY};
use hyper::{Method, Request, Response, StatusCode};

use super::Body;

/// Which origins may call, and the request header that names the user.
pub struct Cors {
    origin: regex::Regex,
    allow_headers: HeaderValue,
}

impl Cors {
    /// `origin` is a regex the whole `Origin` must match (CEEMS's default: `.*`).
    pub fn new(origin: &str, user_header: &str) -> Result<Cors, String> {
        let origin = regex::Regex::new(&format!("^(?s:{origin})$"))
            .map_err(|e| format!("--web.cors.origin `{origin}`: {e}"))?;
        let allow = format!("Accept, Authorization, Content-Type, Origin, {user_header}");
        let allow_headers =
            HeaderValue::from_str(&allow).map_err(|e| format!("{user_header}: {e}"))?;
        Ok(Cors {
            origin,
            allow_headers,
        })
    }

    fn allowed<'a>(&self, req: &'a Request<impl Sized>) -> Option<&'a HeaderValue> {
        let origin = req.headers().get(ORIGIN)?;
        self.origin
            .is_match(origin.to_str().ok()?)
            .then_some(origin)
    }

    /// The answer to a preflight (`OPTIONS` with `Access-Control-Request-Method`) from an
    /// allowed origin; `None` for any other request.
    pub fn preflight(&self, req: &Request<impl Sized>) -> Option<Response<Body>> {
        if req.method() != Method::OPTIONS
            || !req.headers().contains_key("access-control-request-method")
        {
            return None;
        }
        let origin = self.allowed(req)?.clone();
        let mut resp = Response::new(Body::default());
        *resp.status_mut() = StatusCode::OK;
        let h = resp.headers_mut();
        h.insert("access-control-allow-headers", self.allow_headers.clone());
        h.insert(
            "access-control-allow-methods",
            HeaderValue::from_static("GET"),
        );
        h.insert("access-control-allow-origin", origin);
        h.insert(
            "access-control-expose-headers",
            HeaderValue::from_static("Date"),
        );
        h.insert(VARY, HeaderValue::from_static("Origin"));
        h.insert("content-length", HeaderValue::from_static("0"));
        Some(resp)
    }

    /// Names an allowed origin back on an answer to it.
    pub fn allow(&self, req: &Request<impl Sized>, resp: &mut Response<Body>) {
        if let Some(origin) = self.allowed(req) {
            let h = resp.headers_mut();
            h.insert("access-control-allow-origin", origin.clone());
            h.insert(
                "access-control-expose-headers",
                HeaderValue::from_static("Date"),
            );
            h.append(VARY, HeaderValue::from_static("Origin"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(method: Method, origin: &str) -> Request<()> {
        Request::builder()
            .method(method)
            .header(ORIGIN, origin)
            .header("access-control-request-method", "GET")
            .body(())
            .unwrap()
    }

    #[test]
    fn a_preflight_from_an_allowed_origin_is_allowed_and_named_back() {
        let cors = Cors::new(r"https://grafana\.example\.org", "X-Grafana-User").unwrap();
        let ok = cors
            .preflight(&request(Method::OPTIONS, "https://grafana.example.org"))
            .unwrap();
        assert_eq!(ok.status(), StatusCode::OK);
        assert_eq!(
            ok.headers()["access-control-allow-origin"],
            "https://grafana.example.org"
        );
        assert_eq!(
            ok.headers()["access-control-allow-headers"],
            "Accept, Authorization, Content-Type, Origin, X-Grafana-User"
        );
        // The whole origin must match, not a part of it.
        let evil = request(Method::OPTIONS, "https://grafana.example.org.evil.net");
        assert!(cors.preflight(&evil).is_none());
        assert!(cors
            .preflight(&request(Method::GET, "https://grafana.example.org"))
            .is_none());
        assert!(Cors::new("(", "X-Grafana-User").is_err());
    }
}
