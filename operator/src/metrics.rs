//! The operator's own metrics, served in the OpenMetrics text format on `/metrics`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::http::header::CONTENT_TYPE;
use axum::routing::get;
use axum::Router;
use hoststack_crds::{NetworkTuningStatus, Phase};
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Labels naming one tuning.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TuningLabels {
    /// The tuning's name.
    pub tuning: String,
}

/// Labels of the per-tuning phase gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabels {
    /// The tuning's name.
    pub tuning: String,
    /// One of the rollout phases.
    pub phase: PhaseLabel,
}

/// Labels of the per-tuning node-count gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeCountLabels {
    /// The tuning's name.
    pub tuning: String,
    /// matched, updated, applied or failed.
    pub state: &'static str,
}

/// Labels of the watch-event counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceLabels {
    /// The watched resource: nodes, nodetunings, leases or networktunings.
    pub resource: &'static str,
}

/// A rollout phase as a label value.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(missing_docs)]
pub enum PhaseLabel {
    Pending,
    Progressing,
    Paused,
    Complete,
    RolledBack,
    Failed,
    Superseded,
}

impl From<Phase> for PhaseLabel {
    fn from(p: Phase) -> Self {
        match p {
            Phase::Pending => Self::Pending,
            Phase::Progressing => Self::Progressing,
            Phase::Paused => Self::Paused,
            Phase::Complete => Self::Complete,
            Phase::RolledBack => Self::RolledBack,
            Phase::Failed => Self::Failed,
            Phase::Superseded => Self::Superseded,
        }
    }
}

const ALL_PHASES: [PhaseLabel; 7] = [
    PhaseLabel::Pending,
    PhaseLabel::Progressing,
    PhaseLabel::Paused,
    PhaseLabel::Complete,
    PhaseLabel::RolledBack,
    PhaseLabel::Failed,
    PhaseLabel::Superseded,
];

/// The node states counted per tuning.
const NODE_STATES: [&str; 4] = ["matched", "updated", "applied", "failed"];

/// The operator's metrics.
pub struct Metrics {
    registry: Registry,
    reconciles: Family<TuningLabels, Counter>,
    reconcile_errors: Family<TuningLabels, Counter>,
    reconcile_duration: Histogram,
    phase: Family<PhaseLabels, Gauge>,
    nodes: Family<NodeCountLabels, Gauge>,
    watch_events: Family<ResourceLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("hoststack_operator");
        let reconciles = Family::<TuningLabels, Counter>::default();
        registry.register(
            "reconciles",
            "Reconciles of a NetworkTuning",
            reconciles.clone(),
        );
        let reconcile_errors = Family::<TuningLabels, Counter>::default();
        registry.register(
            "reconcile_errors",
            "Reconciles of a NetworkTuning that failed and were requeued",
            reconcile_errors.clone(),
        );
        // 1 ms to 65.5 s: a reconcile of a large pool's wave writes thousands of specs.
        let reconcile_duration = Histogram::new(exponential_buckets(0.001, 2.0, 17));
        registry.register_with_unit(
            "reconcile_duration",
            "Time one reconcile took",
            prometheus_client::registry::Unit::Seconds,
            reconcile_duration.clone(),
        );
        let phase = Family::<PhaseLabels, Gauge>::default();
        registry.register(
            "tuning_phase",
            "1 for the phase each NetworkTuning is in, 0 for the others",
            phase.clone(),
        );
        let nodes = Family::<NodeCountLabels, Gauge>::default();
        registry.register(
            "tuning_nodes",
            "Nodes of each NetworkTuning by state: matched, updated, applied, failed",
            nodes.clone(),
        );
        let watch_events = Family::<ResourceLabels, Counter>::default();
        registry.register(
            "watch_events",
            "Objects the operator's watches brought, by resource",
            watch_events.clone(),
        );
        Self {
            registry,
            reconciles,
            reconcile_errors,
            reconcile_duration,
            phase,
            nodes,
            watch_events,
        }
    }
}

