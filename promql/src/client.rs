//! The async client: a GET of `/api/v1/query` or `/api/v1/query_range` on hyper, bounded by a
//! timeout over the whole exchange and a limit on the body's size, and the answer decoded.

use std::time::Duration;

use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use hyper::header::HeaderMap;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC};

use crate::access::Access;
use crate::answer::{decode, Data, Series};
use crate::endpoint::Endpoint;
use crate::error::{Error, Result};

/// How long a query may take unless [`Client::with_timeout`] says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest answer read unless [`Client::with_max_response_bytes`] says otherwise.
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 4 << 20;

/// What a query string percent-encodes: everything but RFC 3986's unreserved characters.
const QUERY_VALUE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// The span and resolution of a range query, in Unix seconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Range {
    /// The first evaluation time.
    pub start: f64,
    /// The last evaluation time.
    pub end: f64,
    /// Seconds between evaluations.
    pub step: f64,
}

/// A client of one Prometheus server. Cloning it shares its connection pool.
#[derive(Clone, Debug)]
pub struct Client {
    http: hyper_util::client::legacy::Client<HttpsConnector<HttpConnector>, Empty<Bytes>>,
    headers: HeaderMap,
    endpoint: Endpoint,
    timeout: Duration,
    max_response_bytes: usize,
}

impl Client {
    /// A client of the server at `endpoint` (over https, trusting the system's roots), with
    /// the default timeout and size limit.
    pub fn new(endpoint: Endpoint) -> Client {
        Client::with_access(endpoint, &Access::default()).expect("no access settings to refuse")
    }

    /// A client of the server at `endpoint` that presents `access`'s credentials and headers
    /// and trusts its CA bundle; fails when those cannot be used.
    pub fn with_access(endpoint: Endpoint, access: &Access) -> Result<Client> {
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(access.tls_config()?)
            .https_or_http()
            .enable_http1()
            .build();
        Ok(Client {
            http: hyper_util::client::legacy::Client::builder(TokioExecutor::new())
                .build(connector),
            headers: access.header_map()?,
            endpoint,
            timeout: DEFAULT_TIMEOUT,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
        })
    }

    /// The same client with another timeout for each query.
    pub fn with_timeout(self, timeout: Duration) -> Client {
        Client { timeout, ..self }
    }

    /// The same client with another limit on an answer's size.
    pub fn with_max_response_bytes(self, max_response_bytes: usize) -> Client {
        Client {
            max_response_bytes,
            ..self
        }
    }

    /// The server this client asks.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// Evaluates `expr` at `time` (Unix seconds; the server's now when `None`).
    pub async fn query(&self, expr: &str, time: Option<f64>) -> Result<Data> {
        let mut path = format!("/api/v1/query?query={}", encode(expr));
        if let Some(t) = time {
            path.push_str(&format!("&time={t:.3}"));
        }
        self.get(&path).await
    }

    /// Evaluates `expr` over `range`: one series per label set, with its points.
    pub async fn query_range(&self, expr: &str, range: Range) -> Result<Vec<Series>> {
        let Range { start, end, step } = range;
        let path = format!(
            "/api/v1/query_range?query={}&start={start:.3}&end={end:.3}&step={step}",
            encode(expr)
        );
        self.get(&path).await?.into_matrix()
    }

    /// GETs `path` under the endpoint's prefix and decodes the answer.
    async fn get(&self, path: &str) -> Result<Data> {
        let url = format!("{}{path}", self.endpoint);
        let mut request = hyper::Request::get(url.as_str())
            .header(hyper::header::ACCEPT, "application/json")
            .body(Empty::new())
            .map_err(|e| Error::Address {
                address: self.endpoint.to_string(),
                reason: e.to_string(),
            })?;
        request.headers_mut().extend(self.headers.clone());
        let exchange = async {
            let response = self
                .http
                .request(request)
                .await
                .map_err(|e| match tls_failure(&e) {
                    Some(reason) => Error::Tls {
                        url: self.endpoint.to_string(),
                        reason,
                    },
                    None => Error::Unreachable {
                        url: self.endpoint.to_string(),
                        reason: innermost(&e),
                    },
                })?;
            let status = response.status();
            let body = Limited::new(response.into_body(), self.max_response_bytes)
                .collect()
                .await
                .map_err(|e| Error::Read(e.to_string()))?
                .to_bytes();
            match decode(&body) {
                Err(e @ Error::Refused { .. }) => Err(e),
                Err(e) if !status.is_success() => Err(Error::Status {
                    status,
                    source: Box::new(e),
                }),
                other => other,
            }
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| Error::Timeout {
                url: self.endpoint.to_string(),
                after: self.timeout,
            })?
    }
}

