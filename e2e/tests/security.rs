//! Least privilege, proven against the lab's real API server (RBAC and the chart's
//! ValidatingAdmissionPolicies on): what each identity of the chart may and may not do, and
//! that only the operator writes a NodeTuning's spec (the planner, and even an admin, only its
//! `spec.preview`), while the operator writes no DaemonSet but the agents' and nothing of a Node
//! but its agent label.
//!
//! The lab applies the chart's ServiceAccounts, RBAC and write guard, and gives each node's agent
//! a token bound to a Pod on that node (`Lab::agent_kubeconfig`), as a DaemonSet pod's projected
//! token is. No operator or agent runs here, so every write below is the test's own.

use hoststack_crds::{AGENT_NODE_LABEL, OPERATOR_FIELD_MANAGER};
use hoststack_e2e::{Identity, Lab, LabConfig, NAMESPACE};
use std::path::Path;
use std::process::Output;

/// The committed expectation of `kubectl auth can-i --list` for every identity of the chart.
const EXPECTED_CAN_I: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/expected/can-i.txt");

/// Set to rewrite tests/expected/can-i.txt from this run instead of comparing with it.
const BLESS: &str = "HOSTSTACK_BLESS";

/// The lab admin's user name (its client certificate's CN).
const ADMIN_USER: &str = "hoststack-lab-admin";

fn lab() -> Lab {
    Lab::start(LabConfig {
        start_operator: false,
        start_agents: false,
        ..LabConfig::default()
    })
    .expect("the lab starts")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).trim().to_string()
}

fn allowed(out: Output, what: &str) -> String {
    assert!(out.status.success(), "{what}: {}", text(&out.stderr));
    text(&out.stdout)
}

/// The API server's refusal; panics when the request went through.
fn denied(out: Output, what: &str) -> String {
    assert!(
        !out.status.success(),
        "{what} should be refused, but: {}",
        text(&out.stdout)
    );
    text(&out.stderr)
}

/// A NodeTuning status as the agent writes it: server-side apply of the status subresource.
fn status(node: &str, message: &str) -> String {
    format!(
        r#"{{"apiVersion":"hoststack.dev/v1alpha1","kind":"NodeTuning","metadata":{{"name":"{node}"}},"status":{{"message":"{message}"}}}}"#
    )
}

/// `kubectl apply` of a status from stdin: a direct PATCH of the subresource, no GET first,
/// as the agent writes it.
const APPLY_STATUS: [&str; 6] = [
    "apply",
    "--server-side",
    "--subresource=status",
    "--field-manager=hoststack-agent",
    "-f",
    "-",
];

/// A heartbeat Lease as the agent writes it (server-side apply).
fn lease(name: &str, holder: &str) -> String {
    format!(
        r#"{{"apiVersion":"coordination.k8s.io/v1","kind":"Lease","metadata":{{"name":"{name}","namespace":"{NAMESPACE}"}},"spec":{{"holderIdentity":"{holder}"}}}}"#
    )
}

const APPLY_AS_AGENT: [&str; 5] = [
    "apply",
    "--server-side",
    "--field-manager=hoststack-agent",
    "-f",
    "-",
];

