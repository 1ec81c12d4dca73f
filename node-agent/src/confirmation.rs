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

use hoststack_crds::{ProbeResult, Probes};

/// The probe name of the default-gateway check.
pub const GATEWAY_PROBE: &str = "default-gateway";

use crate::destinations::Destinations;
use crate::duration::parse_duration;
use crate::targets::Target;

/// The probe name of the API-server check.
pub const API_SERVER_PROBE: &str = "api-server";

/// Default wait after the transaction before the probes that confirm it.
pub const DEFAULT_SETTLE: Duration = Duration::from_secs(1);
/// Default time one probe is retried before it fails.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// Default time a revision may stay unconfirmed.
pub const DEFAULT_CONFIRM_TIMEOUT: Duration = Duration::from_secs(60);
/// The wait after the first round of probes that could not reach the API server; it doubles
/// with each further one, up to [`MAX_RETRY`].
pub const RETRY: Duration = Duration::from_secs(2);
/// The longest wait between two rounds of probes.
pub const MAX_RETRY: Duration = Duration::from_secs(16);

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

impl Checks {
    /// The checks of a revision with these `probes` (absent: the defaults); `None` when there is
    /// nothing to check (the API-server probe off and no target), so the revision is never
    /// provisional. A duration that does not parse, a `timeout` longer than `confirmTimeout`, a
    /// target that does not parse or whose address lies outside `destinations` is an error
    /// naming the field.
    pub fn of(
        probes: Option<&Probes>,
        destinations: &Destinations,
    ) -> Result<Option<Checks>, String> {
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
            targets: p
                .targets
                .iter()
                .map(|t| Target::of(t, destinations))
                .collect::<Result<_, _>>()?,
        };
        if checks.timeout > checks.confirm_timeout {
            return Err(format!(
                "probes.timeout: {:?} is longer than probes.confirmTimeout ({:?}): a probe must be \
                 able to end within the confirmation window",
                checks.timeout, checks.confirm_timeout
            ));
        }
        let any = checks.api_server || checks.default_gateway || !checks.targets.is_empty();
        Ok(any.then_some(checks))
    }
}

