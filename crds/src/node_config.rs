//! The node-config part of a tuning: everything an agent changes on a host.
//!
//! These types appear twice: flattened into `NetworkTuning.spec` (what the user writes) and as
//! `NodeTuning.spec.config` (what the operator resolved for one node). The revision of a tuning
//! is a hash of this part alone, so that rollout settings never cause a new revision.

use std::collections::BTreeMap;

use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Sysctl key prefixes a tuning may set: the networking trees of the kernel.
pub const SYSCTL_PREFIXES: &[&str] = &[
    "net.core.",
    "net.ipv4.",
    "net.ipv6.",
    "net.netfilter.",
    "net.unix.",
];

/// The few keys outside `net.` that a networking tuning may set, each with the reason.
pub const SYSCTL_EXTRA_KEYS: &[(&str, &str)] = &[
    (
        "vm.min_free_kbytes",
        "headroom for the atomic allocations a NIC's receive path makes under load",
    ),
    (
        "kernel.numa_balancing",
        "page migration moves packet buffers away from the NUMA node of a pinned queue",
    ),
];

/// Longest sysctl value the API accepts, in bytes.
pub const SYSCTL_VALUE_MAX_LEN: usize = 256;

/// Most sysctls one tuning may set.
pub const SYSCTL_MAX_KEYS: usize = 128;

/// The CEL regular expression a sysctl key must match (dot-separated segments of letters, digits,
/// `_` and `-`, under an allowed prefix). It excludes `/`, `..`, whitespace and control characters
/// by construction.
pub const SYSCTL_KEY_CEL_REGEX: &str = "^((net[.](core|ipv4|ipv6|netfilter|unix))([.][A-Za-z0-9_-]+)+|vm[.]min_free_kbytes|kernel[.]numa_balancing)$";

/// The CRD's CEL rule on the keys of `sysctls`; its message names the first bad key.
fn sysctl_keys_rule() -> kube::core::Rule {
    let re = SYSCTL_KEY_CEL_REGEX;
    kube::core::Rule::new(format!("self.all(k, k.matches('{re}'))"))
        .message(kube::core::Message::Expression(format!(
            "'sysctl key ' + self.filter(k, !k.matches('{re}'))[0] + ' is not allowed: keys are \
             dot-separated names under net.core., net.ipv4., net.ipv6., net.netfilter. or net.unix. \
             (or vm.min_free_kbytes, kernel.numa_balancing), with no /, .., whitespace or control characters'"
        )))
        .reason(kube::core::Reason::FieldValueInvalid)
}

/// Whether `key` is a sysctl key the API accepts; the same rule as the CRD's CEL validation.
pub fn sysctl_key_allowed(key: &str) -> bool {
    if SYSCTL_EXTRA_KEYS.iter().any(|(k, _)| *k == key) {
        return true;
    }
    let Some(prefix) = SYSCTL_PREFIXES.iter().find(|p| key.starts_with(**p)) else {
        return false;
    };
    key[prefix.len()..].split('.').all(|segment| {
        !segment.is_empty()
            && segment
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    })
}

/// A sysctl value: printable ASCII, not blank, at most 256 bytes. Whitespace between words is
/// kept as written; the agent compares values with runs of whitespace collapsed, since the kernel
/// prints multi-word values (tcp_rmem) with tabs.
#[derive(
    Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, JsonSchema,
)]
#[serde(transparent)]
pub struct SysctlValue(
    #[schemars(length(min = 1, max = 256), regex(pattern = r"^[ -~]*[!-~][ -~]*$"))] pub String,
);

