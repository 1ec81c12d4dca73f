//! Where the Prometheus gate may send its queries, and with them the credentials of the Secret
//! the chart lets the operator read: only to the endpoints whoever installed the operator
//! configured (`--prometheus-address`, `--prometheus-allowed-address`), never to an address a
//! tuning's author chose, and over plain http only when the installer said so
//! (`--prometheus-allow-insecure`). A tuning chooses the query, not where credentials go.

use hoststack_promql::Endpoint;

use super::prometheus::Failure;

/// The outcome word when a tuning names an address the installer did not allow.
pub const ADDRESS_NOT_ALLOWED: &str = "AddressNotAllowed";
/// The outcome word when a tuning names no address and the installer configured none.
pub const NOT_CONFIGURED: &str = "NotConfigured";

/// The Prometheus endpoints the installer configured: the chart's values `prometheus.address`,
/// `prometheus.allowedAddresses` and `prometheus.allowInsecure`, as the operator's flags.
#[derive(clap::Args, Clone, Debug, Default, PartialEq)]
pub struct PrometheusEndpoints {
    /// The Prometheus the rollout gate asks (`http[s]://host[:port][/prefix]`) for a tuning
    /// that names no `analysis.prometheus.address`. Unset: such a gate is refused.
    #[arg(long = "prometheus-address", value_parser = Endpoint::parse)]
    default: Option<Endpoint>,
    /// Another Prometheus a tuning may name in `analysis.prometheus.address` (repeatable). The
    /// gate sends the Secret's credentials to each of these as to `--prometheus-address`.
    #[arg(long = "prometheus-allowed-address", value_parser = Endpoint::parse)]
    allowed: Vec<Endpoint>,
    /// Let the endpoints above be plain `http://`: the queries, the Secret's credentials and
    /// the answers then cross the network unencrypted. Without it an http endpoint stops the
    /// operator at start.
    #[arg(long = "prometheus-allow-insecure")]
    allow_insecure: bool,
}

impl PrometheusEndpoints {
    /// The endpoints `default` and `allowed`, http ones allowed when `allow_insecure`.
    pub fn new(default: Option<Endpoint>, allowed: Vec<Endpoint>, allow_insecure: bool) -> Self {
        PrometheusEndpoints {
            default,
            allowed,
            allow_insecure,
        }
    }

    /// Refuses a configuration with a plain http endpoint that `--prometheus-allow-insecure`
    /// does not allow, naming the flag.
    pub fn check(&self) -> Result<(), String> {
        let flags = self
            .default
            .iter()
            .map(|e| ("--prometheus-address", e))
            .chain(
                self.allowed
                    .iter()
                    .map(|e| ("--prometheus-allowed-address", e)),
            );
        for (flag, endpoint) in flags {
            self.secure(endpoint)
                .map_err(|why| format!("{flag} {endpoint}: {why}"))?;
        }
        Ok(())
    }

    /// The endpoint a tuning's gate asks: the one its `address` names if the installer allowed
    /// it, else the default; a refusal ([`ADDRESS_NOT_ALLOWED`], [`NOT_CONFIGURED`]) that says
    /// what is allowed otherwise. The gate opens no connection on a refusal.
    pub fn choose(&self, named: Option<&str>) -> Result<Endpoint, Failure> {
        let chosen = match named {
            None => self.default.clone().ok_or_else(|| Failure {
                reason: NOT_CONFIGURED,
                message: "the operator was installed without a Prometheus to ask (chart value \
                          prometheus.address, operator flag --prometheus-address); the gate \
                          sends no query"
                    .into(),
            })?,
            Some(address) => Endpoint::parse(address)
                .ok()
                .filter(|e| self.default.as_ref() == Some(e) || self.allowed.contains(e))
                .ok_or_else(|| Failure {
                    reason: ADDRESS_NOT_ALLOWED,
                    message: format!(
                        "analysis.prometheus.address {address:?} is not a Prometheus the \
                         operator was installed to ask ({}); the gate sends it no query and \
                         no credentials",
                        self.shown()
                    ),
                })?,
        };
        self.secure(&chosen).map_err(|why| Failure {
            reason: ADDRESS_NOT_ALLOWED,
            message: format!("{chosen}: {why}"),
        })?;
        Ok(chosen)
    }

