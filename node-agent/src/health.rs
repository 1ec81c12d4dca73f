//! Health samples for rollouts: the kernel's TCP counters over one window, as the operator asks
//! for them in `NodeTuning.spec.healthRequest` and reads them from `status.health`.
//!
//! The pure core: [`Counters::parse`] takes the six counters from `/proc/net/snmp` and
//! `/proc/net/netstat` (with the exporter's parser), [`measure`] turns two [`Snapshot`]s into a
//! `HealthSample` (deltas and rates), and [`Sampler`] is the window state machine — a fresh
//! window when the request changes, one sample at the end of each window, the sample cleared
//! once when the request goes away. The controller feeds it the request, the snapshots it reads
//! ([`Counters::read`]) and the revision the host is on, and writes status when a sample is new.

use std::path::Path;
use std::time::{Duration, Instant};

use hoststack_crds::{HealthRequest, HealthSample};
use k8s_openapi::jiff::{Timestamp, Unit};

use crate::duration::parse_duration;
use crate::exporter::netstat::{self, Value};

/// The shortest window the agent samples over; a shorter `window` is raised to it (the sample's
/// `durationMs` says what was measured).
pub const MIN_WINDOW: Duration = Duration::from_secs(1);

/// The counters a sample is made of, as (section, field) spelled by the kernel, in the order of
/// [`Counters`]' fields.
pub const FIELDS: [(&str, &str); 6] = [
    ("Tcp", "OutSegs"),
    ("Tcp", "RetransSegs"),
    ("TcpExt", "TCPSackRecovery"),
    ("TcpExt", "TCPDSACKRecv"),
    ("TcpExt", "TCPTimeouts"),
    ("TcpExt", "ListenDrops"),
];

/// The kernel's TCP counters at one moment, in the order of [`FIELDS`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters(pub [u64; FIELDS.len()]);

impl Counters {
    /// Takes the counters of [`FIELDS`] from the text of `/proc/net/snmp` and
    /// `/proc/net/netstat`; a file that does not parse, or a field missing from both, is an
    /// error naming it.
    pub fn parse(snmp: &[u8], netstat: &[u8]) -> Result<Counters, String> {
        let mut found: [Option<u64>; FIELDS.len()] = [None; FIELDS.len()];
        let mut entries = Vec::new();
        for (name, text) in [("snmp", snmp), ("netstat", netstat)] {
            netstat::parse(text, &mut entries).map_err(|e| format!("{name}: {e}"))?;
            for entry in &entries {
                let key = (entry.proto(text), entry.field(text));
                let Some(i) = FIELDS.iter().position(|f| *f == key) else {
                    continue;
                };
                if let Value::Counter(v) = entry.value {
                    found[i] = Some(v);
                }
            }
        }
        let mut counters = Counters::default();
        for (i, value) in found.into_iter().enumerate() {
            let (proto, field) = FIELDS[i];
            counters.0[i] = value.ok_or_else(|| format!("no counter {proto} {field}"))?;
        }
        Ok(counters)
    }

    /// Reads `<proc_root>/net/snmp` and `<proc_root>/net/netstat` — the counters of the network
    /// namespace the agent runs in — and parses them.
    pub fn read(proc_root: &Path) -> Result<Counters, String> {
        let read = |name: &str| {
            let path = proc_root.join("net").join(name);
            std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))
        };
        Counters::parse(&read("snmp")?, &read("netstat")?)
    }
}

/// The counters at one moment, with the wall-clock time (for the sample's start and end) and a
/// monotonic one (for its duration).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Snapshot {
    /// The counters.
    pub counters: Counters,
    /// When, by the wall clock.
    pub wall: Timestamp,
    /// When, by the monotonic clock.
    pub instant: Instant,
}

impl Snapshot {
    /// The counters under `proc_root` now.
    pub fn take(proc_root: &Path) -> Result<Snapshot, String> {
        Ok(Snapshot {
            counters: Counters::read(proc_root)?,
            wall: Timestamp::now(),
            instant: Instant::now(),
        })
    }
}

