//! What a scale run measures, before and after each scenario: the operator's CPU time and
//! peak memory (from /proc), the API server's request counters (`apiserver_request_total`), the
//! operator's watch events and reconcile durations (its /metrics), the writes in the audit log
//! by who made them, and etcd's database size.

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::net::SocketAddr;
use std::time::Instant;

use serde_json::{json, Value};

use crate::prometheus::scrape;
use crate::Lab;

/// One sample of an exposition: name, labels, value.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// The metric's name.
    pub name: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its value.
    pub value: f64,
}

/// The samples of a Prometheus text exposition (comments and malformed lines skipped).
pub fn samples(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(parse_line)
        .collect()
}

fn parse_line(line: &str) -> Option<Sample> {
    let (series, value) = match line.find('{') {
        Some(_) => {
            let close = line.rfind('}')?;
            (&line[..=close], line[close + 1..].trim())
        }
        None => line.split_once(' ')?,
    };
    let value: f64 = value.split_whitespace().next()?.parse().ok()?;
    let (name, labels) = match series.split_once('{') {
        Some((name, rest)) => (name, labels(rest.strip_suffix('}')?)?),
        None => (series, BTreeMap::new()),
    };
    Some(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

/// `a="x",b="y\"z"` as a map.
fn labels(mut text: &str) -> Option<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    while !text.is_empty() {
        let (key, rest) = text.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next()? {
                (i, '"') => break i,
                (_, '\\') => value.push(chars.next()?.1),
                (_, c) => value.push(c),
            }
        };
        out.insert(key.trim_start_matches(',').to_string(), value);
        text = rest[end + 1..].trim_start_matches(',');
    }
    Some(out)
}

/// The sum of `name`'s samples whose labels match `filter`, keyed by `key` of their labels.
fn sums_by(
    samples: &[Sample],
    name: &str,
    key: impl Fn(&BTreeMap<String, String>) -> String,
) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for s in samples.iter().filter(|s| s.name == name) {
        *out.entry(key(&s.labels)).or_insert(0.0) += s.value;
    }
    out
}

/// A process's CPU seconds (user + system) and peak resident memory in bytes.
pub fn cpu_and_peak(pid: u32) -> Option<(f64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // After the command: state is field 3, utime 14 and stime 15 (1-based), in clock ticks.
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let hwm_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some((ticks as f64 / hz, hwm_kib * 1024))
}

/// Starts a new peak-memory measurement of `pid` (`/proc/<pid>/clear_refs`, value 5).
pub fn reset_peak(pid: u32) {
    let _ = std::fs::write(format!("/proc/{pid}/clear_refs"), "5");
}

/// What a lab process counts as in a scale report: the operator, the agents (the fleets), the
/// API server or etcd; `None` for anything else.
fn component(process: &str) -> Option<&'static str> {
    match process {
        "operator" => Some("operator"),
        "kube-apiserver" => Some("apiServer"),
        "etcd" => Some("etcd"),
        p if p.starts_with("fleet") => Some("agents"),
        _ => None,
    }
}

/// CPU seconds each component's running processes have used so far.
fn component_cpu(lab: &Lab) -> BTreeMap<&'static str, f64> {
    let mut cpu = BTreeMap::new();
    for (name, pid) in lab.processes() {
        if let (Some(c), Some((seconds, _))) = (component(&name), cpu_and_peak(pid)) {
            *cpu.entry(c).or_insert(0.0) += seconds;
        }
    }
    cpu
}

/// The lab's operator process.
pub fn operator_pid(lab: &Lab) -> Option<u32> {
    lab.processes()
        .into_iter()
        .find_map(|(name, pid)| (name == "operator").then_some(pid))
}

/// The audit events (parsed) from byte `offset` of the audit log to its last whole line, and
/// the offset after them.
pub fn audit_events_since(lab: &Lab, offset: u64) -> (Vec<Value>, u64) {
    let Ok(mut file) = std::fs::File::open(lab.audit_log_path()) else {
        return (Vec::new(), offset);
    };
    let _ = file.seek(SeekFrom::Start(offset));
    let mut bytes = Vec::new();
    let _ = file.read_to_end(&mut bytes);
    // Only whole lines: the API server may be writing the last one (cut anywhere, even inside
    // a character).
    let whole = bytes.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
    let events = bytes[..whole]
        .split(|b| *b == b'\n')
        .filter_map(|line| serde_json::from_slice(line).ok())
        .collect();
    (events, offset + whole as u64)
}

