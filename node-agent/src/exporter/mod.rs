//! The agent's `/metrics` endpoint (OpenMetrics text, prometheus-client, served with axum).
//!
//! One collector per file, like node_exporter: [`netstat`] (`/proc/net/netstat` and
//! `/proc/net/snmp`), [`softnet`] (`/proc/net/softnet_stat`), [`node_info`] (the node's part in
//! a rollout), [`agent_work`] (the agent's transactions), [`xdp`] (the XDP blocklist's drop
//! counters, from pinned maps) and [`firewall`] (the drop counters of the agent's nftables
//! table, listed from the kernel). Host files are read under
//! `--proc-root` on every scrape, into buffers kept between scrapes. docs/metrics.md lists
//! every metric.

pub mod agent_work;
pub mod firewall;
pub mod netstat;
pub mod node_info;
pub mod softnet;
pub mod xdp;

use std::io::Read;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use axum::http::header::CONTENT_TYPE;
use axum::http::HeaderMap;
use axum::routing::get;
use axum::Router;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

pub use agent_work::AgentWork;
pub use node_info::{NodeInfo, NodeInfoLabels};

/// The content type of the OpenMetrics text format.
pub const CONTENT_TYPE_OPENMETRICS: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The agent's metrics: the registry with every collector, and handles for the controller.
#[derive(Debug)]
pub struct Exporter {
    registry: Registry,
    /// `hoststack_node_info`.
    pub node_info: NodeInfo,
    /// `hoststack_agent_*`.
    pub work: AgentWork,
    /// Size of the last response, to allocate the next one at once.
    last_len: AtomicUsize,
}

impl Exporter {
    /// An exporter reading host files under `proc_root`.
    pub fn new(proc_root: &Path) -> Self {
        Exporter::with_userstack_stats(proc_root, None)
    }

    /// An exporter reading host files under `proc_root` and, when given, the user-space
    /// stack's counters from its runner's stats file (`stack="userspace"`).
    pub fn with_userstack_stats(proc_root: &Path, userstack_stats: Option<&Path>) -> Self {
        let mut registry = Registry::with_prefix("hoststack");
        let errors = ReadErrors::default();
        let node_info = NodeInfo::register(&mut registry);
        let work = AgentWork::register(&mut registry);
        let mut netstat = netstat::NetstatCollector::new(proc_root, errors.clone());
        if let Some(stats) = userstack_stats {
            netstat = netstat.with_userstack_stats(stats);
        }
        registry.register_collector(Box::new(netstat));
        registry.register_collector(Box::new(softnet::SoftnetCollector::new(
            proc_root,
            errors.clone(),
        )));
        registry.register_collector(Box::new(errors));
        registry.register_collector(Box::new(firewall::FirewallCollector::default()));
        Exporter {
            registry,
            node_info,
            work,
            last_len: AtomicUsize::new(0),
        }
    }

    /// Also exports the drop counters of the XDP programs pinned under `bpffs_root`.
    pub fn with_xdp_drops(mut self, bpffs_root: &Path) -> Self {
        self.registry
            .register_collector(Box::new(xdp::XdpCollector::new(bpffs_root)));
        self
    }

    /// Reads the host files and encodes every metric in the OpenMetrics text format.
    pub fn encode(&self) -> String {
        self.encode_as(Format::OpenMetrics)
    }

    /// Reads the host files and encodes every metric in `format`.
    pub fn encode_as(&self, format: Format) -> String {
        let mut out = String::with_capacity(self.last_len.load(Ordering::Relaxed) + 1024);
        match format {
            Format::OpenMetrics => {
                prometheus_client::encoding::text::encode(&mut out, &self.registry)
            }
            Format::PrometheusText => {
                prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry)
            }
        }
        .expect("writing to a String cannot fail");
        self.last_len.store(out.len(), Ordering::Relaxed);
        out
    }
}

/// The exposition formats served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// OpenMetrics 1.0 text, for clients whose `Accept` names `application/openmetrics-text`
    /// (Prometheus does).
    OpenMetrics,
    /// The Prometheus text format 0.0.4, for every other client (curl, promtool).
    PrometheusText,
}

impl Format {
    /// The format a request's headers ask for.
    pub fn negotiate(headers: &HeaderMap) -> Self {
        let openmetrics = headers
            .get_all(axum::http::header::ACCEPT)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .any(|v| v.contains("application/openmetrics-text"));
        if openmetrics {
            Format::OpenMetrics
        } else {
            Format::PrometheusText
        }
    }

    /// The response's content type.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::OpenMetrics => CONTENT_TYPE_OPENMETRICS,
            Format::PrometheusText => prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
        }
    }
}

/// Serves `/metrics` on `addr` (OpenMetrics or Prometheus text, as the client's `Accept` asks) until the process ends; returns the bound address.
pub async fn serve(addr: SocketAddr, exporter: Arc<Exporter>) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let app = Router::new().route(
        "/metrics",
        get(move |headers: HeaderMap| {
            let exporter = exporter.clone();
            async move {
                let format = Format::negotiate(&headers);
                (
                    [(CONTENT_TYPE, format.content_type())],
                    exporter.encode_as(format),
                )
            }
        }),
    );
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "metrics server stopped");
        }
    });
    Ok(bound)
}

/// Reads `path` into `buf` (cleared first), keeping its capacity.
fn read_into(path: &Path, buf: &mut Vec<u8>) -> std::io::Result<()> {
    buf.clear();
    std::fs::File::open(path)?.read_to_end(buf)?;
    Ok(())
}

/// `hoststack_exporter_read_errors_total{file}`: scrapes on which a host file could not be read
/// or parsed (its metrics are then left out of that scrape). Registered after the collectors
/// that count into it, so a scrape reports its own failures. The first failure of each file is
/// logged as a warning, later ones at debug level.
#[derive(Clone, Debug, Default)]
pub struct ReadErrors(Arc<[AtomicU64; FILES.len()]>);

/// The host files, as `file` label values.
const FILES: [&str; 3] = ["netstat", "snmp", "softnet_stat"];

impl ReadErrors {
    /// Counts a failure of `file` (at `path`).
    fn failed(&self, file: &'static str, path: &Path, error: &str) {
        let Some(i) = FILES.iter().position(|f| *f == file) else {
            return;
        };
        if self.0[i].fetch_add(1, Ordering::Relaxed) == 0 {
            tracing::warn!(path = %path.display(), error, "reading a metrics source failed; its metrics are left out");
        } else {
            tracing::debug!(path = %path.display(), error, "reading a metrics source");
        }
    }
}

impl Collector for ReadErrors {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut family = encoder.encode_descriptor(
            "exporter_read_errors",
            "Scrapes on which a host file could not be read or parsed, by file",
            None,
            MetricType::Counter,
        )?;
        for (file, count) in FILES.iter().zip(self.0.iter()) {
            family
                .encode_family(&[("file", *file)])?
                .encode_counter::<NoLabelSet, _, u64>(&count.load(Ordering::Relaxed), None)?;
        }
        Ok(())
    }
}
