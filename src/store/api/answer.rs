//! The envelope every answer is in.

use super::*;

/// The start of a successful answer, up to its data.
pub(super) const SUCCESS_HEAD: &str = r#"{"status":"success","data":"#;

/// An API answer: status and JSON body, shared (not copied) by the cache and the response.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub status: StatusCode,
    pub body: bytes::Bytes,
}

impl Answer {
    pub(super) fn data(data: Value) -> Answer {
        Answer {
            status: StatusCode::OK,
            body: json!({"status": "success", "data": data})
                .to_string()
                .into(),
        }
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
        Answer {
            status: StatusCode::OK,
            body: body.into(),
        }
    }

    pub fn error(status: StatusCode, kind: &str, message: impl Into<String>) -> Answer {
        Answer {
            status,
            body: json!({"status": "error", "errorType": kind, "error": message.into()})
                .to_string()
                .into(),
        }
    }

    /// The body as text (it is always JSON, so UTF-8).
    pub fn text(&self) -> &str {
        std::str::from_utf8(&self.body).unwrap_or_default()
    }

    /// The body parsed, for tests and tools.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    pub(super) fn bad(message: impl Into<String>) -> Answer {
        Answer::error(StatusCode::BAD_REQUEST, "bad_data", message)
    }
}

pub(super) fn query_failed(e: impl std::fmt::Display) -> Answer {
    tracing::warn!(error = %e, "API query failed");
    Answer::error(
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal",
        "database query failed",
    )
}