/// Percent-encodes a query parameter's value.
fn encode(text: &str) -> String {
    percent_encoding::utf8_percent_encode(text, QUERY_VALUE).to_string()
}

/// What rustls reported, when a connection failed in its TLS handshake. The rustls error sits
/// inside io::Errors (tokio-rustls wraps it, hyper-util wraps that), which `source()` skips
/// over, so each is opened with `get_ref`.
fn tls_failure(error: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut cause = Some(error);
    while let Some(e) = cause {
        if let Some(tls) = e.downcast_ref::<rustls::Error>() {
            return Some(tls.to_string());
        }
        cause = match e.downcast_ref::<std::io::Error>() {
            Some(io) => io
                .get_ref()
                .map(|inner| inner as &(dyn std::error::Error + 'static)),
            None => e.source(),
        };
    }
    None
}

/// The innermost cause of an error: what a person can act on (`Connection refused`), not the
/// layers it passed through.
fn innermost(error: &(dyn std::error::Error + 'static)) -> String {
    let mut deepest = error;
    while let Some(source) = deepest.source() {
        deepest = source;
    }
    deepest.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpListener;

    #[test]
    fn queries_are_percent_encoded() {
        assert_eq!(
            encode("rate(x{a=\"b\"}[5s]) / 2"),
            "rate%28x%7Ba%3D%22b%22%7D%5B5s%5D%29%20%2F%202"
        );
    }

    /// A one-shot HTTP server on loopback that answers `response` to the first request and
    /// hands back that request's head.
    fn serve_once(response: String) -> (Endpoint, std::thread::JoinHandle<String>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint =
            Endpoint::parse(&format!("http://{}/p", listener.local_addr().unwrap())).unwrap();
        let served = std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            let mut head = Vec::new();
            let mut byte = [0u8];
            while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).unwrap() == 1 {
                head.push(byte[0]);
            }
            stream.write_all(response.as_bytes()).unwrap();
            String::from_utf8(head).unwrap()
        });
        (endpoint, served)
    }

    #[tokio::test]
    async fn an_instant_query_goes_under_the_prefix_and_decodes() {
        let body = r#"{"status":"success","data":{"resultType":"scalar","result":[7,"2"]}}"#;
        let (endpoint, served) = serve_once(format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ));
        let data = Client::new(endpoint)
            .query("up == 1", Some(7.0))
            .await
            .unwrap();
        assert_eq!(
            data,
            Data::Scalar {
                time: 7.0,
                value: 2.0
            }
        );
        let head = served.join().unwrap();
        assert!(
            head.starts_with("GET /p/api/v1/query?query=up%20%3D%3D%201&time=7.000 HTTP/1.1\r\n"),
            "{head}"
        );
    }

    #[tokio::test]
    async fn an_error_status_without_an_api_answer_names_the_status() {
        let (endpoint, _served) = serve_once(
            "HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\nConnection: close\r\n\r\nnot found"
                .into(),
        );
        let e = Client::new(endpoint).query("up", None).await.unwrap_err();
        let text = e.to_string();
        assert!(matches!(e, Error::Status { .. }), "{e:?}");
        assert!(
            text.starts_with("Prometheus answered 404 Not Found: not a Prometheus answer: "),
            "{text}"
        );
    }

    #[tokio::test]
    async fn an_answer_over_the_limit_is_not_read() {
        let (endpoint, _served) = serve_once(
            "HTTP/1.1 200 OK\r\nContent-Length: 64\r\nConnection: close\r\n\r\n0123456789012345678901234567890123456789012345678901234567890123".into(),
        );
        let e = Client::new(endpoint)
            .with_max_response_bytes(16)
            .query("up", None)
            .await
            .unwrap_err();
        assert!(
            e.to_string().starts_with("reading Prometheus' answer: "),
            "{e}"
        );
    }

    #[tokio::test]
    async fn a_silent_server_times_out_and_a_closed_port_is_unreachable() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint =
            Endpoint::parse(&format!("http://{}", listener.local_addr().unwrap())).unwrap();
        let e = Client::new(endpoint.clone())
            .with_timeout(Duration::from_millis(200))
            .query("up", None)
            .await
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("Prometheus at {endpoint} did not answer within 200ms")
        );
        drop(listener);
        let e = Client::new(endpoint.clone())
            .query("up", None)
            .await
            .unwrap_err();
        assert!(matches!(e, Error::Unreachable { .. }), "{e:?}");
        assert!(
            e.to_string().starts_with(&format!(
                "Prometheus at {endpoint} unreachable: Connection refused"
            )),
            "{e}"
        );
    }
}