/// A sample and what went wrong measuring it.
#[derive(Clone, Debug, PartialEq)]
pub struct Measured {
    /// The sample.
    pub sample: HealthSample,
    /// The counters that went backwards between the snapshots (the namespace's counters were
    /// reset); when any did, the sample measured nothing: every delta 0, no rates, no revision.
    pub went_backwards: Vec<&'static str>,
}

/// The sample of the window from `start` to `end` answering `request_id`, on `revision` (the
/// revision the host was on for the whole window; `None` when there was none, or when it
/// changed or a transaction ran during the window).
///
/// Deltas are end minus start. Rates are per segment sent: the retransmit ratio
/// ΔRetransSegs/ΔOutSegs, and SACK recoveries and D-SACKs per thousand segments sent, as
/// decimals with six places; absent when ΔOutSegs is 0. A counter that went backwards is a reset,
/// never wrapped: see [`Measured::went_backwards`]. The sample is steady when `steady` says the
/// host stayed on one revision and no counter went backwards.
pub fn measure(
    request_id: &str,
    revision: Option<&str>,
    steady: bool,
    start: &Snapshot,
    end: &Snapshot,
) -> Measured {
    let went_backwards: Vec<&'static str> = FIELDS
        .iter()
        .zip(start.counters.0.iter().zip(end.counters.0.iter()))
        .filter(|(_, (a, b))| b < a)
        .map(|((_, field), _)| *field)
        .collect();
    let delta: [u64; FIELDS.len()] = if went_backwards.is_empty() {
        std::array::from_fn(|i| end.counters.0[i] - start.counters.0[i])
    } else {
        [0; FIELDS.len()]
    };
    let [out_segs, retrans_segs, sack_recoveries, dsacks, rto_timeouts, listen_drops] = delta;
    let rate = |n: u64, per: u64| (out_segs > 0).then(|| decimal(n, out_segs, per));
    let duration = end.instant.saturating_duration_since(start.instant);
    Measured {
        sample: HealthSample {
            request_id: request_id.to_string(),
            revision: revision
                .filter(|_| went_backwards.is_empty())
                .map(str::to_string),
            start: rfc3339(start.wall),
            end: rfc3339(end.wall),
            duration_ms: u64::try_from(duration.as_millis()).unwrap_or(u64::MAX),
            steady: steady && went_backwards.is_empty(),
            out_segs,
            retrans_segs,
            sack_recoveries,
            dsacks,
            rto_timeouts,
            listen_drops,
            retransmit_ratio: rate(retrans_segs, 1),
            sack_recoveries_per_kilo_segment: rate(sack_recoveries, 1000),
            dsacks_per_kilo_segment: rate(dsacks, 1000),
        },
        went_backwards,
    }
}

/// `n * scale / d` as a decimal with six places, rounded half up (`d` > 0).
pub fn decimal(n: u64, d: u64, scale: u64) -> String {
    const PLACES: u128 = 1_000_000;
    let (n, d) = (u128::from(n) * u128::from(scale), u128::from(d.max(1)));
    let micros = (n * PLACES + d / 2) / d;
    format!("{}.{:06}", micros / PLACES, micros % PLACES)
}

/// A time in RFC 3339, to the millisecond.
fn rfc3339(t: Timestamp) -> String {
    t.round(Unit::Millisecond).unwrap_or(t).to_string()
}

/// The length of a window as a request writes it (`2s`, `500ms`, `1m`), at least [`MIN_WINDOW`].
pub fn window_length(window: &str) -> Result<Duration, String> {
    parse_duration(window).map(|d| d.max(MIN_WINDOW))
}

