//! `NodeTuning`: the contract between the operator and one node's agent. The operator writes its
//! spec; only that node's agent writes its status.

// kube-derive's repeated `printcolumn(type_ = ...)` attributes look duplicated to clippy.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::node_config::NodeConfig;

/// The configuration the operator resolved for one node (name = the node's name), and what that
/// node's agent did with it.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "hoststack.dev",
    version = "v1alpha1",
    kind = "NodeTuning",
    plural = "nodetunings",
    singular = "nodetuning",
    shortname = "ndt",
    category = "hoststack",
    status = "NodeTuningStatus",
    doc = "NodeTuning: the configuration the operator resolved for one node, named after it, and what the node's agent did with it.",
    printcolumn(
        name = "Governed-By",
        type_ = "string",
        json_path = ".spec.governedBy",
        description = "The NetworkTuning whose rollout manages the node"
    ),
    printcolumn(
        name = "Tuning",
        type_ = "string",
        json_path = ".spec.tuning",
        description = "The NetworkTuning whose revision the node runs"
    ),
    printcolumn(
        name = "Revision",
        type_ = "string",
        json_path = ".spec.revision",
        description = "Revision asked for"
    ),
    printcolumn(
        name = "Rollout",
        type_ = "string",
        json_path = ".spec.rolloutPhase",
        description = "The node's part in the rollout: canary, wave or stable"
    ),
    printcolumn(
        name = "State",
        type_ = "string",
        json_path = ".status.state",
        description = "What the agent did"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct NodeTuningSpec {
    /// The NetworkTuning whose revision this is: the governing one, or, while a tuning that
    /// took the node over has not rolled onto it yet (or rolled back), the one it came from.
    /// Absent when the node is to run nothing of hoststack's, which asks the agent to revert
    /// everything it changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tuning: Option<String>,
    /// The NetworkTuning that governs this node (whose rollout decides what it runs); absent
    /// when none does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub governed_by: Option<String>,
    /// The revision of `config`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// What to change on this node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<NodeConfig>,
    /// `Apply` changes the host; `Plan` only reports what would change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<Mode>,
    /// The node's part in the rollout of its tuning, exported by the agent as the `phase` label
    /// of `hoststack_node_info` so that PromQL can split any counter by it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout_phase: Option<RolloutPhase>,
    /// Asks the agent for TCP health samples while the node is judged in a rollout (as a canary,
    /// a wave or the baseline). The agent reports one sample per window in `status.health`
    /// while this is set, and none once it is removed, so status writes stay bounded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_request: Option<HealthRequest>,
    /// Asks the agent what applying another config would change on this node, changing nothing
    /// (`kubectl hoststack plan`). Written by the plugin under its own field manager, so the
    /// operator neither owns nor clears it, and removed by the plugin when it has the answer;
    /// the agent answers in `status.preview`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preview: Option<PreviewRequest>,
}

impl NodeTuningSpec {
    /// The spec without its preview request: the part the operator writes and compares.
    pub fn without_preview(&self) -> NodeTuningSpec {
        NodeTuningSpec {
            preview: None,
            ..self.clone()
        }
    }
}

/// A request to preview a config on one node.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PreviewRequest {
    /// Names the request; the agent answers each id once and echoes it in `status.preview`.
    #[schemars(length(min = 1, max = 128))]
    pub id: String,
    /// The NetworkTuning the config comes from (it may not exist yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tuning: Option<String>,
    /// The config to preview.
    pub config: NodeConfig,
}

/// The agent's answer to a [`PreviewRequest`]: what applying its config would do on this host
/// now, from the journal and the values read from the host. Nothing was changed.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PreviewResult {
    /// The `spec.preview.id` this answers.
    pub id: String,
    /// The revision of the previewed config.
    pub revision: String,
    /// The revision the host is on now; absent when hoststack has changed nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_revision: Option<String>,
    /// Planned, or Failed when the agent could not make the plan (see `message`).
    pub state: NodeState,
    /// Why items would fail, or why no plan could be made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// One entry per setting the transaction would involve: `actual` is the value on the host
    /// now, `desired` the value it would get (for a setting the config no longer manages: its
    /// original), `state` WouldChange, Unchanged, WouldFail or NotSupported.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub items: Vec<ItemResult>,
    /// When the agent read the host for this answer (RFC 3339).
    pub observed_at: String,
}

/// A request for health samples.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HealthRequest {
    /// Names the request; the agent starts a fresh window when it changes and echoes it in each
    /// sample, so the operator never mistakes an old sample for a new one.
    #[schemars(length(min = 1, max = 128))]
    pub id: String,
    /// Length of one sampling window, e.g. `30s`.
    #[schemars(regex(pattern = r"^[0-9]+(ms|s|m|h)$"))]
    pub window: String,
}

