//! A tuning's probe targets, parsed and checked: a `tcp` target's `host:port`, an `http`
//! target's URL (by `http::Uri`, after refusing every byte that is not visible ASCII, so that
//! nothing the author writes can end the request line), a `dns` target's name. A target whose
//! host is an address is judged against the agents' allowed destinations here, before the
//! revision is applied; one whose host is a name is judged when it is resolved, before every
//! connection ([`crate::probe`]).

use std::net::IpAddr;

use hoststack_crds::ProbeTarget;

use crate::destinations::Destinations;

/// One of the tuning's probe targets, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// Its name.
    pub name: String,
    /// What it checks.
    pub check: Check,
}

/// What a target checks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Check {
    /// A TCP connection to the endpoint.
    Tcp(Endpoint),
    /// A plain-HTTP GET of `request_target` from the endpoint, answered with `status`.
    Http {
        /// Where it connects.
        endpoint: Endpoint,
        /// The path and query of the request line: visible ASCII only, `/` at least.
        request_target: String,
        /// The status it must answer.
        status: u16,
    },
    /// A lookup of the name by the node's resolver (nothing connects to what it finds).
    Dns(String),
}

/// A host and port to connect to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// An IP address (an IPv6 one without its brackets) or a DNS name.
    pub host: String,
    /// The TCP port.
    pub port: u16,
}

impl Endpoint {
    /// `host:port`, an IPv6 address in brackets.
    pub fn authority(&self) -> String {
        match self.host.parse::<IpAddr>() {
            Ok(IpAddr::V6(a)) => format!("[{a}]:{}", self.port),
            _ => format!("{}:{}", self.host, self.port),
        }
    }

    /// The host as a URL or a `Host` header writes it: `host`, `[v6]`, with `:port` unless it
    /// is HTTP's 80.
    pub fn host_header(&self) -> String {
        let authority = self.authority();
        match authority.strip_suffix(":80") {
            Some(host) if self.port == 80 => host.to_string(),
            _ => authority,
        }
    }

    /// The endpoint of `host` (a name, an IPv4 address or a bracketed IPv6 one) and `port`.
    fn of(host: &str, port: u16) -> Result<Endpoint, String> {
        let host = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            Some(v6) => v6
                .parse::<std::net::Ipv6Addr>()
                .map_err(|_| format!("[{v6}] is not an IPv6 address"))?
                .to_string(),
            None if host.parse::<std::net::Ipv4Addr>().is_ok() => host.to_string(),
            None if is_dns_name(host) => host.to_string(),
            None => return Err(format!("{host:?} is neither an address nor a DNS name")),
        };
        if port == 0 {
            return Err("port 0 cannot be connected to".into());
        }
        Ok(Endpoint { host, port })
    }

    /// `host:port` (`[v6]:port`) parsed.
    fn parse(text: &str) -> Result<Endpoint, String> {
        let (host, port) = text
            .rsplit_once(':')
            .ok_or("expected host:port (an IPv6 address in brackets)")?;
        let port = port
            .parse::<u16>()
            .map_err(|_| format!("{port:?} is not a port"))?;
        Endpoint::of(host, port)
    }
}

/// Letters, digits, `.`, `-` and `_`, as a resolver takes them.
fn is_dns_name(name: &str) -> bool {
    (1..=253).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'))
}

/// The endpoint and request target of a plain `http://` URL.
fn parse_url(url: &str) -> Result<(Endpoint, String), String> {
    if let Some(b) = url.bytes().find(|b| !b.is_ascii_graphic()) {
        return Err(format!(
            "{url:?} holds byte {b:#04x}: a URL holds visible ASCII only (percent-encode the rest)"
        ));
    }
    let uri: http::Uri = url
        .parse()
        .map_err(|e| format!("{url:?} is not a URL: {e}"))?;
    if uri.scheme_str() != Some("http") {
        return Err(format!("{url:?} is not a plain http:// URL"));
    }
    let authority = uri
        .authority()
        .filter(|a| !a.host().is_empty())
        .ok_or_else(|| format!("{url:?} names no host"))?;
    if authority.as_str().contains('@') {
        return Err(format!("{url:?} carries user information"));
    }
    // `Authority::port` ignores a port that is not a u16: read it here.
    let after_host = &authority.as_str()[authority.host().len()..];
    let port = match after_host.strip_prefix(':') {
        None => 80,
        Some(port) => port
            .parse::<u16>()
            .map_err(|_| format!("{url:?}: {port:?} is not a port"))?,
    };
    let endpoint = Endpoint::of(authority.host(), port).map_err(|e| format!("{url:?}: {e}"))?;
    let request_target = match uri.path_and_query().map(|p| p.as_str()) {
        None | Some("") => "/".to_string(),
        Some(p) => p.to_string(),
    };
    Ok((endpoint, request_target))
}