#[test]
fn an_agent_writes_only_its_own_nodes_status_and_heartbeat() {
    let lab = lab();
    for node in ["node-a", "node-b"] {
        lab.apply_yaml(&format!(
            "apiVersion: hoststack.dev/v1alpha1\nkind: NodeTuning\nmetadata:\n  name: {node}\nspec: {{}}\n"
        ))
        .expect("the NodeTunings are created");
    }

    // The bound token carries its node, as a pod's projected token does.
    let whoami = allowed(
        lab.kubectl_as_agent_of("node-a", &["auth", "whoami", "-o", "json"], None),
        "auth whoami",
    );
    let whoami: serde_json::Value = serde_json::from_str(&whoami).unwrap();
    let user = &whoami["status"]["userInfo"];
    assert_eq!(
        user["username"],
        format!("system:serviceaccount:{NAMESPACE}:hoststack-agent")
    );
    assert_eq!(
        user["extra"]["authentication.kubernetes.io/node-name"],
        serde_json::json!(["node-a"]),
        "{whoami}"
    );

    // Its own node's status: allowed, and written.
    allowed(
        lab.kubectl_as_agent_of(
            "node-a",
            &APPLY_STATUS,
            Some(&status("node-a", "written by node-a's agent")),
        ),
        "node-a's agent patches node-a's status",
    );
    let nt = lab.get_json(&["get", "nodetuning", "node-a"]);
    assert_eq!(nt["status"]["message"], "written by node-a's agent");

    // Another node's status: refused by the write guard, with its message; nothing written.
    let why = denied(
        lab.kubectl_as_agent_of("node-a", &APPLY_STATUS, Some(&status("node-b", "forged"))),
        "node-a's agent patching node-b's status",
    );
    assert!(
        why.contains("ValidatingAdmissionPolicy 'hoststack-agent-own-node'")
            && why.contains(
                "the hoststack agent of node node-a may write only its own node: refusing UPDATE of nodetunings node-b"
            ),
        "{why}"
    );
    let nt = lab.get_json(&["get", "nodetuning", "node-b"]);
    assert!(nt["status"]["message"].is_null(), "{nt}");

    // The agents' ServiceAccount with a token bound to no node (`kubectl create token`, as
    // the lab's Identity::Agent is) writes no node at all, not even one named like it.
    let why = denied(
        lab.kubectl_as(
            Identity::Agent,
            &APPLY_STATUS,
            Some(&status("node-a", "unbound")),
        ),
        "an unbound agent token patching a status",
    );
    assert!(
        why.contains("hoststack-agent tokens must be bound to a pod on a node"),
        "{why}"
    );

    // Its heartbeat Lease: its own (created, then renewed), not another node's.
    for round in ["creates", "renews"] {
        allowed(
            lab.kubectl_as_agent_of(
                "node-a",
                &APPLY_AS_AGENT,
                Some(&lease("hoststack-agent-node-a", "node-a")),
            ),
            &format!("node-a's agent {round} its heartbeat"),
        );
    }
    let why = denied(
        lab.kubectl_as_agent_of(
            "node-a",
            &APPLY_AS_AGENT,
            Some(&lease("hoststack-agent-node-b", "node-a")),
        ),
        "node-a's agent writing node-b's heartbeat",
    );
    assert!(
        why.contains(
            "may write only its own node: refusing CREATE of leases hoststack-agent-node-b"
        ),
        "{why}"
    );
    let leases = allowed(
        lab.kubectl(&["get", "leases", "-n", NAMESPACE, "-o", "name"]),
        "get leases",
    );
    assert_eq!(leases, "lease.coordination.k8s.io/hoststack-agent-node-a");

    // RBAC: no spec writes, no tunings, no Secrets.
    let apply = ["apply", "--server-side", "-f", "-"];
    let own_spec = r#"{"apiVersion":"hoststack.dev/v1alpha1","kind":"NodeTuning","metadata":{"name":"node-a"},"spec":{"mode":"Plan"}}"#;
    let why = denied(
        lab.kubectl_as_agent_of("node-a", &apply, Some(own_spec)),
        "node-a's agent writing its own spec",
    );
    assert!(
        why.contains("cannot patch resource \"nodetunings\""),
        "{why}"
    );
    let tuning = r#"{"apiVersion":"hoststack.dev/v1alpha1","kind":"NetworkTuning","metadata":{"name":"forged"},"spec":{"nodeSelector":{},"sysctls":{"net.ipv4.tcp_sack":"0"}}}"#;
    let why = denied(
        lab.kubectl_as_agent_of("node-a", &["create", "-f", "-"], Some(tuning)),
        "node-a's agent creating a NetworkTuning",
    );
    assert!(
        why.contains("cannot create resource \"networktunings\""),
        "{why}"
    );
    lab.apply_yaml(tuning).expect("admin creates a tuning");
    let why = denied(
        lab.kubectl_as_agent_of("node-a", &apply, Some(tuning)),
        "node-a's agent changing a NetworkTuning",
    );
    assert!(
        why.contains("cannot patch resource \"networktunings\""),
        "{why}"
    );
    let why = denied(
        lab.kubectl_as_agent_of("node-a", &["delete", "networktuning", "forged"], None),
        "node-a's agent deleting a NetworkTuning",
    );
    assert!(
        why.contains("cannot delete resource \"networktunings\""),
        "{why}"
    );
    for args in [
        vec!["get", "secrets", "-n", NAMESPACE],
        vec!["get", "secrets", "-A"],
    ] {
        let why = denied(
            lab.kubectl_as_agent_of("node-a", &args, None),
            &format!("node-a's agent: {args:?}"),
        );
        assert!(why.contains("cannot list resource \"secrets\""), "{why}");
    }
}

