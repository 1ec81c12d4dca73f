//! A real Prometheus (Debian's `prometheus` package) scraping a lab's operator and agents, asked
//! with `hoststack-promql`'s blocking client — over http, or https with basic auth
//! ([`Prometheus::start_secured`]) — and a small HTTP GET for /metrics endpoints.
//!
//! Prometheus runs as a lab helper ([`Lab::spawn_helper`]), so it dies with the lab even when
//! the test process is killed; dropping [`Prometheus`] stops it and removes its directory.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use hoststack_promql::{blocking, Access, Client, Credentials, Data, Endpoint};

use crate::{Error, Lab, Result};

pub use hoststack_promql::Sample;

/// How often Prometheus scrapes every target.
pub const SCRAPE_INTERVAL: Duration = Duration::from_secs(1);

/// How long one query may take.
const QUERY_TIMEOUT: Duration = Duration::from_secs(5);

/// A Prometheus server scraping the lab: job `hoststack-operator` (the operator's /metrics) and
/// job `hoststack-agent` (every agent's, with the target label `node=<node>`, as a
/// ServiceMonitor relabelling would set it from the pod's node name).
pub struct Prometheus<'lab> {
    lab: &'lab Lab,
    addr: SocketAddr,
    dir: PathBuf,
    client: blocking::Client,
    url: String,
    ca_pem: Option<Vec<u8>>,
}

impl<'lab> Prometheus<'lab> {
    /// Writes the configuration, starts Prometheus with its own TSDB directory under the lab
    /// directory, and waits until it is ready.
    pub fn start(lab: &'lab Lab) -> Result<Prometheus<'lab>> {
        Self::launch(lab, None)
    }

    /// The same Prometheus, serving https only (a certificate for the lab's loopback address,
    /// signed by the lab's CA, [`Prometheus::ca_pem`]) to clients that log in as `user` with
    /// `password` (basic auth, `--web.config.file`).
    pub fn start_secured(lab: &'lab Lab, user: &str, password: &str) -> Result<Prometheus<'lab>> {
        Self::launch(lab, Some((user, password)))
    }

    fn launch(lab: &'lab Lab, login: Option<(&str, &str)>) -> Result<Prometheus<'lab>> {
        let dir = lab.dir().join("prometheus");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("data"))
            .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
        let write = |name: &str, text: &str| {
            let path = dir.join(name);
            std::fs::write(&path, text)
                .map_err(|e| Error::io(format!("writing {}", path.display()), e))
                .map(|_| path)
        };
        let config = write("prometheus.yml", &Self::config(lab))?;
        // A free port on the lab's own loopback address (not 9090: a packaged Prometheus
        // service may hold it on every address).
        let addr = std::net::TcpListener::bind((lab.loopback_ip(), 0))
            .and_then(|l| l.local_addr())
            .map_err(|e| Error::io("finding a free port for prometheus", e))?;
        let mut args = vec![
            "prometheus".to_string(),
            format!("--config.file={}", config.display()),
            format!("--storage.tsdb.path={}", dir.join("data").display()),
            format!("--web.listen-address={addr}"),
            "--storage.tsdb.retention.time=1d".into(),
            "--log.level=warn".into(),
        ];
        let mut access = Access::default();
        let mut ca_pem = None;
        if let Some((user, password)) = login {
            let (cert, key, ca) = lab.serving_certificate("prometheus", lab.loopback_ip())?;
            let hash = bcrypt::hash(password, 4)
                .map_err(|e| Error::Setup(format!("hashing the password: {e}")))?;
            let web = write(
                "web.yml",
                &format!(
                    "tls_server_config:\n  cert_file: {}\n  key_file: {}\n\
                     basic_auth_users:\n  {user}: {hash}\n",
                    cert.display(),
                    key.display()
                ),
            )?;
            args.push(format!("--web.config.file={}", web.display()));
            let pem = std::fs::read(&ca)
                .map_err(|e| Error::io(format!("reading {}", ca.display()), e))?;
            access = Access {
                ca_pem: Some(pem.clone()),
                credentials: Some(Credentials::Basic {
                    username: user.into(),
                    password: password.into(),
                }),
                headers: Vec::new(),
            };
            ca_pem = Some(pem);
        }
        let scheme = if login.is_some() { "https" } else { "http" };
        let endpoint = Endpoint::parse(&format!("{scheme}://{addr}"))
            .map_err(|e| Error::Setup(e.to_string()))?;
        let client = Client::with_access(endpoint, &access)
            .map_err(|e| Error::Setup(e.to_string()))?
            .with_timeout(QUERY_TIMEOUT);
        let client = blocking::Client::wrap(client)
            .map_err(|e| Error::io("starting the Prometheus client's runtime", e))?;
        let prometheus = Prometheus {
            lab,
            addr,
            dir,
            client,
            url: format!("{scheme}://{addr}"),
            ca_pem,
        };
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        lab.spawn_helper("prometheus", &argv)?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if prometheus.client.query("vector(1)", None).is_ok() {
                return Ok(prometheus);
            }
            if !lab.helper_running("prometheus") || Instant::now() > deadline {
                return Err(Error::Setup(format!(
                    "prometheus did not become ready on {addr}; its log:\n{}",
                    crate::process::tail(&lab.log_path("prometheus"), 20)
                )));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The base URL of its HTTP API: `http://…`, or `https://…` when secured.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The operator's flags that make this the Prometheus its rollout gate asks (the chart's
    /// `prometheus.address`, and `prometheus.allowInsecure` when it serves plain http).
    pub fn operator_args(&self) -> Vec<String> {
        let mut args = vec![format!("--prometheus-address={}", self.url)];
        if self.url.starts_with("http://") {
            args.push("--prometheus-allow-insecure".into());
        }
        args
    }

    /// The PEM of the CA that signed a secured Prometheus' certificate (the lab's CA).
    pub fn ca_pem(&self) -> Option<&[u8]> {
        self.ca_pem.as_deref()
    }

    /// The generated prometheus.yml.
    fn config(lab: &Lab) -> String {
        let secs = SCRAPE_INTERVAL.as_secs();
        let mut out = format!(
            "global:\n  scrape_interval: {secs}s\n  scrape_timeout: {secs}s\n  evaluation_interval: {secs}s\nscrape_configs:\n  - job_name: hoststack-operator\n    static_configs:\n      - targets: ['{}']\n  - job_name: hoststack-agent\n    static_configs:\n",
            lab.operator_metrics_address()
        );
        for node in lab.node_names() {
            out.push_str(&format!(
                "      - targets: ['{}']\n        labels: {{node: '{node}'}}\n",
                lab.agent_metrics_address(&node)
            ));
        }
        out
    }

    /// Where the HTTP API listens.
    pub fn address(&self) -> SocketAddr {
        self.addr
    }

    /// Evaluates `expr` at `time` (Unix seconds; now when `None`) with `/api/v1/query`. An
    /// expression Prometheus rejects, or any other failure, is an `Err` with its message.
    pub fn query(&self, expr: &str, time: Option<f64>) -> std::result::Result<Vec<Sample>, String> {
        match self.client.query(expr, time).map_err(|e| e.to_string())? {
            Data::Vector(samples) => Ok(samples),
            Data::Scalar { time, value } => Ok(vec![Sample {
                labels: BTreeMap::new(),
                time,
                value,
            }]),
            other => Err(format!("unexpected result type {:?}", other.kind())),
        }
    }

    /// The health of every scrape target, as `(job, instance) → up`.
    pub fn targets_up(&self) -> BTreeMap<(String, String), bool> {
        self.query("up", None)
            .unwrap_or_default()
            .into_iter()
            .map(|s| {
                let label = |k: &str| s.labels.get(k).cloned().unwrap_or_default();
                ((label("job"), label("instance")), s.value == 1.0)
            })
            .collect()
    }
}

impl Drop for Prometheus<'_> {
    fn drop(&mut self) {
        if let Some(Err(e)) = self.lab.stop_helper("prometheus") {
            eprintln!("stopping prometheus: {e}");
        }
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            eprintln!("removing {}: {e}", self.dir.display());
        }
    }
}

/// A plain HTTP/1.0 GET of `path` from `addr` (5 s timeouts); the status and the body.
/// `accept` sets the Accept header (e.g. `application/openmetrics-text` to ask a /metrics
/// endpoint for OpenMetrics, as Prometheus does).
pub fn http_get(
    addr: SocketAddr,
    path: &str,
    accept: Option<&str>,
) -> std::io::Result<(u16, String)> {
    let timeout = Duration::from_secs(5);
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let accept = accept.map_or(String::new(), |a| format!("Accept: {a}\r\n"));
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: {addr}\r\n{accept}Connection: close\r\n\r\n"
    )?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response)?;
    let text = String::from_utf8_lossy(&response);
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, "not an HTTP response");
    let (head, body) = text.split_once("\r\n\r\n").ok_or_else(bad)?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(bad)?;
    Ok((status, body.to_string()))
}