/// The audit log's writes since byte `offset`, as (who, verb, resource[/subresource]), and the
/// offset after them. Who: `operator`, `agents` (NodeTuning status and heartbeat Leases written
/// by anyone else) or `other`.
pub fn audit_writes_since(lab: &Lab, offset: u64) -> (Vec<(String, String, String)>, u64) {
    let (events, next) = audit_events_since(lab, offset);
    let mut out = Vec::new();
    for event in events {
        let verb = event["verb"].as_str().unwrap_or_default().to_string();
        if matches!(verb.as_str(), "get" | "list" | "watch") {
            continue;
        }
        let object = &event["objectRef"];
        let mut resource = object["resource"].as_str().unwrap_or_default().to_string();
        if let Some(sub) = object["subresource"].as_str() {
            resource = format!("{resource}/{sub}");
        }
        let user = event["user"]["username"].as_str().unwrap_or_default();
        let lease = object["name"]
            .as_str()
            .is_some_and(|n| n.starts_with("hoststack-agent-"));
        let who = if user.contains("hoststack-operator") {
            "operator"
        } else if resource == "nodetunings/status" || (resource == "leases" && lease) {
            "agents"
        } else {
            "other"
        };
        out.push((who.to_string(), verb, resource));
    }
    (out, next)
}

/// The state of everything measured, at one moment.
pub struct Reading {
    at: Instant,
    /// CPU seconds by component ([`component_cpu`]).
    cpu: BTreeMap<&'static str, f64>,
    apiserver: Vec<Sample>,
    operator: Vec<Sample>,
    audit_offset: u64,
}

impl Reading {
    /// Reads everything now (and starts a new peak-memory measurement of the operator).
    pub fn take(lab: &Lab, audit_offset: u64) -> Reading {
        if let Some(pid) = operator_pid(lab) {
            reset_peak(pid);
        }
        Reading {
            at: Instant::now(),
            cpu: component_cpu(lab),
            apiserver: apiserver_samples(lab),
            operator: scrape(lab.operator_metrics_address())
                .map(|t| samples(&t))
                .unwrap_or_default(),
            audit_offset,
        }
    }

    /// What happened between this reading and now, for a scenario that moved `nodes` nodes
    /// through `revisions` revisions and reached its goal at `done` (its `seconds`; the counts
    /// run until now): a JSON object, and the audit offset to continue from.
    pub fn since(&self, lab: &Lab, nodes: usize, revisions: usize, done: Instant) -> (Value, u64) {
        let seconds = done.duration_since(self.at).as_secs_f64();
        let counted = self.at.elapsed().as_secs_f64();
        let peak = operator_pid(lab)
            .and_then(cpu_and_peak)
            .map_or(0, |(_, peak)| peak);
        // A fleet that started during the scenario counts from zero; one that stopped during it
        // is left out (the leaving nodes' hundred agents).
        let cpu_by_component: BTreeMap<&str, f64> = component_cpu(lab)
            .into_iter()
            .map(|(c, now)| (c, round(now - self.cpu.get(c).copied().unwrap_or(0.0))))
            .collect();
        let apiserver = apiserver_samples(lab);
        let operator = scrape(lab.operator_metrics_address())
            .map(|t| samples(&t))
            .unwrap_or_default();
        let by_verb_resource = |l: &BTreeMap<String, String>| {
            let resource = match l.get("subresource").map(String::as_str) {
                Some("") | None => l.get("resource").cloned().unwrap_or_default(),
                Some(sub) => format!("{}/{sub}", l.get("resource").cloned().unwrap_or_default()),
            };
            format!("{} {resource}", l.get("verb").cloned().unwrap_or_default())
        };
        let requests = delta(
            &sums_by(&self.apiserver, "apiserver_request_total", by_verb_resource),
            &sums_by(&apiserver, "apiserver_request_total", by_verb_resource),
        );
        let by_resource =
            |l: &BTreeMap<String, String>| l.get("resource").cloned().unwrap_or_default();
        let watch_events = delta(
            &sums_by(
                &self.operator,
                "hoststack_operator_watch_events_total",
                by_resource,
            ),
            &sums_by(
                &operator,
                "hoststack_operator_watch_events_total",
                by_resource,
            ),
        );
        let (writes, offset) = audit_writes_since(lab, self.audit_offset);
        let mut by_who: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
        for (who, verb, resource) in &writes {
            *by_who
                .entry(who.clone())
                .or_default()
                .entry(format!("{verb} {resource}"))
                .or_insert(0) += 1;
        }
        let operator_writes: u64 = by_who.get("operator").map_or(0, |m| m.values().sum());
        let agent_status_writes: u64 = writes
            .iter()
            .filter(|(who, _, r)| who == "agents" && r == "nodetunings/status")
            .count() as u64;
        let per_node = |n: u64| n as f64 / nodes.max(1) as f64;
        let (p50, p99, reconciles) = reconcile_quantiles(&self.operator, &operator);
        let last = last_finite_bucket(&operator);
        let report = json!({
            "seconds": round(seconds),
            "operatorCpuSeconds": cpu_by_component.get("operator").copied().unwrap_or(0.0),
            "cpuSeconds": cpu_by_component,
            "operatorPeakRssMiB": round(peak as f64 / (1024.0 * 1024.0)),
            "operatorWrites": operator_writes,
            "operatorWritesPerNodePerRevision": round(per_node(operator_writes) / revisions.max(1) as f64),
            "countedSeconds": round(counted),
            "agentStatusWritesPerNodePerMinute": round(per_node(agent_status_writes) / (counted / 60.0).max(1e-9)),
            "writesByWho": by_who,
            "apiRequests": requests,
            "operatorWatchEvents": watch_events,
            "reconciles": reconciles,
            "reconcileP50Ms": p50.map(|s| millis(s, last)),
            "reconcileP99Ms": p99.map(|s| millis(s, last)),
        });
        (report, offset)
    }
}

