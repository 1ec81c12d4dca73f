//! kubectl, helm and kube clients against the lab's API server. kubectl's discovery cache and
//! helm's state live under the lab directory, so labs never share them. Commands run as the
//! lab admin unless given another kubeconfig; the helpers meant for tests panic with the
//! tool's message rather than return errors a test would unwrap.

use super::api_reader::{self, ApiPath, ApiReader};
use super::PROMETHEUS_SECRET;
use crate::command::{self, cmd};
use crate::{Error, Result};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The lab's kubectl and helm.
pub(crate) struct Kubectl {
    kubectl: PathBuf,
    helm: PathBuf,
    /// The admin kubeconfig, the default credentials.
    admin: PathBuf,
    /// kubectl's discovery cache (`KUBECACHEDIR`).
    cache: PathBuf,
    /// Where helm keeps its cache, configuration and data.
    helm_home: PathBuf,
    /// The admin's reads of the kinds it knows, without a kubectl process.
    reader: ApiReader,
}

impl Kubectl {
    /// The `kubectl` and `helm` binaries, for the lab in `lab_dir` (`kube-cache/`, `helm/`),
    /// as the admin of kubeconfig `admin`.
    pub fn new(kubectl: &Path, helm: &Path, lab_dir: &Path, admin: &Path) -> Kubectl {
        Kubectl {
            kubectl: kubectl.to_path_buf(),
            helm: helm.to_path_buf(),
            admin: admin.to_path_buf(),
            cache: lab_dir.join("kube-cache"),
            helm_home: lab_dir.join("helm"),
            reader: ApiReader::new(admin.to_path_buf()),
        }
    }

    /// kubectl with `args` and the credentials of `kubeconfig`.
    fn command(&self, kubeconfig: &Path, args: &[&str]) -> Command {
        let mut kubectl = cmd(self.kubectl.to_str().expect("UTF-8 path"), args);
        kubectl
            .env("KUBECONFIG", kubeconfig)
            .env("KUBECACHEDIR", &self.cache);
        kubectl
    }

    /// Runs kubectl with the credentials of `kubeconfig` and `stdin` as its standard input.
    pub fn output_as(&self, kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> Output {
        let mut kubectl = self.command(kubeconfig, args);
        command::output(&mut kubectl, stdin.map(str::as_bytes))
            .unwrap_or_else(|e| panic!("running kubectl: {e}"))
    }

    /// Runs kubectl as admin.
    pub fn output(&self, args: &[&str]) -> Output {
        self.output_as(&self.admin, args, None)
    }

    /// Runs kubectl as admin: its standard output, or an error when it fails.
    pub fn run(&self, args: &[&str], stdin: Option<&str>) -> Result<String> {
        let mut kubectl = self.command(&self.admin, args);
        command::run(&mut kubectl, stdin.map(str::as_bytes))
    }

    /// `kubectl <args> -o json` as admin, parsed; panics with kubectl's message when it fails.
    /// A `get` of a kind the in-process reader knows is read without kubectl
    /// ([`ApiPath::of`]).
    pub fn get_json(&self, args: &[&str]) -> serde_json::Value {
        if let Some(path) = ApiPath::of(args) {
            return self
                .reader
                .get(&path)
                .unwrap_or_else(|e| panic!("kubectl {args:?}: {e}"));
        }
        let mut all = args.to_vec();
        all.extend(["-o", "json"]);
        let out = self.output(&all);
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("kubectl prints JSON")
    }

    /// `kubectl get --raw <path>` as admin, read in-process: the body, or why it failed.
    pub fn get_raw(&self, path: &str) -> std::result::Result<String, String> {
        self.reader.get_text(path)
    }

    /// `kubectl apply -f -` of `yaml` as admin: `Ok(stdout)`, or `Err(stderr)`.
    pub fn apply_yaml(&self, yaml: &str) -> std::result::Result<String, String> {
        let out = self.output_as(&self.admin, &["apply", "-f", "-"], Some(yaml));
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    /// Sets (`Some`) or removes (`None`) a label of a Node; panics when kubectl fails.
    pub fn label_node(&self, node: &str, key: &str, value: Option<&str>) {
        let label = match value {
            Some(v) => format!("{key}={v}"),
            None => format!("{key}-"),
        };
        self.run(&["label", "node", node, &label, "--overwrite"], None)
            .unwrap_or_else(|e| panic!("labelling node {node}: {e}"));
    }

    /// A kube client with admin credentials. Needs a tokio runtime.
    pub async fn client(&self) -> Result<kube::Client> {
        self.client_as(&self.admin).await
    }

    /// A JSON merge patch of NodeTuning `node` with the credentials in `kubeconfig` under
    /// `field_manager`: one PATCH, no GET first. `Ok(Err(message))` with the API server's
    /// message when it refuses it; `Err` when it cannot be sent.
    pub fn merge_patch_node_tuning(
        &self,
        kubeconfig: &Path,
        node: &str,
        field_manager: &str,
        patch: &serde_json::Value,
    ) -> Result<std::result::Result<(), String>> {
        let params = kube::api::PatchParams {
            field_manager: Some(field_manager.to_string()),
            ..Default::default()
        };
        self.patch_as::<hoststack_crds::NodeTuning>(
            kubeconfig,
            node,
            &params,
            &kube::api::Patch::Merge(patch),
        )
    }

    /// One PATCH of the cluster-scoped object `name` (a `K`) with the credentials in
    /// `kubeconfig`, no GET first (which `kubectl patch` makes, and `kubectl apply
    /// --server-side` replaces with a migration of client-side-apply objects' managed fields):
    /// sent as the operator sends its writes. `Ok(Err(message))` with the API server's message
    /// when it refuses it; `Err` when it cannot be sent.
    pub fn patch_as<K>(
        &self,
        kubeconfig: &Path,
        name: &str,
        params: &kube::api::PatchParams,
        patch: &kube::api::Patch<&serde_json::Value>,
    ) -> Result<std::result::Result<(), String>>
    where
        K: kube::Resource<Scope = kube::core::ClusterResourceScope, DynamicType = ()>
            + Clone
            + k8s_openapi::serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::io("starting a tokio runtime", e))?;
        runtime.block_on(async {
            let client = self.client_as(kubeconfig).await?;
            match kube::Api::<K>::all(client).patch(name, params, patch).await {
                Ok(_) => Ok(Ok(())),
                Err(kube::Error::Api(status)) => Ok(Err(status.message)),
                Err(e) => Err(Error::Kube(e.to_string())),
            }
        })
    }

