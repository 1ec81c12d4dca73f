//! `NetworkTuning`: what the user writes — which nodes, what to change on them, how to roll out.

// kube-derive's repeated `printcolumn(type_ = ...)` attributes look duplicated to clippy.
#![allow(clippy::duplicated_attributes)]

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::core::{Expression, Selector};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::node_config::NodeConfig;

/// The CEL regular expression of a label key: an optional DNS-subdomain prefix and a name.
const LABEL_KEY_CEL_REGEX: &str = "^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$";

/// The CEL rule on the keys of `matchLabels`.
fn match_labels_keys_rule() -> kube::core::Rule {
    kube::core::Rule::new(format!(
        "self.all(k, size(k) <= 317 && k.matches('{LABEL_KEY_CEL_REGEX}'))"
    ))
    .message(
        "matchLabels keys must be valid label keys: [prefix/]name, the name at most 63 characters \
         of letters, digits, '-', '_' and '.', starting and ending with a letter or digit",
    )
}

/// The CEL rule on a requirement's key.
fn label_key_rule() -> kube::core::Rule {
    kube::core::Rule::new(format!("self.matches('{LABEL_KEY_CEL_REGEX}')"))
        .message("must be a valid label key")
}

/// The longest NetworkTuning name, in characters: the operator puts the name into label values
/// (the revision history's [`crate::HISTORY_TUNING_LABEL`] and [`crate::HISTORY_FROM_LABEL`]),
/// which hold at most 63. Every other character of a name (lower-case letters, digits, `-` and
/// `.`, alphanumeric at both ends) is one a label value may hold.
pub const TUNING_NAME_MAX_CHARS: usize = 63;

/// The CRD's CEL rule on a NetworkTuning's name.
fn tuning_name_rule() -> kube::core::Rule {
    kube::core::Rule::new(format!(
        "self.metadata.name.size() <= {TUNING_NAME_MAX_CHARS}"
    ))
    .message(
        format!(
            "metadata.name must be at most {TUNING_NAME_MAX_CHARS} characters: the operator puts \
             it into label values"
        )
        .as_str(),
    )
    .reason(kube::core::Reason::FieldValueInvalid)
}

/// A desired network configuration for the nodes a selector picks, rolled out canary-first.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "hoststack.dev",
    version = "v1alpha1",
    kind = "NetworkTuning",
    plural = "networktunings",
    singular = "networktuning",
    shortname = "nwt",
    category = "hoststack",
    status = "NetworkTuningStatus",
    validation = tuning_name_rule(),
    doc = "NetworkTuning: a host network configuration (sysctls, NICs, hugepages, firewall, XDP, DPDK, the user-space TCP stack) for the nodes its selector picks.",
    printcolumn(
        name = "Phase",
        type_ = "string",
        json_path = ".status.phase",
        description = "Rollout phase"
    ),
    printcolumn(
        name = "Revision",
        type_ = "string",
        json_path = ".status.currentRevision",
        description = "Revision being rolled out"
    ),
    printcolumn(
        name = "Applied/Governed",
        type_ = "string",
        json_path = ".status.progress",
        description = "Nodes that applied the current revision, of the nodes this tuning governs"
    ),
    printcolumn(
        name = "Superseded-By",
        type_ = "string",
        json_path = ".status.supersededBy",
        description = "The tunings that govern the nodes this one matches but does not govern"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct NetworkTuningSpec {
    /// Which nodes this tuning applies to, by their labels. An empty selector selects every
    /// node.
    pub node_selector: NodeSelector,
    /// Which tuning governs a node that several select: the highest priority, then the oldest.
    #[serde(default)]
    #[schemars(range(min = 0, max = 1000))]
    pub priority: i32,
    /// What to change on each selected node.
    #[serde(flatten)]
    pub config: NodeConfig,
    /// How the change spreads over the selected nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<Rollout>,
}

/// A label selector over Nodes, as in `kubectl get nodes -l`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeSelector {
    /// Labels a node must carry with exactly these values.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 64))]
    #[x_kube(validation = match_labels_keys_rule())]
    pub match_labels: BTreeMap<String, LabelValue>,
    /// Set-based requirements a node's labels must all meet.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub match_expressions: Vec<SelectorRequirement>,
}

/// A label value: at most 63 characters of letters, digits, `-`, `_` and `.`, starting and ending
/// with a letter or digit, or empty.
#[derive(
    Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, JsonSchema,
)]
#[serde(transparent)]
pub struct LabelValue(
    #[schemars(
        length(max = 63),
        regex(pattern = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
    )]
    pub String,
);

/// One requirement of a set-based selector.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new(
    "(self.operator in ['In', 'NotIn']) == (has(self.values) && size(self.values) > 0)"
).message("In and NotIn need at least one value; Exists and DoesNotExist take none"))]
pub struct SelectorRequirement {
    /// The label key the requirement applies to.
    #[schemars(length(min = 1, max = 317))]
    #[x_kube(validation = label_key_rule())]
    pub key: String,
    /// How the key's value is tested.
    pub operator: SelectorOperator,
    /// Values for In and NotIn.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub values: Vec<LabelValue>,
}