/// Everything a tuning changes on a host. Only the sections present are touched.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeConfig {
    /// Kernel parameters to set, by their dotted name (as `sysctl -w` takes them), e.g.
    /// `net.ipv4.tcp_sack: "1"`. Keys must lie under net.core., net.ipv4., net.ipv6.,
    /// net.netfilter. or net.unix., or be vm.min_free_kbytes or kernel.numa_balancing.
    /// net.* keys are per network namespace; the agent sets them in its own.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 128))]
    #[x_kube(validation = sysctl_keys_rule())]
    pub sysctls: BTreeMap<String, SysctlValue>,

    /// NIC settings, one entry per group of interfaces chosen by `match`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub interfaces: Vec<InterfaceTuning>,

    /// Hugepage reservations, one entry per page size and NUMA node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub hugepages: Vec<HugepageReservation>,

    /// The agent's own nftables table (named hoststack): blocked prefixes, SYN rate limit, and
    /// accept/notrack rules for the user-space stack's ports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub firewall: Option<Firewall>,

    /// The embedded user-space TCP stack, run by the agent on dedicated cores.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub userspace_stack: Option<UserspaceStack>,

    /// What the agent does when a setting it applied changes behind its back: it always reports
    /// the Drifted condition naming the settings; `Reapply` (the default) also writes the
    /// desired values again, `Report` leaves the host as it found it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drift_policy: Option<DriftPolicy>,

    /// What the agent checks after applying this revision, and how long the revision stays
    /// provisional: unless the agent confirms it (its probes pass, and it wrote its status and
    /// read it back from the API server over a new connection) within `confirmTimeout`, it
    /// reverts the revision by itself. Absent: the defaults (API-server probe on, 1s settle
    /// time, 60s confirm timeout).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probes: Option<Probes>,
}

/// The default of `probes.timeout`.
pub const PROBE_TIMEOUT_DEFAULT: &str = "5s";

/// The default of `probes.confirmTimeout`.
pub const CONFIRM_TIMEOUT_DEFAULT: &str = "60s";

/// The CRD's CEL rule on `probes`: a probe's timeout fits in the confirmation window.
fn probe_timeout_rule() -> kube::core::Rule {
    let (timeout, confirm) = (PROBE_TIMEOUT_DEFAULT, CONFIRM_TIMEOUT_DEFAULT);
    kube::core::Rule::new(format!(
        "duration(has(self.timeout) ? self.timeout : '{timeout}') <= \
         duration(has(self.confirmTimeout) ? self.confirmTimeout : '{confirm}')"
    ))
    .message(
        format!(
            "probes.timeout (default {timeout}) must not be longer than probes.confirmTimeout \
             (default {confirm}): every probe must be able to end within the confirmation window"
        )
        .as_str(),
    )
    .reason(kube::core::Reason::FieldValueInvalid)
}

/// The post-apply probes and the dead-man confirmation of a revision.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = probe_timeout_rule())]
pub struct Probes {
    /// Check the API server after the change, over a new connection along the node's own
    /// network path, and confirm the revision only once the agent's status write is read back
    /// (default true). `false` turns both off: the revision is never provisional unless other
    /// probes are on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_server: Option<bool>,
    /// Check that the default gateway, where the node has a default route, still answers
    /// address resolution (ARP or neighbour discovery; no ICMP) (default true). A node
    /// without a default route skips it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_gateway: Option<bool>,
    /// How long after the transaction the probes run again before the revision is confirmed
    /// (default 1s); each node adds a random part of as much again, so a wave's nodes do not
    /// probe the API server in the same second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]{1,6}(ms|s|m|h)$"), length(max = 8))]
    pub settle_time: Option<String>,
    /// How long one probe is retried before it fails (default 5s); at most `confirmTimeout`.
    /// A round of probes never outlasts the confirmation window: a probe still trying when
    /// it closes fails, saying so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]{1,6}(ms|s|m|h)$"), length(max = 8))]
    pub timeout: Option<String>,
    /// How long the revision may stay unconfirmed before the agent reverts it by itself
    /// (default 60s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]{1,6}(ms|s|m|h)$"), length(max = 8))]
    pub confirm_timeout: Option<String>,
    /// More targets the node must reach after the change.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub targets: Vec<ProbeTarget>,
}

