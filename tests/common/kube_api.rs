//! A stats-server reading a Kubernetes API stand-in (a `TestServer` over TLS) through a
//! kubeconfig with the stand-in's CA and a token.

use std::os::unix::fs::PermissionsExt;

use base64::Engine;

use super::http::TestServer;

/// A stats-server with one Kubernetes cluster, `kube`, whose API server is `api` (its CA and
/// `token` in a kubeconfig), updating every second; `root` is an admin.
pub fn stats_server_of(api: &TestServer, token: &str) -> (tempfile::TempDir, super::Running) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    // The server drops to nobody when started as root.
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let kubeconfig = dir.join("kubeconfig.yml");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nclusters:\n- name: lab\n  cluster:\n    server: {}\n    certificate-authority-data: {}\ncontexts:\n- name: lab\n  context: {{cluster: lab, user: ceems}}\ncurrent-context: lab\nusers:\n- name: ceems\n  user: {{token: {token}}}\n",
            api.url(),
            base64::engine::general_purpose::STANDARD.encode(&api.cert_pem)
        ),
    )
    .unwrap();
    std::fs::set_permissions(&kubeconfig, std::fs::Permissions::from_mode(0o644)).unwrap();
    let config = dir.join("ceems.toml");
    std::fs::write(
        &config,
        format!(
            "[stats-server.web]\nadmin-users = [\"root\"]\n\n[[stats-server.clusters]]\nid = \"kube\"\nmanager = \"k8s\"\nkubeconfig = \"{}\"\n",
            kubeconfig.display()
        ),
    )
    .unwrap();
    let server = super::start_subcommand(
        "stats-server",
        dir,
        &[
            &format!("--config.file={}", config.display()),
            &format!("--storage.data.path={}", dir.join("data").display()),
            "--storage.update-interval=1s",
        ],
        &[],
    );
    (tmp, server)
}
