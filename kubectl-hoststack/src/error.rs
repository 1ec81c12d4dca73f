//! The plugin's one error type, each variant naming what is wrong, and the exit code scripts
//! see for it.

/// Exit code: the command did what it said.
pub const EXIT_OK: u8 = 0;
/// Exit code: the cluster could not be reached or refused the request, or the input was bad.
pub const EXIT_ERROR: u8 = 1;
/// Exit code: the command line did not parse (clap's own code).
pub const EXIT_USAGE: u8 = 2;
/// Exit code: the named tuning (or revision) does not exist.
pub const EXIT_NOT_FOUND: u8 = 3;
/// Exit code: the credentials are not allowed to do this (HTTP 401 or 403).
pub const EXIT_FORBIDDEN: u8 = 4;
/// Exit code of `status`: the rollout rolled back to the stable revision.
pub const EXIT_ROLLED_BACK: u8 = 10;
/// Exit code of `status`: nodes failed to apply and nothing rolled back.
pub const EXIT_FAILED: u8 = 11;
/// Exit code of `status`: the rollout is paused (by `rollout.paused` or an inconclusive
/// analysis).
pub const EXIT_PAUSED: u8 = 12;
/// Exit code of `status`: `--timeout` passed before the rollout ended.
pub const EXIT_TIMEOUT: u8 = 13;

/// Everything that can go wrong in a command.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The kubeconfig could not be read or names no usable context.
    #[error("kubeconfig: {0}")]
    Kubeconfig(String),
    /// The API server did not answer.
    #[error("API server unreachable: {0}")]
    Unreachable(String),
    /// A named object does not exist.
    #[error("{0}")]
    NotFound(String),
    /// The credentials may not do what was asked.
    #[error("no permission: {0}")]
    Forbidden(String),
    /// The API server refused the request for another reason.
    #[error("the API server refused {what}: {message}")]
    Refused {
        /// What was asked.
        what: String,
        /// The server's message.
        message: String,
    },
    /// The command cannot do what was asked in the rollout's current state, or its input is
    /// bad.
    #[error("{0}")]
    Invalid(String),
    /// Writing the output failed.
    #[error("output: {0}")]
    Output(String),
    /// Prometheus did not answer.
    #[error("Prometheus unreachable: {0}")]
    PrometheusUnreachable(String),
    /// Prometheus answered, but not with a result.
    #[error("Prometheus refused {0}")]
    PrometheusRefused(String),
}

/// Result with the plugin's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The process exit code for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::NotFound(_) => EXIT_NOT_FOUND,
            Error::Forbidden(_) => EXIT_FORBIDDEN,
            _ => EXIT_ERROR,
        }
    }

    /// Classifies a client error that happened while doing `what` (e.g. `reading
    /// NetworkTuning "edge"`); `missing` is the message for a 404.
    pub fn from_kube(error: kube::Error, what: &str, missing: impl FnOnce() -> String) -> Self {
        match error {
            kube::Error::Api(status) => match status.code {
                404 => {
                    if status
                        .message
                        .contains("could not find the requested resource")
                    {
                        Error::Refused {
                            what: what.to_string(),
                            message: format!(
                                "{} (are the hoststack CRDs installed?)",
                                status.message
                            ),
                        }
                    } else {
                        Error::NotFound(missing())
                    }
                }
                401 | 403 => Error::Forbidden(format!("{what}: {}", status.message)),
                _ => Error::Refused {
                    what: what.to_string(),
                    message: format!("{} ({} {})", status.message, status.code, status.reason),
                },
            },
            kube::Error::HyperError(e) => Error::Unreachable(format!("{what}: {e}")),
            kube::Error::Service(e) => Error::Unreachable(format!("{what}: {}", chain(&*e))),
            other => Error::Refused {
                what: what.to_string(),
                message: chain(&other),
            },
        }
    }

    /// Classifies a Prometheus client error that happened while asking `what` (e.g. `the range
    /// query "up"`): no answer is [`Error::PrometheusUnreachable`] naming the server, any other
    /// failure [`Error::PrometheusRefused`].
    pub fn from_prometheus(error: hoststack_promql::Error, what: &str) -> Self {
        match error {
            hoststack_promql::Error::Unreachable { url, reason } => {
                Error::PrometheusUnreachable(format!("{url}: {reason}"))
            }
            hoststack_promql::Error::Timeout { url, after } => {
                Error::PrometheusUnreachable(format!("{url}: no answer within {after:?}"))
            }
            other => Error::PrometheusRefused(format!("{what}: {other}")),
        }
    }
}

/// An error with its sources, `a: b: c`, so that "connection refused" is not hidden.
fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        let more = e.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = e.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;

    fn api(code: u16, message: &str) -> kube::Error {
        kube::Error::Api(
            Status {
                code,
                message: message.into(),
                reason: "X".into(),
                ..Status::default()
            }
            .boxed(),
        )
    }

    #[test]
    fn api_errors_get_their_exit_codes_and_name_what_is_wrong() {
        let missing = || "no NetworkTuning named \"edge\"".to_string();
        let e = Error::from_kube(
            api(404, "networktunings \"edge\" not found"),
            "reading",
            missing,
        );
        assert_eq!(
            (e.exit_code(), e.to_string().as_str()),
            (EXIT_NOT_FOUND, "no NetworkTuning named \"edge\"")
        );
        let e = Error::from_kube(api(403, "user x cannot patch"), "patching edge", missing);
        assert_eq!(e.exit_code(), EXIT_FORBIDDEN);
        assert_eq!(
            e.to_string(),
            "no permission: patching edge: user x cannot patch"
        );
        let e = Error::from_kube(
            api(404, "the server could not find the requested resource"),
            "listing",
            missing,
        );
        assert_eq!(e.exit_code(), EXIT_ERROR);
        assert!(e.to_string().contains("CRDs installed"), "{e}");
        let e = Error::from_kube(api(409, "conflict"), "patching", missing);
        assert_eq!(e.exit_code(), EXIT_ERROR);
    }

    #[tokio::test]
    async fn an_unreachable_prometheus_is_named_and_exits_1() {
        // A port nothing listens on: bind one, learn its number, and close it.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let endpoint =
            hoststack_promql::Endpoint::parse(&format!("http://127.0.0.1:{port}")).unwrap();
        let range = hoststack_promql::Range {
            start: 0.0,
            end: 1.0,
            step: 1.0,
        };
        let e = hoststack_promql::Client::new(endpoint)
            .query_range("up", range)
            .await
            .unwrap_err();
        let e = Error::from_prometheus(e, "the range query \"up\"");
        assert_eq!(e.exit_code(), EXIT_ERROR);
        assert!(
            e.to_string().starts_with(&format!(
                "Prometheus unreachable: http://127.0.0.1:{port}: "
            )),
            "{e}"
        );
    }

    #[test]
    fn a_refused_query_names_the_query_and_prometheus_message() {
        let refused = hoststack_promql::decode(
            br#"{"status":"error","errorType":"bad_data","error":"parse error"}"#,
        )
        .unwrap_err();
        let e = Error::from_prometheus(refused, "the range query \"up(\"");
        assert_eq!(e.exit_code(), EXIT_ERROR);
        assert_eq!(
            e.to_string(),
            "Prometheus refused the range query \"up(\": bad_data: parse error"
        );
    }
}