/// A probe target: exactly one of a TCP connect, an HTTP GET or a DNS lookup.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProbeTarget {
    /// Names the probe in the status, the metrics and the failure message.
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    /// `host:port` (an IP address, an IPv6 one in brackets, or a DNS name) to open a TCP
    /// connection to. It must lie within the destinations the agents allow (the chart's
    /// `probes.allowedDestinations`; never loopback or link-local unless named there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 3, max = 253),
        regex(pattern = r"^([A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\]):[0-9]{1,5}$")
    )]
    pub tcp: Option<String>,
    /// A plain-HTTP GET and the status it must answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<HttpProbe>,
    /// A name the node's resolver must turn into at least one address (nothing connects to
    /// them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253), regex(pattern = r"^[A-Za-z0-9._-]+$"))]
    pub dns: Option<String>,
}

/// An HTTP GET probe.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HttpProbe {
    /// `http://host[:port][/path][?query]` (plain HTTP; the host an IP address, an IPv6 one in
    /// brackets, or a DNS name): visible ASCII only — no spaces or control characters,
    /// percent-encode them — and no user information. The host must lie within the
    /// destinations the agents allow, like a `tcp` target's. Only the answer's status code is
    /// reported.
    #[schemars(
        length(min = 8, max = 2048),
        regex(
            pattern = r"^http://([A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?([/?][A-Za-z0-9._~!$&'()*+,;=:@%/?-]*)?$"
        )
    )]
    pub url: String,
    /// The status it must answer (default 200).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 100, max = 599))]
    pub expect_status: Option<u16>,
}

/// A config that does not hash to the revision it came with ([`NodeConfig::verify_revision`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RevisionMismatch {
    /// The revision the config came with.
    pub claimed: String,
    /// The revision the config hashes to.
    pub actual: String,
}

impl std::fmt::Display for RevisionMismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the config hashes to revision {}, not to {}, the revision it came with: it was changed after its revision was computed (or written by a hoststack version whose config has fields this one does not know)",
            self.actual, self.claimed
        )
    }
}

impl std::error::Error for RevisionMismatch {}

/// What the agent does about drift.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum DriftPolicy {
    /// Report the Drifted condition and write the desired values again.
    #[default]
    Reapply,
    /// Report the Drifted condition only.
    Report,
}

impl NodeConfig {
    /// The revision of this config: the first 10 hex digits of the SHA-256 of its canonical JSON
    /// form (maps are ordered, empty sections are omitted), so equal configs share a revision.
    pub fn revision(&self) -> String {
        let canonical = serde_json::to_vec(self).expect("a NodeConfig always serializes");
        let digest = Sha256::digest(&canonical);
        digest.iter().take(5).map(|b| format!("{b:02x}")).collect()
    }

    /// Checks that this config is the content of `revision`, that is, hashes to it: where a
    /// config enters under a revision it did not come with (a NodeTuning's spec, a recorded
    /// revision), someone changed it after the revision was computed, and it is not to be
    /// trusted as that revision.
    pub fn verify_revision(&self, revision: &str) -> Result<(), RevisionMismatch> {
        let actual = self.revision();
        if actual == revision {
            Ok(())
        } else {
            Err(RevisionMismatch {
                claimed: revision.to_string(),
                actual,
            })
        }
    }

    /// Names of the sections other than sysctls that this config uses, in the agent's apply
    /// order.
    pub fn sections_in_use(&self) -> Vec<&'static str> {
        let mut used = Vec::new();
        if !self.hugepages.is_empty() {
            used.push("hugepages");
        }
        if !self.sysctls.is_empty() {
            used.push("sysctls");
        }
        if !self.interfaces.is_empty() {
            used.push("interfaces");
        }
        if self.firewall.is_some() {
            used.push("firewall");
        }
        if self.userspace_stack.is_some() {
            used.push("userspaceStack");
        }
        used
    }
}