#[test]
fn the_operator_cannot_write_node_status_and_can_i_matches_the_expectation() {
    let lab = lab();
    lab.apply_yaml(
        "apiVersion: hoststack.dev/v1alpha1\nkind: NodeTuning\nmetadata:\n  name: node-a\nspec: {}\n",
    )
    .expect("the NodeTuning is created");

    // The operator writes specs, never what a node reports.
    let why = denied(
        lab.kubectl_as(
            Identity::Operator,
            &APPLY_STATUS,
            Some(&status("node-a", "forged by the operator")),
        ),
        "the operator patching a NodeTuning's status",
    );
    assert!(
        why.contains("cannot patch resource \"nodetunings/status\""),
        "{why}"
    );
    allowed(
        lab.kubectl_as(
            Identity::Operator,
            &[
                "apply",
                "--server-side",
                "--field-manager=hoststack-operator",
                "-f",
                "-",
            ],
            Some(
                r#"{"apiVersion":"hoststack.dev/v1alpha1","kind":"NodeTuning","metadata":{"name":"node-a"},"spec":{"mode":"Plan"}}"#,
            ),
        ),
        "the operator applies a NodeTuning's spec",
    );

    // Everything each identity may do, as the API server's authorizer answers it.
    let mut table = String::from(
        "# `kubectl auth can-i --list` with each identity's own token, against the lab's API\n\
         # server with the chart's RBAC (e2e/tests/security.rs). The write guard\n\
         # (ValidatingAdmissionPolicy) narrows the agent further and is not visible here.\n\
         # Regenerate with HOSTSTACK_BLESS=1 after a deliberate RBAC change.\n",
    );
    // The operator's token, and node-a's agent token (None: the operator).
    for (identity, agent_of) in [
        ("hoststack-operator", None),
        (
            "hoststack-agent (token bound to a pod on node-a)",
            Some("node-a"),
        ),
    ] {
        for (scope, namespace) in [
            ("the release namespace", NAMESPACE),
            ("any other namespace", "default"),
        ] {
            let args = ["auth", "can-i", "--list", "-n", namespace];
            let out = match agent_of {
                None => lab.kubectl_as(Identity::Operator, &args, None),
                Some(node) => lab.kubectl_as_agent_of(node, &args, None),
            };
            let list = allowed(out, "auth can-i --list");
            table.push_str(&format!("\n## {identity}, in {scope}\n{list}\n"));
        }
    }
    if std::env::var_os(BLESS).is_some() {
        std::fs::write(EXPECTED_CAN_I, &table).expect("writing the expectation");
    }
    let expected = std::fs::read_to_string(EXPECTED_CAN_I).expect("the committed expectation");
    assert!(
        table == expected,
        "kubectl auth can-i differs from {EXPECTED_CAN_I} (rerun with {BLESS}=1 after a \
         deliberate change and review the diff):\n{table}"
    );

    // The unbound agent token has exactly the bound one's RBAC: only the write guard tells
    // them apart (the test above).
    for namespace in [NAMESPACE, "default"] {
        let args = ["auth", "can-i", "--list", "-n", namespace];
        assert_eq!(
            allowed(lab.kubectl_as(Identity::Agent, &args, None), "can-i"),
            allowed(lab.kubectl_as_agent_of("node-a", &args, None), "can-i")
        );
    }
}

/// A DaemonSet `name` in the release namespace, the smallest one the API server accepts.
fn daemonset(name: &str) -> String {
    serde_json::json!({
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "agent", "image": "hoststack:e2e"}]},
            },
        },
    })
    .to_string()
}

#[test]
fn the_operator_writes_the_agent_daemonset_and_no_other() {
    let lab = lab();
    let operator = lab.kubeconfig_of(Identity::Operator);

    // The agent DaemonSet, by server-side apply as the operator writes it: the first apply
    // creates it, the next one patches it.
    for round in ["creates", "patches"] {
        allowed(
            server_side_apply(
                &lab,
                operator,
                OPERATOR_FIELD_MANAGER,
                &daemonset("hoststack-agent"),
            ),
            &format!("the operator {round} the agent DaemonSet"),
        );
    }
    let agents = lab.get_json(&["get", "daemonset", "hoststack-agent", "-n", NAMESPACE]);
    assert_eq!(
        agents["spec"]["template"]["spec"]["containers"][0]["image"],
        "hoststack:e2e"
    );

    // Any other DaemonSet of the namespace: refused, whether the apply would create or patch.
    let why = denied(
        server_side_apply(&lab, operator, OPERATOR_FIELD_MANAGER, &daemonset("forged")),
        "the operator applying (creating) another DaemonSet",
    );
    assert!(
        why.contains("cannot patch resource \"daemonsets\" in API group \"apps\""),
        "{why}"
    );
    lab.apply_yaml(&daemonset("forged"))
        .expect("an admin creates another DaemonSet");
    let forged = lab.get_json(&["get", "daemonset", "forged", "-n", NAMESPACE]);
    let why = denied(
        server_side_apply(&lab, operator, OPERATOR_FIELD_MANAGER, &daemonset("forged")),
        "the operator applying (patching) another DaemonSet",
    );
    assert!(
        why.contains("cannot patch resource \"daemonsets\" in API group \"apps\""),
        "{why}"
    );
    let unchanged = lab.get_json(&["get", "daemonset", "forged", "-n", NAMESPACE]);
    assert_eq!(
        unchanged["metadata"]["resourceVersion"], forged["metadata"]["resourceVersion"],
        "the refused apply wrote DaemonSet forged"
    );
    // A plain create (POST) names no object in its path, so a rule with resourceNames never
    // grants it: not even of the agent DaemonSet's own name.
    for name in ["hoststack-agent-2", "hoststack-agent"] {
        let why = denied(
            lab.kubectl_as(
                Identity::Operator,
                &["create", "-f", "-"],
                Some(&daemonset(name)),
            ),
            &format!("the operator creating DaemonSet {name} by POST"),
        );
        assert!(
            why.contains("cannot create resource \"daemonsets\" in API group \"apps\""),
            "{why}"
        );
    }

    // Why resourceNames can narrow `create` here: a server-side apply of an object that does
    // not exist is authorized twice, as `patch` and then as `create` of the name in its path.
    // An identity of the test's own that may patch every DaemonSet but create only one name
    // shows the second check.
    let role = format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata:\n  name: e2e-daemonsets\n  namespace: {NAMESPACE}\nrules:\n  - apiGroups: [apps]\n    resources: [daemonsets]\n    verbs: [patch]\n  - apiGroups: [apps]\n    resources: [daemonsets]\n    resourceNames: [e2e-named]\n    verbs: [create]\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata:\n  name: e2e-daemonsets\n  namespace: {NAMESPACE}\nroleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: Role\n  name: e2e-daemonsets\nsubjects:\n  - kind: ServiceAccount\n    name: e2e-daemonsets\n    namespace: {NAMESPACE}\n"
    );
    lab.apply_yaml(&role).expect("the test identity's RBAC");
    let patcher = lab.service_account_kubeconfig("e2e-daemonsets");
    allowed(
        server_side_apply(&lab, &patcher, "e2e", &daemonset("e2e-named")),
        "creating the one DaemonSet name the identity may create, by server-side apply",
    );
    let why = denied(
        server_side_apply(&lab, &patcher, "e2e", &daemonset("e2e-other")),
        "creating another DaemonSet by server-side apply, with patch on every DaemonSet",
    );
    assert!(
        why.contains(
            "User \"system:serviceaccount:hoststack-system:e2e-daemonsets\" cannot create \
             resource \"daemonsets\" in API group \"apps\""
        ),
        "{why}"
    );
    let out = lab.kubectl(&["get", "daemonset", "e2e-other", "-n", NAMESPACE]);
    assert!(!out.status.success(), "e2e-other was created");
}