/// Waits until the audit log has recorded no write for `quiet` other than the agents'
/// heartbeats (so that a scenario's counts include what its end set off: the operator's last
/// rewrites and the agents' answers), at most `timeout`.
pub fn wait_quiet(lab: &Lab, quiet: std::time::Duration, timeout: std::time::Duration) {
    let mut offset = std::fs::metadata(lab.audit_log_path()).map_or(0, |m| m.len());
    let deadline = Instant::now() + timeout;
    let mut last_write = Instant::now();
    while last_write.elapsed() < quiet && Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(500));
        let (writes, next) = audit_writes_since(lab, offset);
        offset = next;
        if writes.iter().any(|(_, _, resource)| resource != "leases") {
            last_write = Instant::now();
        }
    }
}

/// The API server's /metrics (as the lab admin).
fn apiserver_samples(lab: &Lab) -> Vec<Sample> {
    let out = lab.kubectl(&["get", "--raw", "/metrics"]);
    samples(&String::from_utf8_lossy(&out.stdout))
}

/// etcd's database size in bytes.
pub fn etcd_db_bytes(lab: &Lab) -> Option<u64> {
    let address: SocketAddr = lab.etcd_url().trim_start_matches("http://").parse().ok()?;
    let text = scrape(address)?;
    samples(&text)
        .into_iter()
        .find(|s| s.name == "etcd_mvcc_db_total_size_in_bytes")
        .map(|s| s.value as u64)
}

/// `after - before` per key, without the keys that did not move.
fn delta(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>) -> BTreeMap<String, u64> {
    after
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                (v - before.get(k).copied().unwrap_or(0.0)).max(0.0) as u64,
            )
        })
        .filter(|(_, v)| *v > 0)
        .collect()
}