/// Operators of a set-based requirement.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum SelectorOperator {
    /// The label exists and its value is one of `values`.
    #[default]
    In,
    /// The label is absent or its value is none of `values`.
    NotIn,
    /// The label exists.
    Exists,
    /// The label is absent.
    DoesNotExist,
}

impl NodeSelector {
    /// This selector as kube's label selector, for matching and for list queries.
    pub fn to_selector(&self) -> Selector {
        let labels = self
            .match_labels
            .iter()
            .map(|(k, v)| Expression::Equal(k.clone(), v.0.clone()));
        let expressions = self.match_expressions.iter().map(|r| {
            let values: BTreeSet<String> = r.values.iter().map(|v| v.0.clone()).collect();
            match r.operator {
                SelectorOperator::In => Expression::In(r.key.clone(), values),
                SelectorOperator::NotIn => Expression::NotIn(r.key.clone(), values),
                SelectorOperator::Exists => Expression::Exists(r.key.clone()),
                SelectorOperator::DoesNotExist => Expression::DoesNotExist(r.key.clone()),
            }
        });
        labels.chain(expressions).collect()
    }
}

/// How a new revision spreads over the selected nodes.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Rollout {
    /// Nodes changed first and judged before any other: a count or a percentage of the matched
    /// nodes. Nodes labelled hoststack.dev/canary=true are preferred.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary: Option<IntOrString>,
    /// Nodes changed at once in each wave after the canary: a count or a percentage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<IntOrString>,
    /// Wait after the canary has applied, before it is judged complete (e.g. `30s`, `5m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]+(ms|s|m|h)$"))]
    pub pause_after_canary: Option<String>,
    /// Wait between waves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]+(ms|s|m|h)$"))]
    pub pause_between_waves: Option<String>,
    /// How the canary and each wave are judged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub analysis: Option<Analysis>,
    /// Return every updated node to the stable revision when a judged node fails or analysis
    /// fails; false halts the rollout instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_rollback: Option<bool>,
    /// Hold the rollout where it is.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
}

/// How a canary or a wave is judged.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Analysis {
    /// How long health is sampled on the judged and the baseline nodes (e.g. `60s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]+(ms|s|m|h)$"))]
    pub window: Option<String>,
    /// Wait for a person to promote (annotation hoststack.dev/promote) instead of judging.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub manual: bool,
    /// Thresholds on the TCP health the agents sample.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub thresholds: Vec<HealthThreshold>,
    /// A Prometheus query that judges the change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prometheus: Option<PrometheusAnalysis>,
}

/// A bound on one health metric of the judged nodes.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HealthThreshold {
    /// Which metric.
    pub metric: HealthMetric,
    /// Fail when the judged nodes' value exceeds this (a decimal, e.g. `0.01`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]+(\.[0-9]+)?$"))]
    pub max: Option<String>,
    /// Fail when the judged nodes' value exceeds the baseline's times this factor (e.g. `1.5`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]+(\.[0-9]+)?$"))]
    pub max_relative_to_baseline: Option<String>,
}

/// TCP health metrics sampled by the agents.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum HealthMetric {
    /// ΔRetransSegs / ΔOutSegs.
    #[default]
    RetransmitRatio,
    /// SACK recoveries per thousand segments sent.
    SackRecoveriesPerKiloSegment,
    /// D-SACKs received per thousand segments sent.
    DsacksPerKiloSegment,
    /// Retransmission timeouts per second.
    RtoTimeouts,
    /// Listen drops per second.
    ListenDrops,
}

/// A Prometheus gate.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PrometheusAnalysis {
    /// Which Prometheus to ask, when not the default: the base URL of one the operator was
    /// installed to ask (chart values `prometheus.address`, the default, and
    /// `prometheus.allowedAddresses`), e.g. `https://thanos.monitoring:443`. Any other address
    /// is refused (condition PrometheusAnswered False, reason AddressNotAllowed; the rollout
    /// pauses) and never contacted: the installer, not the tuning, decides where the
    /// Secret's credentials go.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 2048))]
    pub address: Option<String>,
    /// PromQL; `{{judged}}` and `{{baseline}}` are replaced by regexes of the node names.
    #[schemars(length(min = 1, max = 8192))]
    pub query: String,
    /// Condition on the query's scalar result, e.g. `result < 0.01`.
    #[schemars(length(min = 1, max = 1024))]
    pub success_condition: String,
    /// Condition that fails the rollout at once, e.g. `result > 0.05`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub failure_condition: Option<String>,
    /// A Secret in the operator's namespace holding what the server asks for: `token` (a
    /// bearer token) or `username` and `password` (basic auth), and `ca.crt` (the PEM CA
    /// bundle that signed an https server's certificate; the system's roots otherwise). The
    /// chart lets the operator read this one Secret only (`prometheus.secretName`), and the
    /// operator sends it only to the addresses the chart allows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub secret_name: Option<String>,
    /// Headers sent with every query, e.g. a tenant's `X-Scope-OrgID` for a multi-tenant
    /// Prometheus-compatible store (not for secrets: the spec is readable by anyone who may
    /// read the tuning; credentials go in the Secret).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub headers: Vec<HttpHeader>,
    /// How long the query may take before the analysis is inconclusive (default `10s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]+(ms|s|m)$"))]
    pub timeout: Option<String>,
}

