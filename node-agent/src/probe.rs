//! The post-apply probes, run on the node's own network path (the agent's network namespace):
//! each target of the tuning (a TCP connect, a plain-HTTP GET and its status, a lookup by the
//! node's resolver), the default gateway (its address resolved by ARP, where the node has a
//! default route), and the API server — a new client (its own TCP and TLS connection, never one
//! the agent already holds) reads the agent's own NodeTuning back and must find the
//! confirmation it wrote pending. The probes of a round run side by side, each retried until
//! its timeout or the round's deadline (the confirmation window's), whichever comes first, and
//! a failed one says which ran out; none needs ICMP, and a node without a default route skips
//! the gateway. A target's host is resolved once per attempt and every address it resolves to
//! is judged against the agents' allowed destinations ([`crate::destinations`]) before
//! anything connects. [`crate::confirmation`] decides what a round means.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use futures::future::join_all;
use hoststack_crds::{NodeTuning, ProbeResult};
use kube::{Api, Client};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};
use tokio::time::{sleep, timeout_at, Instant};

use crate::confirmation::{backoff, Checks, API_SERVER_PROBE, GATEWAY_PROBE};
use crate::destinations::Destinations;
use crate::targets::{Check, Endpoint, Target};

/// The pause after the first failed attempt of a probe; it doubles with each further one, up to
/// [`MAX_ATTEMPT_PAUSE`].
const ATTEMPT_PAUSE: Duration = Duration::from_millis(250);
/// The longest pause between two attempts of a probe.
const MAX_ATTEMPT_PAUSE: Duration = Duration::from_secs(2);

/// What the API-server probe reads back.
pub struct ApiServer<'a> {
    /// The client configuration; every probe builds a new client from it.
    pub config: &'a kube::Config,
    /// The node, whose NodeTuning it reads.
    pub node: &'a str,
    /// The revision whose confirmation the status must show pending.
    pub revision: &'a str,
}

/// One round of `checks`, ended by `deadline` at the latest: the targets (connecting only to
/// `destinations`), the default gateway, then the API server, each when checked, all at once;
/// their results in that order.
pub async fn round(
    checks: &Checks,
    api_server: ApiServer<'_>,
    destinations: &Destinations,
    deadline: Instant,
) -> Vec<ProbeResult> {
    let within = Within {
        timeout: checks.timeout,
        deadline,
    };
    let targets = join_all(checks.targets.iter().map(|target| async move {
        let outcome = within.retried(|| check(target, destinations)).await;
        result(&target.name, &target.shown(), outcome)
    }));
    let gateway = async {
        let (gateway, device) = checks.default_gateway.then(default_gateway).flatten()?;
        let outcome = within
            .retried(|| async { resolve(gateway).await.map_err(Miss::Again) })
            .await;
        Some(result(
            GATEWAY_PROBE,
            &format!("{gateway} via {device}"),
            outcome,
        ))
    };
    let api = async {
        if !checks.api_server {
            return None;
        }
        let url = api_server.config.cluster_url.to_string();
        let outcome = within
            .retried(|| async { read_back(&api_server).await.map_err(Miss::Again) })
            .await;
        Some(result(API_SERVER_PROBE, &url, outcome))
    };
    let (mut results, gateway, api) = futures::join!(targets, gateway, api);
    results.extend(gateway);
    results.extend(api);
    results
}

/// Why one attempt of a probe did not pass.
#[derive(Debug, PartialEq, Eq)]
enum Miss {
    /// It may pass if tried again: the reason.
    Again(String),
    /// The agents' allowed destinations refuse where it would connect: no attempt can pass.
    Refused(String),
}

