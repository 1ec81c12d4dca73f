//! The agent's own work: transactions by result and by the revision they applied, drift,
//! transaction durations, the revision the host is on, post-apply probes and the revisions the
//! agent reverted by itself.

use std::sync::Mutex;
use std::time::Duration;

use hoststack_crds::{NodeState, ProbeResult};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

use crate::journal::Applied;
use crate::transaction::SelfRevert;

/// The label of `hoststack_agent_transactions_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    /// applied, failed or reverted.
    result: &'static str,
}

/// The labels of `hoststack_agent_applied_revision`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AppliedLabels {
    tuning: String,
    revision: String,
}

/// The labels of `hoststack_agent_revision_transactions_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RevisionLabels {
    tuning: String,
    revision: String,
    /// applied or failed.
    result: &'static str,
}

/// The labels of `hoststack_agent_probes_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProbeLabels {
    tuning: String,
    probe: String,
    /// passed or failed.
    result: &'static str,
}

/// The labels of `hoststack_agent_self_reverts_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SelfRevertLabels {
    tuning: String,
    /// probe (a probe target failed) or unconfirmed (the confirmation did not come in time).
    reason: &'static str,
}

/// Results a transaction can end in.
const RESULTS: [&str; 4] = ["applied", "failed", "reverted", "error"];

/// Metrics of the agent's transactions.
#[derive(Debug)]
pub struct AgentWork {
    transactions: Family<ResultLabels, Counter>,
    revision_transactions: Family<RevisionLabels, Counter>,
    drift: Counter,
    duration: Histogram,
    applied: Family<AppliedLabels, Gauge>,
    current: Mutex<Option<AppliedLabels>>,
    probes: Family<ProbeLabels, Counter>,
    self_reverts: Family<SelfRevertLabels, Counter>,
}

impl AgentWork {
    /// Registers the families in `registry`, every result at 0.
    pub fn register(registry: &mut Registry) -> Self {
        let transactions = Family::<ResultLabels, Counter>::default();
        registry.register(
            "agent_transactions",
            "Transactions the agent ran, by result: applied (a revision), failed (nothing changed), reverted (spec withdrawn)",
            transactions.clone(),
        );
        for result in RESULTS {
            drop(transactions.get_or_create(&ResultLabels { result }));
        }
        let revision_transactions = Family::<RevisionLabels, Counter>::default();
        registry.register(
            "agent_revision_transactions",
            "Transactions the agent ran to apply a revision, by tuning, revision and result (applied or failed); reverts are not counted here",
            revision_transactions.clone(),
        );
        let drift = Counter::default();
        registry.register(
            "agent_drift",
            "Transactions started because a setting of the applied revision had drifted on the host (driftPolicy Reapply)",
            drift.clone(),
        );
        let duration = Histogram::new(exponential_buckets(0.001, 2.0, 16));
        registry.register_with_unit(
            "agent_transaction_duration",
            "Time one transaction took, from journal write to commit or rollback",
            Unit::Seconds,
            duration.clone(),
        );
        let applied = Family::<AppliedLabels, Gauge>::default();
        registry.register(
            "agent_applied_revision",
            "1 for the revision the host is on (from the journal); absent when nothing is applied",
            applied.clone(),
        );
        let probes = Family::<ProbeLabels, Counter>::default();
        registry.register(
            "agent_probes",
            "Post-apply probes the agent ran while a revision was provisional, by tuning, probe (api-server or a target's name) and result (passed, failed)",
            probes.clone(),
        );
        let self_reverts = Family::<SelfRevertLabels, Counter>::default();
        registry.register(
            "agent_self_reverts",
            "Provisional revisions the agent reverted by itself, by tuning and reason: probe (a probe target failed) or unconfirmed (not confirmed within confirmTimeout)",
            self_reverts.clone(),
        );
        AgentWork {
            transactions,
            revision_transactions,
            drift,
            duration,
            applied,
            current: Mutex::new(None),
            probes,
            self_reverts,
        }
    }

    /// Counts one round of probes of a revision of `tuning`.
    pub fn probes(&self, tuning: &str, results: &[ProbeResult]) {
        for r in results {
            self.probes
                .get_or_create(&ProbeLabels {
                    tuning: tuning.to_string(),
                    probe: r.name.clone(),
                    result: if r.passed { "passed" } else { "failed" },
                })
                .inc();
        }
    }

    /// Shows the self-revert counters of `tuning` (at 0 until one happens), once it has a
    /// provisional revision.
    pub fn provisional(&self, tuning: &str) {
        for cause in [SelfRevert::ProbeFailed, SelfRevert::Unconfirmed] {
            drop(self.self_reverts.get_or_create(&SelfRevertLabels {
                tuning: tuning.to_string(),
                reason: cause.metric_label(),
            }));
        }
    }

