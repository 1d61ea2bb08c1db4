//! `--web.config.file` on the real servers, driven with curl: TLS with client certificates,
//! basic auth, response headers, and a certificate swapped on disk while the server runs.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::start_subcommand;
use rcgen::{BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair};

struct Ca {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
}

fn ca(name: &str) -> Ca {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    let key = KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    Ca {
        pem: cert.pem(),
        issuer: Issuer::new(params, key),
    }
}

/// A leaf certificate and key signed by `ca`, written as `<name>.crt` / `<name>.key`.
fn leaf(dir: &Path, name: &str, ca: &Ca, usage: ExtendedKeyUsagePurpose) -> (PathBuf, PathBuf) {
    let mut params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    params.extended_key_usages = vec![usage];
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &ca.issuer).unwrap();
    let (c, k) = (
        dir.join(format!("{name}.crt")),
        dir.join(format!("{name}.key")),
    );
    std::fs::write(&c, cert.pem()).unwrap();
    std::fs::write(&k, key.serialize_pem()).unwrap();
    (c, k)
}

fn curl(args: &[&str]) -> (i32, String) {
    let out = Command::new("curl")
        .args([
            "-s",
            "-S",
            "-o",
            "-",
            "-w",
            "\nHTTP %{http_code}",
            "-D",
            "-",
        ])
        .args(args)
        .output()
        .expect("curl is needed for this test");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

#[test]
fn tls_client_certificates_basic_auth_headers_and_certificate_reload() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let server_ca = ca("server CA");
    let client_ca = ca("client CA");
    let stranger_ca = ca("someone else's CA");
    std::fs::write(dir.join("server-ca.pem"), &server_ca.pem).unwrap();
    std::fs::write(dir.join("client-ca.pem"), &client_ca.pem).unwrap();
    leaf(
        dir,
        "server",
        &server_ca,
        ExtendedKeyUsagePurpose::ServerAuth,
    );
    let (good_crt, good_key) = leaf(
        dir,
        "client",
        &client_ca,
        ExtendedKeyUsagePurpose::ClientAuth,
    );
    let (bad_crt, bad_key) = leaf(
        dir,
        "stranger",
        &stranger_ca,
        ExtendedKeyUsagePurpose::ClientAuth,
    );
    let hash = bcrypt::hash("s3cret", 4).unwrap();
    let web = dir.join("web.yml");
    std::fs::write(
        &web,
        format!(
            "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: client-ca.pem\n  min_version: TLS12\nbasic_auth_users:\n  alice: {hash}\nhttp_server_config:\n  headers:\n    X-Frame-Options: deny\n"
        ),
    )
    .unwrap();
    let flag = format!("--web.config.file={}", web.display());
    // Started by hand: the helper's readiness probe speaks plain HTTP; curl retries instead.
    let exporter = {
        let port = common::free_port();
        let child = Command::new(env!("CARGO_BIN_EXE_ceems"))
            .args([
                "exporter",
                "--collector.disable-defaults",
                "--collector.cpu",
                &flag,
                &format!("--web.listen-address=127.0.0.1:{port}"),
            ])
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        common::Running {
            child: common::KillOnDrop(child),
            port,
        }
    };
    let url = format!("https://localhost:{}/metrics", exporter.port);
    let cacert = dir.join("server-ca.pem").display().to_string();
    let (gc, gk) = (
        good_crt.display().to_string(),
        good_key.display().to_string(),
    );
    let base = |extra: &[&str]| {
        let mut a = vec![
            "--cacert",
            &cacert,
            "--retry",
            "20",
            "--retry-connrefused",
            "--retry-delay",
            "0",
        ];
        a.extend_from_slice(extra);
        a.push(&url);
        curl(&a)
    };

    let (code, out) = base(&["--cert", &gc, "--key", &gk, "-u", "alice:s3cret"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("HTTP 200"), "{out}");
    assert!(out.contains("ceems_cpu_seconds_total"), "{out}");
    assert!(
        out.to_ascii_lowercase().contains("x-frame-options: deny"),
        "{out}"
    );

    let (code, out) = base(&["--cert", &gc, "--key", &gk, "-u", "alice:wrong"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("HTTP 401"), "{out}");
    assert!(
        out.to_ascii_lowercase().contains("www-authenticate: basic"),
        "{out}"
    );
    let (_, out) = base(&["--cert", &gc, "--key", &gk]);
    assert!(out.contains("HTTP 401"), "{out}");

    let (bc, bk) = (bad_crt.display().to_string(), bad_key.display().to_string());
    let (code, out) = base(&["--cert", &bc, "--key", &bk, "-u", "alice:s3cret"]);
    assert_ne!(code, 0, "a certificate of another CA was accepted: {out}");
    let (code, out) = base(&["-u", "alice:s3cret"]);
    assert_ne!(code, 0, "no client certificate was accepted: {out}");

    // Swap the server certificate for one of a new CA while the server runs.
    let new_ca = ca("renewed server CA");
    std::fs::write(dir.join("new-ca.pem"), &new_ca.pem).unwrap();
    let (c, k) = leaf(dir, "renewed", &new_ca, ExtendedKeyUsagePurpose::ServerAuth);
    std::fs::rename(&k, dir.join("server.key")).unwrap();
    std::fs::rename(&c, dir.join("server.crt")).unwrap();
    let new_cacert = dir.join("new-ca.pem").display().to_string();
    let (code, out) = curl(&[
        "--cacert",
        &new_cacert,
        "--cert",
        &gc,
        "--key",
        &gk,
        "-u",
        "alice:s3cret",
        &url,
    ]);
    assert_eq!(code, 0, "the renewed certificate is not served: {out}");
    assert!(out.contains("HTTP 200"), "{out}");
    let (code, _) = base(&["--cert", &gc, "--key", &gk, "-u", "alice:s3cret"]);
    assert_ne!(code, 0, "the old certificate is still served");
}

#[test]
fn the_proxy_takes_a_web_config_and_a_bad_one_stops_start_up() {
    let tmp = tempfile::tempdir().unwrap();
    let hash = bcrypt::hash("pw", 4).unwrap();
    let web = tmp.path().join("web.yml");
    std::fs::write(&web, format!("basic_auth_users:\n  ops: {hash}\n")).unwrap();
    let flag = format!("--web.config.file={}", web.display());
    // /health is behind basic auth too.
    let proxy = start_subcommand(
        "redfish-proxy",
        tmp.path(),
        &["--redfish.target=10.0.0.1=http://127.0.0.1:9", &flag],
        &[],
    );
    let (_, out) = curl(&[&proxy.url("/health")]);
    assert!(out.contains("HTTP 401"), "{out}");
    let (_, out) = curl(&["-u", "ops:pw", &proxy.url("/health")]);
    assert!(out.contains("HTTP 200"), "{out}");

    std::fs::write(
        &web,
        "tls_server_config:\n  cert_file: a.crt\n  key_file: a.key\n  min_version: TLS11\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ceems"))
        .args([
            "redfish-proxy",
            "--redfish.target=10.0.0.1=http://127.0.0.1:9",
            &flag,
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("tls_server_config.min_version"), "{err}");
}

#[test]
fn the_shipped_example_web_config_is_valid_but_for_its_certificate_paths() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/web-config.yml");
    let err = ceems::web::toolkit::WebSecurity::load(&path)
        .unwrap_err()
        .to_string();
    // Everything parses and validates up to the certificate files, which are the site's.
    assert!(err.contains("/etc/ceems/tls/"), "{err}");
    let text = std::fs::read_to_string(&path).unwrap();
    let without_tls: String = text
        .split("basic_auth_users:")
        .nth(1)
        .map(|rest| format!("basic_auth_users:{rest}"))
        .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let p = tmp.path().join("web.yml");
    std::fs::write(&p, without_tls).unwrap();
    let sec = ceems::web::toolkit::WebSecurity::load(&p).unwrap();
    assert!(sec.auth.is_some());
    assert_eq!(sec.headers.len(), 2);
}

/// The status and body of a GET with `headers`, over a plain socket: a server that refuses the
/// request may close before reading all of it, which a client library reports as an error.
fn raw_get(port: u16, path: &str, headers: &[(&str, String)]) -> (u16, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let mut request = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    let _ = stream.write_all(request.as_bytes());
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no HTTP answer: {text:?}"));
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    (status, body.to_owned())
}

fn padding(bytes: usize) -> Vec<(&'static str, String)> {
    vec![("X-Padding", "a".repeat(bytes))]
}

/// Each server answers a request whose headers pass 8 KiB with 431, and one just under with
/// its usual answer.
fn refuses_oversized_headers(port: u16, path: &str, usual: u16) {
    assert_eq!(raw_get(port, path, &padding(7 * 1024)).0, usual, "7 KiB");
    for bytes in [9 * 1024, 100 * 1024] {
        assert_eq!(raw_get(port, path, &padding(bytes)).0, 431, "{bytes} bytes");
    }
    // The server is still there for the next client.
    assert_eq!(raw_get(port, path, &[]).0, usual, "after the refusals");
}

#[test]
fn headers_over_8_kib_get_431_from_every_server() {
    let tmp = tempfile::tempdir().unwrap();
    let exporter = common::start_exporter(
        &common::fixtures().join("compat"),
        &[
            "--path.sysfs=sys",
            "--path.procfs=proc",
            "--path.cgroupfs=sys/fs/cgroup",
        ],
    );
    refuses_oversized_headers(exporter.port, "/metrics", 200);
    let proxy = start_subcommand(
        "redfish-proxy",
        tmp.path(),
        &["--redfish.target=10.0.0.1=http://127.0.0.1:9"],
        &[],
    );
    refuses_oversized_headers(proxy.port, "/health", 200);
    let stats = stats_server(tmp.path());
    refuses_oversized_headers(stats.port, "/api/v1/health", 200);
}

fn stats_server(dir: &Path) -> common::Running {
    let data = format!("--storage.data.path={}", dir.join("data").display());
    start_subcommand(
        "stats-server",
        dir,
        &[
            &data,
            "--slurm.sacct.path=/bin/true",
            "--slurm.sacctmgr.path=/bin/true",
            "--storage.update-interval=1h",
            "--slurm.cluster-id=lab",
        ],
        &[],
    )
}

#[test]
fn a_user_name_over_256_bytes_gets_400_with_a_message() {
    let tmp = tempfile::tempdir().unwrap();
    let stats = stats_server(tmp.path());
    let user = |n: usize| vec![("X-Grafana-User", "u".repeat(n))];
    for path in [
        "/api/v1/units",
        "/api/v1/usage/current",
        "/report/lab/1.json",
    ] {
        let (status, body) = raw_get(stats.port, path, &user(257));
        assert_eq!(status, 400, "{path}: {body}");
        assert!(
            body.contains("X-Grafana-User header is 257 bytes long; a user name is at most 256"),
            "{path}: {body}"
        );
    }
    let (status, body) = raw_get(stats.port, "/api/v1/units", &user(256));
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"data\":[]"), "{body}");
}
