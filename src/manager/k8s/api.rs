//! The Kubernetes API server, as the exporter asks it which pod (UID) a pod-resources entry
//! (namespace and name) is: plain HTTPS with a kubeconfig's server, CA and credentials, or the
//! in-cluster service account's token and CA.

use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine;
use serde::Deserialize;

use crate::web::client::{agent_with_tls, ClientTls, Timeouts};

/// The service account files of a pod (in-cluster configuration).
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    #[error("kubeconfig {path}: {message}")]
    Config { path: String, message: String },
    #[error("in-cluster configuration: {0}")]
    InCluster(String),
    #[error("GET {url}: {message}")]
    Request { url: String, message: String },
    #[error("GET {url}: {code}: {message}")]
    Status {
        url: String,
        code: u16,
        message: String,
    },
    #[error("pod list: {0}")]
    Parse(String),
}

/// A client of one API server.
pub struct KubeClient {
    server: String,
    agent: ureq::Agent,
    /// Where the bearer token comes from (read at each call: service-account tokens rotate).
    token: Token,
}

enum Token {
    None,
    Value(String),
    File(PathBuf),
}

/// A pod as the API lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodMeta {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct Kubeconfig {
    #[serde(default)]
    clusters: Vec<Named<ClusterEntry>>,
    #[serde(default)]
    contexts: Vec<Named<ContextEntry>>,
    #[serde(default)]
    users: Vec<Named<UserEntry>>,
    #[serde(default)]
    current_context: String,
}

#[derive(Debug, Deserialize)]
struct Named<T> {
    name: String,
    #[serde(alias = "cluster", alias = "context", alias = "user")]
    value: T,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct ClusterEntry {
    server: String,
    #[serde(default)]
    certificate_authority: Option<PathBuf>,
    #[serde(default)]
    certificate_authority_data: Option<String>,
    #[serde(default)]
    insecure_skip_tls_verify: bool,
}

#[derive(Debug, Default, Deserialize)]
struct ContextEntry {
    cluster: String,
    #[serde(default)]
    user: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
struct UserEntry {
    #[serde(default)]
    token: Option<String>,
    #[serde(default)]
    token_file: Option<PathBuf>,
    #[serde(default)]
    client_certificate: Option<PathBuf>,
    #[serde(default)]
    client_certificate_data: Option<String>,
    #[serde(default)]
    client_key: Option<PathBuf>,
    #[serde(default)]
    client_key_data: Option<String>,
}

/// PEM from a kubeconfig's `*-data` (base64) or file field, relative to the kubeconfig.
fn pem(
    data: &Option<String>,
    file: &Option<PathBuf>,
    base: &Path,
) -> Result<Option<Vec<u8>>, String> {
    if let Some(d) = data {
        return base64::engine::general_purpose::STANDARD
            .decode(d.trim())
            .map(Some)
            .map_err(|e| format!("not base64: {e}"));
    }
    match file {
        Some(f) => {
            let path = base.join(f);
            std::fs::read(&path)
                .map(Some)
                .map_err(|e| format!("{}: {e}", path.display()))
        }
        None => Ok(None),
    }
}

impl KubeClient {
    /// The client of a kubeconfig's current context.
    pub fn from_kubeconfig(path: &Path, timeout: Duration) -> Result<KubeClient, KubeError> {
        let bad = |message: String| KubeError::Config {
            path: path.display().to_string(),
            message,
        };
        let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
        let config: Kubeconfig = serde_norway::from_str(&text).map_err(|e| bad(e.to_string()))?;
        let base = path.parent().unwrap_or(Path::new("."));
        let context = match config.current_context.as_str() {
            "" => config.contexts.first(),
            name => config.contexts.iter().find(|c| c.name == name),
        }
        .ok_or_else(|| bad(format!("no context `{}`", config.current_context)))?;
        let cluster = config
            .clusters
            .iter()
            .find(|c| c.name == context.value.cluster)
            .ok_or_else(|| bad(format!("no cluster `{}`", context.value.cluster)))?;
        let default_user = UserEntry::default();
        let user = config
            .users
            .iter()
            .find(|u| u.name == context.value.user)
            .map(|u| &u.value)
            .unwrap_or(&default_user);
        let c = &cluster.value;
        let roots = pem(
            &c.certificate_authority_data,
            &c.certificate_authority,
            base,
        )
        .map_err(|e| bad(format!("certificate authority: {e}")))?;
        let cert = pem(
            &user.client_certificate_data,
            &user.client_certificate,
            base,
        )
        .map_err(|e| bad(format!("client certificate: {e}")))?;
        let key = pem(&user.client_key_data, &user.client_key, base)
            .map_err(|e| bad(format!("client key: {e}")))?;
        let tls = ClientTls {
            roots_pem: roots.unwrap_or_default(),
            identity_pem: cert.zip(key),
            insecure_skip_verify: c.insecure_skip_tls_verify,
        };
        let token = match (&user.token, &user.token_file) {
            (Some(t), _) => Token::Value(t.clone()),
            (None, Some(f)) => Token::File(base.join(f)),
            (None, None) => Token::None,
        };
        Ok(KubeClient {
            server: c.server.trim_end_matches('/').to_owned(),
            agent: agent_with_tls(Timeouts::all(timeout), &tls).map_err(bad)?,
            token,
        })
    }