    /// A kube client with the credentials in `kubeconfig`. Needs a tokio runtime.
    async fn client_as(&self, kubeconfig: &Path) -> Result<kube::Client> {
        api_reader::client(kubeconfig).await.map_err(Error::Kube)
    }

    /// helm with `args` and its state under the lab directory.
    fn helm_command(&self, args: &[&str]) -> Command {
        let mut helm = cmd(self.helm.to_str().expect("UTF-8 path"), args);
        helm.env("HELM_CACHE_HOME", self.helm_home.join("cache"))
            .env("HELM_CONFIG_HOME", self.helm_home.join("config"))
            .env("HELM_DATA_HOME", self.helm_home.join("data"));
        helm
    }

    /// Runs helm as admin.
    pub fn helm(&self, args: &[&str]) -> Output {
        let mut helm = self.helm_command(args);
        helm.env("KUBECONFIG", &self.admin);
        command::output(&mut helm, None).unwrap_or_else(|e| panic!("running helm: {e}"))
    }

    /// `helm template` of `chart`'s ServiceAccounts, RBAC, per-node write guard, spec guard and
    /// operator's node guard (the ValidatingAdmissionPolicies) into `namespace`, the operator
    /// allowed to read the Prometheus gate's Secret [`PROMETHEUS_SECRET`].
    pub fn render_chart_rbac(&self, chart: &Path, namespace: &str) -> Result<String> {
        let chart = chart.to_str().expect("UTF-8 path");
        let secret = format!("prometheus.secretName={PROMETHEUS_SECRET}");
        let mut helm = self.helm_command(&[
            "template",
            "hoststack",
            chart,
            "--namespace",
            namespace,
            "--show-only",
            "templates/serviceaccounts.yaml",
            "--show-only",
            "templates/rbac-operator.yaml",
            "--show-only",
            "templates/rbac-agent.yaml",
            "--show-only",
            "templates/node-write-guard.yaml",
            "--show-only",
            "templates/node-spec-guard.yaml",
            "--show-only",
            "templates/operator-node-guard.yaml",
            "--set",
            &secret,
        ]);
        command::run(&mut helm, None)
    }
}