/// The longest interface-name glob the API accepts, in bytes. An interface name has at most 15
/// (IFNAMSIZ - 1), but a glob that spells characters as classes is longer
/// (`enp[0-9][0-9]s0f[01]` is 20): 64 leaves room for such globs, and bounds one match by the
/// agent at 65 x 16 steps.
pub const INTERFACE_GLOB_MAX_BYTES: usize = 64;

/// The most `*` an interface-name glob may hold. The agent's matcher takes the same linear time
/// whatever their number; the bound is for agents older than it, which backtracked in time
/// growing as the name's length to the power of the stars, and no naming scheme needs more.
pub const INTERFACE_GLOB_MAX_STARS: usize = 4;

/// Whether the API accepts `glob` as an interface-name glob, else why not: at most
/// [`INTERFACE_GLOB_MAX_BYTES`] of printable ASCII (no whitespace, no control characters), with
/// at most [`INTERFACE_GLOB_MAX_STARS`] stars. The same bounds as the CRD's schema, for the agent
/// to refuse a spec that an older schema let through.
pub fn check_interface_glob(glob: &str) -> Result<(), String> {
    if glob.is_empty() || glob.len() > INTERFACE_GLOB_MAX_BYTES {
        return Err(format!(
            "is {} bytes long; an interface name glob has 1 to {INTERFACE_GLOB_MAX_BYTES} bytes",
            glob.len()
        ));
    }
    if let Some(c) = glob.chars().find(|c| !c.is_ascii_graphic()) {
        return Err(format!("holds {c:?}; {INTERFACE_GLOB_CHARACTERS_MESSAGE}"));
    }
    let stars = glob.matches('*').count();
    if stars > INTERFACE_GLOB_MAX_STARS {
        return Err(format!(
            "holds {stars} '*'; {}",
            interface_glob_stars_message()
        ));
    }
    Ok(())
}

/// What the CRD says of an interface-name glob's characters.
const INTERFACE_GLOB_CHARACTERS_MESSAGE: &str =
    "an interface name glob is printable ASCII, without whitespace or control characters";

/// What the CRD says of an interface-name glob's stars.
fn interface_glob_stars_message() -> String {
    format!("an interface name glob holds at most {INTERFACE_GLOB_MAX_STARS} '*'")
}

/// The CRD's CEL rule on an interface-name glob's characters.
fn interface_glob_characters_rule() -> kube::core::Rule {
    kube::core::Rule::new("self.matches('^[!-~]*$')")
        .message(INTERFACE_GLOB_CHARACTERS_MESSAGE)
        .reason(kube::core::Reason::FieldValueInvalid)
}

/// The CRD's CEL rule on an interface-name glob's stars.
fn interface_glob_stars_rule() -> kube::core::Rule {
    kube::core::Rule::new(format!(
        "self.matches('^[^*]*([*][^*]*){{0,{INTERFACE_GLOB_MAX_STARS}}}$')"
    ))
    .message(interface_glob_stars_message().as_str())
    .reason(kube::core::Reason::FieldValueInvalid)
}

/// Which interfaces an entry applies to. Every given field must match; at least one is required.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new("has(self.name) || has(self.driver) || has(self.pciAddress)").message("match needs at least one of name, driver or pciAddress"))]
pub struct InterfaceMatch {
    /// Interface name or shell-style glob, e.g. `eth1` or `ens*`: `*` (any run of characters),
    /// `?` (one character), `[abc]`, `[a-z]`, `[!a]` or `[^a]` (one character of a class, or not
    /// of it). At most 64 bytes of printable ASCII (no whitespace), with at most 4 `*`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = INTERFACE_GLOB_MAX_BYTES))]
    #[x_kube(
        validation = interface_glob_characters_rule(),
        validation = interface_glob_stars_rule()
    )]
    pub name: Option<String>,
    /// Kernel driver name as in /sys/class/net/IF/device/driver, e.g. `ixgbe`, `virtio_net`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64), regex(pattern = r"^[A-Za-z0-9_-]+$"))]
    pub driver: Option<String>,
    /// PCI address in domain:bus:device.function form, e.g. `0000:00:03.0`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$"))]
    pub pci_address: Option<String>,
}