    /// The client of the pod this process runs in (`KUBERNETES_SERVICE_HOST`, the service
    /// account's token and CA).
    pub fn in_cluster(dir: &Path, timeout: Duration) -> Result<KubeClient, KubeError> {
        let host = std::env::var("KUBERNETES_SERVICE_HOST")
            .map_err(|_| KubeError::InCluster("KUBERNETES_SERVICE_HOST is not set: not in a pod; give --collector.k8s.kubeconfig.file".into()))?;
        let port = std::env::var("KUBERNETES_SERVICE_PORT").unwrap_or_else(|_| "443".into());
        let roots = std::fs::read(dir.join("ca.crt"))
            .map_err(|e| KubeError::InCluster(format!("{}: {e}", dir.join("ca.crt").display())))?;
        let tls = ClientTls {
            roots_pem: roots,
            ..ClientTls::default()
        };
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host
        };
        Ok(KubeClient {
            server: format!("https://{host}:{port}"),
            agent: agent_with_tls(Timeouts::all(timeout), &tls).map_err(KubeError::InCluster)?,
            token: Token::File(dir.join("token")),
        })
    }

    /// The answer to `GET <server><path>`, with the bearer token.
    fn call(&self, path: &str) -> Result<ureq::Response, KubeError> {
        self.send("GET", path, None)
    }

    /// `DELETE <server><path>` with `body` (DeleteOptions), and the answer's body.
    pub fn delete(&self, path: &str, body: &serde_json::Value) -> Result<String, KubeError> {
        self.send("DELETE", path, Some(body))?
            .into_string()
            .map_err(|e| KubeError::Request {
                url: format!("{}{path}", self.server),
                message: e.to_string(),
            })
    }