/// Node node-a as the operator applies it: `labels` and nothing else, or with `spec`.
fn node_a(labels: serde_json::Value, spec: Option<serde_json::Value>) -> serde_json::Value {
    let mut node = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "node-a", "labels": labels},
    });
    if let Some(spec) = spec {
        node["spec"] = spec;
    }
    node
}

/// The operator's node guard's refusal of a change of node-a that changes `changes`.
fn refused_node_change(why: &str, changes: &str) {
    assert!(
        why.contains("ValidatingAdmissionPolicy 'hoststack-operator-node-label'")
            && why.ends_with(&format!(
                "the hoststack operator may change only the label hoststack.dev/agent (to true, \
                 or remove it) of a Node: refusing UPDATE of node node-a, which changes {changes}"
            )),
        "{why}"
    );
}

#[test]
fn the_operator_changes_only_the_agent_label_of_a_node() {
    let lab = lab();
    let operator = lab.kubeconfig_of(Identity::Operator);
    let before = lab.get_json(&["get", "node", "node-a"]);
    assert!(before["metadata"]["labels"][AGENT_NODE_LABEL].is_null());

    // The operator's one write of a Node: its agent label, by server-side apply (forced, under
    // its field manager, as operator/src/controller/effects.rs sends it).
    lab.apply_node(
        operator,
        OPERATOR_FIELD_MANAGER,
        &node_a(serde_json::json!({AGENT_NODE_LABEL: "true"}), None),
    )
    .expect("the operator labels node-a for an agent");
    let labelled = lab.get_json(&["get", "node", "node-a"]);
    assert_eq!(labelled["metadata"]["labels"][AGENT_NODE_LABEL], "true");

    // RBAC lets it patch every field of every Node; the node guard refuses all but that label.
    let forged_owner = serde_json::json!({"metadata": {"ownerReferences": [{
        "apiVersion": "v1", "kind": "Node", "name": "node-b",
        "uid": "00000000-0000-0000-0000-000000000000",
    }]}});
    for (what, patch, changes) in [
        (
            "another label",
            serde_json::json!({"metadata": {"labels": {"pool": "forged"}}}),
            "metadata.labels[pool]",
        ),
        (
            "a new label",
            serde_json::json!({"metadata": {"labels": {"e2e": "forged"}}}),
            "metadata.labels[e2e]",
        ),
        (
            "the removal of another label",
            serde_json::json!({"metadata": {"labels": {"kubernetes.io/os": null}}}),
            "metadata.labels[kubernetes.io/os]",
        ),
        (
            "its agent label to another value",
            serde_json::json!({"metadata": {"labels": {AGENT_NODE_LABEL: "maybe"}}}),
            "metadata.labels[hoststack.dev/agent] to a value other than true",
        ),
        (
            "an annotation",
            serde_json::json!({"metadata": {"annotations": {"e2e": "forged"}}}),
            "metadata.annotations",
        ),
        (
            "a finalizer",
            serde_json::json!({"metadata": {"finalizers": ["e2e.hoststack.dev/forged"]}}),
            "metadata.finalizers",
        ),
        (
            "an owner reference",
            forged_owner,
            "metadata.ownerReferences",
        ),
        (
            "its schedulability",
            serde_json::json!({"spec": {"unschedulable": true}}),
            "spec",
        ),
        (
            "a taint",
            serde_json::json!({"spec": {"taints": [{"key": "e2e", "effect": "NoExecute"}]}}),
            "spec",
        ),
    ] {
        let why = lab
            .merge_patch_node(operator, "node-a", OPERATOR_FIELD_MANAGER, &patch)
            .expect_err(&format!("the operator's merge patch of {what} of node-a"));
        refused_node_change(&why, changes);
    }
    // Its own way of writing, server-side apply, is judged the same: another label or a taint
    // riding along with the agent label.
    for (what, object, changes) in [
        (
            "another label",
            node_a(
                serde_json::json!({AGENT_NODE_LABEL: "true", "pool": "forged"}),
                None,
            ),
            "metadata.labels[pool]",
        ),
        (
            "a taint",
            node_a(
                serde_json::json!({AGENT_NODE_LABEL: "true"}),
                Some(serde_json::json!({"taints": [{"key": "e2e", "effect": "NoSchedule"}]})),
            ),
            "spec",
        ),
    ] {
        let why = lab
            .apply_node(operator, OPERATOR_FIELD_MANAGER, &object)
            .expect_err(&format!("the operator's apply of {what} of node-a"));
        refused_node_change(&why, changes);
    }
    let after_refusals = lab.get_json(&["get", "node", "node-a"]);
    assert_eq!(
        after_refusals["metadata"]["resourceVersion"], labelled["metadata"]["resourceVersion"],
        "a refused request wrote node-a"
    );

    // And it removes its label: the apply without it.
    lab.apply_node(
        operator,
        OPERATOR_FIELD_MANAGER,
        &node_a(serde_json::json!({}), None),
    )
    .expect("the operator removes node-a's agent label");
    let after = lab.get_json(&["get", "node", "node-a"]);
    for field in ["labels", "annotations", "finalizers", "ownerReferences"] {
        assert_eq!(
            after["metadata"][field], before["metadata"][field],
            "node-a's metadata.{field}"
        );
    }
    assert_eq!(after["spec"], before["spec"], "node-a's spec");

    // An agent label that someone else set to another value is no change of the operator's:
    // its apply that leaves it as it is goes through.
    allowed(
        lab.kubectl(&["label", "node", "node-a", "hoststack.dev/agent=false"]),
        "an admin sets node-a's agent label to false",
    );
    lab.apply_node(
        operator,
        OPERATOR_FIELD_MANAGER,
        &node_a(serde_json::json!({}), None),
    )
    .expect("the operator's apply that leaves an admin's agent label as it is");
    let node = lab.get_json(&["get", "node", "node-a"]);
    assert_eq!(node["metadata"]["labels"][AGENT_NODE_LABEL], "false");
    allowed(
        lab.kubectl(&["label", "node", "node-a", "hoststack.dev/agent-"]),
        "an admin removes node-a's agent label",
    );

    // The guard judges the operator alone: an admin still labels a Node.
    allowed(
        lab.kubectl(&["label", "node", "node-a", "e2e=admin"]),
        "an admin labels node-a",
    );
    allowed(
        lab.kubectl(&["label", "node", "node-a", "e2e-"]),
        "an admin removes the label",
    );
}

