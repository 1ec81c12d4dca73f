//! A Prometheus server's base URL, checked once: the scheme (`http://` or `https://`), the
//! authority with its port, and the path prefix the API lives under.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// Where a Prometheus server's API is: `http[s]://<authority><prefix>/api/v1/...`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    tls: bool,
    authority: String,
    prefix: String,
}

impl Endpoint {
    /// Parses `http://host[:port][/prefix]` or `https://...` (port 80 or 443 when none is
    /// named); anything else is refused with the reason.
    pub fn parse(url: &str) -> Result<Endpoint> {
        let bad = |reason: &str| Error::Address {
            address: url.to_string(),
            reason: reason.to_string(),
        };
        let (tls, rest) = match (url.strip_prefix("https://"), url.strip_prefix("http://")) {
            (Some(rest), _) => (true, rest),
            (None, Some(rest)) => (false, rest),
            (None, None) => return Err(bad("only http:// and https:// URLs are supported")),
        };
        let default_port = if tls { 443 } else { 80 };
        let (host, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if host.is_empty() {
            return Err(bad("no host"));
        }
        let authority = if host.rsplit_once(':').is_some_and(|(_, p)| !p.contains(']')) {
            host.to_string()
        } else {
            format!("{host}:{default_port}")
        };
        if authority.parse::<hyper::http::uri::Authority>().is_err() {
            return Err(bad("not a host and port"));
        }
        let prefix = prefix.trim_end_matches('/');
        let prefix = if prefix.is_empty() {
            String::new()
        } else {
            format!("/{prefix}")
        };
        Ok(Endpoint {
            tls,
            authority,
            prefix,
        })
    }

    /// Whether the server is spoken to over TLS.
    pub fn tls(&self) -> bool {
        self.tls
    }

    /// `host:port`.
    pub fn authority(&self) -> &str {
        &self.authority
    }

    /// The path prefix (empty, or e.g. `/prometheus`), without a trailing slash.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }
}

impl fmt::Display for Endpoint {
    /// The base URL, `http[s]://host:port[/prefix]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = if self.tls { "https" } else { "http" };
        write!(f, "{scheme}://{}{}", self.authority, self.prefix)
    }
}

impl FromStr for Endpoint {
    type Err = Error;

    fn from_str(url: &str) -> Result<Endpoint> {
        Endpoint::parse(url)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_into_authority_and_prefix() {
        let e = Endpoint::parse("http://127.0.0.1:9090").unwrap();
        assert_eq!((e.authority(), e.prefix()), ("127.0.0.1:9090", ""));
        assert_eq!(e.to_string(), "http://127.0.0.1:9090");
        let e = Endpoint::parse("http://prom.example/prometheus/").unwrap();
        assert_eq!(
            (e.authority(), e.prefix()),
            ("prom.example:80", "/prometheus")
        );
        assert_eq!(e.to_string(), "http://prom.example:80/prometheus");
        assert_eq!(
            Endpoint::parse("http://[::1]:9090/").unwrap().authority(),
            "[::1]:9090"
        );
        assert_eq!(
            Endpoint::parse("http://[::1]/").unwrap().authority(),
            "[::1]:80"
        );
        let e = Endpoint::parse("https://prom.example/p").unwrap();
        assert!(e.tls());
        assert_eq!(e.to_string(), "https://prom.example:443/p");
        let e = Endpoint::parse("ftp://prom:9090").unwrap_err().to_string();
        assert!(e.contains("only http:// and https://"), "{e}");
        assert!(
            e.starts_with("bad Prometheus address \"ftp://prom:9090\": "),
            "{e}"
        );
        assert!(Endpoint::parse("http:///x").is_err());
        assert!(Endpoint::parse("http://a b:1").is_err());
    }
}