impl Target {
    /// The checked form of `target`; an error naming the field when it sets not exactly one
    /// check, a `tcp` endpoint or an HTTP URL does not parse (anything but plain `http://` with a
    /// host, a space or a control character), or its address lies outside `destinations`.
    pub fn of(target: &ProbeTarget, destinations: &Destinations) -> Result<Target, String> {
        let name = &target.name;
        let check = match (&target.tcp, &target.http, &target.dns) {
            (Some(tcp), None, None) => Check::Tcp(
                Endpoint::parse(tcp)
                    .map_err(|e| format!("probes.targets[{name}].tcp: {tcp:?}: {e}"))?,
            ),
            (None, Some(http), None) => {
                let (endpoint, request_target) = parse_url(&http.url)
                    .map_err(|e| format!("probes.targets[{name}].http.url: {e}"))?;
                Check::Http {
                    endpoint,
                    request_target,
                    status: http.expect_status.unwrap_or(200),
                }
            }
            (None, None, Some(dns)) if is_dns_name(dns) => Check::Dns(dns.clone()),
            (None, None, Some(dns)) => {
                return Err(format!(
                    "probes.targets[{name}].dns: {dns:?} is not a DNS name"
                ))
            }
            _ => {
                return Err(format!(
                    "probes.targets[{name}]: set exactly one of tcp, http and dns"
                ))
            }
        };
        let target = Target {
            name: name.clone(),
            check,
        };
        if let Some(address) = target.endpoint().and_then(|e| e.host.parse().ok()) {
            destinations
                .judge(address)
                .map_err(|e| format!("probes.targets[{name}]: {}: {e}", target.shown()))?;
        }
        Ok(target)
    }

    /// Where it connects (none for a lookup).
    pub fn endpoint(&self) -> Option<&Endpoint> {
        match &self.check {
            Check::Tcp(e) | Check::Http { endpoint: e, .. } => Some(e),
            Check::Dns(_) => None,
        }
    }

