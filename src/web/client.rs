//! The outgoing HTTP client shared by the collectors and the Redfish proxy: blocking (it runs on
//! collector threads or in `spawn_blocking`), rustls with the ring provider, bounded timeouts,
//! and certificate checks that only the operator can turn off.

use std::sync::Arc;
use std::time::Duration;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

/// Timeouts of one client.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    pub connect: Duration,
    /// Whole request, headers and body included.
    pub total: Duration,
}

impl Timeouts {
    pub fn all(d: Duration) -> Timeouts {
        Timeouts {
            connect: d,
            total: d,
        }
    }
}

/// Accepts any server certificate: for BMCs with self-signed ones, when the operator says so.
#[derive(Debug)]
struct AcceptAnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AcceptAnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

fn tls_config(insecure_skip_verify: bool) -> Result<Arc<rustls::ClientConfig>, rustls::Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()?;
    let config = if insecure_skip_verify {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AcceptAnyCertificate(provider)))
            .with_no_client_auth()
    } else {
        let roots =
            rustls::RootCertStore::from_iter(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        builder.with_root_certificates(roots).with_no_client_auth()
    };
    Ok(Arc::new(config))
}

/// A client with these timeouts. Redirects are not followed: a BMC that redirects is answered
/// by whoever asked, and the proxy must never be steered elsewhere.
pub fn agent(timeouts: Timeouts, insecure_skip_verify: bool) -> Result<ureq::Agent, rustls::Error> {
    Ok(agent_builder(timeouts, insecure_skip_verify)?.build())
}

/// What [`agent`] builds, for a caller that adds to it (a resolver, say).
pub fn agent_builder(
    timeouts: Timeouts,
    insecure_skip_verify: bool,
) -> Result<ureq::AgentBuilder, rustls::Error> {
    Ok(ureq::AgentBuilder::new()
        .timeout_connect(timeouts.connect)
        .timeout(timeouts.total)
        .redirects(0)
        .tls_config(tls_config(insecure_skip_verify)?)
        .user_agent(concat!("ceems/", env!("CARGO_PKG_VERSION"))))
}

/// TLS of a client that trusts given roots and may prove itself with a certificate: the
/// Kubernetes API server's CA and a kubeconfig's client certificate, say.
#[derive(Debug, Clone, Default)]
pub struct ClientTls {
    /// PEM roots; empty: the public ones.
    pub roots_pem: Vec<u8>,
    /// PEM certificate chain and key of this client.
    pub identity_pem: Option<(Vec<u8>, Vec<u8>)>,
    pub insecure_skip_verify: bool,
}

/// The rustls configuration of a client with this TLS, for a caller with its own transport (the
/// lb's stores).
pub fn rustls_config(tls: &ClientTls) -> Result<rustls::ClientConfig, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::PrivateKeyDer;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = if tls.insecure_skip_verify {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AcceptAnyCertificate(provider)))
    } else if tls.roots_pem.is_empty() {
        builder.with_root_certificates(rustls::RootCertStore::from_iter(
            webpki_roots::TLS_SERVER_ROOTS.iter().cloned(),
        ))
    } else {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(&tls.roots_pem) {
            let cert = cert.map_err(|e| format!("certificate authority: {e}"))?;
            roots
                .add(cert)
                .map_err(|e| format!("certificate authority: {e}"))?;
        }
        builder.with_root_certificates(roots)
    };
    let config = match &tls.identity_pem {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let chain = CertificateDer::pem_slice_iter(cert)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("client certificate: {e}"))?;
            let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| format!("client key: {e}"))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| format!("client certificate: {e}"))?
        }
    };
    Ok(config)
}

/// A client with these timeouts and this TLS (see [`agent`]).
pub fn agent_with_tls(timeouts: Timeouts, tls: &ClientTls) -> Result<ureq::Agent, String> {
    let config = rustls_config(tls)?;
    Ok(ureq::AgentBuilder::new()
        .timeout_connect(timeouts.connect)
        .timeout(timeouts.total)
        .redirects(0)
        .tls_config(Arc::new(config))
        .user_agent(concat!("ceems/", env!("CARGO_PKG_VERSION")))
        .build())
}

/// A client with these timeouts for a server of a CEEMS `web:` section (its roots, client
/// certificate and `insecure_skip_verify`; headers are the caller's to send).
pub fn agent_for(
    settings: &crate::config::http_client::ClientSettings,
    timeouts: Timeouts,
) -> Result<ureq::Agent, String> {
    let tls = ClientTls {
        roots_pem: settings.ca_pem.clone(),
        identity_pem: settings.identity_pem.clone(),
        insecure_skip_verify: settings.insecure_skip_verify,
    };
    agent_with_tls(timeouts, &tls)
}