/// One sampling window.
#[derive(Clone, Debug, PartialEq)]
struct Window {
    /// What it answers.
    request: HealthRequest,
    /// Its length.
    length: Duration,
    /// The counters at its start; `None` when they could not be read.
    start: Option<Snapshot>,
    /// When it ends.
    ends: Instant,
    /// The revision the host was on at its start.
    revision: Option<String>,
    /// A transaction started during it.
    disturbed: bool,
}

/// What ending a window gave.
#[derive(Clone, Debug, PartialEq)]
pub enum Ended {
    /// A new sample, now [`Sampler::latest`]: write status.
    Sample(Box<Measured>),
    /// No sample: the counters could not be read at the start or the end (the reason); the
    /// next window starts when they can be read.
    Unmeasured(String),
}

/// The sampling state machine of one node: at most one window at a time, and the latest sample.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sampler {
    window: Option<Window>,
    /// The latest sample, reported in status while a request is present.
    latest: Option<HealthSample>,
    /// A request whose window did not parse; not retried (nor logged again) until it changes.
    rejected: Option<HealthRequest>,
}

impl Sampler {
    /// A sampler with nothing to do.
    pub fn new() -> Self {
        Sampler::default()
    }

    /// Takes over the sample a previous run of the agent reported (the object's
    /// `status.health`), so that a restart does not clear a sample the operator may be reading.
    /// It stays only while a request is present (see [`Sampler::update`]).
    pub fn resume(&mut self, previous: Option<&HealthSample>) {
        if self.latest.is_none() {
            self.latest = previous.cloned();
        }
    }

    /// The sample to report in status: the latest one, while a request is present.
    pub fn latest(&self) -> Option<&HealthSample> {
        self.latest.as_ref()
    }

    /// When the current window ends.
    pub fn deadline(&self) -> Option<Instant> {
        self.window.as_ref().map(|w| w.ends)
    }

    /// Follows the request of the spec: a new or changed request starts a fresh window (with
    /// `snapshot`, taken only then, and `revision`, the revision the host is on); the same
    /// request keeps its window; no request stops sampling and forgets the latest sample, so
    /// that the next status write clears it. Errs (once per request) when its window does not
    /// parse.
    pub fn update(
        &mut self,
        request: Option<&HealthRequest>,
        revision: Option<&str>,
        snapshot: impl FnOnce() -> Result<Snapshot, String>,
    ) -> Result<(), String> {
        let Some(request) = request else {
            self.window = None;
            self.latest = None;
            self.rejected = None;
            return Ok(());
        };
        if self.window.as_ref().is_some_and(|w| w.request == *request)
            || self.rejected.as_ref() == Some(request)
        {
            return Ok(());
        }
        let length = match window_length(&request.window) {
            Ok(length) => length,
            Err(e) => {
                self.window = None;
                self.rejected = Some(request.clone());
                return Err(format!("health request {}: {e}", request.id));
            }
        };
        self.rejected = None;
        let start = snapshot();
        let now = start
            .as_ref()
            .map_or_else(|_| Instant::now(), |s| s.instant);
        self.window = Some(Window {
            request: request.clone(),
            length,
            start: start.as_ref().ok().copied(),
            ends: now + length,
            revision: revision.map(str::to_string),
            disturbed: false,
        });
        start.map(drop)
    }

    /// A transaction is starting: the current window's sample must not be credited to any
    /// revision.
    pub fn transaction_started(&mut self) {
        if let Some(w) = &mut self.window {
            w.disturbed = true;
        }
    }

