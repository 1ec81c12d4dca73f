//! The dead-man confirmation of an applied revision, as pure decisions: which checks a
//! revision's `probes` ask for ([`Checks`]), and, while the revision is provisional, what the
//! agent does next ([`Window::step`]) and what a round of probes means ([`judge`]).
//!
//! A revision is applied provisionally (the journal keeps what undoes it,
//! [`crate::journal::Provisional`]). After `settleTime` the agent runs its probes: each
//! configured TCP target, and the API server — its own status, written with the confirmation
//! pending, read back over a new connection. All passing confirms the revision. A target that
//! fails reverts it at once: the change broke what the tuning says must keep working. An API
//! server that cannot be reached is retried until `confirmTimeout`: a node cut off from the
//! control plane cannot be told to roll back, so at the deadline it reverts by itself.

use std::time::Duration;

use hoststack_crds::{ProbeResult, ProbeTarget, Probes};

/// The probe name of the default-gateway check.
pub const GATEWAY_PROBE: &str = "default-gateway";

use crate::duration::parse_duration;

/// The probe name of the API-server check.
pub const API_SERVER_PROBE: &str = "api-server";

/// Default wait after the transaction before the probes that confirm it.
pub const DEFAULT_SETTLE: Duration = Duration::from_secs(1);
/// Default time one probe is retried before it fails.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// Default time a revision may stay unconfirmed.
pub const DEFAULT_CONFIRM_TIMEOUT: Duration = Duration::from_secs(60);
/// How soon a round of probes that could not reach the API server runs again.
pub const RETRY: Duration = Duration::from_secs(2);

/// What a revision's probes ask the agent to check after applying it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checks {
    /// Read the agent's own status back from the API server over a new connection.
    pub api_server: bool,
    /// Resolve the default gateway's address, where there is a default route.
    pub default_gateway: bool,
    /// The wait after the transaction before the confirming round.
    pub settle: Duration,
    /// How long one probe is retried.
    pub timeout: Duration,
    /// How long the revision may stay unconfirmed.
    pub confirm_timeout: Duration,
    /// The tuning's own targets.
    pub targets: Vec<Target>,
}

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
    /// A TCP connection to `host:port`.
    Tcp(String),
    /// A plain-HTTP GET of `path` from `authority` (`host:port`), answered with `status`.
    Http {
        /// `host:port`.
        authority: String,
        /// The request path, `/` at least.
        path: String,
        /// The status it must answer.
        status: u16,
    },
    /// A lookup of the name by the node's resolver.
    Dns(String),
}

impl Target {
    /// The checked form of `target`; an error naming the target when it sets not exactly one
    /// check or an HTTP URL that is not plain `http://`.
    pub fn of(target: &ProbeTarget) -> Result<Target, String> {
        let name = &target.name;
        let check = match (&target.tcp, &target.http, &target.dns) {
            (Some(tcp), None, None) => Check::Tcp(tcp.clone()),
            (None, Some(http), None) => {
                let rest = http.url.strip_prefix("http://").ok_or_else(|| {
                    format!(
                        "probes.targets[{name}].http.url: {:?} is not a plain http:// URL",
                        http.url
                    )
                })?;
                let (host, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
                if host.is_empty() {
                    return Err(format!(
                        "probes.targets[{name}].http.url: {:?} names no host",
                        http.url
                    ));
                }
                let authority = if host
                    .rsplit_once(':')
                    .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
                {
                    host.to_string()
                } else {
                    format!("{host}:80")
                };
                Check::Http {
                    authority,
                    path: if path.is_empty() {
                        "/".into()
                    } else {
                        path.into()
                    },
                    status: http.expect_status.unwrap_or(200),
                }
            }
            (None, None, Some(dns)) => Check::Dns(dns.clone()),
            _ => {
                return Err(format!(
                    "probes.targets[{name}]: set exactly one of tcp, http and dns"
                ))
            }
        };
        Ok(Target {
            name: name.clone(),
            check,
        })
    }

    /// What it reaches for, as the status shows it.
    pub fn shown(&self) -> String {
        match &self.check {
            Check::Tcp(t) | Check::Dns(t) => t.clone(),
            Check::Http {
                authority, path, ..
            } => format!("http://{authority}{path}"),
        }
    }
}

impl Checks {
    /// The checks of a revision with these `probes` (absent: the defaults); `None` when there is
    /// nothing to check (the API-server probe off and no target), so the revision is never
    /// provisional. A duration that does not parse is an error naming the field.
    pub fn of(probes: Option<&Probes>) -> Result<Option<Checks>, String> {
        let default = Probes::default();
        let p = probes.unwrap_or(&default);
        let duration = |field: &str, value: &Option<String>, default: Duration| match value {
            Some(text) => parse_duration(text).map_err(|e| format!("probes.{field}: {e}")),
            None => Ok(default),
        };
        let checks = Checks {
            api_server: p.api_server.unwrap_or(true),
            default_gateway: p.default_gateway.unwrap_or(true),
            settle: duration("settleTime", &p.settle_time, DEFAULT_SETTLE)?,
            timeout: duration("timeout", &p.timeout, DEFAULT_TIMEOUT)?,
            confirm_timeout: duration(
                "confirmTimeout",
                &p.confirm_timeout,
                DEFAULT_CONFIRM_TIMEOUT,
            )?,
            targets: p.targets.iter().map(Target::of).collect::<Result<_, _>>()?,
        };
        let any = checks.api_server || checks.default_gateway || !checks.targets.is_empty();
        Ok(any.then_some(checks))
    }
}

/// A provisional revision's window, in milliseconds since the epoch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Window {
    /// The revision awaiting confirmation.
    pub revision: String,
    /// When it was applied (the window opened).
    pub opened_at: u64,
    /// When the confirming round may run.
    pub settled_at: u64,
    /// When the revision is reverted unless confirmed.
    pub deadline: u64,
    /// When the next round runs (the settle time first, then after each round that could not
    /// reach the API server).
    pub next_round: u64,
    /// Why the last round did not confirm.
    pub last_error: Option<String>,
}

