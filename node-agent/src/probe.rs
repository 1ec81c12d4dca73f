//! The post-apply probes, run on the node's own network path (the agent's network namespace):
//! each target of the tuning (a TCP connect, a plain-HTTP GET and its status, a lookup by the
//! node's resolver), the default gateway (its address resolved by ARP, where the node has a
//! default route), and the API server — a new client (its own TCP and TLS connection, never one
//! the agent already holds) reads the agent's own NodeTuning back and must find the
//! confirmation it wrote pending. Each probe is retried until its timeout; none needs ICMP, and a
//! node without a default route skips the gateway. [`crate::confirmation`] decides what a round
//! means.

use std::net::Ipv4Addr;
use std::time::Duration;

use hoststack_crds::{NodeTuning, ProbeResult};
use kube::{Api, Client};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};
use tokio::time::{sleep, timeout, Instant};

use crate::confirmation::{backoff, Check, Checks, Target, API_SERVER_PROBE, GATEWAY_PROBE};

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

/// One round of `checks`: the targets, the default gateway, then the API server, each when
/// checked.
pub async fn round(checks: &Checks, api_server: ApiServer<'_>) -> Vec<ProbeResult> {
    let mut results = Vec::new();
    for target in &checks.targets {
        let outcome = retried(checks.timeout, || check(target)).await;
        results.push(result(&target.name, &target.shown(), outcome));
    }
    if checks.default_gateway {
        if let Some((gateway, device)) = default_gateway() {
            let outcome = retried(checks.timeout, || resolve(gateway)).await;
            let shown = format!("{gateway} via {device}");
            results.push(result(GATEWAY_PROBE, &shown, outcome));
        }
    }
    if checks.api_server {
        let url = api_server.config.cluster_url.to_string();
        let outcome = retried(checks.timeout, || read_back(&api_server)).await;
        results.push(result(API_SERVER_PROBE, &url, outcome));
    }
    results
}

/// One attempt at a target.
async fn check(target: &Target) -> Result<(), String> {
    match &target.check {
        Check::Tcp(address) => TcpStream::connect(address)
            .await
            .map(drop)
            .map_err(|e| e.to_string()),
        Check::Http {
            authority,
            path,
            status,
        } => http_get(authority, path, *status).await,
        Check::Dns(name) => match tokio::net::lookup_host((name.as_str(), 0)).await {
            Ok(mut found) => match found.next() {
                Some(_) => Ok(()),
                None => Err(format!("{name} resolved to no address")),
            },
            Err(e) => Err(format!("resolving {name}: {e}")),
        },
    }
}

/// A plain HTTP/1.0 GET of `path` from `authority`; passes when the status line says `want`.
async fn http_get(authority: &str, path: &str, want: u16) -> Result<(), String> {
    let mut stream = TcpStream::connect(authority)
        .await
        .map_err(|e| e.to_string())?;
    let host = authority.rsplit_once(':').map_or(authority, |(h, _)| h);
    let request = format!("GET {path} HTTP/1.0\r\nHost: {host}\r\nConnection: close\r\n\r\n");
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
    let line = String::from_utf8_lossy(&head[..read]);
    let line = line.lines().next().unwrap_or_default();
    let status: Option<u16> = line.split_whitespace().nth(1).and_then(|s| s.parse().ok());
    match status {
        Some(s) if s == want => Ok(()),
        Some(s) => Err(format!("answered {s}, not {want}")),
        None => Err(format!("no HTTP status line: {line:?}")),
    }
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

/// Runs `attempt` until it succeeds or `within` has passed (each attempt bounded by what is
/// left, the pauses between them backing off with jitter); the last error when none succeeded.
async fn retried<F, Fut>(within: Duration, mut attempt: F) -> Result<(), String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let deadline = Instant::now() + within;
    let mut failed = 0;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let error = match timeout(left, attempt()).await {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(e)) => e,
            Err(_) => format!("no answer within {within:?}"),
        };
        let pause = backoff(ATTEMPT_PAUSE, MAX_ATTEMPT_PAUSE, failed, fastrand::f64());
        if Instant::now() + pause >= deadline {
            return Err(error);
        }
        sleep(pause).await;
        failed += 1;
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

    #[tokio::test]
    async fn a_tcp_probe_passes_on_a_listener_and_fails_with_the_reason_without_one() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let open = listener.local_addr().unwrap().to_string();
        let target = Target {
            name: "web".into(),
            check: Check::Tcp(open),
        };
        assert_eq!(check(&target).await, Ok(()));
        drop(listener);
        let failed = retried(Duration::from_millis(600), || check(&target)).await;
        assert!(failed.unwrap_err().contains("refused"));
    }

    #[tokio::test]
    async fn an_http_probe_checks_the_status_line() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let authority = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            for answer in [
                "HTTP/1.0 200 OK\r\n\r\n",
                "HTTP/1.1 503 Unavailable\r\n\r\n",
            ] {
                let (mut s, _) = listener.accept().await.unwrap();
                let mut request = [0u8; 512];
                let _ = s.read(&mut request).await.unwrap();
                assert!(request.starts_with(b"GET /healthz HTTP/1.0\r\n"));
                s.write_all(answer.as_bytes()).await.unwrap();
            }
        });
        assert_eq!(http_get(&authority, "/healthz", 200).await, Ok(()));
        assert_eq!(
            http_get(&authority, "/healthz", 200).await,
            Err("answered 503, not 200".into())
        );
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