/// Settings for the interfaces that an entry matches.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InterfaceTuning {
    /// Which interfaces this entry applies to.
    #[serde(rename = "match")]
    pub match_: InterfaceMatch,
    /// Queue (channel) counts, as `ethtool -L` sets them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channels: Option<Channels>,
    /// Offload features by the kernel's name (`tso`, `gso`, `gro`, `lro`, `rx-checksum`, ...),
    /// true to enable.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 64))]
    pub offloads: BTreeMap<String, bool>,
    /// Ring sizes, as `ethtool -G` sets them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rings: Option<Rings>,
    /// MTU in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 68, max = 65535))]
    pub mtu: Option<u32>,
    /// Where the interface's queue interrupts are handled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub irq_affinity: Option<IrqAffinity>,
    /// Receive packet steering for the interface's rx queues.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rps: Option<Rps>,
    /// Transmit packet steering for the interface's tx queues.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xps: Option<Xps>,
    /// An XDP program attached to the interface.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xdp: Option<Xdp>,
    /// Bind the interface's PCI device to a user-space I/O driver for DPDK.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dpdk: Option<DpdkBinding>,
}

/// Queue counts. Drivers offer either combined channels or separate rx and tx ones.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Channels {
    /// Combined rx/tx channels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1024))]
    pub combined: Option<u32>,
    /// Receive-only channels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1024))]
    pub rx: Option<u32>,
    /// Transmit-only channels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1024))]
    pub tx: Option<u32>,
}

/// Descriptor ring sizes.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Rings {
    /// Receive ring entries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65536))]
    pub rx: Option<u32>,
    /// Transmit ring entries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65536))]
    pub tx: Option<u32>,
}

/// A CPU list in the kernel's list format, e.g. `0-3,8,10-11`.
pub const CPU_LIST_PATTERN: &str = r"^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$";

/// How queue interrupts are placed on CPUs.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IrqAffinity {
    /// `Spread` places queue i's interrupt on the i-th CPU of `cpus`, round-robin; `Pin` uses
    /// the explicit `pin` map.
    pub policy: IrqPolicy,
    /// CPUs to spread over, in list format (`0-7`). Required for `Spread`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        regex(pattern = r"^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$"),
        length(max = 256)
    )]
    pub cpus: Option<String>,
    /// Queue index to CPU, for `Pin`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 1024))]
    pub pin: BTreeMap<String, u32>,
}

/// Interrupt placement policy.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum IrqPolicy {
    /// Queues spread round-robin over a CPU list.
    #[default]
    Spread,
    /// An explicit queue-to-CPU map.
    Pin,
}

/// Receive packet steering.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Rps {
    /// CPUs that may process received packets, in list format.
    #[schemars(
        regex(pattern = r"^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$"),
        length(max = 256)
    )]
    pub cpus: String,
    /// rps_flow_cnt per rx queue (receive flow steering); 0 leaves RFS off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 1048576))]
    pub flow_entries: Option<u32>,
}

/// Transmit packet steering.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Xps {
    /// CPUs whose packets use each tx queue, in list format; queues are spread over them.
    #[schemars(
        regex(pattern = r"^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$"),
        length(max = 256)
    )]
    pub cpus: String,
}

/// An XDP program for an interface.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Xdp {
    /// Which built-in program to attach.
    pub program: XdpProgram,
    /// Attach mode.
    #[serde(default)]
    pub mode: XdpMode,
    /// Source prefixes (CIDR) the `Blocklist` program drops.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 4096))]
    pub blocked_prefixes: Vec<String>,
    /// Allow a dropping program on the interface that carries the default route or the route to
    /// the API server.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_management_interface: bool,
}

/// The built-in XDP programs.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum XdpProgram {
    /// Drops packets whose source address lies in a blocked prefix, counting drops per CPU.
    #[default]
    Blocklist,
    /// Passes every packet; useful to measure the cost of the hook.
    Pass,
}