impl Metrics {
    /// Counts one reconcile of `tuning` that took `took`.
    pub fn reconciled(&self, tuning: &str, took: Duration, failed: bool) {
        let labels = TuningLabels {
            tuning: tuning.into(),
        };
        self.reconciles.get_or_create(&labels).inc();
        if failed {
            self.reconcile_errors.get_or_create(&labels).inc();
        }
        self.reconcile_duration.observe(took.as_secs_f64());
    }

    /// Counts one object a watch of `resource` brought.
    pub fn watch_event(&self, resource: &'static str) {
        self.watch_events
            .get_or_create(&ResourceLabels { resource })
            .inc();
    }

    /// Records a tuning's phase and node counts from its status.
    pub fn observe_status(&self, tuning: &str, status: &NetworkTuningStatus) {
        if let Some(phase) = status.phase {
            self.set_phase(tuning, phase);
        }
        for (state, count) in NODE_STATES.iter().zip([
            status.matched_nodes,
            status.updated_nodes,
            status.applied_nodes,
            status.failed_nodes,
        ]) {
            let labels = NodeCountLabels {
                tuning: tuning.into(),
                state,
            };
            self.nodes.get_or_create(&labels).set(i64::from(count));
        }
    }

    /// Records the phase `tuning` is in.
    fn set_phase(&self, tuning: &str, phase: Phase) {
        let now = PhaseLabel::from(phase);
        for p in ALL_PHASES {
            let labels = PhaseLabels {
                tuning: tuning.into(),
                phase: p,
            };
            self.phase.get_or_create(&labels).set(i64::from(p == now));
        }
    }

    /// Forgets a deleted tuning's phase.
    pub fn forget(&self, tuning: &str) {
        for p in ALL_PHASES {
            self.phase.remove(&PhaseLabels {
                tuning: tuning.into(),
                phase: p,
            });
        }
    }

    /// The registry in the OpenMetrics text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }

    /// The registry in the Prometheus text format 0.0.4 (for clients that do not ask for
    /// OpenMetrics: curl, promtool).
    pub fn encode_prometheus_text(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}

/// Serves `/metrics` on `addr` until the process ends; returns the bound address. OpenMetrics
/// when the client's `Accept` names `application/openmetrics-text` (Prometheus does), the
/// Prometheus text format otherwise.
pub async fn serve(addr: SocketAddr, metrics: Arc<Metrics>) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let app = Router::new().route(
        "/metrics",
        get(move |headers: axum::http::HeaderMap| {
            let metrics = metrics.clone();
            async move {
                let openmetrics = headers
                    .get_all(axum::http::header::ACCEPT)
                    .iter()
                    .filter_map(|v| v.to_str().ok())
                    .any(|v| v.contains("application/openmetrics-text"));
                if openmetrics {
                    (
                        [(
                            CONTENT_TYPE,
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        metrics.encode(),
                    )
                } else {
                    (
                        [(
                            CONTENT_TYPE,
                            prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
                        )],
                        metrics.encode_prometheus_text(),
                    )
                }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_counters_and_one_hot_phase() {
        let m = Metrics::default();
        m.reconciled("edge", Duration::from_millis(3), false);
        m.reconciled("edge", Duration::from_millis(5), true);
        m.observe_status(
            "edge",
            &NetworkTuningStatus {
                phase: Some(Phase::Complete),
                matched_nodes: 3,
                applied_nodes: 2,
                ..Default::default()
            },
        );
        let text = m.encode();
        assert!(
            text.contains("hoststack_operator_reconciles_total{tuning=\"edge\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("hoststack_operator_reconcile_errors_total{tuning=\"edge\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("hoststack_operator_tuning_phase{tuning=\"edge\",phase=\"Complete\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("hoststack_operator_tuning_phase{tuning=\"edge\",phase=\"Failed\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("hoststack_operator_reconcile_duration_seconds_count 2"),
            "{text}"
        );
        assert!(
            text.contains("hoststack_operator_tuning_nodes{tuning=\"edge\",state=\"applied\"} 2"),
            "{text}"
        );
        m.forget("edge");
        assert!(!m.encode().contains("tuning_phase{"));
    }
}