/// The median and 99th percentile of the reconciles between two readings of the operator's
/// `reconcile_duration_seconds` histogram (each the upper bound of its bucket), and how many.
fn reconcile_quantiles(before: &[Sample], after: &[Sample]) -> (Option<f64>, Option<f64>, u64) {
    let buckets = |samples: &[Sample]| -> BTreeMap<u64, f64> {
        samples
            .iter()
            .filter(|s| s.name == "hoststack_operator_reconcile_duration_seconds_bucket")
            .filter_map(|s| {
                let le = s.labels.get("le")?;
                // Nanoseconds as the key (ordered); +Inf as the largest key.
                let bound = if le == "+Inf" {
                    u64::MAX
                } else {
                    (le.parse::<f64>().ok()? * 1e9) as u64
                };
                Some((bound, s.value))
            })
            .collect()
    };
    let (b, a) = (buckets(before), buckets(after));
    let counts: Vec<(u64, f64)> = a
        .iter()
        .map(|(bound, v)| (*bound, v - b.get(bound).copied().unwrap_or(0.0)))
        .collect();
    let total = counts.last().map_or(0.0, |(_, c)| *c);
    let quantile = |q: f64| {
        counts
            .iter()
            .find(|(_, c)| *c >= q * total && total > 0.0)
            .map(|(bound, _)| match *bound {
                u64::MAX => f64::INFINITY,
                ns => ns as f64 / 1e9,
            })
    };
    (quantile(0.5), quantile(0.99), total as u64)
}

/// The largest finite bucket bound of the reconcile histogram, in seconds.
fn last_finite_bucket(samples: &[Sample]) -> f64 {
    samples
        .iter()
        .filter(|s| s.name == "hoststack_operator_reconcile_duration_seconds_bucket")
        .filter_map(|s| s.labels.get("le")?.parse::<f64>().ok())
        .filter(|b| b.is_finite())
        .fold(0.0, f64::max)
}

/// A bucket's upper bound in seconds as milliseconds; past the last finite bucket, a string
/// naming that bucket (`">65536"`).
fn millis(seconds: f64, last_finite: f64) -> Value {
    if seconds.is_finite() {
        json!(round(seconds * 1000.0))
    } else {
        json!(format!(">{}", round(last_finite * 1000.0)))
    }
}

/// `x` to three decimals.
fn round(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn processes_count_as_their_component() {
        let named: Vec<Option<&str>> = [
            "operator",
            "fleet",
            "fleet-joining",
            "kube-apiserver",
            "etcd",
            "prometheus",
        ]
        .iter()
        .map(|p| component(p))
        .collect();
        assert_eq!(
            named,
            [
                Some("operator"),
                Some("agents"),
                Some("agents"),
                Some("apiServer"),
                Some("etcd"),
                None
            ]
        );
    }

    #[test]
    fn samples_with_and_without_labels() {
        let text = "# HELP x\nup 1\napiserver_request_total{code=\"200\",resource=\"nodes\",subresource=\"\",verb=\"POST\"} 12\nq{a=\"x\\\"y,z\"} 2.5e3\n";
        let s = samples(text);
        assert_eq!(s.len(), 3);
        assert_eq!((s[0].name.as_str(), s[0].value), ("up", 1.0));
        assert_eq!(s[1].labels["verb"], "POST");
        assert_eq!(s[1].labels["subresource"], "");
        assert_eq!(s[1].value, 12.0);
        assert_eq!(s[2].labels["a"], "x\"y,z");
        assert_eq!(s[2].value, 2500.0);
    }

    #[test]
    fn quantiles_from_bucket_deltas() {
        let hist = |counts: &[(&str, f64)]| -> Vec<Sample> {
            counts
                .iter()
                .map(|(le, v)| Sample {
                    name: "hoststack_operator_reconcile_duration_seconds_bucket".into(),
                    labels: [("le".to_string(), le.to_string())].into(),
                    value: *v,
                })
                .collect()
        };
        let before = hist(&[("0.001", 10.0), ("0.002", 10.0), ("+Inf", 10.0)]);
        let after = hist(&[("0.001", 60.0), ("0.002", 109.0), ("+Inf", 110.0)]);
        let (p50, p99, n) = reconcile_quantiles(&before, &after);
        assert_eq!(n, 100);
        assert_eq!(p50, Some(0.001));
        assert_eq!(p99, Some(0.002));
        // Past the last finite bucket.
        let slow = hist(&[("0.001", 10.0), ("0.002", 10.0), ("+Inf", 20.0)]);
        let (_, p99, _) = reconcile_quantiles(&before, &slow);
        assert_eq!(p99, Some(f64::INFINITY));
        assert_eq!(last_finite_bucket(&slow), 0.002);
        assert_eq!(millis(f64::INFINITY, 8.192), json!(">8192"));
        assert_eq!(millis(0.004, 8.192), json!(4.0));
    }
}