/// What the agent does about a provisional revision now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Nothing until this much later.
    Wait(Duration),
    /// Run a round of probes.
    Probe,
    /// The deadline passed: revert, for this reason.
    Expire(String),
}

impl Window {
    /// The window of `revision` applied at `now` under `checks`.
    pub fn open(revision: &str, checks: &Checks, now: u64) -> Self {
        let settled_at = now + millis(checks.settle);
        Window {
            revision: revision.to_string(),
            opened_at: now,
            settled_at,
            deadline: now + millis(checks.confirm_timeout),
            next_round: settled_at,
            last_error: None,
        }
    }

    /// What to do at `now`.
    pub fn step(&self, now: u64) -> Step {
        if now >= self.deadline {
            let why = self
                .last_error
                .as_deref()
                .unwrap_or("no round of probes passed");
            return Step::Expire(format!(
                "revision {} was not confirmed within {}s of its apply, so the agent reverted it by itself: {why}",
                self.revision,
                (self.deadline - self.opened_at) / 1000
            ));
        }
        if now >= self.next_round {
            Step::Probe
        } else {
            Step::Wait(Duration::from_millis(
                self.next_round.min(self.deadline) - now,
            ))
        }
    }

    /// Records a round at `now` that did not confirm, for `why`: the next one after
    /// [`RETRY`].
    pub fn retry(&mut self, now: u64, why: String) {
        self.last_error = Some(why);
        self.next_round = now + millis(RETRY);
    }
}

impl Step {
    /// The reason of an expiry.
    pub fn expired(self) -> Option<String> {
        match self {
            Step::Expire(why) => Some(why),
            Step::Wait(_) | Step::Probe => None,
        }
    }
}

/// What a round of probes decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Every probe passed: confirm.
    Confirm,
    /// A target failed: revert at once, for this reason.
    Revert(String),
    /// Only the API server could not be reached (or did not show the status yet): try again
    /// until the deadline.
    Retry(String),
}

