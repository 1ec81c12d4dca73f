//! What a client needs beyond a URL to be let in: the CA bundle that signed the server's TLS
//! certificate (the system's roots when none is given), credentials (a bearer token or basic
//! auth), and headers every request carries (a tenant header such as `X-Scope-OrgID` for a
//! multi-tenant Prometheus-compatible store).

use std::sync::Arc;

use base64::Engine as _;
use hyper::header::{HeaderMap, HeaderName, HeaderValue, AUTHORIZATION};
use hyper_rustls::ConfigBuilderExt as _;
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::CertificateDer;

use crate::error::{Error, Result};

/// Credentials sent in the `Authorization` header.
#[derive(Clone, PartialEq, Eq)]
pub enum Credentials {
    /// `Authorization: Bearer <token>`.
    Bearer(String),
    /// `Authorization: Basic base64(<username>:<password>)`.
    Basic {
        /// The user.
        username: String,
        /// The password.
        password: String,
    },
}

impl std::fmt::Debug for Credentials {
    /// Names the kind only: a secret never reaches a log.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credentials::Bearer(_) => f.write_str("Bearer(..)"),
            Credentials::Basic { username, .. } => write!(f, "Basic({username}:..)"),
        }
    }
}

/// How to reach a server that asks for more than a URL.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Access {
    /// PEM certificates of the CAs to trust for the server's certificate (instead of the
    /// system's roots).
    pub ca_pem: Option<Vec<u8>>,
    /// Credentials, if the server asks for them.
    pub credentials: Option<Credentials>,
    /// Headers every request carries, as (name, value).
    pub headers: Vec<(String, String)>,
}

impl Access {
    /// The TLS configuration: the CA bundle's certificates, or the system's roots (none when
    /// the system has none: an https server then fails with an unknown issuer).
    pub(crate) fn tls_config(&self) -> Result<rustls::ClientConfig> {
        let bad = |reason: String| Error::Access(reason);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| bad(format!("TLS: {e}")))?;
        let Some(pem) = &self.ca_pem else {
            return Ok(match builder.clone().with_native_roots() {
                Ok(roots) => roots.with_no_client_auth(),
                Err(_) => builder
                    .with_root_certificates(rustls::RootCertStore::empty())
                    .with_no_client_auth(),
            });
        };
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(pem) {
            let cert =
                cert.map_err(|e| bad(format!("the CA bundle is not PEM certificates: {e}")))?;
            roots
                .add(cert)
                .map_err(|e| bad(format!("a CA certificate was refused: {e}")))?;
        }
        if roots.is_empty() {
            return Err(bad("the CA bundle holds no certificate".into()));
        }
        Ok(builder.with_root_certificates(roots).with_no_client_auth())
    }

    /// The headers of every request: credentials and the custom ones, checked once.
    pub(crate) fn header_map(&self) -> Result<HeaderMap> {
        let mut headers = HeaderMap::new();
        for (name, value) in &self.headers {
            let name = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| Error::Access(format!("{name:?} is not an HTTP header name")))?;
            let value = HeaderValue::from_str(value)
                .map_err(|_| Error::Access(format!("the value of header {name} is not valid")))?;
            headers.append(name, value);
        }
        if let Some(credentials) = &self.credentials {
            let text = match credentials {
                Credentials::Bearer(token) => format!("Bearer {token}"),
                Credentials::Basic { username, password } => {
                    let pair = format!("{username}:{password}");
                    let encoded = base64::engine::general_purpose::STANDARD.encode(pair);
                    format!("Basic {encoded}")
                }
            };
            let mut value = HeaderValue::from_str(&text)
                .map_err(|_| Error::Access("the credentials are not valid in a header".into()))?;
            value.set_sensitive(true);
            headers.insert(AUTHORIZATION, value);
        }
        Ok(headers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_and_headers_become_request_headers_and_secrets_stay_out_of_debug() {
        let access = Access {
            credentials: Some(Credentials::Basic {
                username: "alice".into(),
                password: "s3cret".into(),
            }),
            headers: vec![("X-Scope-OrgID".into(), "team-a".into())],
            ..Access::default()
        };
        let headers = access.header_map().unwrap();
        assert_eq!(headers["authorization"], "Basic YWxpY2U6czNjcmV0");
        assert_eq!(headers["x-scope-orgid"], "team-a");
        assert!(!format!("{access:?}").contains("s3cret"));
        let bearer = Access {
            credentials: Some(Credentials::Bearer("tok".into())),
            ..Access::default()
        };
        assert_eq!(bearer.header_map().unwrap()["authorization"], "Bearer tok");
        let bad = Access {
            headers: vec![("bad header".into(), "x".into())],
            ..Access::default()
        };
        assert!(bad
            .header_map()
            .unwrap_err()
            .to_string()
            .contains("\"bad header\" is not an HTTP header name"));
        let no_pem = Access {
            ca_pem: Some(b"not a certificate".to_vec()),
            ..Access::default()
        };
        assert!(no_pem
            .tls_config()
            .unwrap_err()
            .to_string()
            .contains("the CA bundle holds no certificate"));
    }
}