/// One attempt at a target.
async fn check(target: &Target, destinations: &Destinations) -> Result<(), Miss> {
    match &target.check {
        Check::Tcp(endpoint) => {
            let addresses = allowed_addresses(endpoint, destinations).await?;
            TcpStream::connect(&addresses[..])
                .await
                .map(drop)
                .map_err(|e| Miss::Again(e.to_string()))
        }
        Check::Http {
            endpoint,
            request_target,
            status,
        } => {
            let addresses = allowed_addresses(endpoint, destinations).await?;
            http_get(&addresses, endpoint, request_target, *status)
                .await
                .map_err(Miss::Again)
        }
        Check::Dns(name) => match tokio::net::lookup_host((name.as_str(), 0)).await {
            Ok(mut found) => match found.next() {
                Some(_) => Ok(()),
                None => Err(Miss::Again(format!("{name} resolved to no address"))),
            },
            Err(e) => Err(Miss::Again(format!("resolving {name}: {e}"))),
        },
    }
}

/// The addresses `endpoint` resolves to, once every one of them is judged allowed: a name that
/// resolves to one refused address is refused (it could answer from it), and the connection
/// goes to exactly the addresses judged (no second lookup between judging and connecting).
async fn allowed_addresses(
    endpoint: &Endpoint,
    destinations: &Destinations,
) -> Result<Vec<SocketAddr>, Miss> {
    let found: Vec<SocketAddr> = tokio::net::lookup_host((endpoint.host.as_str(), endpoint.port))
        .await
        .map_err(|e| Miss::Again(format!("resolving {}: {e}", endpoint.host)))?
        .collect();
    if found.is_empty() {
        return Err(Miss::Again(format!(
            "{} resolved to no address",
            endpoint.host
        )));
    }
    for address in &found {
        destinations.judge(address.ip()).map_err(|e| {
            Miss::Refused(format!(
                "refused before connecting: {} resolves to {e}",
                endpoint.host
            ))
        })?;
    }
    Ok(found)
}

/// A plain HTTP/1.0 GET of `request_target` from `endpoint` at one of `addresses`; passes
/// when the status line says `want`. Only the status code of the answer is reported, never
/// its bytes.
async fn http_get(
    addresses: &[SocketAddr],
    endpoint: &Endpoint,
    request_target: &str,
    want: u16,
) -> Result<(), String> {
    let mut stream = TcpStream::connect(addresses)
        .await
        .map_err(|e| e.to_string())?;
    let host = endpoint.host_header();
    let request =
        format!("GET {request_target} HTTP/1.0\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut head = vec![0u8; 256];
    let mut read = 0;
    while read < head.len() && !head[..read].contains(&b'\n') {
        let n = stream
            .read(&mut head[read..])
            .await
            .map_err(|e| e.to_string())?;
        if n == 0 {
            break;
        }
        read += n;
    }
    match status_code(&head[..read]) {
        Some(s) if s == want => Ok(()),
        Some(s) => Err(format!("answered {s}, not {want}")),
        None => Err("the answer does not begin with an HTTP status line".into()),
    }
}

/// The status code of an answer that begins with an HTTP status line (`HTTP/1.x NNN ...`).
fn status_code(answer: &[u8]) -> Option<u16> {
    let line = answer.split(|b| *b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?;
    let mut words = line.split_whitespace();
    words.next().filter(|v| v.starts_with("HTTP/"))?;
    words
        .next()
        .filter(|code| code.len() == 3)
        .and_then(|code| code.parse().ok())
}

/// The default route's IPv4 gateway and device, from the agent's own `/proc/net/route`; `None`
/// without one.
fn default_gateway() -> Option<(Ipv4Addr, String)> {
    let table = std::fs::read_to_string("/proc/net/route").ok()?;
    default_route(&table)
}

/// The default route of a `/proc/net/route` table: destination 0, mask 0, a gateway.
fn default_route(table: &str) -> Option<(Ipv4Addr, String)> {
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (device, destination, gateway, mask) = (
            fields.first()?,
            fields.get(1)?,
            fields.get(2)?,
            fields.get(7)?,
        );
        if *destination != "00000000" || *mask != "00000000" {
            return None;
        }
        // The kernel prints the address in host byte order (little-endian here).
        let raw = u32::from_str_radix(gateway, 16).ok()?;
        let gateway = Ipv4Addr::from(raw.swap_bytes());
        (!gateway.is_unspecified()).then(|| (gateway, device.to_string()))
    })
}