/// An HTTP header.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HttpHeader {
    /// The header's name, e.g. `X-Scope-OrgID`.
    #[schemars(regex(pattern = r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,256}$"))]
    pub name: String,
    /// Its value.
    #[schemars(length(max = 4096))]
    pub value: String,
}

/// Where a tuning's rollout stands.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum Phase {
    /// Nothing applied yet.
    #[default]
    Pending,
    /// Nodes are being changed.
    Progressing,
    /// Held by `rollout.paused` or an inconclusive analysis.
    Paused,
    /// Every governed node applied the current revision.
    Complete,
    /// Updated nodes were returned to the stable revision.
    RolledBack,
    /// Nodes failed to apply and nothing rolled back.
    Failed,
    /// Every node the selector matches is governed by another tuning (`status.supersededBy`):
    /// this one changes nothing until it governs a node again.
    Superseded,
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self, f)
    }
}

/// What the operator observed of a tuning.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkTuningStatus {
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The revision of the current spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_revision: Option<String>,
    /// The last revision that every governed node applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stable_revision: Option<String>,
    /// Where the rollout stands.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    /// Ready, Progressing, Degraded and Conflict, with reasons.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Nodes the selector matches.
    #[serde(default)]
    pub matched_nodes: i32,
    /// Nodes this tuning governs that were given the current revision.
    #[serde(default)]
    pub updated_nodes: i32,
    /// Nodes whose agent applied the current revision.
    #[serde(default)]
    pub applied_nodes: i32,
    /// Nodes whose agent failed to apply the current revision.
    #[serde(default)]
    pub failed_nodes: i32,
    /// `applied/governed`, for `kubectl get`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<String>,
    /// The tunings that govern the matched nodes this one does not (comma-separated), for
    /// `kubectl get`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub superseded_by: Option<String>,
    /// Matched nodes governed by another tuning instead.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conflicts: Vec<NodeConflict>,
    /// The rollout's waves, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waves: Vec<WaveStatus>,
    /// Why the rollout is paused, rolled back or halted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// A matched node that another tuning governs.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeConflict {
    /// The node.
    pub node: String,
    /// The tuning that governs it.
    pub governed_by: String,
}

/// One wave of a rollout.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WaveStatus {
    /// Position in the rollout; 0 is the canary.
    pub index: u32,
    /// Nodes changed in this wave.
    pub nodes: Vec<String>,
    /// Pending, Applying, Applied, Failed or RolledBack.
    pub result: String,
    /// When every node of the wave had applied the revision (RFC 3339): the start of its pause
    /// and of its analysis window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_at: Option<String>,
    /// How the wave was judged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub analysis: Option<AnalysisStatus>,
    /// What the wave's nodes ran before it, where that was not the stable revision: a rollback
    /// returns them there. Absent nodes came from the stable revision (or, without one, had
    /// nothing of hoststack's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub from: Vec<WaveOrigin>,
}

/// Nodes of a wave that came from the same configuration.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WaveOrigin {
    /// The nodes.
    pub nodes: Vec<String>,
    /// The tuning whose revision they ran (this one, or another); absent: nothing of
    /// hoststack's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tuning: Option<String>,
    /// The revision they ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
}

/// The judgement of one wave.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AnalysisStatus {
    /// Pending, Pass, Fail or Inconclusive.
    pub verdict: String,
    /// Why, in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The health request the samples answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    /// Each measured metric of the judged nodes against the baseline.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub metrics: Vec<MetricResult>,
    /// How the Prometheus query went, when one ran: `Answered`, or why it did not
    /// (`TLSFailed`, `Unauthorized`, `Forbidden`, `ServerError`, `HTTPError`, `Timeout`,
    /// `Unreachable`, `NoData`, `QueryRefused`, `BadAnswer`, `BadSettings`,
    /// `SecretUnreadable`); the tuning's `PrometheusAnswered` condition carries it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prometheus_outcome: Option<String>,
}

/// One metric of an analysis.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MetricResult {
    /// The metric (a HealthMetric name, or `prometheus`).
    pub metric: String,
    /// Its value over the judged nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub judged: Option<String>,
    /// Its value over the baseline nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline: Option<String>,
    /// The bound it was held to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<String>,
    /// Whether it passed.
    pub passed: bool,
}
