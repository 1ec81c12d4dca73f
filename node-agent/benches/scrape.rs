//! Scrape benchmark: the agent's `/metrics` against Debian's prometheus-node-exporter set up to
//! read the same files and export the same fields, side by side in one run.
//!
//! `cargo bench -p hoststack-agent --bench scrape` runs `ROUNDS` rounds (default 5) of
//! `SCRAPES` scrapes per server (default 2000), after 50 warm-up scrapes each, and prints one
//! JSON document. Run without `--bench` (as `cargo test --all-targets` does) it makes one round
//! of 20 scrapes to prove the harness works (and, without node_exporter installed, scrapes the
//! agent alone); figures go to docs/metrics.md, never into assertions.
//!
//! The two servers:
//! - the agent's exporter ([`Exporter`] served by [`serve`], the code the agent runs) in a child
//!   process, this binary again with `HOSTSTACK_BENCH_SERVE=1`, reading the real /proc;
//! - `prometheus-node-exporter` (Debian's node_exporter 1.5) with the collectors of the same
//!   files, netstat and softnet (`--collector.disable-defaults --collector.netstat
//!   --collector.softnet`), its own Go, process and promhttp metrics off
//!   (`--web.disable-exporter-metrics`), and `--collector.netstat.fields` set to the sections
//!   the agent exported in its first scrape (`^(Icmp|IcmpMsg|Ip|...)_`: every field of those
//!   sections, as the agent exports). Its netstat collector reads and parses /proc/net/snmp6
//!   whatever the regex says (it filters after parsing), so it gets a `--path.procfs` of its
//!   own: a temporary directory holding only `net/netstat`, `net/snmp` and `net/softnet_stat`,
//!   symlinks to /proc/net (the same files of the same namespace the agent reads); without
//!   snmp6 it behaves as on a host with IPv6 off.
//!
//! Both on 127.0.0.1, each scrape a new connection and one plain `GET /metrics` (HTTP/1.0, no
//! `Accept`, so both answer the Prometheus text format 0.0.4; no `Accept-Encoding`, so neither
//! compresses). Within a round the servers are scraped alternately, one scrape each in turn, the
//! order swapped every round. Per server and round: median and p99 latency (connect to last
//! byte), the server's CPU time per scrape (user + system of all its threads, from its
//! process CPU clock, `clock_getcpuclockid`), scrapes per CPU second and per wall second
//! (sequential scrapes, so wall is the latency sum); the JSON gives min/median/max of each over
//! the rounds, the response sizes and sample counts, and the set difference of the metric
//! families (node_exporter's `node_netstat_<Section>_<Field>` against the agent's
//! `hoststack_netstat_{total,value}{proto="<Section>", field="<Field>"}`, and the other
//! families by name without the `hoststack_`/`node_` prefix).
//!
//! What still differs:
//! - runtime and server: Go (net/http, a goroutine per connection, garbage collector, the
//!   collectors run in goroutines) against Rust (tokio's multi-threaded runtime, hyper/axum);
//!   both may use every core, so a server's CPU time per scrape can exceed its latency;
//! - process: node_exporter is its real binary; the agent side is the agent's exporter alone in
//!   a bench process (no controller, no Kubernetes watch running beside it);
//! - encoding: node_exporter makes one family per field (a `# HELP Statistic ...` and a
//!   `# TYPE ... untyped` line each), values as floats (`5.222082e+06`), from a map of strings it
//!   builds and parses on every scrape; the agent one labelled family with integer values,
//!   parsed in place into buffers kept between scrapes. The same netstat samples in different
//!   bytes (about 51 kB against 29 kB in all): the sizes are printed;
//! - extra work on each side: node_exporter adds `node_scrape_collector_{duration_seconds,
//!   success}` per collector, `node_exporter_build_info` and `promhttp_metric_handler_errors_total`
//!   (which the flag leaves on); its softnet collector exports 3 of the columns the agent's
//!   exports 6 of. The agent adds `node_info`, its transaction counters and histogram, its read
//!   errors, and looks its nftables table up over netlink on every scrape (the table does not
//!   exist here, so no samples and no rule listing, but the lookup is made).

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hoststack_agent::exporter::{serve, Exporter};
use serde_json::{json, Value};