/// Whether the kernel resolves `gateway`'s link-layer address: a datagram to its discard port
/// makes it ask (ARP), and `/proc/net/arp` must then show the entry complete.
async fn resolve(gateway: Ipv4Addr) -> Result<(), String> {
    let socket = UdpSocket::bind("0.0.0.0:0")
        .await
        .map_err(|e| e.to_string())?;
    socket
        .send_to(&[0], (gateway, 9))
        .await
        .map_err(|e| e.to_string())?;
    sleep(Duration::from_millis(100)).await;
    let arp = std::fs::read_to_string("/proc/net/arp").map_err(|e| e.to_string())?;
    if resolved(&arp, gateway) {
        Ok(())
    } else {
        Err(format!("{gateway} does not answer address resolution"))
    }
}

/// Whether `/proc/net/arp` shows `address` complete (flag 0x2).
fn resolved(arp: &str, address: Ipv4Addr) -> bool {
    let address = address.to_string();
    arp.lines().skip(1).any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        fields.first() == Some(&address.as_str())
            && fields
                .get(2)
                .and_then(|f| u32::from_str_radix(f.trim_start_matches("0x"), 16).ok())
                .is_some_and(|flags| flags & 0x2 != 0)
    })
}

/// Reads the node's NodeTuning with a new client: passes when its status shows the revision's
/// confirmation pending (the agent's own status write went through and reads back).
async fn read_back(probe: &ApiServer<'_>) -> Result<(), String> {
    let client = Client::try_from(probe.config.clone()).map_err(|e| e.to_string())?;
    let api: Api<NodeTuning> = Api::all(client);
    // A GET: one key read from etcd, whatever the size of the pool. (A list by name is a
    // consistent read of the watch cache, which waits for the cache to catch up with etcd and
    // falls back to listing every NodeTuning from etcd: at 1,000 nodes such reads took 2 s on
    // average and most of those that fell back timed out.)
    let own = api.get_opt(probe.node).await.map_err(|e| e.to_string())?;
    let pending = own
        .as_ref()
        .and_then(|o| o.status.as_ref())
        .and_then(|s| s.confirmation.as_ref())
        .map(|c| c.revision.as_str());
    if pending == Some(probe.revision) {
        Ok(())
    } else {
        Err(format!(
            "the API server answered, but does not show the agent's status for revision {} yet",
            probe.revision
        ))
    }
}

/// How long a probe of a round is tried: its own timeout, but never past the round's deadline.
#[derive(Clone, Copy, Debug)]
struct Within {
    /// The probe's timeout (`probes.timeout`), from its first attempt.
    timeout: Duration,
    /// The end of the confirmation window (`probes.confirmTimeout`).
    deadline: Instant,
}

/// What ended the attempts of a probe that did not pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RanOut {
    /// The probe's own timeout.
    Timeout(Duration),
    /// The confirmation window.
    Deadline,
}

impl Within {
    /// Runs `attempt` until it succeeds, is refused, or the timeout or the deadline comes
    /// (each attempt bounded by what is left, the pauses between them backing off with jitter);
    /// the reason it did not pass, saying which ran out.
    async fn retried<F, Fut>(self, mut attempt: F) -> Result<(), String>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<(), Miss>>,
    {
        let timed_out = Instant::now() + self.timeout;
        let (end, ran_out) = if self.deadline < timed_out {
            (self.deadline, RanOut::Deadline)
        } else {
            (timed_out, RanOut::Timeout(self.timeout))
        };
        let mut failed = 0;
        loop {
            let last = match timeout_at(end, attempt()).await {
                Ok(Ok(())) => return Ok(()),
                Ok(Err(Miss::Refused(why))) => return Err(why),
                Ok(Err(Miss::Again(why))) => Some(why),
                Err(_) => None,
            };
            let pause = backoff(ATTEMPT_PAUSE, MAX_ATTEMPT_PAUSE, failed, fastrand::f64());
            if Instant::now() + pause >= end {
                return Err(gave_up(ran_out, last));
            }
            sleep(pause).await;
            failed += 1;
        }
    }
}

