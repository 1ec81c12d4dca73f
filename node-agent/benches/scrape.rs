//! Scrape benchmark: the agent's /metrics against Debian's prometheus-node-exporter with only
//! its netstat collector, set to every field (`--collector.netstat.fields='.*'`), side by side
//! in one run.
//!
//! `cargo bench -p hoststack-agent --bench scrape` (env `SCRAPES`, default 2000). The agent's
//! exporter runs in a child process (this binary again, with `HOSTSTACK_BENCH_SERVE=1`) on
//! 127.0.0.1, reading the real /proc; node_exporter runs on 127.0.0.1 too. Scrapes alternate
//! between the two, one plain HTTP/1.0 GET per scrape (text format, no compression, a new
//! connection each time, the same for both). For each: median and p99 latency (connect to
//! last byte), the server's CPU time (utime + stime from /proc/PID/stat) per scrape over the
//! measured scrapes, the response size and the number of samples. Prints one JSON object.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hoststack_agent::exporter::{serve, Exporter};

const SERVE_ENV: &str = "HOSTSTACK_BENCH_SERVE";

fn main() {
    if std::env::var_os(SERVE_ENV).is_some() {
        return serve_forever();
    }
    // `cargo bench` passes `--bench`; `cargo test --benches` would pass other flags: do
    // nothing then.
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!("run with `cargo bench -p hoststack-agent --bench scrape`");
        return;
    }
    let scrapes: usize = std::env::var("SCRAPES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2000);

    let mut agent = Server::agent();
    let mut node_exporter = Server::node_exporter();
    let servers = [&mut agent, &mut node_exporter];
    for s in servers {
        for _ in 0..50 {
            s.scrape();
        }
    }
    let cpu_before = [agent.cpu_ticks(), node_exporter.cpu_ticks()];
    let mut latencies = [Vec::with_capacity(scrapes), Vec::with_capacity(scrapes)];
    for _ in 0..scrapes {
        latencies[0].push(agent.scrape());
        latencies[1].push(node_exporter.scrape());
    }
    let cpu_after = [agent.cpu_ticks(), node_exporter.cpu_ticks()];
    let tick = clock_tick();
    let mut results = Vec::new();
    for (i, s) in [&agent, &node_exporter].into_iter().enumerate() {
        let lat = &mut latencies[i];
        lat.sort();
        let cpu = Duration::from_secs_f64((cpu_after[i] - cpu_before[i]) as f64 * tick);
        results.push(format!(
            "\"{}\": {{\"median_us\": {}, \"p99_us\": {}, \"cpu_us_per_scrape\": {:.1}, \"cpu_ms_total\": {}, \"bytes\": {}, \"samples\": {}, \"netstat_samples\": {}}}",
            s.name,
            lat[lat.len() / 2].as_micros(),
            lat[lat.len() * 99 / 100].as_micros(),
            cpu.as_secs_f64() * 1e6 / scrapes as f64,
            cpu.as_millis(),
            s.last.len(),
            s.last.lines().filter(|l| !l.starts_with('#') && !l.is_empty()).count(),
            s.netstat_samples(),
        ));
    }
    println!(
        "{{\"scrapes\": {scrapes}, \"kernel\": {:?}, {}}}",
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim(),
        results.join(", ")
    );
}

/// The child: the agent's exporter on 127.0.0.1, its address on stdout.
fn serve_forever() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let exporter = Arc::new(Exporter::new(std::path::Path::new("/proc")));
        let bound = serve("127.0.0.1:0".parse().unwrap(), exporter)
            .await
            .expect("bind");
        println!("{bound}");
        std::future::pending::<()>().await;
    });
}

/// A server under test, killed on drop.
struct Server {
    name: &'static str,
    child: Child,
    addr: SocketAddr,
    last: String,
}

impl Server {
    fn agent() -> Server {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .env(SERVE_ENV, "1")
            .stdout(Stdio::piped())
            .spawn()
            .expect("the bench's server child starts");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line.trim().parse().expect("the child prints its address");
        Server::ready("hoststack_agent", child, addr)
    }

    fn node_exporter() -> Server {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let child = Command::new("prometheus-node-exporter")
            .args([
                "--collector.disable-defaults",
                "--collector.netstat",
                "--collector.netstat.fields=.*",
                &format!("--web.listen-address={addr}"),
                "--log.level=warn",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus-node-exporter (Debian's package) starts");
        Server::ready("node_exporter", child, addr)
    }

    fn ready(name: &'static str, child: Child, addr: SocketAddr) -> Server {
        let mut server = Server {
            name,
            child,
            addr,
            last: String::new(),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(addr).is_err() {
            assert!(
                Instant::now() < deadline,
                "{name} does not listen on {addr}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        server.scrape();
        server
    }

    /// One GET /metrics; its latency, the body kept in `last`.
    fn scrape(&mut self) -> Duration {
        let start = Instant::now();
        let mut stream = TcpStream::connect(self.addr).unwrap();
        stream
            .write_all(b"GET /metrics HTTP/1.0\r\nHost: bench\r\nConnection: close\r\n\r\n")
            .unwrap();
        self.last.clear();
        stream.read_to_string(&mut self.last).unwrap();
        let took = start.elapsed();
        assert!(self.last.starts_with("HTTP/1.") && self.last.contains(" 200 "));
        took
    }

    /// utime + stime of the server process, in clock ticks.
    fn cpu_ticks(&self) -> u64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap();
        // Fields after the command name (which is in parentheses): state is field 3.
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        let fields: Vec<&str> = rest.split(' ').collect();
        fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
    }

    /// Samples of /proc/net/netstat and /proc/net/snmp fields in the last body.
    fn netstat_samples(&self) -> usize {
        self.last
            .lines()
            .filter(|l| l.starts_with("hoststack_netstat_") || l.starts_with("node_netstat_"))
            .count()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Seconds per clock tick (`getconf CLK_TCK`, 100 when it cannot be asked).
fn clock_tick() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .trim()
                .parse::<f64>()
                .ok()
        })
        .map_or(0.01, |hz| 1.0 / hz)
}
