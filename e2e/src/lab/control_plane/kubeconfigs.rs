//! The lab's kubeconfigs, one per [`Identity`] and one per node's agent: the admin's carries a
//! client certificate of the lab CA; the others carry tokens of the chart's ServiceAccounts in
//! [`NAMESPACE`], minted once the API server runs, so that the operator and agents run with the
//! chart's least-privilege RBAC. A node's agent gets a token bound to a Pod on that node, so it
//! carries the node-name claim that the chart's write guard checks (as a DaemonSet pod's
//! projected token does); an extra operator replica gets one bound to a Pod of its own name, so
//! that the audit log tells its requests from the lab operator's (the pod-name claim).

use super::pki::{self, Pki};
use crate::lab::kubectl::Kubectl;
use crate::Result;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Namespace of the operator's and agents' ServiceAccounts.
pub const NAMESPACE: &str = hoststack_crds::DEFAULT_NAMESPACE;

/// Whose credentials a kubeconfig carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Identity {
    /// Cluster admin (client certificate, O=system:masters).
    Admin,
    /// The operator's ServiceAccount token (the chart's operator RBAC).
    Operator,
    /// The agents' ServiceAccount token (the chart's agent RBAC).
    Agent,
}

/// Where the kubeconfigs of one lab are: `<lab dir>/{admin,operator,agent}.kubeconfig` and
/// `<lab dir>/agent-<node>.kubeconfig`.
#[derive(Clone, Debug)]
pub(crate) struct Kubeconfigs {
    lab_dir: PathBuf,
    by_identity: BTreeMap<Identity, PathBuf>,
}

impl Kubeconfigs {
    /// The kubeconfigs of the lab in `lab_dir` (none written yet).
    pub fn in_dir(lab_dir: &Path) -> Kubeconfigs {
        let by_identity = [
            (Identity::Admin, "admin"),
            (Identity::Operator, "operator"),
            (Identity::Agent, "agent"),
        ]
        .into_iter()
        .map(|(id, name)| (id, lab_dir.join(format!("{name}.kubeconfig"))))
        .collect();
        Kubeconfigs {
            lab_dir: lab_dir.to_path_buf(),
            by_identity,
        }
    }

    /// The kubeconfig of `identity`.
    pub fn of(&self, identity: Identity) -> &Path {
        &self.by_identity[&identity]
    }

    /// The kubeconfig of `node`'s agent (a node-bound token).
    pub fn agent_of(&self, node: &str) -> PathBuf {
        self.lab_dir.join(format!("agent-{node}.kubeconfig"))
    }

    /// The kubeconfig of operator replica `pod_name` (a token bound to a Pod of that name).
    pub fn replica_of(&self, pod_name: &str) -> PathBuf {
        self.lab_dir.join(format!("operator-{pod_name}.kubeconfig"))
    }

    /// Writes the admin kubeconfig for the API server at `api_url`.
    pub fn write_admin(&self, api_url: &str, pki: &Pki) -> Result<()> {
        pki::write_kubeconfig(
            self.of(Identity::Admin),
            api_url,
            &pki.ca_cert,
            "hoststack-lab-admin",
            pki::Credentials::Certificate {
                cert: &pki.admin_cert,
                key: &pki.admin_key,
            },
        )
    }

    /// Mints a token of the operator's and of the agents' ServiceAccount (24 h, bound to no
    /// node) and writes their kubeconfigs.
    pub fn mint_service_accounts(&self, kubectl: &Kubectl, api_url: &str, ca: &Path) -> Result<()> {
        for (identity, account) in [
            (Identity::Operator, "hoststack-operator"),
            (Identity::Agent, "hoststack-agent"),
        ] {
            let token = kubectl.run(
                &[
                    "create",
                    "token",
                    account,
                    "-n",
                    NAMESPACE,
                    "--duration=24h",
                ],
                None,
            )?;
            pki::write_kubeconfig(
                self.of(identity),
                api_url,
                ca,
                account,
                pki::Credentials::Token(token.trim()),
            )?;
        }
        Ok(())
    }