/// Set in the child that serves the agent's exporter.
const SERVE_ENV: &str = "HOSTSTACK_BENCH_SERVE";
/// Debian's node_exporter binary.
const NODE_EXPORTER: &str = "prometheus-node-exporter";
/// The files under /proc both servers read.
const PROC_FILES: [&str; 3] = ["net/netstat", "net/snmp", "net/softnet_stat"];
/// node_exporter's family names that the agent spells differently (without prefixes).
const RENAMED: [(&str, &str); 1] = [("softnet_times_squeezed_total", "softnet_time_squeeze_total")];

fn main() -> Result<(), String> {
    if std::env::var_os(SERVE_ENV).is_some() {
        return serve_forever();
    }
    let full = std::env::args().any(|a| a == "--bench");
    let (rounds, scrapes, warmup) = if full {
        (env_count("ROUNDS", 5)?, env_count("SCRAPES", 2000)?, 50)
    } else {
        (1, 20, 2)
    };

    let mut servers = vec![Server::agent()?];
    let agent = Families::of_agent(&servers[0].body);
    let fields = fields_regex(&agent.netstat_sections);
    match Server::node_exporter(&fields) {
        Ok(server) => servers.push(server),
        Err(e) if !full => eprintln!("scraping the agent alone: {e}"),
        Err(e) => return Err(e),
    }

    for server in &mut servers {
        for _ in 0..warmup {
            server.scrape()?;
        }
    }
    let mut figures: Vec<Figures> = servers.iter().map(|_| Figures::default()).collect();
    for round in 0..rounds {
        let mut order: Vec<usize> = (0..servers.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        let cpu_before = servers
            .iter()
            .map(Server::cpu)
            .collect::<Result<Vec<_>, _>>()?;
        let mut latencies = vec![Vec::with_capacity(scrapes); servers.len()];
        for _ in 0..scrapes {
            for &i in &order {
                latencies[i].push(servers[i].scrape()?);
            }
        }
        for (i, server) in servers.iter().enumerate() {
            let cpu = server.cpu()?.saturating_sub(cpu_before[i]);
            figures[i].add_round(&mut latencies[i], cpu);
        }
    }

    let mut results = serde_json::Map::new();
    for (server, figures) in servers.iter().zip(&figures) {
        results.insert(server.name.to_string(), figures.json(&server.body));
    }
    let mut document = json!({
        "benchmark": "scrape",
        "kernel": std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim(),
        "rounds": rounds,
        "scrapes_per_round": scrapes,
        "warmup_scrapes": warmup,
        "results": results,
    });
    if let [agent_server, node_exporter] = &servers[..] {
        let ratio = |key: &str| {
            let median = |f: &Figures| f.spread(key).map(|(_, median, _)| median);
            let (agent, node_exporter) = (median(&figures[0])?, median(&figures[1])?);
            Some(round2(node_exporter / agent.max(f64::MIN_POSITIVE)))
        };
        document["node_exporter_args"] = json!(node_exporter.args);
        document["node_exporter_over_agent"] = json!({
            "median_latency": ratio("median_us"),
            "p99_latency": ratio("p99_us"),
            "cpu_per_scrape": ratio("cpu_us_per_scrape"),
            "bytes": round2(node_exporter.body.len() as f64 / agent_server.body.len().max(1) as f64),
        });
        document["families"] = agent.difference(&Families::of_node_exporter(&node_exporter.body));
    }
    let text = serde_json::to_string_pretty(&document).map_err(|e| e.to_string())?;
    println!("{text}");
    Ok(())
}

/// A positive count from the environment, `default` when unset.
fn env_count(name: &str, default: usize) -> Result<usize, String> {
    match std::env::var(name) {
        Err(_) => Ok(default),
        Ok(s) => s
            .parse()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| format!("{name}={s:?} is not a positive count")),
    }
}

