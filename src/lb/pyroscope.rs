//! Pyroscope behind `ceems lb`, as CEEMS's Pyroscope load balancer: a user may call three
//! methods of the querier's Connect API (`SelectMergeStacktraces`, `LabelNames`,
//! `LabelValues`), for the units its label selectors name with `service_name="…"` (how
//! CEEMS's profilers label a job's profiles). The body is read as the protobuf or Connect JSON
//! message of the method; the bytes relayed are the ones read.

use serde::Deserialize;

use super::query::{self, Scope, ScopeError};

/// The label of a profile that names its unit.
pub const UNIT_LABEL: &str = "service_name";

/// The querier's service, the prefix of its methods' paths.
pub(super) const QUERIER: &str = "/querier.v1.QuerierService/";

/// The methods a user may call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    SelectMergeStacktraces,
    LabelNames,
    LabelValues,
}

/// The method a path calls, when a user may call it.
pub fn call(path: &str) -> Option<Call> {
    match path.strip_prefix(QUERIER)? {
        "SelectMergeStacktraces" => Some(Call::SelectMergeStacktraces),
        "LabelNames" => Some(Call::LabelNames),
        "LabelValues" => Some(Call::LabelValues),
        _ => None,
    }
}

/// What an admin may call besides: every method of the querier (all of them read), and GETs of
/// the HTTP API; never the ingestion or admin paths.
pub fn admin_may_call(method: &hyper::Method, path: &str) -> bool {
    let querier_method = path
        .strip_prefix(QUERIER)
        .is_some_and(|m| !m.is_empty() && m.chars().all(|c| c.is_ascii_alphanumeric()));
    (method == hyper::Method::POST && querier_method)
        || (method == hyper::Method::GET
            && path.starts_with("/api/v1/")
            && !path.starts_with("/api/v1/admin/"))
}

/// How a request's message is encoded (Connect's unary protocol).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Proto,
    Json,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PyroError {
    #[error("a {0} body is not relayed: send Connect's application/proto or application/json (Grafana's datasource does)")]
    Unsupported(String),
    #[error("a compressed request body is not relayed ({0})")]
    Compressed(String),
    #[error("the {call:?} request is not a valid message: {reason}")]
    Malformed { call: Call, reason: String },
    #[error(transparent)]
    Scope(#[from] ScopeError),
}

/// The encoding named by a request's `Content-Type`; none is protobuf, as CEEMS reads it.
pub fn encoding(content_type: Option<&str>) -> Result<Encoding, PyroError> {
    let Some(raw) = content_type else {
        return Ok(Encoding::Proto);
    };
    let mime = raw
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    match mime.as_str() {
        "" | "application/proto" | "application/protobuf" | "application/x-protobuf" => {
            Ok(Encoding::Proto)
        }
        "application/json" => Ok(Encoding::Json),
        _ => Err(PyroError::Unsupported(raw.chars().take(80).collect())),
    }
}

/// What a call asks: its label selectors and its time range (milliseconds; 0 when not given).
#[derive(Debug, Default, PartialEq)]
pub struct Asked {
    pub selectors: Vec<String>,
    pub start_ms: i64,
    pub end_ms: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
struct SelectMergeStacktracesRequest {
    #[prost(string, tag = "2")]
    label_selector: String,
    #[prost(int64, tag = "3")]
    start: i64,
    #[prost(int64, tag = "4")]
    end: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
struct LabelNamesRequest {
    #[prost(string, repeated, tag = "1")]
    matchers: Vec<String>,
    #[prost(int64, tag = "2")]
    start: i64,
    #[prost(int64, tag = "3")]
    end: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
struct LabelValuesRequest {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(string, repeated, tag = "2")]
    matchers: Vec<String>,
    #[prost(int64, tag = "3")]
    start: i64,
    #[prost(int64, tag = "4")]
    end: i64,
}

/// The same messages in protobuf's JSON mapping (lowerCamel names, the proto names accepted
/// too, 64-bit integers as strings or numbers; a field given twice is an error).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SelectJson {
    #[serde(default, alias = "label_selector")]
    label_selector: Option<String>,
    #[serde(default, deserialize_with = "int64")]
    start: i64,
    #[serde(default, deserialize_with = "int64")]
    end: i64,
}

#[derive(Deserialize)]
struct LabelsJson {
    #[serde(default)]
    matchers: Option<Vec<String>>,
    #[serde(default, deserialize_with = "int64")]
    start: i64,
    #[serde(default, deserialize_with = "int64")]
    end: i64,
}

fn int64<'de, D: serde::Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Int {
        Number(i64),
        Text(String),
        Null(()),
    }
    match Int::deserialize(d)? {
        Int::Number(n) => Ok(n),
        Int::Text(t) => t.trim().parse().map_err(serde::de::Error::custom),
        Int::Null(()) => Ok(0),
    }
}

/// Longest body read: a selector naming a few hundred jobs is a few KiB.
pub const MAX_BODY_BYTES: usize = 256 << 10;