    /// Whether `endpoint` may be used: https, or http when the installer allowed it.
    fn secure(&self, endpoint: &Endpoint) -> Result<(), &'static str> {
        if endpoint.tls() || self.allow_insecure {
            Ok(())
        } else {
            Err(
                "plain http would send the queries and the Secret's credentials unencrypted; \
                 use https, or allow http with --prometheus-allow-insecure (chart value \
                 prometheus.allowInsecure)",
            )
        }
    }

    /// The allowed endpoints in words, for a refusal.
    fn shown(&self) -> String {
        let mut all: Vec<String> = self
            .default
            .iter()
            .map(|e| format!("{e} (the default)"))
            .collect();
        all.extend(self.allowed.iter().map(Endpoint::to_string));
        if all.is_empty() {
            "none configured: chart value prometheus.address".into()
        } else {
            format!(
                "chart values prometheus.address and prometheus.allowedAddresses: {}",
                all.join(", ")
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        endpoints: PrometheusEndpoints,
    }

    fn parse(flags: &[&str]) -> Result<PrometheusEndpoints, clap::Error> {
        Flags::try_parse_from(std::iter::once("operator").chain(flags.iter().copied()))
            .map(|f| f.endpoints)
    }

    fn endpoint(url: &str) -> Endpoint {
        Endpoint::parse(url).unwrap()
    }

    #[test]
    fn the_flags_name_the_default_the_others_and_whether_http_is_allowed() {
        let e = parse(&[
            "--prometheus-address=https://prom.monitoring:9090",
            "--prometheus-allowed-address=https://thanos.monitoring/api/",
            "--prometheus-allowed-address",
            "http://mimir:8080/prometheus",
            "--prometheus-allow-insecure",
        ])
        .unwrap();
        assert_eq!(
            e,
            PrometheusEndpoints::new(
                Some(endpoint("https://prom.monitoring:9090")),
                vec![
                    endpoint("https://thanos.monitoring/api"),
                    endpoint("http://mimir:8080/prometheus")
                ],
                true
            )
        );
        assert_eq!(parse(&[]).unwrap(), PrometheusEndpoints::default());
        let bad = parse(&["--prometheus-address=ftp://prom"]).unwrap_err();
        assert!(
            bad.to_string().contains("only http:// and https://"),
            "{bad}"
        );
    }

    #[test]
    fn plain_http_needs_the_installers_word() {
        let http = parse(&["--prometheus-allowed-address=http://prom:9090"]).unwrap();
        let why = http.check().unwrap_err();
        assert!(
            why.starts_with("--prometheus-allowed-address http://prom:9090: plain http")
                && why.contains("--prometheus-allow-insecure"),
            "{why}"
        );
        let refused = http.choose(Some("http://prom:9090")).unwrap_err();
        assert_eq!(refused.reason, ADDRESS_NOT_ALLOWED);
        let allowed = parse(&[
            "--prometheus-address=http://prom:9090",
            "--prometheus-allow-insecure",
        ])
        .unwrap();
        assert_eq!(allowed.check(), Ok(()));
        assert_eq!(allowed.choose(None), Ok(endpoint("http://prom:9090")));
        let https = parse(&["--prometheus-address=https://prom:9090"]).unwrap();
        assert_eq!(https.check(), Ok(()));
    }

    #[test]
    fn a_tuning_gets_only_an_endpoint_the_installer_configured() {
        let installed = PrometheusEndpoints::new(
            Some(endpoint("https://prom.monitoring:9090")),
            vec![endpoint("https://thanos.monitoring/api")],
            false,
        );
        let none = PrometheusEndpoints::default();
        // (the tuning's address, the installer's endpoints) -> the endpoint, or the refusal.
        let table: [(Option<&str>, &PrometheusEndpoints, Result<&str, &str>); 9] = [
            (None, &installed, Ok("https://prom.monitoring:9090")),
            (
                Some("https://prom.monitoring:9090/"),
                &installed,
                Ok("https://prom.monitoring:9090"),
            ),
            (
                Some("https://thanos.monitoring:443/api"),
                &installed,
                Ok("https://thanos.monitoring:443/api"),
            ),
            (
                Some("https://evil.example:9090"),
                &installed,
                Err(ADDRESS_NOT_ALLOWED),
            ),
            // The same host over http, on another port, or under another prefix is another
            // endpoint.
            (
                Some("http://prom.monitoring:9090"),
                &installed,
                Err(ADDRESS_NOT_ALLOWED),
            ),
            (
                Some("https://prom.monitoring:9091"),
                &installed,
                Err(ADDRESS_NOT_ALLOWED),
            ),
            (
                Some("https://thanos.monitoring/other"),
                &installed,
                Err(ADDRESS_NOT_ALLOWED),
            ),
            (Some("not a url"), &installed, Err(ADDRESS_NOT_ALLOWED)),
            (None, &none, Err(NOT_CONFIGURED)),
        ];
        for (named, endpoints, want) in table {
            let got = endpoints.choose(named);
            match want {
                Ok(url) => assert_eq!(got, Ok(endpoint(url)), "{named:?}"),
                Err(reason) => {
                    let failure = got.expect_err(named.unwrap_or("no address"));
                    assert_eq!(failure.reason, reason, "{named:?}: {}", failure.message);
                }
            }
        }
        let refused = installed
            .choose(Some("https://evil.example:9090"))
            .unwrap_err();
        assert_eq!(
            refused.message,
            "analysis.prometheus.address \"https://evil.example:9090\" is not a Prometheus the \
             operator was installed to ask (chart values prometheus.address and \
             prometheus.allowedAddresses: https://prom.monitoring:9090 (the default), \
             https://thanos.monitoring:443/api); the gate sends it no query and no credentials"
        );
        let unset = none.choose(Some("https://prom:9090")).unwrap_err();
        assert!(
            unset
                .message
                .contains("(none configured: chart value prometheus.address)"),
            "{}",
            unset.message
        );
    }
}