/// How an XDP program is attached.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum XdpMode {
    /// Native (driver) mode, falling back to generic; the outcome is reported in status.
    #[default]
    Auto,
    /// Native (driver) mode only.
    Native,
    /// Generic (skb) mode.
    Generic,
}

/// Binding an interface's PCI device to a user-space I/O driver.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DpdkBinding {
    /// Driver to bind to.
    #[serde(default)]
    pub driver: DpdkDriver,
    /// Allow binding the interface that carries the default route or the route to the API
    /// server; without it such a request is refused, since it would cut the node off.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_management_interface: bool,
}

/// User-space I/O drivers.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum DpdkDriver {
    /// vfio-pci, which needs an IOMMU.
    #[default]
    VfioPci,
}

/// Hugepages of one size, on one NUMA node or system-wide.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HugepageReservation {
    /// Page size.
    pub size: HugepageSize,
    /// Number of pages to reserve.
    #[schemars(range(max = 1048576))]
    pub count: u32,
    /// NUMA node to reserve on; system-wide when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 1023))]
    pub numa_node: Option<u32>,
    /// Mount a hugetlbfs of this page size here for the user-space stack.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^/[A-Za-z0-9_./-]*$"), length(max = 256))]
    pub mount_path: Option<String>,
}

/// Hugepage sizes on x86-64.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum HugepageSize {
    /// 2 MiB pages.
    #[default]
    #[serde(rename = "2Mi")]
    Size2Mi,
    /// 1 GiB pages, where the CPU has them.
    #[serde(rename = "1Gi")]
    Size1Gi,
}

/// The agent's nftables table.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Firewall {
    /// Source prefixes (CIDR, IPv4 or IPv6) whose packets are dropped. The agent refuses a
    /// prefix with host bits set (`10.0.0.1/8`), and one that contains the API server's address
    /// (it would cut the node off).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 4096))]
    pub blocked_prefixes: Vec<String>,
    /// New TCP connections per second allowed from one source address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub syn_rate_limit: Option<SynRateLimit>,
    /// TCP ports to accept without connection tracking (the user-space stack's services).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256))]
    pub notrack_ports: Vec<u16>,
}

/// A per-source SYN rate limit.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SynRateLimit {
    /// SYNs per second per source.
    #[schemars(range(min = 1, max = 1000000))]
    pub per_second: u32,
    /// Burst above the rate, in packets; 0 means the kernel's default of 5.
    #[serde(default)]
    #[schemars(range(max = 1000000))]
    pub burst: u32,
}

/// The embedded user-space TCP stack.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UserspaceStack {
    /// Dedicated cores, in list format; one shard per core.
    #[schemars(
        regex(pattern = r"^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$"),
        length(max = 256)
    )]
    pub cores: String,
    /// Interface whose queues the stack takes.
    #[schemars(length(min = 1, max = 15))]
    pub interface: String,
    /// Packet I/O backend.
    #[serde(default)]
    pub backend: StackBackend,
    /// The stack's own IPv4 address with prefix length, e.g. `198.18.1.10/24`.
    #[schemars(regex(pattern = r"^([0-9]{1,3}\.){3}[0-9]{1,3}/[0-9]{1,2}$"))]
    pub address: String,
    /// Next hop for destinations off the subnet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]{1,3}\.){3}[0-9]{1,3}$"))]
    pub gateway: Option<String>,
    /// TCP options; defaults are those of a current Linux kernel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp: Option<StackTcpOptions>,
    /// Services the stack serves.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub services: Vec<StackService>,
}

/// Packet I/O backends of the user-space stack.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum StackBackend {
    /// AF_XDP sockets on the interface's queues (copy mode where zero-copy is not offered).
    #[default]
    AfXdp,
    /// DPDK on a device bound to vfio-pci.
    Dpdk,
    /// A TAP device, for tests and hosts with neither.
    Tap,
}

