//! The agent DaemonSet the operator owns, and the node label that places its pods.
//!
//! The DaemonSet selects nodes by the label hoststack.dev/agent=true, which the operator keeps on
//! every node that some tuning governs or whose agent still has something to revert. A label,
//! rather than node affinity computed from the tunings' selectors, keeps the pod template fixed,
//! so that a change of selection never restarts every agent.
//!
//! Everything an installer chooses about the agents' pods (image, extra node selector,
//! tolerations, resources, priority class, the API server's address, where the agents' probes
//! may connect, extra agent arguments) comes from the operator's
//! flags, [`AgentPod`], which the Helm chart fills from its values.

use std::collections::BTreeMap;

use hoststack_crds::{AGENT_METRICS_PORT, AGENT_NODE_LABEL};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ResourceRequirements, Toleration};
use serde_json::json;

/// Name of the agent DaemonSet and of its ServiceAccount.
pub const AGENT_NAME: &str = "hoststack-agent";

/// Where the agent binary lives in the image.
pub const AGENT_BINARY: &str = "/usr/local/bin/hoststack-agent";

/// The installer's choices for the agent pods: the operator's `--agent-*` flags.
#[derive(clap::Args, Debug, Clone, PartialEq)]
pub struct AgentPod {
    /// Image of the node agent, for the DaemonSet the operator owns.
    #[arg(long = "agent-image", env = "HOSTSTACK_AGENT_IMAGE", default_value = concat!("hoststack/hoststack:", env!("CARGO_PKG_VERSION")))]
    pub image: String,
    /// When the kubelet pulls the agent image.
    #[arg(long = "agent-image-pull-policy", default_value = "IfNotPresent", value_parser = ["Always", "IfNotPresent", "Never"])]
    pub image_pull_policy: String,
    /// Labels, as a JSON object, that an agent's node must carry besides hoststack.dev/agent=true
    /// (which the operator sets on every node a tuning governs).
    #[arg(long = "agent-node-selector", default_value = "{}", value_parser = parse_json::<BTreeMap<String, String>>)]
    pub node_selector: BTreeMap<String, String>,
    /// The agent pods' tolerations, as a JSON array; the default tolerates every taint, so that
    /// a tainted node keeps the agent that can revert it.
    #[arg(long = "agent-tolerations", default_value = r#"[{"operator":"Exists"}]"#, value_parser = parse_json::<::std::vec::Vec<Toleration>>)]
    pub tolerations: ::std::vec::Vec<Toleration>,
    /// The agent container's resources, as a JSON object (requests, limits).
    #[arg(long = "agent-resources", default_value = r#"{"requests":{"cpu":"10m","memory":"32Mi"},"limits":{"memory":"128Mi"}}"#, value_parser = parse_json::<ResourceRequirements>)]
    pub resources: ResourceRequirements,
    /// Priority class of the agent pods; empty for none.
    #[arg(long = "agent-priority-class", default_value = "system-node-critical")]
    pub priority_class: String,
    /// The agents' log filter (their RUST_LOG).
    #[arg(long = "agent-log-level", default_value = "info")]
    pub log_level: String,
    /// Host (name or address) of the API server for the agents, set as their
    /// KUBERNETES_SERVICE_HOST: for clusters where host-network pods cannot reach the
    /// `kubernetes` Service's ClusterIP (no kube-proxy). Unset: the in-cluster default.
    #[arg(long = "agent-api-server-host", requires = "api_server_port")]
    pub api_server_host: Option<String>,
    /// Port of the API server for the agents (KUBERNETES_SERVICE_PORT); only with
    /// `--agent-api-server-host`.
    #[arg(long = "agent-api-server-port", requires = "api_server_host")]
    pub api_server_port: Option<u16>,
    /// Where the agents' probes of a tuning's targets may connect: comma-separated CIDR
    /// prefixes, passed on as the agents' `--probe-allowed-destinations` (loopback and
    /// link-local stay refused unless a listed prefix lies inside them).
    #[arg(long = "agent-probe-allowed-destinations", default_value = "0.0.0.0/0,::/0", value_parser = parse_prefixes)]
    pub probe_allowed_destinations: String,
    /// One more argument for the agent, after the operator's own (repeatable, in order), e.g.
    /// `--agent-extra-arg=--resync-interval=10s`.
    #[arg(long = "agent-extra-arg", allow_hyphen_values = true)]
    pub extra_args: Vec<String>,
}