/// TCP health of one node over one window: the counter deltas from /proc/net/snmp and
/// /proc/net/netstat (kernel stack), and the rates derived from them.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HealthSample {
    /// The `healthRequest.id` this sample answers.
    pub request_id: String,
    /// The revision the host was on during the whole window (absent: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// Start of the window (RFC 3339).
    pub start: String,
    /// End of the window (RFC 3339).
    pub end: String,
    /// Length of the window in milliseconds.
    pub duration_ms: u64,
    /// The host stayed on one revision (no transaction ran) and no counter was reset during
    /// the whole window: only a steady sample is judged.
    #[serde(default)]
    pub steady: bool,
    /// Δ Tcp OutSegs: segments sent.
    pub out_segs: u64,
    /// Δ Tcp RetransSegs: segments retransmitted.
    pub retrans_segs: u64,
    /// Δ TcpExt TCPSackRecovery: recoveries driven by SACK.
    pub sack_recoveries: u64,
    /// Δ TcpExt TCPDSACKRecv: D-SACKs received.
    pub dsacks: u64,
    /// Δ TcpExt TCPTimeouts: retransmission timeouts.
    pub rto_timeouts: u64,
    /// Δ TcpExt ListenDrops: connections dropped at listen.
    pub listen_drops: u64,
    /// retransSegs / outSegs, as a decimal (absent when nothing was sent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retransmit_ratio: Option<String>,
    /// sackRecoveries per thousand segments sent (absent when nothing was sent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sack_recoveries_per_kilo_segment: Option<String>,
    /// dsacks per thousand segments sent (absent when nothing was sent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dsacks_per_kilo_segment: Option<String>,
}

/// A node's part in a rollout.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum RolloutPhase {
    /// Changed first and judged against the baseline.
    Canary,
    /// Changed in a wave after the canary.
    Wave,
    /// Not changed by the rollout in progress, or the rollout is over: what the canary is
    /// compared with while it lasts.
    Stable,
    /// No part in any rollout: the agents' label for a node without a spec. The operator no
    /// longer writes it (earlier builds relabelled every node outside the waves so, one more
    /// write per node per revision).
    #[default]
    Baseline,
}

impl RolloutPhase {
    /// The label value: canary, wave, stable or baseline.
    pub fn as_str(self) -> &'static str {
        match self {
            RolloutPhase::Canary => "canary",
            RolloutPhase::Wave => "wave",
            RolloutPhase::Stable => "stable",
            RolloutPhase::Baseline => "baseline",
        }
    }
}

/// What the agent does with a spec.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum Mode {
    /// Change the host.
    #[default]
    Apply,
    /// Report the plan only; change nothing.
    Plan,
}

/// The agent's summary of its node.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum NodeState {
    /// Nothing asked yet.
    #[default]
    Idle,
    /// A transaction is running.
    Applying,
    /// The asked revision is applied and verified.
    Applied,
    /// The asked revision failed; the host is as it was before it.
    Failed,
    /// Everything hoststack changed is restored.
    Reverted,
    /// Plan mode: `items` say what would change.
    Planned,
}

impl std::fmt::Display for NodeState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self, f)
    }
}

/// What the node's agent reports.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeTuningStatus {
    /// Summary of the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<NodeState>,
    /// The revision the host is on; absent when hoststack has changed nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_revision: Option<String>,
    /// The tuning the applied revision came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_tuning: Option<String>,
    /// The revision the last transaction (or plan) was about; for a revert of a withdrawn
    /// spec, the revision reverted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_revision: Option<String>,
    /// Why the last transaction failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// One entry per host setting the last transaction touched.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub items: Vec<ItemResult>,
    /// Applied, Degraded, Drifted and Reverted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// What the agent found on the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub facts: Option<HostFacts>,
    /// The latest health sample, while `spec.healthRequest` asks for samples.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<HealthSample>,
    /// The answer to `spec.preview`, while it is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preview: Option<PreviewResult>,
    /// While the applied revision is provisional: when the agent reverts it by itself unless it
    /// confirms it first (`config.probes`). A node is not counted as applied before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirmation: Option<Confirmation>,
    /// The last round of post-apply probes, one entry per probe.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub probes: Vec<ProbeResult>,
    /// The user-space TCP stack the agent runs for `config.userspaceStack`, while it runs or
    /// is restarted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub userspace_stack: Option<UserspaceStackStatus>,
}

/// A provisional revision awaiting confirmation.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Confirmation {
    /// The revision awaiting confirmation.
    pub revision: String,
    /// When the agent reverts it unless confirmed (RFC 3339).
    pub deadline: String,
}

