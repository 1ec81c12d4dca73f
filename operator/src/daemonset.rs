//! The agent DaemonSet the operator owns, and the node label that places its pods.
//!
//! The DaemonSet selects nodes by the label hoststack.dev/agent=true, which the operator keeps on
//! every node that some tuning governs or whose agent still has something to revert. A label,
//! rather than node affinity computed from the tunings' selectors, keeps the pod template fixed,
//! so that a change of selection never restarts every agent.

use std::collections::BTreeMap;

use hoststack_crds::AGENT_NODE_LABEL;
use k8s_openapi::api::apps::v1::DaemonSet;
use serde_json::json;

/// Name of the agent DaemonSet and of its ServiceAccount.
pub const AGENT_NAME: &str = "hoststack-agent";

/// The agent DaemonSet: privileged, host network, host /proc and /sys under /host, its journal
/// in a hostPath that survives pod restarts, only on nodes labelled for an agent.
pub fn agent_daemonset(namespace: &str, image: &str) -> DaemonSet {
    let labels = BTreeMap::from([
        ("app.kubernetes.io/name".to_string(), AGENT_NAME.to_string()),
        (
            "app.kubernetes.io/part-of".to_string(),
            "hoststack".to_string(),
        ),
    ]);
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
                    "nodeSelector": {AGENT_NODE_LABEL: "true"},
                    "tolerations": [{"operator": "Exists"}],
                    "priorityClassName": "system-node-critical",
                    "terminationGracePeriodSeconds": 30,
                    "containers": [{
                        "name": "agent",
                        "image": image,
                        "command": ["/hoststack-agent"],
                        "args": [
                            "--node-name=$(NODE_NAME)",
                            "--proc-root=/host/proc",
                            "--sys-root=/host/sys",
                            "--state-dir=/var/lib/hoststack",
                        ],
                        "env": [
                            {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                            {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}
                        ],
                        "securityContext": {"privileged": true},
                        "resources": {
                            "requests": {"cpu": "10m", "memory": "32Mi"},
                            "limits": {"memory": "128Mi"}
                        },
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

    #[test]
    fn daemonset_runs_only_on_labelled_nodes_with_host_paths() {
        let ds = agent_daemonset("hs", "img:1");
        let spec = ds.spec.template.spec.unwrap();
        assert_eq!(spec.node_selector.unwrap()[AGENT_NODE_LABEL], "true");
        assert_eq!(spec.host_network, Some(true));
        let c = &spec.containers[0];
        assert_eq!(c.image.as_deref(), Some("img:1"));
        assert!(c
            .args
            .as_ref()
            .unwrap()
            .contains(&"--proc-root=/host/proc".to_string()));
    }

    #[test]
    fn agent_stays_until_reverted() {
        assert!(needs_agent(true, None, None));
        assert!(needs_agent(false, None, Some("r1")));
        assert!(needs_agent(false, Some("t"), None));
        assert!(!needs_agent(false, None, None));
    }
}
