//! The operator's own metrics, served in the OpenMetrics text format on `/metrics`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
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

/// Labels of one judged value of a wave's analysis.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct AnalysisLabels {
    /// The tuning's name.
    pub tuning: String,
    /// The revision the wave rolled out.
    pub revision: String,
    /// The wave's index (0: the canary).
    pub wave: String,
    /// The metric judged: a HealthMetric name, or `prometheus`.
    pub metric: String,
    /// `judged` (the wave's nodes; for a Prometheus query, the largest of its series),
    /// `baseline` (the nodes not yet changed) or `limit` (the bound it was held to).
    pub series: &'static str,
}

/// Labels of a wave's per-metric verdict.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct VerdictLabels {
    /// The tuning's name.
    pub tuning: String,
    /// The revision the wave rolled out.
    pub revision: String,
    /// The wave's index (0: the canary).
    pub wave: String,
    /// The metric judged.
    pub metric: String,
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
    analysis_value: Family<AnalysisLabels, Gauge<f64, AtomicU64>>,
    analysis_passed: Family<VerdictLabels, Gauge>,
    /// The analysis series each tuning shows now, so that those of an earlier rollout go.
    analysis_shown: Mutex<BTreeMap<String, AnalysisSeries>>,
}

/// The analysis series of one tuning.
type AnalysisSeries = (BTreeSet<AnalysisLabels>, BTreeSet<VerdictLabels>);

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
        let analysis_value = Family::<AnalysisLabels, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "analysis_value",
            "Each judged value of the current rollout's wave analyses: the wave's value, the \
             baseline's and the limit, by metric",
            analysis_value.clone(),
        );
        let analysis_passed = Family::<VerdictLabels, Gauge>::default();
        registry.register(
            "analysis_passed",
            "1 when a wave's metric passed its analysis, 0 when it did not",
            analysis_passed.clone(),
        );
        Self {
            registry,
            reconciles,
            reconcile_errors,
            reconcile_duration,
            phase,
            nodes,
            watch_events,
            analysis_value,
            analysis_passed,
            analysis_shown: Mutex::default(),
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

    /// Records a tuning's phase, node counts and its current rollout's analysis values from its
    /// status.
    pub fn observe_status(&self, tuning: &str, status: &NetworkTuningStatus) {
        if let Some(phase) = status.phase {
            self.set_phase(tuning, phase);
        }
        self.show_analysis(tuning, status);
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

    /// Forgets a deleted tuning's phase and analysis values.
    pub fn forget(&self, tuning: &str) {
        for p in ALL_PHASES {
            self.phase.remove(&PhaseLabels {
                tuning: tuning.into(),
                phase: p,
            });
        }
        self.show_analysis(tuning, &NetworkTuningStatus::default());
    }

    /// Sets the analysis gauges of `tuning` from the waves of `status` (its current rollout),
    /// and removes those of waves it no longer shows.
    fn show_analysis(&self, tuning: &str, status: &NetworkTuningStatus) {
        let revision = status.current_revision.clone().unwrap_or_default();
        let mut values = BTreeSet::new();
        let mut verdicts = BTreeSet::new();
        for wave in &status.waves {
            let Some(analysis) = &wave.analysis else {
                continue;
            };
            for m in &analysis.metrics {
                let verdict = VerdictLabels {
                    tuning: tuning.into(),
                    revision: revision.clone(),
                    wave: wave.index.to_string(),
                    metric: m.metric.clone(),
                };
                self.analysis_passed
                    .get_or_create(&verdict)
                    .set(i64::from(m.passed));
                for (series, text) in [
                    ("judged", &m.judged),
                    ("baseline", &m.baseline),
                    ("limit", &m.limit),
                ] {
                    let Some(value) = text.as_deref().and_then(largest_number) else {
                        continue;
                    };
                    let labels = AnalysisLabels {
                        tuning: verdict.tuning.clone(),
                        revision: verdict.revision.clone(),
                        wave: verdict.wave.clone(),
                        metric: verdict.metric.clone(),
                        series,
                    };
                    self.analysis_value.get_or_create(&labels).set(value);
                    values.insert(labels);
                }
                verdicts.insert(verdict);
            }
        }
        let mut shown = self
            .analysis_shown
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let (old_values, old_verdicts) = shown.remove(tuning).unwrap_or_default();
        for gone in old_values.difference(&values) {
            self.analysis_value.remove(gone);
        }
        for gone in old_verdicts.difference(&verdicts) {
            self.analysis_passed.remove(gone);
        }
        if !values.is_empty() || !verdicts.is_empty() {
            shown.insert(tuning.into(), (values, verdicts));
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

/// The largest number in an analysis value's text: `0.0123`, a Prometheus query's values
/// `0.001, 0.002`, or its condition `result < 0.01`; `None` when there is none.
fn largest_number(text: &str) -> Option<f64> {
    text.split(|c: char| c == ',' || c.is_whitespace())
        .filter_map(|word| word.parse::<f64>().ok())
        .filter(|v| !v.is_nan())
        .reduce(f64::max)
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
    use hoststack_crds::{AnalysisStatus, MetricResult, WaveStatus};

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

    fn judged(revision: &str, metrics: Vec<MetricResult>) -> NetworkTuningStatus {
        NetworkTuningStatus {
            current_revision: Some(revision.into()),
            waves: vec![WaveStatus {
                index: 0,
                analysis: Some(AnalysisStatus {
                    verdict: "Fail".into(),
                    metrics,
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn analysis_values_are_shown_for_the_current_rollout_only() {
        let m = Metrics::default();
        let ratio = MetricResult {
            metric: "RetransmitRatio".into(),
            judged: Some("0.03".into()),
            baseline: Some("0.001".into()),
            limit: Some("0.002".into()),
            passed: false,
        };
        let query = MetricResult {
            metric: "prometheus".into(),
            judged: Some("0.004, 0.012, NaN".into()),
            baseline: None,
            limit: Some("result < 0.01".into()),
            passed: false,
        };
        m.observe_status("edge", &judged("r2", vec![ratio, query]));
        let text = m.encode_prometheus_text();
        let series = |rev: &str, metric: &str, series: &str| {
            format!(
                "hoststack_operator_analysis_value{{tuning=\"edge\",revision=\"{rev}\",wave=\"0\",metric=\"{metric}\",series=\"{series}\"}}"
            )
        };
        for (line, value) in [
            (series("r2", "RetransmitRatio", "judged"), "0.03"),
            (series("r2", "RetransmitRatio", "baseline"), "0.001"),
            (series("r2", "RetransmitRatio", "limit"), "0.002"),
            // A query's largest series, against its condition's bound.
            (series("r2", "prometheus", "judged"), "0.012"),
            (series("r2", "prometheus", "limit"), "0.01"),
        ] {
            assert!(
                text.contains(&format!("{line} {value}\n")),
                "{line} {value}: {text}"
            );
        }
        assert!(
            !text.contains(&series("r2", "prometheus", "baseline")),
            "{text}"
        );
        assert!(text.contains(
            "hoststack_operator_analysis_passed{tuning=\"edge\",revision=\"r2\",wave=\"0\",metric=\"RetransmitRatio\"} 0"
        ));
        // The next rollout replaces them; a deleted tuning leaves none.
        m.observe_status("edge", &judged("r3", vec![]));
        let text = m.encode_prometheus_text();
        assert!(!text.contains("revision=\"r2\""), "{text}");
        m.observe_status(
            "edge",
            &judged(
                "r3",
                vec![MetricResult {
                    metric: "prometheus".into(),
                    judged: Some("0.001".into()),
                    limit: Some("result < 0.01".into()),
                    passed: true,
                    ..Default::default()
                }],
            ),
        );
        assert!(m
            .encode_prometheus_text()
            .contains(&format!("{} 0.001\n", series("r3", "prometheus", "judged"))));
        m.forget("edge");
        assert!(!m.encode().contains("analysis_"), "{}", m.encode());
    }
}