/// docs/kubectl-plugin.md, the ClusterRole `kubectl hoststack plan` needs (the YAML block after
/// its `<!-- planner role -->` marker): the test grants exactly what the docs tell users to.
fn documented_planner_role() -> String {
    let doc = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../docs/kubectl-plugin.md"
    ))
    .expect("docs/kubectl-plugin.md");
    let (_, after) = doc
        .split_once("<!-- planner role -->")
        .expect("docs/kubectl-plugin.md marks the planner role");
    after
        .split_once("```yaml\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .expect("a yaml block after the marker")
        .0
        .to_string()
}

/// node-a's NodeTuning as the operator writes it: owned by its Node, with `spec`.
fn node_a_tuning(lab: &Lab, spec: serde_json::Value) -> String {
    let uid = lab.get_json(&["get", "node", "node-a"])["metadata"]["uid"].clone();
    serde_json::json!({
        "apiVersion": "hoststack.dev/v1alpha1",
        "kind": "NodeTuning",
        "metadata": {
            "name": "node-a",
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": uid}],
        },
        "spec": spec,
    })
    .to_string()
}

/// `kubectl apply --server-side` of `object` with the credentials of `kubeconfig`, under
/// field manager `manager`.
fn server_side_apply(lab: &Lab, kubeconfig: &Path, manager: &str, object: &str) -> Output {
    let manager = format!("--field-manager={manager}");
    lab.kubectl_with(
        kubeconfig,
        &["apply", "--server-side", &manager, "-f", "-"],
        Some(object),
    )
}