    /// Makes ServiceAccount `account` in [`NAMESPACE`] (if it is missing), mints a token of it
    /// (24 h) and writes `<lab dir>/sa-<account>.kubeconfig`; its path. For identities of a
    /// test's own, e.g. the RBAC that `kubectl hoststack plan` documents.
    pub fn mint_account(
        &self,
        account: &str,
        kubectl: &Kubectl,
        api_url: &str,
        ca: &Path,
    ) -> Result<PathBuf> {
        let object = serde_json::json!({
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": account, "namespace": NAMESPACE},
        });
        kubectl.run(&["apply", "-f", "-"], Some(&format!("{object}\n")))?;
        let token = kubectl.run(
            &[
                "create",
                "token",
                account,
                "-n",
                NAMESPACE,
                "--duration=24h",
            ],
            None,
        )?;
        let path = self.lab_dir.join(format!("sa-{account}.kubeconfig"));
        pki::write_kubeconfig(
            &path,
            api_url,
            ca,
            account,
            pki::Credentials::Token(token.trim()),
        )?;
        Ok(path)
    }

    /// Makes `node`'s token Pod (which no kubelet runs: it stays Pending), mints an agents'
    /// token bound to it (24 h) and writes `node`'s agent kubeconfig.
    pub fn mint_agent_of(
        &self,
        node: &str,
        kubectl: &Kubectl,
        api_url: &str,
        ca: &Path,
    ) -> Result<()> {
        let anchor = TokenPod {
            name: &format!("hoststack-agent-token-{node}"),
            account: "hoststack-agent",
            node: Some(node),
        };
        let token = anchor.mint(kubectl)?;
        pki::write_kubeconfig(
            &self.agent_of(node),
            api_url,
            ca,
            "hoststack-agent",
            pki::Credentials::Token(token.trim()),
        )
    }

    /// Makes the token Pod `pod_name` (bound to no node, run by nothing), mints an operator
    /// token bound to it (24 h) and writes replica `pod_name`'s kubeconfig.
    pub fn mint_replica(
        &self,
        pod_name: &str,
        kubectl: &Kubectl,
        api_url: &str,
        ca: &Path,
    ) -> Result<()> {
        let anchor = TokenPod {
            name: pod_name,
            account: "hoststack-operator",
            node: None,
        };
        let token = anchor.mint(kubectl)?;
        pki::write_kubeconfig(
            &self.replica_of(pod_name),
            api_url,
            ca,
            "hoststack-operator",
            pki::Credentials::Token(token.trim()),
        )
    }
}

/// A Pod that only anchors a bound service-account token: the API server puts the Pod's name
/// (and, with a nodeName, the node's) into tokens bound to it. No kubelet runs it (an image
/// that never pulls, every taint tolerated so that no controller evicts it).
struct TokenPod<'a> {
    name: &'a str,
    account: &'a str,
    node: Option<&'a str>,
}

impl TokenPod<'_> {
    /// Creates (or keeps) the Pod and mints a 24 h token of its account bound to it.
    fn mint(&self, kubectl: &Kubectl) -> Result<String> {
        kubectl.run(&["apply", "-f", "-"], Some(&self.object()))?;
        kubectl.run(
            &[
                "create",
                "token",
                self.account,
                "-n",
                NAMESPACE,
                "--bound-object-kind=Pod",
                &format!("--bound-object-name={}", self.name),
                "--duration=24h",
            ],
            None,
        )
    }

    fn object(&self) -> String {
        let object = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": self.name, "namespace": NAMESPACE},
            "spec": {
                "nodeName": self.node,
                "serviceAccountName": self.account,
                "automountServiceAccountToken": false,
                "tolerations": [{"operator": "Exists"}],
                "containers": [{
                    "name": "token-anchor",
                    "image": "hoststack.invalid/token-anchor",
                    "imagePullPolicy": "Never"
                }]
            }
        });
        // JSON is YAML.
        format!("{object}\n")
    }
}