/// Parses a flag's JSON value into `T`, naming what is wrong.
fn parse_json<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, String> {
    serde_json::from_str(text).map_err(|e| format!("not valid here: {e}"))
}

/// A comma-separated list of CIDR prefixes (`ADDR/LEN`, or a bare address), each checked,
/// the first bad one named; the list as given. The agent parses it again, and refuses host bits.
fn parse_prefixes(text: &str) -> Result<String, String> {
    for prefix in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (address, len) = prefix.split_once('/').unwrap_or((prefix, "0"));
        let bits = match address.parse::<std::net::IpAddr>() {
            Ok(std::net::IpAddr::V4(_)) => 32,
            Ok(std::net::IpAddr::V6(_)) => 128,
            Err(_) => {
                return Err(format!(
                    "{prefix:?} is not an IPv4 or IPv6 prefix (ADDR/LEN)"
                ))
            }
        };
        if !len.parse::<u8>().is_ok_and(|len| len <= bits) {
            return Err(format!("{prefix:?}: the prefix length must be 0 to {bits}"));
        }
    }
    Ok(text.to_string())
}

/// The agent DaemonSet: privileged, host network, host /proc and /sys under /host, its journal
/// in a hostPath that survives pod restarts, only on nodes labelled for an agent (and matching
/// the installer's node selector).
pub fn agent_daemonset(namespace: &str, pod: &AgentPod) -> DaemonSet {
    let labels = BTreeMap::from([
        ("app.kubernetes.io/name".to_string(), AGENT_NAME.to_string()),
        (
            "app.kubernetes.io/part-of".to_string(),
            "hoststack".to_string(),
        ),
    ]);
    let mut node_selector = pod.node_selector.clone();
    node_selector.insert(AGENT_NODE_LABEL.to_string(), "true".to_string());
    let mut env = vec![
        json!({"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}),
        json!({"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}),
        json!({"name": "RUST_LOG", "value": pod.log_level}),
    ];
    if let (Some(host), Some(port)) = (&pod.api_server_host, pod.api_server_port) {
        env.push(json!({"name": "KUBERNETES_SERVICE_HOST", "value": host}));
        env.push(json!({"name": "KUBERNETES_SERVICE_PORT", "value": port.to_string()}));
    }
    let priority_class = (!pod.priority_class.is_empty()).then_some(&pod.priority_class);
    let mut args: Vec<String> = [
        "--node-name=$(NODE_NAME)",
        "--proc-root=/host/proc",
        "--sys-root=/host/sys",
        "--state-dir=/var/lib/hoststack",
    ]
    .map(String::from)
    .into();
    args.push(format!(
        "--probe-allowed-destinations={}",
        pod.probe_allowed_destinations
    ));
    args.extend(pod.extra_args.iter().cloned());
    serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": AGENT_NAME, "namespace": namespace, "labels": labels},
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/name": AGENT_NAME}},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": AGENT_NAME,
                    "hostNetwork": true,
                    "dnsPolicy": "ClusterFirstWithHostNet",
                    "nodeSelector": node_selector,
                    "tolerations": pod.tolerations,
                    "priorityClassName": priority_class,
                    "terminationGracePeriodSeconds": 30,
                    "containers": [{
                        "name": "agent",
                        "image": pod.image,
                        "imagePullPolicy": pod.image_pull_policy,
                        "command": [AGENT_BINARY],
                        "args": args,
                        "env": env,
                        "ports": [{"name": "metrics", "containerPort": AGENT_METRICS_PORT, "protocol": "TCP"}],
                        // Privileged: the agent writes sysctls of every namespace kind, IRQ
                        // affinities, sysfs (hugepages, driver binding), loads XDP programs and
                        // nftables tables (docs/install.md).
                        "securityContext": {"privileged": true},
                        "resources": pod.resources,
                        "volumeMounts": [
                            {"name": "host-proc", "mountPath": "/host/proc"},
                            {"name": "host-sys", "mountPath": "/host/sys"},
                            {"name": "state", "mountPath": "/var/lib/hoststack"},
                            // XDP pins must outlive the pod, so that a restarted agent finds
                            // its programs still attached: the host's bpffs, shared both ways.
                            {"name": "bpffs", "mountPath": "/sys/fs/bpf", "mountPropagation": "Bidirectional"}
                        ]
                    }],
                    "volumes": [
                        {"name": "host-proc", "hostPath": {"path": "/proc", "type": "Directory"}},
                        {"name": "host-sys", "hostPath": {"path": "/sys", "type": "Directory"}},
                        {"name": "state", "hostPath": {"path": "/var/lib/hoststack", "type": "DirectoryOrCreate"}},
                        {"name": "bpffs", "hostPath": {"path": "/sys/fs/bpf", "type": "DirectoryOrCreate"}}
                    ]
                }
            }
        }
    }))
    .expect("the agent DaemonSet literal matches the DaemonSet type")
}