/// What `body`, the message of `call` in `encoding`, asks.
pub fn asked(call: Call, encoding: Encoding, body: &[u8]) -> Result<Asked, PyroError> {
    use prost::Message as _;
    let malformed = |reason: String| PyroError::Malformed { call, reason };
    let proto = |e: prost::DecodeError| malformed(e.to_string());
    let json = |e: serde_json::Error| malformed(e.to_string());
    Ok(match (call, encoding) {
        (Call::SelectMergeStacktraces, Encoding::Proto) => {
            let m = SelectMergeStacktracesRequest::decode(body).map_err(proto)?;
            Asked {
                selectors: vec![m.label_selector],
                start_ms: m.start,
                end_ms: m.end,
            }
        }
        (Call::SelectMergeStacktraces, Encoding::Json) => {
            let m: SelectJson = serde_json::from_slice(body).map_err(json)?;
            Asked {
                selectors: vec![m.label_selector.unwrap_or_default()],
                start_ms: m.start,
                end_ms: m.end,
            }
        }
        (Call::LabelNames, Encoding::Proto) => {
            let m = LabelNamesRequest::decode(body).map_err(proto)?;
            Asked {
                selectors: m.matchers,
                start_ms: m.start,
                end_ms: m.end,
            }
        }
        (Call::LabelValues, Encoding::Proto) => {
            let m = LabelValuesRequest::decode(body).map_err(proto)?;
            Asked {
                selectors: m.matchers,
                start_ms: m.start,
                end_ms: m.end,
            }
        }
        (Call::LabelNames | Call::LabelValues, Encoding::Json) => {
            let m: LabelsJson = serde_json::from_slice(body).map_err(json)?;
            Asked {
                selectors: m.matchers.unwrap_or_default(),
                start_ms: m.start,
                end_ms: m.end,
            }
        }
    })
}

/// `body`, the message of `call`, asking for `[start_ms, end_ms]` instead of its own times:
/// protobuf's fields appended (the last of a field wins, as Pyroscope reads it), JSON's
/// replaced.
pub fn with_times(
    call: Call,
    encoding: Encoding,
    body: &[u8],
    start_ms: i64,
    end_ms: i64,
) -> Result<Vec<u8>, PyroError> {
    match encoding {
        Encoding::Proto => {
            let (start_tag, end_tag) = match call {
                Call::SelectMergeStacktraces | Call::LabelValues => (3, 4),
                Call::LabelNames => (2, 3),
            };
            let mut out = body.to_vec();
            prost::encoding::int64::encode(start_tag, &start_ms, &mut out);
            prost::encoding::int64::encode(end_tag, &end_ms, &mut out);
            Ok(out)
        }
        Encoding::Json => {
            let mut message: serde_json::Map<String, serde_json::Value> =
                serde_json::from_slice(body).map_err(|e| PyroError::Malformed {
                    call,
                    reason: e.to_string(),
                })?;
            message.insert("start".into(), start_ms.to_string().into());
            message.insert("end".into(), end_ms.to_string().into());
            Ok(serde_json::to_vec(&message).unwrap_or_default())
        }
    }
}