/// The child: the agent's exporter on 127.0.0.1, its address on stdout.
fn serve_forever() -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("runtime: {e}"))?;
    runtime.block_on(async {
        let exporter = Arc::new(Exporter::new(std::path::Path::new("/proc")));
        let bound = serve(([127, 0, 0, 1], 0).into(), exporter)
            .await
            .map_err(|e| format!("bind: {e}"))?;
        println!("{bound}");
        std::future::pending::<()>().await;
        Ok(())
    })
}

/// `--collector.netstat.fields` selecting every field of `sections` and nothing else (the
/// snmp6 sections are `Ip6`, `Icmp6`, `Udp6`, `UdpLite6`: `^(Ip|...)_` does not match them).
/// Sections rather than an alternation of the ~310 field names: the same fields from the same
/// files, without making Go's regexp engine (about 30% of node_exporter's CPU per scrape with
/// the long alternation, measured on kernel 6.18) part of what is compared.
fn fields_regex(sections: &BTreeSet<String>) -> String {
    let sections: Vec<&str> = sections.iter().map(String::as_str).collect();
    format!("^({})_", sections.join("|"))
}

/// A server under test, killed on drop (and by the kernel if this process dies first).
struct Server {
    name: &'static str,
    child: Child,
    addr: SocketAddr,
    /// The arguments it was started with.
    args: Vec<String>,
    /// The body of the last response.
    body: String,
    /// node_exporter's procfs, removed after the server is killed.
    _procfs: Option<tempfile::TempDir>,
}

