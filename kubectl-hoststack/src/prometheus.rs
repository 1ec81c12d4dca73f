//! A small blocking client for Prometheus' range API over plain HTTP: the plugin asks a few
//! queries and needs no TLS, pooling or streaming.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use serde_json::Value;

use crate::error::{Error, Result};

/// How long connecting, sending and reading may each take.
const TIMEOUT: Duration = Duration::from_secs(10);

/// A Prometheus server's base URL, split into what a request needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Server {
    /// `host:port` (port 80 when the URL names none).
    pub authority: String,
    /// The path prefix the API lives under (empty, or e.g. `/prometheus`), without a trailing
    /// slash.
    pub prefix: String,
}

impl Server {
    /// Parses `http://host[:port][/prefix]`; anything else (https included) is refused with
    /// the reason.
    pub fn parse(url: &str) -> std::result::Result<Server, String> {
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| format!("{url:?}: only plain http:// Prometheus URLs are supported"))?;
        let (host, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if host.is_empty() {
            return Err(format!("{url:?}: no host"));
        }
        let authority = if host.rsplit_once(':').is_some_and(|(_, p)| !p.contains(']')) {
            host.to_string()
        } else {
            format!("{host}:80")
        };
        let prefix = prefix.trim_end_matches('/');
        let prefix = if prefix.is_empty() {
            String::new()
        } else {
            format!("/{prefix}")
        };
        Ok(Server { authority, prefix })
    }

    /// Evaluates `expr` from `start` to `end` (Unix seconds) every `step` seconds with
    /// `/api/v1/query_range`; the answer's `data` object (`resultType` and `result`).
    pub fn query_range(&self, expr: &str, start: f64, end: f64, step: f64) -> Result<Value> {
        let path = format!(
            "{}/api/v1/query_range?query={}&start={start:.3}&end={end:.3}&step={step}",
            self.prefix,
            url_encode(expr)
        );
        let (status, body) = self.get(&path)?;
        let json: Value = serde_json::from_str(&body).map_err(|e| {
            Error::PrometheusRefused(format!("the range query (HTTP {status}, not JSON: {e})"))
        })?;
        if json["status"] != "success" {
            return Err(Error::PrometheusRefused(format!(
                "the range query {expr:?}: {}: {}",
                json["errorType"].as_str().unwrap_or("error"),
                json["error"].as_str().unwrap_or(&body)
            )));
        }
        Ok(json["data"].clone())
    }

    /// A plain HTTP/1.0 GET of `path`: the status and the body.
    fn get(&self, path: &str) -> Result<(u16, String)> {
        let unreachable = |e: std::io::Error| {
            Error::PrometheusUnreachable(format!("http://{}{}: {e}", self.authority, self.prefix))
        };
        let addr = self
            .authority
            .to_socket_addrs()
            .map_err(unreachable)?
            .next()
            .ok_or_else(|| {
                unreachable(std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "the host has no address",
                ))
            })?;
        let mut stream = TcpStream::connect_timeout(&addr, TIMEOUT).map_err(unreachable)?;
        stream
            .set_read_timeout(Some(TIMEOUT))
            .map_err(unreachable)?;
        stream
            .set_write_timeout(Some(TIMEOUT))
            .map_err(unreachable)?;
        write!(
            stream,
            "GET {path} HTTP/1.0\r\nHost: {}\r\nAccept: application/json\r\nConnection: close\r\n\r\n",
            self.authority
        )
        .map_err(unreachable)?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).map_err(unreachable)?;
        parse_response(&String::from_utf8_lossy(&response)).ok_or_else(|| {
            Error::PrometheusRefused(format!(
                "a request to http://{}: not an HTTP response",
                self.authority
            ))
        })
    }
}

/// The status code and body of an HTTP/1.x response without chunked encoding.
fn parse_response(text: &str) -> Option<(u16, String)> {
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, body.to_string()))
}

/// Percent-encodes everything but RFC 3986's unreserved characters.
fn url_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 3);
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_into_authority_and_prefix() {
        assert_eq!(
            Server::parse("http://127.0.0.1:9090").unwrap(),
            Server {
                authority: "127.0.0.1:9090".into(),
                prefix: String::new()
            }
        );
        assert_eq!(
            Server::parse("http://prom.example/prometheus/").unwrap(),
            Server {
                authority: "prom.example:80".into(),
                prefix: "/prometheus".into()
            }
        );
        assert_eq!(
            Server::parse("http://[::1]:9090/").unwrap().authority,
            "[::1]:9090"
        );
        assert_eq!(
            Server::parse("http://[::1]/").unwrap().authority,
            "[::1]:80"
        );
        let e = Server::parse("https://prom:9090").unwrap_err();
        assert!(e.contains("only plain http://"), "{e}");
        assert!(Server::parse("http:///x").is_err());
    }

    #[test]
    fn responses_and_queries_are_encoded_and_decoded() {
        assert_eq!(
            url_encode("rate(x{a=\"b\"}[5s]) / 2"),
            "rate%28x%7Ba%3D%22b%22%7D%5B5s%5D%29%20%2F%202"
        );
        assert_eq!(
            parse_response("HTTP/1.0 400 Bad Request\r\nA: b\r\n\r\n{}"),
            Some((400, "{}".into()))
        );
        assert_eq!(parse_response("garbage"), None);
    }

    #[test]
    fn an_unreachable_server_is_named_and_exits_1() {
        // A port nothing listens on: bind one, learn its number, and close it.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let server = Server::parse(&format!("http://127.0.0.1:{port}")).unwrap();
        let e = server.query_range("up", 0.0, 1.0, 1.0).unwrap_err();
        assert_eq!(e.exit_code(), crate::error::EXIT_ERROR);
        assert!(
            e.to_string().starts_with(&format!(
                "Prometheus unreachable: http://127.0.0.1:{port}: "
            )),
            "{e}"
        );
    }
}
