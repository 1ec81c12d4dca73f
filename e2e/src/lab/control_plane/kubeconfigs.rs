//! The lab's kubeconfigs, one per [`Identity`] and one per node's agent: the admin's carries a
//! client certificate of the lab CA; the others carry tokens of the chart's ServiceAccounts in
//! [`NAMESPACE`], minted once the API server runs, so that the operator and agents run with the
//! chart's least-privilege RBAC. A node's agent gets a token bound to a Pod on that node, so it
//! carries the node-name claim that the chart's write guard checks (as a DaemonSet pod's
//! projected token does).

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

    /// Makes `node`'s token Pod (which no kubelet runs: it stays Pending), mints an agents'
    /// token bound to it (24 h) and writes `node`'s agent kubeconfig.
    pub fn mint_agent_of(
        &self,
        node: &str,
        kubectl: &Kubectl,
        api_url: &str,
        ca: &Path,
    ) -> Result<()> {
        kubectl.run(&["apply", "-f", "-"], Some(&token_pod_object(node)))?;
        let token = kubectl.run(
            &[
                "create",
                "token",
                "hoststack-agent",
                "-n",
                NAMESPACE,
                "--bound-object-kind=Pod",
                &format!("--bound-object-name={}", token_pod(node)),
                "--duration=24h",
            ],
            None,
        )?;
        pki::write_kubeconfig(
            &self.agent_of(node),
            api_url,
            ca,
            "hoststack-agent",
            pki::Credentials::Token(token.trim()),
        )
    }
}

/// Name of the Pod that `node`'s agent token is bound to.
fn token_pod(node: &str) -> String {
    format!("hoststack-agent-token-{node}")
}

/// A Pod on `node` that only anchors its agent's bound token: the API server puts the node's
/// name into tokens bound to a Pod with a nodeName. No kubelet runs it (an image that never
/// pulls, every taint tolerated so that no controller evicts it).
fn token_pod_object(node: &str) -> String {
    let object = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": token_pod(node), "namespace": NAMESPACE},
        "spec": {
            "nodeName": node,
            "serviceAccountName": "hoststack-agent",
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
