//! The Helm chart against the lab's real API server: it lints strictly, every values file in
//! charts/hoststack/ci/ renders to objects the API server accepts (server-side dry run), the
//! values reach the agent DaemonSet through the operator's flags, and the pods' security
//! contexts are the ones docs/install.md documents.

use hoststack_e2e::{Lab, LabConfig, NAMESPACE};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

const CHART: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../charts/hoststack");
const INSTALL_DOC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/install.md");

/// `helm <args>` with the lab's helm (scripts/setup.sh builds it), rendering only: its homes
/// point nowhere, so it reads and writes no user configuration.
fn helm(args: &[&str]) -> String {
    let bin = hoststack_e2e::control_plane_dir();
    let helm = bin.join("helm");
    assert!(
        helm.exists(),
        "no helm at {}: run scripts/setup.sh",
        helm.display()
    );
    let nowhere = Path::new("/nonexistent/hoststack-chart-test");
    let out = Command::new(&helm)
        .args(args)
        .env("HELM_CACHE_HOME", nowhere.join("cache"))
        .env("HELM_CONFIG_HOME", nowhere.join("config"))
        .env("HELM_DATA_HOME", nowhere.join("data"))
        .env_remove("KUBECONFIG")
        .output()
        .expect("helm runs");
    ok(out, &format!("helm {args:?}"))
}

fn ok(out: Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The chart's ci/*.yaml values files, sorted.
fn values_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(Path::new(CHART).join("ci"))
        .expect("charts/hoststack/ci")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 4, "{files:?}");
    files
}

/// `helm template` of the chart in the lab's namespace with `extra` arguments.
fn render(extra: &[&str]) -> String {
    let mut args = vec!["template", "hoststack", CHART, "--namespace", NAMESPACE];
    args.extend_from_slice(extra);
    helm(&args)
}

/// The objects of `yaml` as the API server would store them (`kubectl apply
/// --dry-run=server`); panics with the server's message when it refuses one.
fn dry_run(lab: &Lab, yaml: &str, what: &str) -> Vec<Value> {
    let out = lab.kubectl_as(
        hoststack_e2e::Identity::Admin,
        &["apply", "--dry-run=server", "-o", "json", "-f", "-"],
        Some(yaml),
    );
    let list: Value = serde_json::from_str(&ok(out, what)).expect("kubectl prints JSON");
    match list["kind"].as_str() {
        Some("List") => list["items"].as_array().unwrap().clone(),
        _ => vec![list],
    }
}

fn kinds(objects: &[Value]) -> Vec<String> {
    let mut kinds: Vec<String> = objects
        .iter()
        .map(|o| {
            format!(
                "{}/{}",
                o["kind"].as_str().unwrap(),
                o["metadata"]["name"].as_str().unwrap()
            )
        })
        .collect();
    kinds.sort();
    kinds
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind}/{name} in {:?}", kinds(objects)))
}

/// The operator's arguments in a rendered chart (every one is a quoted string on its own line
/// of the Deployment's `args`).
fn operator_args(rendered: &str) -> Vec<String> {
    rendered
        .lines()
        .map(str::trim)
        .filter_map(|l| l.strip_prefix("- \"--"))
        .map(|rest| serde_json::from_str::<String>(&format!("\"--{rest}")).expect("a quoted arg"))
        .collect()
}