impl Server {
    fn agent() -> Result<Server, String> {
        let exe = std::env::current_exe().map_err(|e| format!("this binary: {e}"))?;
        let mut child = killed_with_parent(Command::new(exe))
            .env(SERVE_ENV, "1")
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("the agent's exporter child: {e}"))?;
        let mut line = String::new();
        if let Some(stdout) = child.stdout.take() {
            BufReader::new(stdout)
                .read_line(&mut line)
                .map_err(|e| format!("the child's address: {e}"))?;
        }
        let addr = line.trim().parse();
        // Built before the address is checked, so that dropping it kills the child.
        let mut server = Server {
            name: "hoststack_agent",
            child,
            addr: ([127, 0, 0, 1], 0).into(),
            args: Vec::new(),
            body: String::new(),
            _procfs: None,
        };
        server.addr = addr.map_err(|_| format!("the child printed {line:?}, not its address"))?;
        server.ready()?;
        Ok(server)
    }

    fn node_exporter(fields: &str) -> Result<Server, String> {
        let procfs = tempfile::tempdir().map_err(|e| format!("a procfs directory: {e}"))?;
        std::fs::create_dir(procfs.path().join("net")).map_err(|e| e.to_string())?;
        for file in PROC_FILES {
            std::os::unix::fs::symlink(format!("/proc/{file}"), procfs.path().join(file))
                .map_err(|e| format!("{file}: {e}"))?;
        }
        let addr = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("a free port: {e}"))?;
        let args = vec![
            "--collector.disable-defaults".to_string(),
            "--collector.netstat".to_string(),
            "--collector.softnet".to_string(),
            format!("--collector.netstat.fields={fields}"),
            "--web.disable-exporter-metrics".to_string(),
            format!("--path.procfs={}", procfs.path().display()),
            format!("--web.listen-address={addr}"),
            "--log.level=warn".to_string(),
        ];
        let child = killed_with_parent(Command::new(NODE_EXPORTER))
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("{NODE_EXPORTER} (Debian's package, scripts/setup.sh): {e}"))?;
        let mut server = Server {
            name: "node_exporter",
            child,
            addr,
            args,
            body: String::new(),
            _procfs: Some(procfs),
        };
        server.ready()?;
        Ok(server)
    }

    /// Waits until the server answers a scrape (10 s at most).
    fn ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(self.addr).is_err() {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("{} exited: {status}", self.name));
            }
            if Instant::now() > deadline {
                return Err(format!("{} does not listen on {}", self.name, self.addr));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.scrape().map(drop)
    }

    /// One GET /metrics on a new connection; its latency, the body kept in `body`.
    fn scrape(&mut self) -> Result<Duration, String> {
        let failed = |e: std::io::Error| format!("scraping {}: {e}", self.name);
        let start = Instant::now();
        let mut stream = TcpStream::connect(self.addr).map_err(failed)?;
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .map_err(failed)?;
        stream
            .write_all(b"GET /metrics HTTP/1.0\r\nHost: bench\r\nConnection: close\r\n\r\n")
            .map_err(failed)?;
        self.body.clear();
        stream.read_to_string(&mut self.body).map_err(failed)?;
        let took = start.elapsed();
        let Some(header_end) = self.body.find("\r\n\r\n") else {
            return Err(format!("{}: a response without headers", self.name));
        };
        let status = self.body.lines().next().unwrap_or_default();
        if !status.starts_with("HTTP/1.") || !status.contains(" 200 ") {
            return Err(format!("{}: {status}", self.name));
        }
        self.body.drain(..header_end + 4);
        Ok(took)
    }

    /// CPU time (user + system, every thread, exited ones included) of the server process.
    fn cpu(&self) -> Result<Duration, String> {
        let pid = libc::pid_t::try_from(self.child.id()).map_err(|e| e.to_string())?;
        let mut clock: libc::clockid_t = 0;
        // SAFETY: clock_getcpuclockid writes one clockid_t through a pointer to a local.
        let rc = unsafe { libc::clock_getcpuclockid(pid, &mut clock) };
        if rc != 0 {
            let e = std::io::Error::from_raw_os_error(rc);
            return Err(format!("the CPU clock of {}: {e}", self.name));
        }
        let mut now = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes one timespec through a pointer to a local.
        if unsafe { libc::clock_gettime(clock, &mut now) } != 0 {
            let e = std::io::Error::last_os_error();
            return Err(format!("the CPU time of {}: {e}", self.name));
        }
        let secs = u64::try_from(now.tv_sec).unwrap_or(0);
        let nanos = u32::try_from(now.tv_nsec).unwrap_or(0);
        Ok(Duration::new(secs, nanos))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `command`, set up so that its process is killed when this one's thread that spawns it ends
/// (a killed or panicking bench leaves no server behind).
fn killed_with_parent(mut command: Command) -> Command {
    // SAFETY: the closure runs between fork and exec and only calls prctl, which is
    // async-signal-safe, and reads errno.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
    command
}

/// The figures taken per server and round, by name in the JSON.
const FIGURES: [&str; 5] = [
    "median_us",
    "p99_us",
    "cpu_us_per_scrape",
    "scrapes_per_cpu_second",
    "scrapes_per_wall_second",
];

/// One server's figures: per figure of [`FIGURES`], one value per round.
#[derive(Debug, Default)]
struct Figures([Vec<f64>; FIGURES.len()]);

impl Figures {
    /// Adds a round of `latencies` (sorted here) that cost the server `cpu`.
    fn add_round(&mut self, latencies: &mut [Duration], cpu: Duration) {
        latencies.sort();
        let n = latencies.len();
        let at = |q: usize| latencies[(n * q).div_ceil(100).clamp(1, n) - 1];
        let micros = |d: Duration| d.as_secs_f64() * 1e6;
        let wall: Duration = latencies.iter().sum();
        let round = [
            micros(at(50)),
            micros(at(99)),
            micros(cpu) / n as f64,
            n as f64 / cpu.as_secs_f64().max(1e-9),
            n as f64 / wall.as_secs_f64().max(1e-9),
        ];
        for (values, value) in self.0.iter_mut().zip(round) {
            values.push(value);
        }
    }

    /// Min, median and max over the rounds of the figure `key` (one of [`FIGURES`]).
    fn spread(&self, key: &str) -> Option<(f64, f64, f64)> {
        let mut values = self.0[FIGURES.iter().position(|k| *k == key)?].clone();
        values.sort_by(f64::total_cmp);
        Some((*values.first()?, values[values.len() / 2], *values.last()?))
    }

    /// The figures and the last response's size as JSON.
    fn json(&self, body: &str) -> Value {
        let mut out = serde_json::Map::new();
        out.insert("bytes".into(), json!(body.len()));
        out.insert("samples".into(), json!(samples(body).count()));
        out.insert(
            "netstat_samples".into(),
            json!(samples(body)
                .filter(|l| l.starts_with("hoststack_netstat_") || l.starts_with("node_netstat_"))
                .count()),
        );
        for key in FIGURES {
            if let Some((min, median, max)) = self.spread(key) {
                out.insert(
                    key.into(),
                    json!({"min": round1(min), "median": round1(median), "max": round1(max)}),
                );
            }
        }
        Value::Object(out)
    }
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// The sample lines of a text-format body.
fn samples(body: &str) -> impl Iterator<Item = &str> {
    body.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
}

/// The metric families of a response, in common names.
#[derive(Debug, Default)]
struct Families {
    /// netstat/snmp fields as `Section_Field`.
    netstat: BTreeSet<String>,
    /// The sections of those fields.
    netstat_sections: BTreeSet<String>,
    /// Every other family, by name without the exporter's prefix, node_exporter's renamed to
    /// the agent's where they only differ in spelling ([`RENAMED`]).
    other: BTreeSet<String>,
}

impl Families {
    /// The agent's: `hoststack_netstat_{total,value}{stack="kernel", proto, field}` samples
    /// and every other `# TYPE` line.
    fn of_agent(body: &str) -> Families {
        let mut families = Families::default();
        for line in body.lines() {
            if let Some(name) = type_line(line) {
                if !name.starts_with("hoststack_netstat_") {
                    let name = name.strip_prefix("hoststack_").unwrap_or(name);
                    families.other.insert(name.to_string());
                }
            } else if line.starts_with("hoststack_netstat_total{")
                || line.starts_with("hoststack_netstat_value{")
            {
                if let (Some("kernel"), Some(proto), Some(field)) = (
                    label(line, "stack"),
                    label(line, "proto"),
                    label(line, "field"),
                ) {
                    families.netstat.insert(format!("{proto}_{field}"));
                    families.netstat_sections.insert(proto.to_string());
                }
            }
        }
        families
    }

    /// node_exporter's: every `# TYPE` line, `node_netstat_<Section>_<Field>` as netstat.
    fn of_node_exporter(body: &str) -> Families {
        let mut families = Families::default();
        for name in body.lines().filter_map(type_line) {
            if let Some(field) = name.strip_prefix("node_netstat_") {
                families.netstat.insert(field.to_string());
            } else {
                let name = name.strip_prefix("node_").unwrap_or(name);
                let name = RENAMED
                    .iter()
                    .find(|(theirs, _)| *theirs == name)
                    .map_or(name, |&(_, ours)| ours);
                families.other.insert(name.to_string());
            }
        }
        families
    }

    /// What both have and what only one has, as JSON.
    fn difference(&self, node_exporter: &Families) -> Value {
        let only = |a: &BTreeSet<String>, b: &BTreeSet<String>| -> Vec<String> {
            a.difference(b).cloned().collect()
        };
        json!({
            "netstat_fields": {
                "both": self.netstat.intersection(&node_exporter.netstat).count(),
                "only_agent": only(&self.netstat, &node_exporter.netstat),
                "only_node_exporter": only(&node_exporter.netstat, &self.netstat),
            },
            "other_families": {
                "both": self.other.intersection(&node_exporter.other).collect::<Vec<_>>(),
                "only_agent": only(&self.other, &node_exporter.other),
                "only_node_exporter": only(&node_exporter.other, &self.other),
            },
        })
    }
}

/// The family name of a `# TYPE name type` line.
fn type_line(line: &str) -> Option<&str> {
    line.strip_prefix("# TYPE ")?.split(' ').next()
}

/// The value of label `name` in a sample line (label values here never contain quotes).
fn label<'l>(line: &'l str, name: &str) -> Option<&'l str> {
    let labels = &line[line.find('{')? + 1..line.find('}')?];
    labels.split(',').find_map(|pair| {
        pair.strip_prefix(name)?
            .strip_prefix("=\"")?
            .strip_suffix('"')
    })
}