/// The outcome of one post-apply probe.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProbeResult {
    /// `api-server`, or the name of a `config.probes.targets` entry.
    pub name: String,
    /// What it reached for (`host:port`, or the API server's URL).
    pub target: String,
    /// Whether it passed.
    pub passed: bool,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// One host setting.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ItemResult {
    /// The applier: `sysctl`, `hugepages`, `nic`, ...
    pub kind: String,
    /// What it changes, e.g. `net.ipv4.tcp_sack`.
    pub target: String,
    /// The value before hoststack changed it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub original: Option<String>,
    /// The value asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired: Option<String>,
    /// The value read back from the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actual: Option<String>,
    /// What happened to it.
    pub state: ItemState,
    /// Why, when it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// What happened to one item.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ItemState {
    /// Not done yet.
    #[default]
    Pending,
    /// Set and verified.
    Applied,
    /// Already had the desired value.
    Unchanged,
    /// Could not be set; see the message.
    Failed,
    /// Was set, then restored because another item failed.
    RolledBack,
    /// Restored to its original value.
    Reverted,
    /// Plan mode: would change from actual to desired.
    WouldChange,
    /// Plan mode: would fail; see the message.
    WouldFail,
    /// This agent does not implement this kind yet.
    NotSupported,
}

impl std::fmt::Display for ItemState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self, f)
    }
}

/// What the agent found on its host.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostFacts {
    /// Kernel release (`uname -r`).
    pub kernel_release: String,
    /// Online CPUs in list format.
    pub cpus_online: String,
    /// Number of online CPUs.
    pub cpu_count: u32,
    /// NUMA node ids.
    #[serde(default)]
    pub numa_nodes: Vec<u32>,
    /// Hugepage sizes the kernel offers, e.g. `2Mi`, `1Gi`.
    #[serde(default)]
    pub hugepage_sizes: Vec<String>,
    /// Network interfaces in the agent's network namespace.
    #[serde(default)]
    pub interfaces: Vec<InterfaceFacts>,
    /// Whether the vfio-pci driver is available.
    #[serde(default)]
    pub vfio_available: bool,
    /// Whether the kernel describes its own types in BTF (/sys/kernel/btf/vmlinux): BPF programs
    /// with CO-RE relocations need it; hoststack's XDP programs do not.
    #[serde(default)]
    pub btf_available: bool,
    /// Whether BPF programs are JIT-compiled (net.core.bpf_jit_enable is 1 or 2); without it XDP
    /// runs interpreted, far slower.
    #[serde(default)]
    pub bpf_jit_enabled: bool,
}

/// One network interface.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InterfaceFacts {
    /// Interface name.
    pub name: String,
    /// Kernel driver, when the interface has a device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
    /// PCI address, when the device is on PCI.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_address: Option<String>,
    /// MTU in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// Receive queues.
    pub rx_queues: u32,
    /// Transmit queues.
    pub tx_queues: u32,
}

/// The user-space TCP stack as its supervisor, the node agent, sees it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UserspaceStackStatus {
    /// `Starting` (started, not serving yet), `Running` (every shard serves) or `Restarting`
    /// (it died; waiting out the backoff before the next start).
    pub state: String,
    /// The runner process (`hoststack-userstack`), while it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// The packet I/O backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<crate::node_config::StackBackend>,
    /// How the backend moves packets: `copy` or `zeroCopy` (AF_XDP), `tap` or `dpdk`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// The dedicated cores, in list format.
    pub cores: String,
    /// Whether every dedicated core is isolated from the scheduler (listed in both
    /// `/sys/devices/system/cpu/isolated` and `nohz_full`); when not, `message` warns.
    pub isolated: bool,
    /// How often the stack died and was started again by this agent.
    #[serde(default)]
    pub restarts: u32,
    /// One entry per shard: its core, device queue and counters.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shards: Vec<StackShardStatus>,
    /// The services listening.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub services: Vec<StackServiceStatus>,
    /// How flows reach their shard: the RSS key and indirection table the stack steers by
    /// (the NIC's own, or a configured key where the device has no RSS to read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steering: Option<StackSteeringStatus>,
    /// Warnings (cores not isolated) and how the stack last ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// One shard of the user-space stack.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StackShardStatus {
    /// The core its thread is pinned to.
    pub core: u32,
    /// The device queue it polls.
    pub queue: u32,
    /// Packets received.
    pub rx_packets: u64,
    /// Packets sent.
    pub tx_packets: u64,
    /// Connections open now.
    pub connections: u64,
}

/// The receive-side steering the user-space stack computes flows' shards with: shard = the
/// queue the NIC's Toeplitz hash and indirection table put the flow on, and connections the
/// stack opens take a source port that hashes back to their own shard.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StackSteeringStatus {
    /// `nic` (the key and table were read from the NIC through ethtool netlink) or
    /// `configured` (the NIC has no RSS to read, or is not a netdev: Microsoft's key over the
    /// shards, which the DPDK backend also programs into the device).
    pub source: String,
    /// The Toeplitz key, in hex.
    pub key: String,
    /// Entries in the indirection table.
    pub indirection_size: u32,
}

/// A service the user-space stack listens with.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StackServiceStatus {
    /// What it does.
    pub kind: crate::node_config::ServiceKind,
    /// Its TCP port.
    pub port: u16,
}