/// The reason of a probe that did not pass: the last attempt's error (none when it got no
/// answer at all), and what ran out.
fn gave_up(ran_out: RanOut, last: Option<String>) -> String {
    let until = match ran_out {
        RanOut::Timeout(t) => format!("the probe's timeout ({t:?}) ran out"),
        RanOut::Deadline => {
            "the confirmation window (probes.confirmTimeout) closed before the probe's timeout"
                .to_string()
        }
    };
    match last {
        Some(error) => format!("{error}; tried until {until}"),
        None => format!("no answer: {until}"),
    }
}

fn result(name: &str, target: &str, outcome: Result<(), String>) -> ProbeResult {
    ProbeResult {
        name: name.to_string(),
        target: target.to_string(),
        passed: outcome.is_ok(),
        message: outcome.err(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The loopback listeners of these tests, allowed by name.
    fn loopback() -> Destinations {
        "127.0.0.0/8".parse().unwrap()
    }

    fn tcp(name: &str, address: SocketAddr) -> Target {
        Target {
            name: name.into(),
            check: Check::Tcp(Endpoint {
                host: address.ip().to_string(),
                port: address.port(),
            }),
        }
    }

    /// Checks of `targets` alone, probed for `timeout` each.
    fn checks_of(targets: Vec<Target>, timeout: Duration) -> Checks {
        Checks {
            api_server: false,
            default_gateway: false,
            settle: Duration::ZERO,
            timeout,
            confirm_timeout: Duration::from_secs(60),
            targets,
        }
    }

    /// A round of `checks` (no API server) ending by `deadline`.
    async fn round_of(
        checks: &Checks,
        destinations: &Destinations,
        deadline: Instant,
    ) -> Vec<ProbeResult> {
        let config = kube::Config::new("http://127.0.0.1:1".parse().unwrap());
        let api_server = ApiServer {
            config: &config,
            node: "node-a",
            revision: "r1",
        };
        round(checks, api_server, destinations, deadline).await
    }

    #[tokio::test]
    async fn a_tcp_probe_passes_on_a_listener_and_fails_with_the_reason_without_one() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target = tcp("web", listener.local_addr().unwrap());
        assert_eq!(check(&target, &loopback()).await, Ok(()));
        drop(listener);
        let within = Within {
            timeout: Duration::from_millis(600),
            deadline: Instant::now() + Duration::from_secs(60),
        };
        let allowed = loopback();
        let failed = within.retried(|| check(&target, &allowed)).await;
        let failed = failed.unwrap_err();
        assert!(
            failed.contains("refused")
                && failed.ends_with("; tried until the probe's timeout (600ms) ran out"),
            "{failed}"
        );
    }

    #[tokio::test]
    async fn an_http_probe_sends_one_request_line_and_reports_only_the_status_code() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            for answer in [
                "HTTP/1.0 200 OK\r\n\r\n",
                "HTTP/1.1 503 Unavailable\r\n\r\n",
                "SSH-2.0-OpenSSH_9.6 secret banner\r\n",
            ] {
                let (mut s, _) = listener.accept().await.unwrap();
                let mut request = [0u8; 512];
                let n = s.read(&mut request).await.unwrap();
                let request = String::from_utf8_lossy(&request[..n]).to_string();
                let host = format!("Host: {address}");
                let lines: Vec<&str> = request.split("\r\n").collect();
                assert_eq!(
                    lines,
                    [
                        "GET /healthz?x=%0D%0A HTTP/1.0",
                        &host,
                        "Connection: close",
                        "",
                        ""
                    ]
                );
                s.write_all(answer.as_bytes()).await.unwrap();
            }
        });
        let endpoint = Endpoint {
            host: address.ip().to_string(),
            port: address.port(),
        };
        let addresses = [address];
        let get = || http_get(&addresses, &endpoint, "/healthz?x=%0D%0A", 200);
        assert_eq!(get().await, Ok(()));
        assert_eq!(get().await, Err("answered 503, not 200".into()));
        assert_eq!(
            get().await,
            Err("the answer does not begin with an HTTP status line".into())
        );
    }

    #[test]
    fn a_failed_probe_says_which_ran_out() {
        let timeout = RanOut::Timeout(Duration::from_secs(5));
        assert_eq!(
            gave_up(timeout, None),
            "no answer: the probe's timeout (5s) ran out"
        );
        assert_eq!(
            gave_up(RanOut::Deadline, Some("connection refused".into())),
            "connection refused; tried until the confirmation window (probes.confirmTimeout) \
             closed before the probe's timeout"
        );
    }

    /// Three HTTP targets that accept and never answer, probed for 5 s each, in a window that
    /// closes 6 s after the round starts: the round ends by then, on tokio's paused clock, and
    /// says the probes' timeout ran out; a window that closes first says so.
    #[tokio::test(start_paused = true)]
    async fn a_round_of_targets_that_never_answer_ends_by_the_deadline() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let silent = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = listener.accept().await {
                held.push(s);
            }
        });
        let targets = ["a", "b", "c"].map(|name| Target {
            name: name.into(),
            check: Check::Http {
                endpoint: Endpoint {
                    host: silent.ip().to_string(),
                    port: silent.port(),
                },
                request_target: "/".into(),
                status: 200,
            },
        });
        let checks = checks_of(targets.to_vec(), Duration::from_secs(5));
        for (window, ran_out) in [
            (Duration::from_secs(6), "the probe's timeout (5s) ran out"),
            (Duration::from_secs(2), "the confirmation window"),
        ] {
            let start = Instant::now();
            let deadline = start + window;
            let results = round_of(&checks, &loopback(), deadline).await;
            assert!(
                Instant::now() <= deadline,
                "the round ended {:?} after it started, past the deadline at {window:?}",
                Instant::now() - start
            );
            assert_eq!(results.len(), 3);
            for r in &results {
                let message = r.message.as_deref().unwrap_or_default();
                assert!(!r.passed && message.contains(ran_out), "{r:?}");
            }
        }
    }

    /// A name that resolves to a refused address is refused before anything connects, at once
    /// rather than after its timeout.
    #[tokio::test(start_paused = true)]
    async fn a_name_that_resolves_outside_the_allowed_destinations_is_refused_at_once() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let target = Target {
            name: "kubelet".into(),
            check: Check::Tcp(Endpoint {
                host: "localhost".into(),
                port,
            }),
        };
        let checks = checks_of(vec![target], Duration::from_secs(5));
        let start = Instant::now();
        let results = round_of(
            &checks,
            &Destinations::default(),
            start + Duration::from_secs(60),
        )
        .await;
        assert_eq!(Instant::now(), start, "no attempt was retried");
        let message = results[0].message.as_deref().unwrap_or_default();
        assert!(
            !results[0].passed
                && message.starts_with("refused before connecting: localhost resolves to ")
                && message.contains("loopback"),
            "{results:?}"
        );
        let accepted = tokio::time::timeout(Duration::from_millis(1), listener.accept()).await;
        assert!(accepted.is_err(), "nothing connected");
    }

    #[test]
    fn the_default_route_and_a_resolved_neighbour_are_read_from_proc() {
        let route =
            "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
                     eth0\t00000000\t010212C6\t0003\t0\t0\t0\t00000000\t0\t0\t0\n\
                     eth0\t000212C6\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n";
        assert_eq!(
            default_route(route),
            Some((Ipv4Addr::new(198, 18, 2, 1), "eth0".into()))
        );
        let no_default = route
            .lines()
            .take(1)
            .chain(route.lines().skip(2))
            .collect::<Vec<_>>()
            .join("\n");
        assert_eq!(default_route(&no_default), None);
        let arp =
            "IP address       HW type     Flags       HW address            Mask     Device\n\
                   198.18.2.1       0x1         0x2         aa:bb:cc:dd:ee:ff     *        eth0\n\
                   198.18.2.9       0x1         0x0         00:00:00:00:00:00     *        eth0\n";
        assert!(resolved(arp, Ipv4Addr::new(198, 18, 2, 1)));
        assert!(!resolved(arp, Ipv4Addr::new(198, 18, 2, 9)));
        assert!(!resolved(arp, Ipv4Addr::new(198, 18, 2, 7)));
    }
}