/// node-a's spec as the operator writes it (server-side apply as its ServiceAccount).
fn operator_spec(lab: &Lab, sack: &str) {
    let spec = serde_json::json!({
        "tuning": "edge",
        "revision": format!("r-{sack}"),
        "mode": "Apply",
        "config": {"sysctls": {"net.ipv4.tcp_sack": sack}},
    });
    allowed(
        server_side_apply(
            lab,
            lab.kubeconfig_of(Identity::Operator),
            "hoststack-operator",
            &node_a_tuning(lab, spec),
        ),
        "the operator applies node-a's spec",
    );
}

fn spec_of(lab: &Lab, node: &str) -> serde_json::Value {
    lab.get_json(&["get", "nodetuning", node])["spec"].clone()
}

/// The spec guard's refusal of `who` changing `fields` (and no others) of `node`'s spec.
fn refused_spec_change(why: &str, who: &str, operation: &str, node: &str, fields: &[&str]) {
    let (head, changed) = why
        .split_once(", which changes ")
        .unwrap_or_else(|| panic!("not the spec guard's refusal: {why}"));
    assert!(
        head.contains("ValidatingAdmissionPolicy 'hoststack-node-spec-guard'")
            && head.ends_with(&format!(
                "only the hoststack operator (system:serviceaccount:{NAMESPACE}:hoststack-operator) \
                 writes a NodeTuning spec; {who} may change only spec.preview: refusing {operation} \
                 of nodetuning {node}"
            )),
        "{why}"
    );
    let mut named: Vec<&str> = changed.trim().split(", ").collect();
    named.sort_unstable();
    let want: Vec<String> = fields.iter().map(|f| format!("spec.{f}")).collect();
    assert_eq!(named, want, "{why}");
}

/// The spec guard's refusal of `who` changing who owns `node`'s spec (its managedFields) and no
/// value: `changes` are the refusal's own words, e.g. `e2e-co-owner takes spec.config`.
fn refused_ownership_change(why: &str, who: &str, node: &str, changes: &[&str]) {
    let (head, changed) = why
        .split_once(", which changes who owns its spec (metadata.managedFields): ")
        .unwrap_or_else(|| panic!("not the spec guard's refusal of an ownership change: {why}"));
    assert!(
        head.contains("ValidatingAdmissionPolicy 'hoststack-node-spec-guard'")
            && head.ends_with(&format!(
                "only the hoststack operator (system:serviceaccount:{NAMESPACE}:hoststack-operator) \
                 writes a NodeTuning spec; {who} may change only spec.preview: refusing UPDATE \
                 of nodetuning {node}"
            )),
        "{why}"
    );
    let mut named: Vec<&str> = changed.trim().split("; ").collect();
    named.sort_unstable();
    assert_eq!(named, changes, "{why}");
}

/// The spec guard's refusal of `who` adding or changing `node`'s owner references.
fn refused_owner_references(why: &str, who: &str, operation: &str, node: &str) {
    assert!(
        why.contains("ValidatingAdmissionPolicy 'hoststack-node-spec-guard'")
            && why.contains(&format!(
                "only the hoststack operator (system:serviceaccount:{NAMESPACE}:hoststack-operator) \
                 sets the owner references of a NodeTuning; {who} may only remove one: refusing {operation} of \
                 nodetuning {node}, which adds or changes metadata.ownerReferences"
            )),
        "{why}"
    );
}

/// A merge patch of `node`'s NodeTuning with `kubeconfig`'s credentials, sent as the plugin
/// sends its patches (no GET first, which the planner may not do): the API server's refusal,
/// if any.
fn merge_patch(lab: &Lab, kubeconfig: &Path, node: &str, body: &str) -> Result<(), String> {
    let body: serde_json::Value = serde_json::from_str(body).expect("a JSON patch body");
    lab.merge_patch_node_tuning(kubeconfig, node, "e2e-security", &body)
}