    fn send(
        &self,
        method: &str,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<ureq::Response, KubeError> {
        let url = format!("{}{path}", self.server);
        let failed = |message: String| KubeError::Request {
            url: url.clone(),
            message,
        };
        let mut request = self
            .agent
            .request(method, &url)
            .set("Accept", "application/json");
        let token = match &self.token {
            Token::None => None,
            Token::Value(t) => Some(t.clone()),
            Token::File(f) => Some(
                std::fs::read_to_string(f)
                    .map_err(|e| failed(format!("token {}: {e}", f.display())))?
                    .trim()
                    .to_owned(),
            ),
        };
        if let Some(t) = token {
            request = request.set("Authorization", &format!("Bearer {t}"));
        }
        let sent = match body {
            Some(b) => request
                .set("Content-Type", "application/json")
                .send_string(&b.to_string()),
            None => request.call(),
        };
        match sent {
            Ok(r) => Ok(r),
            Err(ureq::Error::Status(code, r)) => Err(KubeError::Status {
                url: url.clone(),
                code,
                message: r.into_string().unwrap_or_default().trim().to_owned(),
            }),
            Err(e) => Err(failed(e.to_string())),
        }
    }

    /// The body of `GET <server><path>`.
    pub fn get(&self, path: &str) -> Result<String, KubeError> {
        self.call(path)?
            .into_string()
            .map_err(|e| KubeError::Request {
                url: format!("{}{path}", self.server),
                message: e.to_string(),
            })
    }

    /// The body of `GET <server><path>` as it arrives: a watch's events, one JSON per line.
    pub fn stream(&self, path: &str) -> Result<Box<dyn std::io::Read + Send + Sync>, KubeError> {
        Ok(self.call(path)?.into_reader())
    }

    /// The pods of node `node` (every pod without one).
    pub fn pods(&self, node: Option<&str>) -> Result<Vec<PodMeta>, KubeError> {
        parse_pod_list(&self.get(&pods_path(node))?)
    }
}

/// `/api/v1/pods`, restricted to one node's pods by a field selector.
pub fn pods_path(node: Option<&str>) -> String {
    match node {
        Some(n) => format!(
            "/api/v1/pods?fieldSelector={}",
            form_urlencoded::byte_serialize(format!("spec.nodeName={n}").as_bytes())
                .collect::<String>()
        ),
        None => "/api/v1/pods".to_owned(),
    }
}

#[derive(Deserialize)]
struct PodList {
    #[serde(default)]
    items: Vec<PodItem>,
}

#[derive(Deserialize)]
struct PodItem {
    #[serde(default)]
    metadata: Metadata,
}

#[derive(Default, Deserialize)]
struct Metadata {
    #[serde(default)]
    name: String,
    #[serde(default)]
    namespace: String,
    #[serde(default)]
    uid: String,
}

/// The pods of a `PodList` document; items without a name or UID are skipped.
pub fn parse_pod_list(json: &str) -> Result<Vec<PodMeta>, KubeError> {
    let list: PodList = serde_json::from_str(json).map_err(|e| KubeError::Parse(e.to_string()))?;
    Ok(list
        .items
        .into_iter()
        .filter(|p| !p.metadata.name.is_empty() && !p.metadata.uid.is_empty())
        .map(|p| PodMeta {
            namespace: p.metadata.namespace,
            name: p.metadata.name,
            uid: p.metadata.uid,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_list_gives_each_pods_identity() {
        let doc = r#"{"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"12"},"items":[
          {"metadata":{"name":"train","namespace":"ml","uid":"483168fc-b347-4aa2-a9fa-9e3d220ba4c5","annotations":{"ceems.io/created-by":"alice"}},"spec":{"nodeName":"n1"}},
          {"metadata":{"name":"","uid":"x"}}
        ]}"#;
        let pods = parse_pod_list(doc).unwrap();
        assert_eq!(
            pods,
            [PodMeta {
                namespace: "ml".into(),
                name: "train".into(),
                uid: "483168fc-b347-4aa2-a9fa-9e3d220ba4c5".into()
            }]
        );
        assert!(parse_pod_list("<html>").is_err());
    }

    #[test]
    fn only_this_nodes_pods_are_asked_for() {
        assert_eq!(
            pods_path(Some("gpu-01.example.org")),
            "/api/v1/pods?fieldSelector=spec.nodeName%3Dgpu-01.example.org"
        );
        assert_eq!(pods_path(None), "/api/v1/pods");
    }

    #[test]
    fn a_kubeconfig_without_its_context_or_cluster_says_which() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("kubeconfig");
        let write = |text: &str| std::fs::write(&path, text).unwrap();
        write("apiVersion: v1\ncurrent-context: gone\ncontexts: []\n");
        let e = KubeClient::from_kubeconfig(&path, Duration::from_secs(1))
            .err()
            .unwrap();
        assert!(e.to_string().contains("no context `gone`"), "{e}");
        write("contexts:\n- name: c\n  context: {cluster: k, user: u}\ncurrent-context: c\n");
        let e = KubeClient::from_kubeconfig(&path, Duration::from_secs(1))
            .err()
            .unwrap();
        assert!(e.to_string().contains("no cluster `k`"), "{e}");
        write("clusters:\n- name: k\n  cluster: {server: 'https://127.0.0.1:6443', certificate-authority-data: '%%'}\ncontexts:\n- name: c\n  context: {cluster: k, user: u}\n");
        let e = KubeClient::from_kubeconfig(&path, Duration::from_secs(1))
            .err()
            .unwrap();
        assert!(e.to_string().contains("not base64"), "{e}");
    }
}