/// The JSON block that follows the line `<!-- name -->` in docs/install.md.
fn documented(name: &str) -> Value {
    let doc = std::fs::read_to_string(INSTALL_DOC).expect("docs/install.md");
    let marker = format!("<!-- {name} -->");
    let after = doc
        .split_once(&marker)
        .unwrap_or_else(|| panic!("docs/install.md has no {marker}"))
        .1;
    let block = after
        .split_once("```json\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .unwrap_or_else(|| panic!("no ```json block after {marker}"))
        .0;
    serde_json::from_str(block).unwrap_or_else(|e| panic!("{marker}: {e}"))
}

#[test]
fn the_chart_lints_and_every_values_file_renders_objects_the_api_server_accepts() {
    for file in values_files() {
        let file = file.display().to_string();
        let out = helm(&["lint", "--strict", CHART, "-f", &file]);
        assert!(
            out.contains("1 chart(s) linted, 0 chart(s) failed"),
            "{out}"
        );
    }
    // Bad values are refused by values.schema.json before anything renders.
    let bin = hoststack_e2e::control_plane_dir();
    let refused = Command::new(bin.join("helm"))
        .args([
            "template",
            "hoststack",
            CHART,
            "--set",
            "operator.replicas=0",
        ])
        .args(["--set", "agent.tolerations[0].operator=Sometimes"])
        .env("HELM_CACHE_HOME", "/nonexistent/cache")
        .env("HELM_CONFIG_HOME", "/nonexistent/config")
        .env("HELM_DATA_HOME", "/nonexistent/data")
        .output()
        .expect("helm runs");
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(
        why.contains("at '/operator/replicas': minimum: got 0, want 1")
            && why.contains("at '/agent/tolerations/0/operator'"),
        "{why}"
    );
    // A plain http Prometheus only with the installer's explicit word.
    let http = [
        "--set",
        "prometheus.address=http://prometheus.monitoring:9090",
    ];
    let refused = Command::new(bin.join("helm"))
        .args(["template", "hoststack", CHART])
        .args(http)
        .env("HELM_CACHE_HOME", "/nonexistent/cache")
        .env("HELM_CONFIG_HOME", "/nonexistent/config")
        .env("HELM_DATA_HOME", "/nonexistent/data")
        .output()
        .expect("helm runs");
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success()
            && why.contains("prometheus: http://prometheus.monitoring:9090 is plain http"),
        "{why}"
    );
    let allowed = operator_args(&render(&[
        http[0],
        http[1],
        "--set",
        "prometheus.allowInsecure=true",
    ]));
    assert!(
        allowed.contains(&"--prometheus-address=http://prometheus.monitoring:9090".to_string())
            && allowed.contains(&"--prometheus-allow-insecure".to_string()),
        "{allowed:?}"
    );

    let lab = Lab::start(LabConfig {
        start_operator: false,
        start_agents: false,
        ..LabConfig::default()
    })
    .expect("the lab starts");
    // ci/custom-agent-values.yaml puts the dashboards into a namespace of their own.
    lab.apply_yaml("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: monitoring\n")
        .expect("namespace");

    let always = [
        "ClusterRole/hoststack-agent",
        "ClusterRole/hoststack-operator",
        "ClusterRoleBinding/hoststack-agent",
        "ClusterRoleBinding/hoststack-operator",
        "Deployment/hoststack-operator",
        "Role/hoststack-agent",
        "Role/hoststack-operator",
        "RoleBinding/hoststack-agent",
        "RoleBinding/hoststack-operator",
        "ServiceAccount/hoststack-agent",
        "ServiceAccount/hoststack-operator",
    ];
    for file in values_files() {
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        let rendered = render(&["-f", &file.display().to_string()]);
        let objects = dry_run(&lab, &rendered, &format!("dry run of {name}"));
        let kinds = kinds(&objects);
        eprintln!("{name}: {kinds:?}");
        for kind in always {
            assert!(kinds.iter().any(|k| k == kind), "{name}: no {kind}");
        }
        // Without monitoring.coreos.com/v1 on the cluster, no Prometheus Operator objects.
        assert!(
            !kinds
                .iter()
                .any(|k| k.starts_with("ServiceMonitor/") || k.starts_with("PodMonitor/")),
            "{name}: {kinds:?}"
        );
        let has = |kind: &str| kinds.iter().any(|k| k == kind);
        let deployment = find(&objects, "Deployment", "hoststack-operator");
        let args = operator_args(&rendered);
        match name.as_str() {
            "minimal-values.yaml" => {
                assert!(!has("ValidatingAdmissionPolicy/hoststack-agent-own-node"));
                assert!(!has("ValidatingAdmissionPolicy/hoststack-node-spec-guard"));
                assert!(!has(
                    "ValidatingAdmissionPolicy/hoststack-operator-node-label"
                ));
                assert!(
                    !kinds.iter().any(|k| k.starts_with("ConfigMap/")),
                    "{kinds:?}"
                );
            }
            "custom-agent-values.yaml" => {
                assert_eq!(deployment["spec"]["replicas"], 1);
                assert!(!has("PodDisruptionBudget/hoststack-operator"));
                let cm = find(&objects, "ConfigMap", "hoststack-dashboard-rollout");
                assert_eq!(cm["metadata"]["namespace"], "monitoring");
                let sa = find(&objects, "ServiceAccount", "hoststack-agent");
                assert_eq!(
                    sa["imagePullSecrets"],
                    json!([{"name": "registry-example"}])
                );
                assert!(
                    args.contains(&"--agent-priority-class=".to_string()),
                    "{args:?}"
                );
                assert!(args.contains(&r#"--agent-node-selector={"pool":"edge"}"#.to_string()));
                let extra: Vec<&String> = args
                    .iter()
                    .filter(|a| a.starts_with("--agent-extra-arg="))
                    .collect();
                assert_eq!(
                    extra,
                    [
                        "--agent-extra-arg=--resync-interval=1m",
                        "--agent-extra-arg=--heartbeat-interval=5s"
                    ],
                    "{args:?}"
                );
            }
            "no-kube-proxy-values.yaml" => {
                let env = &deployment["spec"]["template"]["spec"]["containers"][0]["env"];
                let env = env.as_array().unwrap();
                let value = |n: &str| {
                    env.iter()
                        .find(|e| e["name"] == n)
                        .map(|e| e["value"].clone())
                };
                assert_eq!(value("KUBERNETES_SERVICE_HOST"), Some(json!("198.18.0.1")));
                assert_eq!(value("KUBERNETES_SERVICE_PORT"), Some(json!("6443")));
                assert!(args.contains(&"--agent-api-server-host=198.18.0.1".to_string()));
                assert!(args.contains(&"--agent-api-server-port=6443".to_string()));
                assert!(args.contains(&"--agent-image=hoststack.lab/hoststack:dev".to_string()));
                assert!(args.contains(&"--agent-image-pull-policy=Never".to_string()));
            }
            "default-values.yaml" => {
                assert_eq!(deployment["spec"]["replicas"], 2);
                let pdb = find(&objects, "PodDisruptionBudget", "hoststack-operator");
                assert_eq!(pdb["spec"]["maxUnavailable"], 1);
                assert_eq!(
                    pdb["spec"]["selector"]["matchLabels"],
                    deployment["spec"]["selector"]["matchLabels"]
                );
                assert!(has("ValidatingAdmissionPolicy/hoststack-agent-own-node"));
                assert!(has(
                    "ValidatingAdmissionPolicyBinding/hoststack-agent-own-node"
                ));
                assert!(has("ValidatingAdmissionPolicy/hoststack-node-spec-guard"));
                assert!(has(
                    "ValidatingAdmissionPolicyBinding/hoststack-node-spec-guard"
                ));
                assert!(has(
                    "ValidatingAdmissionPolicy/hoststack-operator-node-label"
                ));
                assert!(has(
                    "ValidatingAdmissionPolicyBinding/hoststack-operator-node-label"
                ));
                assert_eq!(
                    kinds.iter().filter(|k| k.starts_with("ConfigMap/")).count(),
                    3
                );
                let env =
                    deployment["spec"]["template"]["spec"]["containers"][0]["env"].to_string();
                assert!(!env.contains("KUBERNETES_SERVICE_HOST"), "{env}");
                assert!(
                    !args.iter().any(|a| a.starts_with("--agent-extra-arg")),
                    "{args:?}"
                );

                // The security contexts are the documented ones.
                let pod = &deployment["spec"]["template"]["spec"];
                assert_eq!(
                    pod["securityContext"],
                    documented("securityContext: operator pod")
                );
                assert_eq!(
                    pod["containers"][0]["securityContext"],
                    documented("securityContext: operator container")
                );
                assert_eq!(pod["serviceAccountName"], "hoststack-operator");
            }
            other => panic!("no expectations for ci/{other}: add them here"),
        }
    }

    // With the Prometheus Operator's API on the cluster: a ServiceMonitor for the operator's
    // Service and a PodMonitor for the agents' pods, each on a port named "metrics".
    let rendered = render(&["--api-versions", "monitoring.coreos.com/v1"]);
    for kind in [
        "kind: ServiceMonitor",
        "kind: PodMonitor",
        "kind: Service\n",
    ] {
        assert!(rendered.contains(kind), "no {kind:?}");
    }
    let minimal = Path::new(CHART).join("ci/minimal-values.yaml");
    let off = render(&[
        "--api-versions",
        "monitoring.coreos.com/v1",
        "-f",
        &minimal.display().to_string(),
    ]);
    assert!(!off.contains("kind: ServiceMonitor") && !off.contains("kind: PodMonitor"));
}

#[test]
fn values_reach_the_agent_daemonset_through_the_operators_flags() {
    let ci = Path::new(CHART).join("ci");
    let values = [
        ci.join("custom-agent-values.yaml"),
        ci.join("no-kube-proxy-values.yaml"),
    ];
    let files: Vec<String> = values.iter().map(|p| p.display().to_string()).collect();
    let rendered = render(&["-f", &files[0], "-f", &files[1]]);
    let args = operator_args(&rendered);
    // The lab passes its own namespace, image and metrics address; everything else the chart
    // renders goes to the lab's real operator as is.
    let image = args
        .iter()
        .find_map(|a| a.strip_prefix("--agent-image="))
        .expect("--agent-image")
        .to_string();
    let operator_args: Vec<String> = args
        .iter()
        .filter(|a| {
            !["--namespace=", "--agent-image=", "--metrics-bind-address="]
                .iter()
                .any(|p| a.starts_with(p))
        })
        .cloned()
        .collect();
    assert!(operator_args.contains(&"--owner-deployment=hoststack-operator".to_string()));
    // The Prometheus endpoints the gate may send the Secret's credentials to, and no http.
    for flag in [
        "--prometheus-address=https://prometheus.monitoring:9090",
        "--prometheus-allowed-address=https://thanos-query.monitoring:10902/prometheus",
    ] {
        assert!(operator_args.iter().any(|a| a == flag), "{operator_args:?}");
    }
    assert!(!operator_args
        .iter()
        .any(|a| a == "--prometheus-allow-insecure"));
    let lab = Lab::start(LabConfig {
        start_operator: false,
        start_agents: false,
        operator_args,
        agent_image: image.clone(),
        ..LabConfig::default()
    })
    .expect("the lab starts");
    // The chart's Deployment as an object (no kubelet runs it here): the owner the operator
    // gives the DaemonSet.
    let deployment = helm(&[
        "template",
        "hoststack",
        CHART,
        "--namespace",
        NAMESPACE,
        "-f",
        &files[0],
        "-f",
        &files[1],
        "--show-only",
        "templates/operator-deployment.yaml",
    ]);
    lab.apply_yaml(&deployment)
        .expect("the Deployment is stored");
    let uid = lab.get_json(&["get", "deployment", "-n", NAMESPACE, "hoststack-operator"])
        ["metadata"]["uid"]
        .clone();
    lab.start_operator();
    let ds = lab.wait_for(
        "the operator to create the agent DaemonSet",
        Duration::from_secs(60),
        || {
            let out = lab.kubectl(&[
                "get",
                "daemonset",
                "-n",
                NAMESPACE,
                "hoststack-agent",
                "-o",
                "json",
            ]);
            out.status
                .success()
                .then(|| serde_json::from_slice::<Value>(&out.stdout).unwrap())
        },
    );

    let owners = &ds["metadata"]["ownerReferences"];
    assert_eq!(owners[0]["kind"], "Deployment");
    assert_eq!(owners[0]["uid"], uid);
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(
        pod["nodeSelector"],
        json!({"hoststack.dev/agent": "true", "pool": "edge"})
    );
    assert_eq!(
        pod["tolerations"],
        json!([{"key": "dedicated", "operator": "Equal", "value": "network", "effect": "NoSchedule"}])
    );
    assert!(pod.get("priorityClassName").is_none(), "{pod}");
    assert_eq!(pod["serviceAccountName"], "hoststack-agent");
    let agent = &pod["containers"][0];
    assert_eq!(
        agent["image"],
        "registry.example.com/net/hoststack-agent:0.1.0-debug"
    );
    assert_eq!(agent["image"].as_str(), Some(image.as_str()));
    assert_eq!(agent["imagePullPolicy"], "Always");
    assert_eq!(
        agent["resources"],
        json!({"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}})
    );
    let env = agent["env"].as_array().unwrap();
    let value = |n: &str| {
        env.iter()
            .find(|e| e["name"] == n)
            .map(|e| e["value"].clone())
    };
    assert_eq!(value("KUBERNETES_SERVICE_HOST"), Some(json!("198.18.0.1")));
    assert_eq!(value("KUBERNETES_SERVICE_PORT"), Some(json!("6443")));
    assert_eq!(value("RUST_LOG"), Some(json!("debug")));
    assert_eq!(agent["ports"][0]["name"], "metrics");
    // probes.allowedDestinations, then agent.extraArgs, follow the operator's own arguments,
    // in order.
    assert_eq!(
        agent["args"],
        json!([
            "--node-name=$(NODE_NAME)",
            "--proc-root=/host/proc",
            "--sys-root=/host/sys",
            "--state-dir=/var/lib/hoststack",
            "--probe-allowed-destinations=198.18.0.0/15,fd00::/8",
            "--resync-interval=1m",
            "--heartbeat-interval=5s"
        ])
    );

    // The agent pods' security context is the documented one, and the PodMonitor the chart
    // renders selects these pods by a label they carry, on their port "metrics".
    assert_eq!(
        agent["securityContext"],
        documented("securityContext: agent container")
    );
    assert_eq!(pod["hostNetwork"], true);
    let monitors = render(&[
        "--api-versions",
        "monitoring.coreos.com/v1",
        "--show-only",
        "templates/monitoring.yaml",
    ]);
    let pod_monitor = monitors
        .split("\n---")
        .find(|doc| doc.contains("kind: PodMonitor"))
        .expect("a PodMonitor");
    let labels = ds["spec"]["template"]["metadata"]["labels"]
        .as_object()
        .unwrap();
    let selected = labels
        .iter()
        .any(|(k, v)| pod_monitor.contains(&format!("{k}: {}", v.as_str().unwrap())));
    assert!(selected, "{pod_monitor}\n{labels:?}");
    assert!(pod_monitor.contains("- port: metrics"), "{pod_monitor}");
}