/// The units the call reads: every selector must name its units; a call with none reads all.
pub fn scope(asked: &Asked) -> Result<Scope, PyroError> {
    let mut scope = Scope::default();
    if asked.selectors.is_empty() {
        return Err(ScopeError::Unscoped("no label selector".into(), UNIT_LABEL).into());
    }
    for s in &asked.selectors {
        scope.extend(query::scope_of_labelled_selector(s, UNIT_LABEL)?);
    }
    Ok(scope)
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message as _;

    fn select(selector: &str, start: i64) -> Vec<u8> {
        SelectMergeStacktracesRequest {
            label_selector: selector.into(),
            start,
            end: start + 1,
        }
        .encode_to_vec()
    }

    #[test]
    fn only_three_querier_methods_are_a_users() {
        assert_eq!(
            call("/querier.v1.QuerierService/SelectMergeStacktraces"),
            Some(Call::SelectMergeStacktraces)
        );
        assert_eq!(
            call("/querier.v1.QuerierService/LabelValues"),
            Some(Call::LabelValues)
        );
        for p in [
            "/querier.v1.QuerierService/SelectMergeProfile",
            "/querier.v1.QuerierService/LabelNames/",
            "/x/querier.v1.QuerierService/LabelNames",
            "/push.v1.PusherService/Push",
            "/api/v1/status/config",
            "/",
        ] {
            assert_eq!(call(p), None, "{p}");
        }
        use hyper::Method;
        assert!(admin_may_call(
            &Method::POST,
            "/querier.v1.QuerierService/SelectSeries"
        ));
        assert!(admin_may_call(&Method::GET, "/api/v1/status/config"));
        assert!(!admin_may_call(
            &Method::POST,
            "/push.v1.PusherService/Push"
        ));
        assert!(!admin_may_call(&Method::POST, "/ingest"));
        assert!(!admin_may_call(
            &Method::POST,
            "/querier.v1.QuerierService/../x"
        ));
    }

    /// The message CEEMS's `pyro_requestor` sends: raw protobuf, no Content-Type.
    #[test]
    fn a_protobuf_selection_names_its_service() {
        let body = select(r#"{service_name="1479763"}"#, 1645450627000);
        let enc = encoding(None).unwrap();
        let a = asked(Call::SelectMergeStacktraces, enc, &body).unwrap();
        assert_eq!(a.start_ms, 1645450627000);
        let s = scope(&a).unwrap();
        assert_eq!(s.units.into_iter().collect::<Vec<_>>(), ["1479763"]);
        // Label names and values name theirs in matchers.
        let body = LabelValuesRequest {
            name: "__name__".into(),
            matchers: vec![
                r#"{service_name="1"}"#.into(),
                r#"{service_name=~"2|3"}"#.into(),
            ],
            start: 1,
            end: 2,
        }
        .encode_to_vec();
        let a = asked(Call::LabelValues, Encoding::Proto, &body).unwrap();
        assert_eq!(scope(&a).unwrap().units.len(), 3);
    }

    #[test]
    fn connect_json_is_read_too() {
        let enc = encoding(Some("application/json; charset=utf-8")).unwrap();
        let a = asked(
            Call::SelectMergeStacktraces,
            enc,
            br#"{"profileTypeID":"process_cpu:cpu:nanoseconds:cpu:nanoseconds","labelSelector":"{service_name=\"7\"}","start":"1700000000000","end":1700000060000}"#,
        )
        .unwrap();
        assert_eq!((a.start_ms, a.end_ms), (1700000000000, 1700000060000));
        assert_eq!(
            scope(&a).unwrap().units.into_iter().collect::<Vec<_>>(),
            ["7"]
        );
        let a = asked(
            Call::LabelNames,
            enc,
            br#"{"matchers":["{service_name=\"8\"}"]}"#,
        )
        .unwrap();
        assert_eq!(scope(&a).unwrap().units.len(), 1);
        // The same field twice is not guessed at.
        let e = asked(
            Call::SelectMergeStacktraces,
            enc,
            br#"{"labelSelector":"{service_name=\"7\"}","label_selector":"{}"}"#,
        )
        .unwrap_err();
        assert!(matches!(e, PyroError::Malformed { .. }), "{e}");
    }

    /// The times a window gives replace the message's, however it was encoded.
    #[test]
    fn times_are_replaced_in_either_encoding() {
        for call in [
            Call::SelectMergeStacktraces,
            Call::LabelNames,
            Call::LabelValues,
        ] {
            let body = match call {
                Call::SelectMergeStacktraces => select(r#"{service_name="1"}"#, 5),
                Call::LabelNames => LabelNamesRequest {
                    matchers: vec![r#"{service_name="1"}"#.into()],
                    start: 5,
                    end: 6,
                }
                .encode_to_vec(),
                Call::LabelValues => LabelValuesRequest {
                    name: "x".into(),
                    matchers: vec![r#"{service_name="1"}"#.into()],
                    start: 5,
                    end: 6,
                }
                .encode_to_vec(),
            };
            let patched = with_times(call, Encoding::Proto, &body, 1000, 2000).unwrap();
            let a = asked(call, Encoding::Proto, &patched).unwrap();
            assert_eq!((a.start_ms, a.end_ms), (1000, 2000), "{call:?}");
            assert_eq!(a.selectors, [r#"{service_name="1"}"#]);
        }
        let json = br#"{"labelSelector":"{service_name=\"1\"}","start":"5","end":6}"#;
        let patched = with_times(
            Call::SelectMergeStacktraces,
            Encoding::Json,
            json,
            1000,
            2000,
        )
        .unwrap();
        let a = asked(Call::SelectMergeStacktraces, Encoding::Json, &patched).unwrap();
        assert_eq!((a.start_ms, a.end_ms), (1000, 2000));
    }

    #[test]
    fn selectors_that_name_no_unit_and_bad_bodies_are_refused() {
        for selector in [
            "{}",
            "",
            r#"{service_name!="1"}"#,
            r#"{service_name=~"1.*"}"#,
            r#"{namespace="x"}"#,
        ] {
            let a = asked(
                Call::SelectMergeStacktraces,
                Encoding::Proto,
                &select(selector, 0),
            )
            .unwrap();
            assert!(scope(&a).is_err(), "{selector}");
        }
        let none = asked(Call::LabelNames, Encoding::Proto, b"").unwrap();
        assert!(scope(&none).is_err());
        assert!(matches!(
            asked(
                Call::SelectMergeStacktraces,
                Encoding::Proto,
                b"\xff\xff\xff"
            ),
            Err(PyroError::Malformed { .. })
        ));
        assert!(matches!(
            encoding(Some("application/grpc+proto")),
            Err(PyroError::Unsupported(_))
        ));
        // The message is read as Pyroscope reads it: the last of a repeated field wins.
        let mut twice = select(r#"{service_name="1"}"#, 0);
        twice.extend(select(r#"{service_name="2"}"#, 0));
        let a = asked(Call::SelectMergeStacktraces, Encoding::Proto, &twice).unwrap();
        assert_eq!(a.selectors, [r#"{service_name="2"}"#]);
    }
}