    /// Counts a provisional revision of `tuning` the agent reverted by itself, for `cause`.
    pub fn self_revert(&self, tuning: &str, cause: SelfRevert) {
        self.self_reverts
            .get_or_create(&SelfRevertLabels {
                tuning: tuning.to_string(),
                reason: cause.metric_label(),
            })
            .inc();
    }

    /// Counts one transaction to `target` (`None`: a revert) that ended in `state` after
    /// `took`; `drift` when it re-applied the revision the host was already on.
    pub fn transaction(
        &self,
        target: Option<&Applied>,
        state: NodeState,
        took: Duration,
        drift: bool,
    ) {
        let result = match state {
            NodeState::Applied => "applied",
            NodeState::Reverted => "reverted",
            NodeState::Failed => "failed",
            // A transaction ends Applying only when the agent's own error stopped it.
            NodeState::Applying => "error",
            _ => return,
        };
        self.transactions
            .get_or_create(&ResultLabels { result })
            .inc();
        if let Some(target) = target {
            self.revision_transactions
                .get_or_create(&RevisionLabels {
                    tuning: target.tuning.clone(),
                    revision: target.revision.clone(),
                    result,
                })
                .inc();
        }
        self.duration.observe(took.as_secs_f64());
        if drift {
            self.drift.inc();
        }
    }

    /// Records the revision the host is on.
    pub fn applied(&self, applied: Option<&Applied>) {
        let labels = applied.map(|a| AppliedLabels {
            tuning: a.tuning.clone(),
            revision: a.revision.clone(),
        });
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        if *current == labels {
            return;
        }
        if let Some(new) = &labels {
            self.applied.get_or_create(new).set(1);
        }
        if let Some(old) = std::mem::replace(&mut *current, labels) {
            self.applied.remove(&old);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transactions_by_result_and_the_applied_revision() {
        let mut registry = Registry::with_prefix("hoststack");
        let work = AgentWork::register(&mut registry);
        let encode = |r: &Registry| {
            let mut out = String::new();
            prometheus_client::encoding::text::encode(&mut out, r).unwrap();
            out
        };
        let text = encode(&registry);
        for result in RESULTS {
            let line = format!("hoststack_agent_transactions_total{{result=\"{result}\"}} 0");
            assert!(text.contains(&line), "{text}");
        }
        let r1 = Applied {
            tuning: "edge".into(),
            revision: "r1".into(),
        };
        let r2 = Applied {
            revision: "r2".into(),
            ..r1.clone()
        };
        work.transaction(
            Some(&r1),
            NodeState::Applied,
            Duration::from_millis(3),
            false,
        );
        work.transaction(
            Some(&r1),
            NodeState::Applied,
            Duration::from_millis(4),
            true,
        );
        work.transaction(
            Some(&r2),
            NodeState::Failed,
            Duration::from_millis(5),
            false,
        );
        work.transaction(None, NodeState::Reverted, Duration::from_millis(2), false);
        work.transaction(
            Some(&r2),
            NodeState::Planned,
            Duration::from_millis(5),
            false,
        );
        work.applied(Some(&r1));
        work.applied(Some(&r2));
        let text = encode(&registry);
        assert!(text.contains("hoststack_agent_transactions_total{result=\"applied\"} 2"));
        assert!(text.contains("hoststack_agent_transactions_total{result=\"failed\"} 1"));
        assert!(text.contains("hoststack_agent_transactions_total{result=\"reverted\"} 1"));
        // Per revision: the two of r1, the failed one of r2; the revert and the plan nowhere.
        let mut per_revision: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("hoststack_agent_revision_transactions_total{"))
            .collect();
        per_revision.sort();
        assert_eq!(
            per_revision,
            [
                "hoststack_agent_revision_transactions_total{tuning=\"edge\",revision=\"r1\",result=\"applied\"} 2",
                "hoststack_agent_revision_transactions_total{tuning=\"edge\",revision=\"r2\",result=\"failed\"} 1",
            ],
            "{text}"
        );
        assert!(text.contains("hoststack_agent_drift_total 1"));
        assert!(text.contains("hoststack_agent_transaction_duration_seconds_count 4"));
        assert!(
            text.contains("hoststack_agent_applied_revision{tuning=\"edge\",revision=\"r2\"} 1")
        );
        assert!(!text.contains("hoststack_agent_applied_revision{tuning=\"edge\",revision=\"r1\"}"));
        work.applied(None);
        assert!(!encode(&registry).contains("hoststack_agent_applied_revision{"));
    }
}