/// The `/metrics` text at `addr`, when it answers 200.
pub fn scrape(addr: SocketAddr) -> Option<String> {
    let (status, body) = http_get(addr, "/metrics", None).ok()?;
    (status == 200).then_some(body)
}

/// The value of the sample `series` (name and labels exactly as printed) in a /metrics `text`.
pub fn sample(text: &str, series: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

/// The transactions an agent's /metrics `text` counts for `revision`, by result (`applied`,
/// `failed`), from `hoststack_agent_revision_transactions_total`: empty when it ran none.
pub fn revision_transactions(text: &str, revision: &str) -> BTreeMap<String, u64> {
    let label = |labels: &str, name: &str| -> Option<String> {
        let start = labels.find(&format!("{name}=\""))? + name.len() + 2;
        let len = labels[start..].find('"')?;
        Some(labels[start..start + len].to_string())
    };
    text.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("hoststack_agent_revision_transactions_total{")?;
            let (labels, value) = rest.split_once("} ")?;
            if label(labels, "revision")? != revision {
                return None;
            }
            Some((label(labels, "result")?, value.trim().parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transactions_of_one_revision_by_result() {
        let text = "# TYPE hoststack_agent_revision_transactions counter\n\
            hoststack_agent_revision_transactions_total{tuning=\"edge\",revision=\"r1\",result=\"applied\"} 2\n\
            hoststack_agent_revision_transactions_total{tuning=\"edge\",revision=\"r2\",result=\"failed\"} 1\n\
            hoststack_agent_revision_transactions_total{tuning=\"edge\",revision=\"r1\",result=\"failed\"} 1\n\
            hoststack_agent_transactions_total{result=\"failed\"} 2\n";
        assert_eq!(
            revision_transactions(text, "r1"),
            BTreeMap::from([("applied".into(), 2), ("failed".into(), 1)])
        );
        assert_eq!(
            revision_transactions(text, "r2"),
            BTreeMap::from([("failed".into(), 1)])
        );
        assert!(revision_transactions(text, "r3").is_empty());
    }
}