    /// Ends the current window with `snapshot` (taken at its deadline) on `revision` (the
    /// revision the host is on now), and starts the next window of the same request from the
    /// same snapshot. `None` when no window is open.
    pub fn end(
        &mut self,
        revision: Option<&str>,
        snapshot: Result<Snapshot, String>,
    ) -> Option<Ended> {
        let window = self.window.take()?;
        let now = snapshot
            .as_ref()
            .map_or_else(|_| Instant::now(), |s| s.instant);
        self.window = Some(Window {
            start: snapshot.as_ref().ok().copied(),
            ends: now + window.length,
            revision: revision.map(str::to_string),
            disturbed: false,
            ..window.clone()
        });
        let (start, end) = match (window.start, snapshot) {
            (Some(start), Ok(end)) => (start, end),
            (_, Err(e)) => return Some(Ended::Unmeasured(e)),
            (None, Ok(_)) => {
                return Some(Ended::Unmeasured(
                    "the counters could not be read at the start of the window".into(),
                ))
            }
        };
        let steady = !window.disturbed && window.revision.as_deref() == revision;
        let measured = measure(
            &window.request.id,
            revision.filter(|_| steady),
            steady,
            &start,
            &end,
        );
        self.latest = Some(measured.sample.clone());
        Some(Ended::Sample(Box::new(measured)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SNMP: &str = "Tcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens PassiveOpens AttemptFails EstabResets CurrEstab InSegs OutSegs RetransSegs InErrs OutRsts InCsumErrors\n\
Tcp: 1 200 120000 -1 10 5 0 0 2 1000 2000 30 0 4 0\n\
Udp: InDatagrams NoPorts\n\
Udp: 7 0\n";

    const NETSTAT: &str = "TcpExt: SyncookiesSent ListenDrops TCPSackRecovery TCPTimeouts TCPDSACKRecv TCPSACKReneging\n\
TcpExt: 0 3 12 1 4 0\n\
IpExt: InNoRoutes InOctets\n\
IpExt: 0 123456\n";

    fn snap(counters: [u64; 6], second: i64) -> Snapshot {
        Snapshot {
            counters: Counters(counters),
            wall: Timestamp::from_second(1_800_000_000 + second).expect("time"),
            instant: base() + Duration::from_secs(u64::try_from(second).expect("second")),
        }
    }

    /// One monotonic origin for every snapshot of a test process.
    fn base() -> Instant {
        static BASE: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        *BASE.get_or_init(Instant::now)
    }

    #[test]
    fn counters_come_from_both_files_by_name() {
        let c = Counters::parse(SNMP.as_bytes(), NETSTAT.as_bytes()).expect("parses");
        // OutSegs, RetransSegs, TCPSackRecovery, TCPDSACKRecv, TCPTimeouts, ListenDrops.
        assert_eq!(c, Counters([2000, 30, 12, 4, 1, 3]));

        let no_dsack = NETSTAT.replace("TCPDSACKRecv", "TCPDSACKRecvSegs");
        assert_eq!(
            Counters::parse(SNMP.as_bytes(), no_dsack.as_bytes()),
            Err("no counter TcpExt TCPDSACKRecv".into())
        );
        let torn = "Tcp: OutSegs RetransSegs\nTcp: 1\n";
        let err = Counters::parse(torn.as_bytes(), NETSTAT.as_bytes()).expect_err("torn");
        assert!(err.starts_with("snmp: line 2:"), "{err}");
    }

    #[test]
    fn counters_of_this_kernel_parse() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/proc/linux-6.18");
        let c = Counters::read(&dir).expect("the fixture has every counter");
        assert!(c.0[0] > 0, "{c:?}");
        assert!(Counters::read(Path::new("/nonexistent")).is_err());
    }

    #[test]
    fn measure_table() {
        struct Case {
            name: &'static str,
            start: [u64; 6],
            end: [u64; 6],
            revision: Option<&'static str>,
            want: HealthSample,
            backwards: &'static [&'static str],
        }
        let sample = |d: [u64; 6]| HealthSample {
            request_id: "h1".into(),
            revision: Some("r1".into()),
            start: "2027-01-15T08:00:00Z".into(),
            end: "2027-01-15T08:00:02Z".into(),
            duration_ms: 2000,
            steady: true,
            out_segs: d[0],
            retrans_segs: d[1],
            sack_recoveries: d[2],
            dsacks: d[3],
            rto_timeouts: d[4],
            listen_drops: d[5],
            retransmit_ratio: None,
            sack_recoveries_per_kilo_segment: None,
            dsacks_per_kilo_segment: None,
        };
        let cases = [
            Case {
                name: "deltas and rates",
                start: [1000, 10, 5, 2, 1, 0],
                end: [4000, 40, 8, 11, 1, 2],
                revision: Some("r1"),
                want: HealthSample {
                    retransmit_ratio: Some("0.010000".into()),
                    sack_recoveries_per_kilo_segment: Some("1.000000".into()),
                    dsacks_per_kilo_segment: Some("3.000000".into()),
                    ..sample([3000, 30, 3, 9, 0, 2])
                },
                backwards: &[],
            },
            Case {
                name: "rates round half up to six places",
                start: [0; 6],
                end: [3, 1, 2, 0, 0, 0],
                revision: Some("r1"),
                want: HealthSample {
                    retransmit_ratio: Some("0.333333".into()),
                    sack_recoveries_per_kilo_segment: Some("666.666667".into()),
                    dsacks_per_kilo_segment: Some("0.000000".into()),
                    ..sample([3, 1, 2, 0, 0, 0])
                },
                backwards: &[],
            },
            Case {
                name: "nothing sent: no rates, the other deltas still count",
                start: [500, 7, 0, 0, 3, 0],
                end: [500, 7, 0, 0, 3, 9],
                revision: Some("r1"),
                want: sample([0, 0, 0, 0, 0, 9]),
                backwards: &[],
            },
            Case {
                name: "no revision during the window",
                start: [0; 6],
                end: [10, 0, 0, 0, 0, 0],
                revision: None,
                want: HealthSample {
                    revision: None,
                    retransmit_ratio: Some("0.000000".into()),
                    sack_recoveries_per_kilo_segment: Some("0.000000".into()),
                    dsacks_per_kilo_segment: Some("0.000000".into()),
                    ..sample([10, 0, 0, 0, 0, 0])
                },
                backwards: &[],
            },
            Case {
                name: "a counter that went backwards is a reset: nothing measured, never wrapped",
                start: [9000, 90, 9, 9, 9, 9],
                end: [100, 1, 0, 0, 0, 9],
                revision: Some("r1"),
                want: HealthSample {
                    revision: None,
                    ..sample([0; 6])
                },
                backwards: &[
                    "OutSegs",
                    "RetransSegs",
                    "TCPSackRecovery",
                    "TCPDSACKRecv",
                    "TCPTimeouts",
                ],
            },
            Case {
                name: "counters near the top of u64 do not overflow",
                start: [u64::MAX - 10, 0, 0, 0, 0, 0],
                end: [u64::MAX, 5, 0, 0, 0, 0],
                revision: Some("r1"),
                want: HealthSample {
                    retransmit_ratio: Some("0.500000".into()),
                    sack_recoveries_per_kilo_segment: Some("0.000000".into()),
                    dsacks_per_kilo_segment: Some("0.000000".into()),
                    ..sample([10, 5, 0, 0, 0, 0])
                },
                backwards: &[],
            },
        ];
        for case in cases {
            let got = measure(
                "h1",
                case.revision,
                true,
                &snap(case.start, 0),
                &snap(case.end, 2),
            );
            let want = HealthSample {
                steady: case.backwards.is_empty(),
                ..case.want
            };
            assert_eq!(got.sample, want, "{}", case.name);
            assert_eq!(got.went_backwards, case.backwards, "{}", case.name);
        }
    }

    #[test]
    fn decimals() {
        assert_eq!(decimal(0, 7, 1), "0.000000");
        assert_eq!(decimal(1, 2_000_000, 1), "0.000001");
        assert_eq!(decimal(1, 3_000_000, 1), "0.000000");
        assert_eq!(decimal(7, 7, 1), "1.000000");
        assert_eq!(decimal(5, 2, 1000), "2500.000000");
        assert_eq!(
            decimal(u64::MAX, 1, 1000),
            format!("{}.000000", u128::from(u64::MAX) * 1000)
        );
    }

    #[test]
    fn windows_parse_with_a_floor() {
        assert_eq!(window_length("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(window_length("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(window_length("200ms"), Ok(MIN_WINDOW));
        assert_eq!(window_length("0s"), Ok(MIN_WINDOW));
        assert!(window_length("99999999999h").is_err());
    }

    fn request(id: &str, window: &str) -> HealthRequest {
        HealthRequest {
            id: id.into(),
            window: window.into(),
        }
    }

    fn ok(s: Snapshot) -> impl FnOnce() -> Result<Snapshot, String> {
        move || Ok(s)
    }

    fn never() -> impl FnOnce() -> Result<Snapshot, String> {
        || panic!("no snapshot is needed")
    }

    #[test]
    fn one_sample_per_window_while_asked() {
        let mut s = Sampler::new();
        let h1 = request("h1", "2s");
        assert_eq!(s.deadline(), None);
        s.update(Some(&h1), Some("r1"), ok(snap([0; 6], 0)))
            .expect("starts");
        assert_eq!(s.deadline(), Some(base() + Duration::from_secs(2)));
        assert_eq!(s.latest(), None);
        // The same request again (a resync, a status event) keeps the window.
        s.update(Some(&h1), Some("r1"), never()).expect("kept");

        let Some(Ended::Sample(first)) = s.end(Some("r1"), Ok(snap([100, 1, 0, 0, 0, 0], 2)))
        else {
            panic!("a sample");
        };
        assert_eq!(first.sample.request_id, "h1");
        assert_eq!(first.sample.revision.as_deref(), Some("r1"));
        assert_eq!(first.sample.out_segs, 100);
        assert_eq!(s.latest(), Some(&first.sample));
        // The next window starts where the last one ended.
        assert_eq!(s.deadline(), Some(base() + Duration::from_secs(4)));
        let Some(Ended::Sample(second)) = s.end(Some("r1"), Ok(snap([150, 1, 0, 0, 0, 0], 4)))
        else {
            panic!("a sample");
        };
        assert_eq!(second.sample.out_segs, 50);
        assert_eq!(second.sample.start, first.sample.end);

        // The request goes away: no window, nothing to report, nothing to end.
        s.update(None, Some("r1"), never()).expect("stops");
        assert_eq!(s.latest(), None);
        assert_eq!(s.deadline(), None);
        assert_eq!(s.end(Some("r1"), Ok(snap([0; 6], 6))), None);
    }

    #[test]
    fn a_new_id_starts_a_fresh_window_and_keeps_the_old_sample_until_then() {
        let mut s = Sampler::new();
        s.update(Some(&request("h1", "2s")), None, ok(snap([0; 6], 0)))
            .expect("starts");
        s.end(None, Ok(snap([10, 0, 0, 0, 0, 0], 2)));
        // Asked again at second 3 with a new id: a fresh window from there.
        s.update(
            Some(&request("h2", "2s")),
            None,
            ok(snap([20, 0, 0, 0, 0, 0], 3)),
        )
        .expect("starts");
        assert_eq!(s.deadline(), Some(base() + Duration::from_secs(5)));
        assert_eq!(s.latest().map(|l| l.request_id.as_str()), Some("h1"));
        let Some(Ended::Sample(m)) = s.end(None, Ok(snap([25, 0, 0, 0, 0, 0], 5))) else {
            panic!("a sample");
        };
        assert_eq!((m.sample.request_id.as_str(), m.sample.out_segs), ("h2", 5));
        // Another window length is another request too.
        s.update(
            Some(&request("h2", "5s")),
            None,
            ok(snap([25, 0, 0, 0, 0, 0], 6)),
        )
        .expect("starts");
        assert_eq!(s.deadline(), Some(base() + Duration::from_secs(11)));
    }

    #[test]
    fn a_window_with_a_transaction_or_another_revision_credits_no_revision() {
        let mut s = Sampler::new();
        let h1 = request("h1", "2s");
        s.update(Some(&h1), Some("r1"), ok(snap([0; 6], 0)))
            .expect("starts");
        s.transaction_started();
        let Some(Ended::Sample(m)) = s.end(Some("r1"), Ok(snap([10, 0, 0, 0, 0, 0], 2))) else {
            panic!("a sample");
        };
        assert_eq!(
            m.sample.revision, None,
            "a transaction ran (a drift re-apply)"
        );
        // The next window is clean again.
        let Some(Ended::Sample(m)) = s.end(Some("r1"), Ok(snap([20, 0, 0, 0, 0, 0], 4))) else {
            panic!("a sample");
        };
        assert_eq!(m.sample.revision.as_deref(), Some("r1"));
        // The revision changed between start and end.
        let Some(Ended::Sample(m)) = s.end(Some("r2"), Ok(snap([30, 0, 0, 0, 0, 0], 6))) else {
            panic!("a sample");
        };
        assert_eq!(m.sample.revision, None);
        let Some(Ended::Sample(m)) = s.end(Some("r2"), Ok(snap([40, 0, 0, 0, 0, 0], 8))) else {
            panic!("a sample");
        };
        assert_eq!(m.sample.revision.as_deref(), Some("r2"));
        // Outside a window a transaction changes nothing.
        s.update(None, None, never()).expect("stops");
        s.transaction_started();
        assert_eq!(s, Sampler::new());
    }

    #[test]
    fn unreadable_counters_give_no_sample_and_the_next_window_starts_when_they_can_be_read() {
        let mut s = Sampler::new();
        let h1 = request("h1", "2s");
        let err = s
            .update(Some(&h1), None, || Err("snmp: gone".into()))
            .expect_err("reported");
        assert_eq!(err, "snmp: gone");
        assert!(s.deadline().is_some(), "the window runs anyway");
        assert!(matches!(
            s.end(None, Ok(snap([5, 0, 0, 0, 0, 0], 2))),
            Some(Ended::Unmeasured(_))
        ));
        assert_eq!(s.latest(), None);
        assert_eq!(
            s.end(None, Err("netstat: gone".into())),
            Some(Ended::Unmeasured("netstat: gone".into()))
        );
        assert!(matches!(
            s.end(None, Ok(snap([9, 0, 0, 0, 0, 0], 6))),
            Some(Ended::Unmeasured(_))
        ));
        let Some(Ended::Sample(m)) = s.end(None, Ok(snap([19, 0, 0, 0, 0, 0], 8))) else {
            panic!("a sample");
        };
        assert_eq!(m.sample.out_segs, 10);
    }

    #[test]
    fn a_bad_window_is_reported_once_per_request() {
        let mut s = Sampler::new();
        let bad = request("h1", "99999999999h");
        let err = s.update(Some(&bad), None, never()).expect_err("refused");
        assert!(
            err.starts_with("health request h1: invalid duration"),
            "{err}"
        );
        assert_eq!(s.deadline(), None);
        s.update(Some(&bad), None, never()).expect("not again");
        s.update(Some(&request("h1", "2s")), None, ok(snap([0; 6], 0)))
            .expect("a good one starts");
        assert!(s.deadline().is_some());
    }

    #[test]
    fn a_restart_keeps_the_previous_sample_while_asked() {
        let previous = measure("h1", Some("r1"), true, &snap([0; 6], 0), &snap([1; 6], 2)).sample;
        let mut s = Sampler::new();
        s.resume(Some(&previous));
        s.update(Some(&request("h1", "2s")), Some("r1"), ok(snap([0; 6], 10)))
            .expect("starts");
        assert_eq!(s.latest(), Some(&previous));
        s.update(None, Some("r1"), never()).expect("stops");
        assert_eq!(s.latest(), None);
    }
}