    /// What it reaches for, as the status shows it.
    pub fn shown(&self) -> String {
        match &self.check {
            Check::Tcp(e) => e.authority(),
            Check::Dns(name) => name.clone(),
            Check::Http {
                endpoint,
                request_target,
                ..
            } => format!("http://{}{request_target}", endpoint.host_header()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn http(url: &str, status: Option<u16>) -> ProbeTarget {
        ProbeTarget {
            name: "web".into(),
            http: Some(hoststack_crds::HttpProbe {
                url: url.into(),
                expect_status: status,
            }),
            ..ProbeTarget::default()
        }
    }

    fn endpoint(host: &str, port: u16) -> Endpoint {
        Endpoint {
            host: host.into(),
            port,
        }
    }

    fn of(target: &ProbeTarget) -> Result<Check, String> {
        Target::of(target, &Destinations::default()).map(|t| t.check)
    }

    #[test]
    fn a_target_sets_exactly_one_check_and_http_urls_are_plain() {
        let table = [
            (
                http("http://198.18.0.9:8080/healthz?full=1", Some(204)),
                Ok(Check::Http {
                    endpoint: endpoint("198.18.0.9", 8080),
                    request_target: "/healthz?full=1".into(),
                    status: 204,
                }),
            ),
            (
                http("http://svc.local", None),
                Ok(Check::Http {
                    endpoint: endpoint("svc.local", 80),
                    request_target: "/".into(),
                    status: 200,
                }),
            ),
            (
                http("http://[2001:db8::9]:81/a%20b#fragment", None),
                Ok(Check::Http {
                    endpoint: endpoint("2001:db8::9", 81),
                    request_target: "/a%20b".into(),
                    status: 200,
                }),
            ),
            (
                http("https://svc.local/", None),
                Err(
                    "probes.targets[web].http.url: \"https://svc.local/\" is not a plain http:// URL"
                        .to_string(),
                ),
            ),
            (
                http("http://user:pw@svc.local/", None),
                Err(
                    "probes.targets[web].http.url: \"http://user:pw@svc.local/\" carries user information"
                        .to_string(),
                ),
            ),
            (
                ProbeTarget {
                    name: "web".into(),
                    tcp: Some("a:1".into()),
                    dns: Some("a".into()),
                    ..ProbeTarget::default()
                },
                Err("probes.targets[web]: set exactly one of tcp, http and dns".to_string()),
            ),
            (
                ProbeTarget {
                    name: "resolver".into(),
                    dns: Some("kubernetes.default".into()),
                    ..ProbeTarget::default()
                },
                Ok(Check::Dns("kubernetes.default".into())),
            ),
            (
                ProbeTarget {
                    name: "peer".into(),
                    tcp: Some("[2001:db8::9]:5300".into()),
                    ..ProbeTarget::default()
                },
                Ok(Check::Tcp(endpoint("2001:db8::9", 5300))),
            ),
        ];
        for (target, want) in table {
            assert_eq!(of(&target), want, "{target:?}");
        }
    }

    #[test]
    fn a_url_with_a_line_break_a_space_or_no_host_is_refused_naming_the_field() {
        for url in [
            "http://198.18.0.9/healthz HTTP/1.0\r\nX-Injected: 1\r\n\r\nGET /",
            "http://198.18.0.9/a\nb",
            "http://198.18.0.9/a b",
            "http://198.18.0.9\r\n/",
            "http://198.18.0.9/\u{85}",
            "http:///path",
            "http://a b/",
            "http://198.18.0.9:0/",
            "http://198.18.0.9:99999/",
            "ftp://198.18.0.9/",
            "198.18.0.9/healthz",
        ] {
            let refused = of(&http(url, None)).expect_err(url);
            assert!(
                refused.starts_with("probes.targets[web].http.url: "),
                "{url:?}: {refused}"
            );
        }
    }

    #[test]
    fn a_tcp_endpoint_or_dns_name_that_does_not_parse_is_refused_naming_the_field() {
        for (tcp, dns) in [
            (Some("198.18.0.9"), None),
            (Some("2001:db8::9:80"), None),
            (Some("svc\r\n:80"), None),
            (Some("svc:http"), None),
            (None, Some("kubernetes.default\nx")),
        ] {
            let target = ProbeTarget {
                name: "t".into(),
                tcp: tcp.map(String::from),
                dns: dns.map(String::from),
                ..ProbeTarget::default()
            };
            let refused = of(&target).expect_err(&format!("{target:?}"));
            let field = if tcp.is_some() { "tcp" } else { "dns" };
            assert!(
                refused.starts_with(&format!("probes.targets[t].{field}: ")),
                "{refused}"
            );
        }
    }

    #[test]
    fn an_address_outside_the_allowed_destinations_is_refused_before_anything_connects() {
        let tcp = |address: &str| ProbeTarget {
            name: "kubelet".into(),
            tcp: Some(address.into()),
            ..ProbeTarget::default()
        };
        let refused = of(&tcp("127.0.0.1:10250")).unwrap_err();
        assert!(
            refused.starts_with("probes.targets[kubelet]: 127.0.0.1:10250: 127.0.0.1 is loopback"),
            "{refused}"
        );
        let metadata = of(&http("http://169.254.169.254/latest/meta-data/", None)).unwrap_err();
        assert!(
            metadata.starts_with("probes.targets[web]: http://169.254.169.254/latest/meta-data/: 169.254.169.254 is link-local"),
            "{metadata}"
        );
        let narrow: Destinations = "198.18.0.0/15".parse().unwrap();
        assert!(Target::of(&tcp("198.18.0.9:80"), &narrow).is_ok());
        assert!(Target::of(&tcp("10.0.0.1:80"), &narrow)
            .unwrap_err()
            .contains("10.0.0.1 is outside the agents' allowed destinations (198.18.0.0/15)"));
        // A name is judged when it is resolved, before each connection.
        assert!(Target::of(&tcp("localhost:80"), &narrow).is_ok());
    }
}
