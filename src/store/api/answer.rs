//! The envelope every answer is in.

use std::sync::{Arc, OnceLock};

use super::*;

/// The start of a successful answer, up to its data.
pub(super) const SUCCESS_HEAD: &str = r#"{"status":"success","data":"#;

/// An API answer: status and JSON body, shared (not copied) by the caches and the response.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: StatusCode,
    pub body: bytes::Bytes,
    /// The body compressed, made for the first request that asks for it and shared by every
    /// copy of this answer: compressing a user's day of jobs (200 KB) for each request of
    /// Grafana, which asks for gzip, cost more than the rest of the answer.
    compressed: Arc<OnceLock<Option<bytes::Bytes>>>,
}

impl PartialEq for Answer {
    fn eq(&self, other: &Answer) -> bool {
        self.status == other.status && self.body == other.body
    }
}

impl Answer {
    pub fn new(status: StatusCode, body: bytes::Bytes) -> Answer {
        Answer {
            status,
            body,
            compressed: Default::default(),
        }
    }

    /// The body as `compress` makes it, made once for this answer and its copies (so a server
    /// passes the same coding every time); None where `compress` gave none.
    pub fn compressed(
        &self,
        compress: impl FnOnce(&[u8]) -> Option<bytes::Bytes>,
    ) -> Option<bytes::Bytes> {
        self.compressed.get_or_init(|| compress(&self.body)).clone()
    }

    pub(super) fn data(data: Value) -> Answer {
        Answer::new(
            StatusCode::OK,
            json!({"status": "success", "data": data})
                .to_string()
                .into(),
        )
    }

    /// `data` already serialized (by SQLite's JSON functions).
    pub(super) fn raw_data(data: &str) -> Answer {
        let mut body = String::with_capacity(SUCCESS_HEAD.len() + data.len() + 1);
        body.push_str(SUCCESS_HEAD);
        body.push_str(data);
        Answer::success_body(body)
    }

    /// `body` is `SUCCESS_HEAD`, the data, and an open brace to close.
    pub(super) fn success_body(mut body: String) -> Answer {
        body.push('}');
        Answer::new(StatusCode::OK, body.into())
    }

    fn error(status: StatusCode, kind: &str, message: impl Into<String>) -> Answer {
        Answer::new(
            status,
            json!({"status": "error", "data": null, "errorType": kind, "error": message.into()})
                .to_string()
                .into(),
        )
    }

    /// The body as text (it is always JSON, so UTF-8).
    pub fn text(&self) -> &str {
        std::str::from_utf8(&self.body).unwrap_or_default()
    }

    /// The body parsed, for tests and tools.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

/// Why a request got no data. The kind makes the HTTP status and the envelope's `errorType`;
/// the message is the envelope's `error`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    /// A parameter or path the API does not take.
    #[error("{0}")]
    BadData(String),
    /// No user named in the user header.
    #[error("{0}")]
    Unauthorized(String),
    /// Someone else's job, or an admin route for a user who is not one.
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Internal(String),
    /// The database does not answer.
    #[error("{0}")]
    Unavailable(String),
}

impl ApiError {
    pub(super) fn bad(message: impl Into<String>) -> ApiError {
        ApiError::BadData(message.into())
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadData(_) => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The envelope's `errorType`, as CEEMS names it.
    pub fn kind(&self) -> &'static str {
        match self {
            ApiError::BadData(_) => "bad_data",
            ApiError::Unauthorized(_) => "unauthorized",
            ApiError::Forbidden(_) => "forbidden",
            ApiError::NotFound(_) => "not_found",
            ApiError::Internal(_) => "internal",
            ApiError::Unavailable(_) => "unavailable",
        }
    }
}

impl From<ApiError> for Answer {
    fn from(e: ApiError) -> Answer {
        Answer::error(e.status(), e.kind(), e.to_string())
    }
}

/// A failed query: the log says why, the answer only that it failed.
pub(super) fn query_failed(e: impl std::fmt::Display) -> ApiError {
    tracing::warn!(error = %e, "API query failed");
    ApiError::Internal("database query failed".into())
}