/// TCP options of the user-space stack.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StackTcpOptions {
    /// Selective acknowledgements (RFC 2018).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sack: Option<bool>,
    /// Timestamps (RFC 7323).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamps: Option<bool>,
    /// Window scaling (RFC 7323).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_scaling: Option<bool>,
    /// Congestion control algorithm.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub congestion_control: Option<CongestionControl>,
    /// Delayed-ACK timeout in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 500))]
    pub delayed_ack_ms: Option<u32>,
    /// Minimum retransmission timeout in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 60000))]
    pub min_rto_ms: Option<u32>,
    /// Nagle's algorithm.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nagle: Option<bool>,
}

/// Congestion control algorithms of the user-space stack.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum CongestionControl {
    /// CUBIC (RFC 9438).
    #[default]
    Cubic,
    /// NewReno (RFC 6582).
    NewReno,
}

/// A service served by the user-space stack.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StackService {
    /// What the service does.
    pub kind: ServiceKind,
    /// TCP port it listens on.
    #[schemars(range(min = 1, max = 65535))]
    pub port: u16,
    /// Static body of the `Http` service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 65536))]
    pub body: Option<String>,
}

/// Services of the user-space stack.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ServiceKind {
    /// Echoes what it receives.
    #[default]
    Echo,
    /// Reads and discards.
    Discard,
    /// HTTP/1.1 with keep-alive, answering every GET with the configured body.
    Http,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sysctl_allowlist_accepts_networking_keys_and_rejects_the_rest() {
        for ok in [
            "net.ipv4.tcp_sack",
            "net.core.rmem_max",
            "net.ipv4.conf.eth0.rp_filter",
            "net.ipv6.conf.all.forwarding",
            "vm.min_free_kbytes",
        ] {
            assert!(sysctl_key_allowed(ok), "{ok}");
        }
        for bad in [
            "kernel.panic",
            "vm.overcommit_memory",
            "net.ipv4.",
            "net.ipv4..tcp_sack",
            "net.ipv4/tcp_sack",
            "net.ipv4.tcp sack",
            "net.ipv4.tcp_sack\n",
            "net.ipv4.../../etc",
            "fs.file-max",
        ] {
            assert!(!sysctl_key_allowed(bad), "{bad:?}");
        }
    }

    #[test]
    fn revision_is_stable_and_changes_with_content() {
        let mut a = NodeConfig::default();
        a.sysctls
            .insert("net.ipv4.tcp_sack".into(), SysctlValue("1".into()));
        a.sysctls
            .insert("net.core.somaxconn".into(), SysctlValue("4096".into()));
        let mut b = NodeConfig::default();
        b.sysctls
            .insert("net.core.somaxconn".into(), SysctlValue("4096".into()));
        b.sysctls
            .insert("net.ipv4.tcp_sack".into(), SysctlValue("1".into()));
        assert_eq!(a.revision(), b.revision());
        assert_eq!(a.revision().len(), 10);
        b.sysctls
            .insert("net.ipv4.tcp_sack".into(), SysctlValue("0".into()));
        assert_ne!(a.revision(), b.revision());
    }

    #[test]
    fn a_config_verifies_only_against_the_revision_it_hashes_to() {
        let mut config = NodeConfig::default();
        config
            .sysctls
            .insert("net.ipv4.tcp_sack".into(), SysctlValue("1".into()));
        let revision = config.revision();
        assert_eq!(config.verify_revision(&revision), Ok(()));
        config
            .sysctls
            .insert("net.ipv4.tcp_sack".into(), SysctlValue("0".into()));
        let mismatch = config.verify_revision(&revision).unwrap_err();
        assert_eq!(
            (mismatch.claimed.as_str(), mismatch.actual.as_str()),
            (revision.as_str(), config.revision().as_str())
        );
        let message = mismatch.to_string();
        assert!(
            message.contains(&revision) && message.contains(&config.revision()),
            "{message}"
        );
    }
}