#[test]
fn only_the_operator_writes_a_spec_the_planner_only_its_preview() {
    let lab = lab();
    operator_spec(&lab, "0");
    let written = spec_of(&lab, "node-a");

    // The planner: the RBAC docs/kubectl-plugin.md gives `kubectl hoststack plan`, bound to a
    // ServiceAccount of its own. RBAC lets it patch a NodeTuning, any field of it.
    let binding = format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata:\n  name: hoststack-planner\nroleRef:\n  apiGroup: rbac.authorization.k8s.io\n  kind: ClusterRole\n  name: hoststack-planner\nsubjects:\n  - kind: ServiceAccount\n    name: hoststack-planner\n    namespace: {NAMESPACE}\n"
    );
    lab.apply_yaml(&format!("{}---\n{binding}", documented_planner_role()))
        .expect("the planner's RBAC");
    let planner = lab.service_account_kubeconfig("hoststack-planner");
    let planner_user = format!("system:serviceaccount:{NAMESPACE}:hoststack-planner");
    let can = allowed(
        lab.kubectl_with(&planner, &["auth", "can-i", "patch", "nodetunings"], None),
        "auth can-i",
    );
    assert_eq!(can, "yes");

    // Its attempt to change the config: refused with the policy's message, nothing written.
    let forged =
        r#"{"spec":{"config":{"sysctls":{"net.ipv4.tcp_sack":"1","net.ipv4.tcp_ecn":"1"}}}}"#;
    let why = merge_patch(&lab, &planner, "node-a", forged).expect_err("forging spec.config");
    refused_spec_change(&why, &planner_user, "UPDATE", "node-a", &["config"]);
    // Or the revision and the mode, or withdrawing the config: the same.
    let why = merge_patch(
        &lab,
        &planner,
        "node-a",
        r#"{"spec":{"revision":"r-forged","mode":"Plan"}}"#,
    )
    .expect_err("changing the revision and the mode");
    refused_spec_change(
        &why,
        &planner_user,
        "UPDATE",
        "node-a",
        &["mode", "revision"],
    );
    let why = merge_patch(&lab, &planner, "node-a", r#"{"spec":{"config":null}}"#)
        .expect_err("withdrawing the config");
    refused_spec_change(&why, &planner_user, "UPDATE", "node-a", &["config"]);
    // A preview riding along with a config change is no better.
    let both = r#"{"spec":{"preview":{"id":"plan-1","config":{"sysctls":{"net.ipv4.tcp_ecn":"1"}}},"config":{"sysctls":{"net.ipv4.tcp_sack":"1"}}}}"#;
    let why =
        merge_patch(&lab, &planner, "node-a", both).expect_err("a preview and a config change");
    refused_spec_change(&why, &planner_user, "UPDATE", "node-a", &["config"]);
    assert_eq!(spec_of(&lab, "node-a"), written, "nothing was written");

    // A preview alone goes through, written and removed again.
    let ask =
        r#"{"spec":{"preview":{"id":"plan-1","config":{"sysctls":{"net.ipv4.tcp_ecn":"1"}}}}}"#;
    merge_patch(&lab, &planner, "node-a", ask).expect("the planner asking for a preview");
    let asked = spec_of(&lab, "node-a");
    assert_eq!(asked["preview"]["id"], "plan-1", "{asked}");
    assert_eq!(asked["config"], written["config"]);
    merge_patch(&lab, &planner, "node-a", r#"{"spec":{"preview":null}}"#)
        .expect("the planner removing its preview");
    assert_eq!(spec_of(&lab, "node-a"), written);
    // And `kubectl hoststack plan` itself, with the planner's credentials: it writes its
    // request (no agent runs here to answer it: exit 6) and removes it again.
    let file = lab.dir().join("plan.yaml");
    std::fs::write(
        &file,
        "apiVersion: hoststack.dev/v1alpha1\nkind: NetworkTuning\nmetadata:\n  name: edge\nspec:\n  nodeSelector:\n    matchLabels:\n      pool: edge\n  sysctls:\n    net.ipv4.tcp_ecn: \"1\"\n",
    )
    .expect("writing the plan's file");
    let out = std::process::Command::new(lab.plugin_binary())
        .arg("--kubeconfig")
        .arg(&planner)
        .arg("plan")
        .arg(&file)
        .args(["--node", "node-a", "--timeout", "2s"])
        .output()
        .expect("the plugin runs");
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(6), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("no answer from its agent within 2s"),
        "{stdout}\n{stderr}"
    );
    assert_eq!(spec_of(&lab, "node-a"), written);

    // Every identity but the operator, cluster admins too: a spec is the operator's to write.
    let why = denied(
        lab.kubectl(&[
            "patch",
            "nodetuning",
            "node-a",
            "--type=merge",
            "-p",
            forged,
        ]),
        "an admin forging spec.config",
    );
    refused_spec_change(&why, ADMIN_USER, "UPDATE", "node-a", &["config"]);
    allowed(
        lab.kubectl(&[
            "label",
            "nodetuning",
            "node-a",
            "e2e=metadata-is-not-judged",
        ]),
        "an admin labelling a NodeTuning",
    );
    let why = lab
        .apply_yaml(
            "apiVersion: hoststack.dev/v1alpha1\nkind: NodeTuning\nmetadata:\n  name: node-b\nspec:\n  tuning: edge\n  revision: r-forged\n  config:\n    sysctls:\n      net.ipv4.tcp_sack: \"1\"\n",
        )
        .expect_err("an admin creating a NodeTuning with a config");
    refused_spec_change(
        &why,
        ADMIN_USER,
        "CREATE",
        "node-b",
        &["config", "revision", "tuning"],
    );
    assert_eq!(spec_of(&lab, "node-a"), written);

    // Ownership, not only values. The planner server-side applying node-a's spec exactly as it
    // is, under a field manager of its own, changes no value; admitted, it would make the planner
    // a co-owner of every field, which the operator's apply could then no longer withdraw.
    let same = node_a_tuning(&lab, written.clone());
    let why = denied(
        server_side_apply(&lab, &planner, "e2e-co-owner", &same),
        "the planner applying node-a's unchanged spec under its own field manager",
    );
    refused_ownership_change(
        &why,
        &planner_user,
        "node-a",
        &["e2e-co-owner takes spec.config, spec.mode, spec.revision, spec.tuning"],
    );
    // A cluster admin is no different.
    let why = denied(
        server_side_apply(&lab, lab.kubeconfig(), "e2e-admin", &same),
        "an admin applying node-a's unchanged spec under its own field manager",
    );
    refused_ownership_change(
        &why,
        ADMIN_USER,
        "node-a",
        &["e2e-admin takes spec.config, spec.mode, spec.revision, spec.tuning"],
    );
    // Nor may anyone rewrite the managed fields themselves: a reset leaves the spec owned by
    // no one, and the operator's next apply could withdraw nothing it wrote before.
    let why = merge_patch(
        &lab,
        &planner,
        "node-a",
        r#"{"metadata":{"managedFields":[{}]}}"#,
    )
    .expect_err("resetting the managed fields");
    refused_ownership_change(
        &why,
        &planner_user,
        "node-a",
        &["hoststack-operator gives up spec.config, spec.mode, spec.revision, spec.tuning"],
    );

    // The owner references are the operator's too: the garbage collector deletes a NodeTuning
    // whose owners are gone, so an owner that is not the node (here, a uid no object has)
    // would have the NodeTuning deleted (the host reverts) and recreated at will.
    let forged_owner = r#"{"metadata":{"ownerReferences":[{"apiVersion":"v1","kind":"Node","name":"node-a","uid":"00000000-0000-0000-0000-000000000000"}]}}"#;
    let why = merge_patch(&lab, &planner, "node-a", forged_owner)
        .expect_err("the planner replacing node-a's owner");
    refused_owner_references(&why, &planner_user, "UPDATE", "node-a");
    let why = denied(
        lab.kubectl(&[
            "patch",
            "nodetuning",
            "node-a",
            "--type=merge",
            "-p",
            forged_owner,
        ]),
        "an admin replacing node-a's owner",
    );
    refused_owner_references(&why, ADMIN_USER, "UPDATE", "node-a");
    let why = lab
        .apply_yaml(
            "apiVersion: hoststack.dev/v1alpha1\nkind: NodeTuning\nmetadata:\n  name: node-b\n  ownerReferences:\n    - apiVersion: v1\n      kind: Node\n      name: node-b\n      uid: 00000000-0000-0000-0000-000000000000\nspec: {}\n",
        )
        .expect_err("an admin creating a NodeTuning with an owner");
    refused_owner_references(&why, ADMIN_USER, "CREATE", "node-b");
    let owners =
        lab.get_json(&["get", "nodetuning", "node-a"])["metadata"]["ownerReferences"].clone();
    assert_eq!(owners[0]["name"], "node-a", "{owners}");
    assert_eq!(spec_of(&lab, "node-a"), written);

    // The operator still writes specs, and withdraws what it wrote: no one else owns a field.
    operator_spec(&lab, "1");
    let rewritten = spec_of(&lab, "node-a");
    assert_eq!(rewritten["config"]["sysctls"]["net.ipv4.tcp_sack"], "1");
    assert_eq!(rewritten["revision"], "r-1");
    allowed(
        server_side_apply(
            &lab,
            lab.kubeconfig_of(Identity::Operator),
            "hoststack-operator",
            &node_a_tuning(&lab, serde_json::json!({"tuning": "edge", "mode": "Apply"})),
        ),
        "the operator withdraws node-a's config",
    );
    let withdrawn = spec_of(&lab, "node-a");
    assert_eq!(
        withdrawn,
        serde_json::json!({"tuning": "edge", "mode": "Apply"}),
        "the operator's withdrawal left fields behind"
    );

    // Removing the owner reference, as the garbage collector does when it orphans a Node's
    // dependents, deletes nothing and is allowed.
    allowed(
        lab.kubectl(&[
            "patch",
            "nodetuning",
            "node-a",
            "--type=json",
            "-p",
            r#"[{"op":"remove","path":"/metadata/ownerReferences"}]"#,
        ]),
        "an admin removing node-a's owner reference",
    );
}