/// The verdict of one round of probe `results`: a failure of the tuning's targets or of the
/// default gateway reverts; one of the API server is retried.
pub fn judge(results: &[ProbeResult]) -> Verdict {
    let failed = |r: &&ProbeResult| !r.passed;
    let describe = |r: &ProbeResult| {
        format!(
            "probe {} ({}) failed: {}",
            r.name,
            r.target,
            r.message.as_deref().unwrap_or("no reason given")
        )
    };
    if let Some(target) = results
        .iter()
        .filter(failed)
        .find(|r| r.name != API_SERVER_PROBE)
    {
        return Verdict::Revert(describe(target));
    }
    match results.iter().find(failed) {
        Some(api) => Verdict::Retry(describe(api)),
        None => Verdict::Confirm,
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(name: &str, passed: bool) -> ProbeResult {
        ProbeResult {
            name: name.into(),
            target: "198.18.0.1:443".into(),
            passed,
            message: (!passed).then(|| "connection refused".into()),
        }
    }

    #[test]
    fn checks_default_to_the_api_server_and_can_be_turned_off() {
        let checks = Checks::of(None).unwrap().expect("the defaults check");
        assert!(checks.api_server && checks.targets.is_empty());
        assert_eq!(
            (checks.settle, checks.timeout, checks.confirm_timeout),
            (DEFAULT_SETTLE, DEFAULT_TIMEOUT, DEFAULT_CONFIRM_TIMEOUT)
        );
        let off = Probes {
            api_server: Some(false),
            default_gateway: Some(false),
            ..Probes::default()
        };
        assert_eq!(Checks::of(Some(&off)), Ok(None));
        let target = Probes {
            confirm_timeout: Some("20s".into()),
            targets: vec![ProbeTarget {
                name: "web".into(),
                tcp: Some("198.18.0.9:80".into()),
                ..ProbeTarget::default()
            }],
            ..off.clone()
        };
        let checks = Checks::of(Some(&target)).unwrap().unwrap();
        assert_eq!(checks.confirm_timeout, Duration::from_secs(20));
        assert_eq!(checks.targets[0].check, Check::Tcp("198.18.0.9:80".into()));
        let bad = Probes {
            settle_time: Some("soon".into()),
            ..Probes::default()
        };
        assert!(Checks::of(Some(&bad))
            .unwrap_err()
            .starts_with("probes.settleTime: "));
    }

    #[test]
    fn a_target_sets_exactly_one_check_and_http_urls_are_plain() {
        let http = |url: &str, status| ProbeTarget {
            name: "web".into(),
            http: Some(hoststack_crds::HttpProbe {
                url: url.into(),
                expect_status: status,
            }),
            ..ProbeTarget::default()
        };
        let table = [
            (
                http("http://198.18.0.9:8080/healthz", Some(204)),
                Ok(Check::Http {
                    authority: "198.18.0.9:8080".into(),
                    path: "/healthz".into(),
                    status: 204,
                }),
            ),
            (
                http("http://svc.local", None),
                Ok(Check::Http {
                    authority: "svc.local:80".into(),
                    path: "/".into(),
                    status: 200,
                }),
            ),
            (
                http("https://svc.local/", None),
                Err("probes.targets[web].http.url: \"https://svc.local/\" is not a plain http:// URL".to_string()),
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
        ];
        for (target, want) in table {
            assert_eq!(Target::of(&target).map(|t| t.check), want, "{target:?}");
        }
    }

    #[test]
    fn a_window_settles_probes_retries_and_expires() {
        let checks = Checks::of(None).unwrap().unwrap();
        let mut w = Window::open("r2", &checks, 1_000_000);
        assert_eq!(w.step(1_000_000), Step::Wait(Duration::from_secs(1)));
        assert_eq!(w.step(1_001_000), Step::Probe);
        w.retry(1_001_000, "probe api-server failed: timed out".into());
        assert_eq!(w.step(1_002_000), Step::Wait(Duration::from_secs(1)));
        assert_eq!(w.step(1_003_000), Step::Probe);
        let Step::Expire(why) = w.step(1_060_000) else {
            panic!("expired")
        };
        assert!(
            why.starts_with("revision r2 was not confirmed within 60s")
                && why.ends_with("probe api-server failed: timed out"),
            "{why}"
        );
    }

    #[test]
    fn a_failed_target_reverts_at_once_and_an_unreachable_api_server_is_retried() {
        let all = [result(API_SERVER_PROBE, true), result("web", true)];
        assert_eq!(judge(&all), Verdict::Confirm);
        assert_eq!(judge(&[]), Verdict::Confirm);
        let web = [result(API_SERVER_PROBE, false), result("web", false)];
        assert_eq!(
            judge(&web),
            Verdict::Revert("probe web (198.18.0.1:443) failed: connection refused".into())
        );
        let api = [result(API_SERVER_PROBE, false), result("web", true)];
        assert!(matches!(judge(&api), Verdict::Retry(ref m) if m.starts_with("probe api-server")));
    }
}