/// A provisional revision's window, in milliseconds of a monotonic clock (the watch loop's
/// [`crate::clock::Clocks::monotonic_millis`]): a step of the wall clock moves none of it.
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
    /// The last moment a round can start and still end by the deadline (`timeout` before it).
    pub last_call: u64,
    /// How many rounds did not confirm.
    pub failed_rounds: u32,
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
    /// The window of `revision` applied at `now` under `checks`. `jitter` (in `[0, 1)`) places
    /// the confirming round within `[settle, 2 × settle)`: the nodes of a wave, applied in the
    /// same second, spread their new connections to the API server over the settle time instead
    /// of opening them all at once.
    pub fn open(revision: &str, checks: &Checks, now: u64, jitter: f64) -> Self {
        let settle = millis(checks.settle);
        let settled_at = now + settle + scaled(settle, jitter);
        let deadline = now + millis(checks.confirm_timeout);
        Window {
            revision: revision.to_string(),
            opened_at: now,
            settled_at,
            deadline,
            next_round: settled_at,
            last_call: deadline.saturating_sub(millis(checks.timeout)),
            failed_rounds: 0,
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

    /// Records a round at `now` that did not confirm, for `why`. The next one runs after a
    /// [`backoff`] from [`RETRY`] up to [`MAX_RETRY`] (an API server too busy to answer is not
    /// asked ever more often by every node of a wave), but no later than the last call: the
    /// window always gets a round that can end by its deadline.
    pub fn retry(&mut self, now: u64, why: String, jitter: f64) {
        self.last_error = Some(why);
        let wait = millis(backoff(RETRY, MAX_RETRY, self.failed_rounds, jitter));
        self.failed_rounds += 1;
        self.next_round = if now < self.last_call {
            (now + wait).min(self.last_call)
        } else {
            now + wait
        };
    }
}

/// The wait before try `attempt` + 1 (`attempt` from 0) of something that failed: `first`
/// doubled with each attempt up to `max`, of which `jitter` (in `[0, 1)`) keeps between half and
/// all (so clients that failed together do not come back together).
pub fn backoff(first: Duration, max: Duration, attempt: u32, jitter: f64) -> Duration {
    let full = first
        .saturating_mul(2u32.saturating_pow(attempt.min(31)))
        .min(max);
    full / 2 + Duration::from_millis(scaled(millis(full / 2), jitter))
}

/// `jitter` (clamped to `[0, 1]`) of `ms` milliseconds.
fn scaled(ms: u64, jitter: f64) -> u64 {
    (ms as f64 * jitter.clamp(0.0, 1.0)) as u64
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
    use hoststack_crds::ProbeTarget;

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
        let checks = Checks::of(None, &Destinations::default())
            .unwrap()
            .expect("the defaults check");
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
        assert_eq!(Checks::of(Some(&off), &Destinations::default()), Ok(None));
        let target = Probes {
            confirm_timeout: Some("20s".into()),
            targets: vec![ProbeTarget {
                name: "web".into(),
                tcp: Some("198.18.0.9:80".into()),
                ..ProbeTarget::default()
            }],
            ..off.clone()
        };
        let checks = Checks::of(Some(&target), &Destinations::default())
            .unwrap()
            .unwrap();
        assert_eq!(checks.confirm_timeout, Duration::from_secs(20));
        assert_eq!(checks.targets[0].shown(), "198.18.0.9:80");
        let bad = Probes {
            settle_time: Some("soon".into()),
            ..Probes::default()
        };
        assert!(Checks::of(Some(&bad), &Destinations::default())
            .unwrap_err()
            .starts_with("probes.settleTime: "));
    }

    #[test]
    fn a_probe_timeout_longer_than_the_confirmation_window_is_refused() {
        // The same defaults as the schema's rule.
        assert_eq!(
            parse_duration(hoststack_crds::PROBE_TIMEOUT_DEFAULT),
            Ok(DEFAULT_TIMEOUT)
        );
        assert_eq!(
            parse_duration(hoststack_crds::CONFIRM_TIMEOUT_DEFAULT),
            Ok(DEFAULT_CONFIRM_TIMEOUT)
        );
        let long = |timeout: &str, confirm: Option<&str>| Probes {
            timeout: Some(timeout.into()),
            confirm_timeout: confirm.map(String::from),
            ..Probes::default()
        };
        assert!(Checks::of(Some(&long("20s", Some("20s"))), &Destinations::default()).is_ok());
        for probes in [long("21s", Some("20s")), long("2m", None)] {
            let refused = Checks::of(Some(&probes), &Destinations::default()).expect_err("refused");
            assert!(refused.starts_with("probes.timeout: "), "{refused}");
        }
    }

    #[test]
    fn a_window_settles_probes_retries_and_expires() {
        let checks = Checks::of(None, &Destinations::default()).unwrap().unwrap();
        let mut w = Window::open("r2", &checks, 1_000_000, 0.0);
        assert_eq!(w.step(1_000_000), Step::Wait(Duration::from_secs(1)));
        assert_eq!(w.step(1_001_000), Step::Probe);
        w.retry(1_001_000, "probe api-server failed: timed out".into(), 1.0);
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
    fn the_first_round_falls_within_one_settle_time_after_the_settle_time() {
        let checks = Checks::of(
            Some(&Probes {
                settle_time: Some("10s".into()),
                ..Probes::default()
            }),
            &Destinations::default(),
        )
        .unwrap()
        .unwrap();
        let rounds: Vec<u64> = [0.0, 0.25, 0.5, 0.999]
            .iter()
            .map(|&j| Window::open("r", &checks, 0, j).next_round)
            .collect();
        assert_eq!(rounds, [10_000, 12_500, 15_000, 19_990]);
    }

    #[test]
    fn retries_back_off_with_jitter_up_to_the_cap_and_keep_a_last_call() {
        // Half to all of 2 s, 4 s, 8 s, then 16 s for good.
        let waits: Vec<(u64, u64)> = (0..6)
            .map(|k| {
                let wait = |j| millis(backoff(RETRY, MAX_RETRY, k, j));
                (wait(0.0), wait(1.0))
            })
            .collect();
        assert_eq!(
            waits,
            [
                (1_000, 2_000),
                (2_000, 4_000),
                (4_000, 8_000),
                (8_000, 16_000),
                (8_000, 16_000),
                (8_000, 16_000)
            ]
        );
        assert_eq!(
            backoff(RETRY, MAX_RETRY, u32::MAX, 0.5),
            Duration::from_secs(12)
        );

        // A 60 s window with 5 s probes: the rounds the longest waits leave, then a last call
        // at 55 s that can still end by the deadline.
        let checks = Checks::of(None, &Destinations::default()).unwrap().unwrap();
        let mut w = Window::open("r", &checks, 0, 0.0);
        let mut rounds = vec![w.next_round];
        while let Step::Probe = w.step(w.next_round) {
            let now = w.next_round;
            w.retry(now, "probe api-server failed: timed out".into(), 1.0);
            rounds.push(w.next_round);
        }
        assert_eq!(
            rounds,
            [1_000, 3_000, 7_000, 15_000, 31_000, 47_000, 55_000, 71_000]
        );
        assert!(matches!(w.step(60_000), Step::Expire(_)));
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