/// Whether a node needs an agent: some tuning governs it, or its NodeTuning still asks for or
/// reports a revision (its agent must stay until it has reverted).
pub fn needs_agent(
    governed: bool,
    spec_tuning: Option<&str>,
    applied_revision: Option<&str>,
) -> bool {
    governed || spec_tuning.is_some() || applied_revision.is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The operator's agent flags alone.
    #[derive(clap::Parser, Debug)]
    struct Flags {
        #[command(flatten)]
        pod: AgentPod,
    }

    /// Parses `hoststack-operator <flags>`.
    fn parse(flags: &[&str]) -> Result<AgentPod, clap::Error> {
        let argv = std::iter::once("hoststack-operator").chain(flags.iter().copied());
        <Flags as clap::Parser>::try_parse_from(argv).map(|f| f.pod)
    }

    /// The pod settings of `hoststack-operator <flags>`.
    fn pod_of(flags: &[&str]) -> AgentPod {
        parse(flags).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn daemonset_runs_only_on_labelled_nodes_with_host_paths() {
        let ds = agent_daemonset("hs", &pod_of(&["--agent-image=img:1"]));
        let spec = ds.spec.template.spec.unwrap();
        assert_eq!(spec.node_selector.unwrap()[AGENT_NODE_LABEL], "true");
        assert_eq!(spec.host_network, Some(true));
        assert_eq!(
            spec.priority_class_name.as_deref(),
            Some("system-node-critical")
        );
        assert_eq!(
            spec.tolerations.unwrap()[0].operator.as_deref(),
            Some("Exists")
        );
        let c = &spec.containers[0];
        assert_eq!(c.image.as_deref(), Some("img:1"));
        assert_eq!(c.command.as_ref().unwrap()[0], AGENT_BINARY);
        assert!(c
            .args
            .as_ref()
            .unwrap()
            .contains(&"--proc-root=/host/proc".to_string()));
        assert_eq!(
            c.args.as_ref().unwrap()[4],
            "--probe-allowed-destinations=0.0.0.0/0,::/0"
        );
        assert_eq!(
            c.args.as_ref().unwrap().len(),
            5,
            "no extra arguments by default"
        );
        let env = c.env.as_ref().unwrap();
        assert!(!env.iter().any(|e| e.name == "KUBERNETES_SERVICE_HOST"));
        let requests = c.resources.as_ref().unwrap().requests.as_ref().unwrap();
        assert_eq!(requests["memory"].0, "32Mi");
    }

    #[test]
    fn the_flags_set_image_placement_resources_priority_and_api_server() {
        let pod = pod_of(&[
            "--agent-image=registry.example/hs:2",
            "--agent-image-pull-policy=Never",
            r#"--agent-node-selector={"pool":"edge","hoststack.dev/agent":"false"}"#,
            r#"--agent-tolerations=[{"key":"dedicated","operator":"Equal","value":"net","effect":"NoSchedule"}]"#,
            r#"--agent-resources={"requests":{"cpu":"50m"},"limits":{"memory":"1Gi"}}"#,
            "--agent-priority-class=",
            "--agent-api-server-host=198.18.0.1",
            "--agent-api-server-port=6443",
        ]);
        let spec = agent_daemonset("hs", &pod).spec.template.spec.unwrap();
        let selector = spec.node_selector.unwrap();
        assert_eq!(selector["pool"], "edge");
        // The agent label cannot be overridden: it is how the operator places agents.
        assert_eq!(selector[AGENT_NODE_LABEL], "true");
        let tolerations = spec.tolerations.unwrap();
        assert_eq!(tolerations.len(), 1);
        assert_eq!(tolerations[0].key.as_deref(), Some("dedicated"));
        assert_eq!(spec.priority_class_name, None);
        let c = &spec.containers[0];
        assert_eq!(c.image.as_deref(), Some("registry.example/hs:2"));
        assert_eq!(c.image_pull_policy.as_deref(), Some("Never"));
        let limits = c.resources.as_ref().unwrap().limits.as_ref().unwrap();
        assert_eq!(limits["memory"].0, "1Gi");
        let env: BTreeMap<_, _> = c
            .env
            .as_ref()
            .unwrap()
            .iter()
            .map(|e| (e.name.as_str(), e.value.as_deref()))
            .collect();
        assert_eq!(env["KUBERNETES_SERVICE_HOST"], Some("198.18.0.1"));
        assert_eq!(env["KUBERNETES_SERVICE_PORT"], Some("6443"));
    }

    #[test]
    fn extra_args_follow_the_operators_own_in_order() {
        let pod = pod_of(&[
            "--agent-extra-arg=--resync-interval=10s",
            "--agent-extra-arg",
            "--metrics-bind-address=0.0.0.0:9500",
        ]);
        let spec = agent_daemonset("hs", &pod).spec.template.spec.unwrap();
        let args = spec.containers[0].args.clone().unwrap();
        assert_eq!(
            args,
            [
                "--node-name=$(NODE_NAME)",
                "--proc-root=/host/proc",
                "--sys-root=/host/sys",
                "--state-dir=/var/lib/hoststack",
                "--probe-allowed-destinations=0.0.0.0/0,::/0",
                "--resync-interval=10s",
                "--metrics-bind-address=0.0.0.0:9500",
            ]
        );
    }

    #[test]
    fn bad_flag_values_are_refused_with_the_reason() {
        let parse = |flags: &[&str]| parse(flags).unwrap_err().to_string();
        let e = parse(&["--agent-tolerations={}"]);
        assert!(
            e.contains("--agent-tolerations") && e.contains("expected a sequence"),
            "{e}"
        );
        let e = parse(&["--agent-api-server-host=10.0.0.1"]);
        assert!(e.contains("--agent-api-server-port"), "{e}");
        let e = parse(&["--agent-image-pull-policy=Sometimes"]);
        assert!(e.contains("Sometimes"), "{e}");
        let e = parse(&["--agent-probe-allowed-destinations=10.0.0.0/8,10.0.0.0/33"]);
        assert!(
            e.contains("--agent-probe-allowed-destinations")
                && e.contains("\"10.0.0.0/33\": the prefix length must be 0 to 32"),
            "{e}"
        );
        let e = parse(&["--agent-probe-allowed-destinations=localhost/8"]);
        assert!(
            e.contains("\"localhost/8\" is not an IPv4 or IPv6 prefix"),
            "{e}"
        );
    }

    #[test]
    fn agent_stays_until_reverted() {
        assert!(needs_agent(true, None, None));
        assert!(needs_agent(false, None, Some("r1")));
        assert!(needs_agent(false, Some("t"), None));
        assert!(!needs_agent(false, None, None));
    }
}
