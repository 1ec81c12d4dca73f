//! What `kubectl get <kind> [<name>] [-n <namespace>] [-l <selector>] -o json` prints, read
//! in-process: one HTTP request on a kept-open connection instead of a kubectl process. The
//! tests poll the API server every 250 ms while they wait, and each kubectl costs about 0.1
//! CPU-second (a Go program's start, TLS, its discovery cache): on 2 cores shared by three
//! tests, those polls were a good part of the suite's CPU time (docs/testing.md).
//!
//! The reader runs a kube client on a thread of its own with its own runtime, so that it can
//! be called from plain and from async code alike. Kinds it does not know, and any other
//! flags, go to kubectl as before ([`ApiPath::of`] says which).

use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::Mutex;

/// A request to the reader's thread: a path of the API, and where to send the answer (the
/// body as text).
type Request = (String, mpsc::Sender<Result<String, String>>);

/// The kinds the reader knows: the names kubectl takes, the API's prefix and its plural, and
/// whether the objects live in a namespace.
const KINDS: [(&[&str], &str, &str, bool); 7] = [
    (
        &["networktuning", "networktunings"],
        "/apis/hoststack.dev/v1alpha1",
        "networktunings",
        false,
    ),
    (
        &["nodetuning", "nodetunings"],
        "/apis/hoststack.dev/v1alpha1",
        "nodetunings",
        false,
    ),
    (&["node", "nodes"], "/api/v1", "nodes", false),
    (&["pod", "pods"], "/api/v1", "pods", true),
    (
        &["daemonset", "daemonsets", "ds"],
        "/apis/apps/v1",
        "daemonsets",
        true,
    ),
    (
        &["deployment", "deployments", "deploy"],
        "/apis/apps/v1",
        "deployments",
        true,
    ),
    (
        &["lease", "leases"],
        "/apis/coordination.k8s.io/v1",
        "leases",
        true,
    ),
];

/// The API path a `kubectl get` reads, and whether it reads a list.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct ApiPath {
    /// The path with its query (`/api/v1/namespaces/ns/pods?labelSelector=app%3Dx`).
    pub path: String,
    /// A list (no name given): printed as kubectl prints one, `kind: List`.
    pub list: bool,
}

impl ApiPath {
    /// The path of `kubectl <args>` when `args` are `get <kind> [<name>]` with at most `-n
    /// <namespace>` and `-l <selector>`, in any order after the kind, and the kind is one the
    /// reader knows; `None` for anything else.
    pub fn of(args: &[&str]) -> Option<ApiPath> {
        let ["get", kind, rest @ ..] = args else {
            return None;
        };
        let &(_, prefix, plural, namespaced) =
            KINDS.iter().find(|(names, ..)| names.contains(kind))?;
        let (mut name, mut namespace, mut selector) = (None, None, None);
        let mut rest = rest.iter();
        while let Some(&arg) = rest.next() {
            match arg {
                "-n" | "--namespace" => namespace = Some(*rest.next()?),
                "-l" | "--selector" => selector = Some(*rest.next()?),
                _ if arg.starts_with('-') || name.is_some() => return None,
                _ => name = Some(arg),
            }
        }
        if selector.is_some() && name.is_some() {
            return None;
        }
        let mut path = prefix.to_string();
        match (namespaced, namespace) {
            (true, Some(ns)) => path.push_str(&format!("/namespaces/{ns}")),
            // kubectl's default namespace for namespaced kinds.
            (true, None) => path.push_str("/namespaces/default"),
            (false, Some(_)) => return None,
            (false, None) => {}
        }
        path.push('/');
        path.push_str(plural);
        if let Some(name) = name {
            path.push('/');
            path.push_str(name);
        }
        if let Some(selector) = selector {
            path.push_str("?labelSelector=");
            path.push_str(&percent_encode(selector));
        }
        Some(ApiPath {
            list: name.is_none(),
            path,
        })
    }
}

/// `value` with every byte but unreserved ones (RFC 3986) percent-encoded.
fn percent_encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The in-process reader of one lab, as its admin. Its thread starts at the first read (the
/// API server is not up when the lab is made) and ends when the reader is dropped.
pub(crate) struct ApiReader {
    /// The admin kubeconfig.
    kubeconfig: PathBuf,
    /// The channel to the reader's thread, once it runs.
    requests: Mutex<Option<mpsc::Sender<Request>>>,
}

impl ApiReader {
    /// A reader with the credentials in `kubeconfig`.
    pub fn new(kubeconfig: PathBuf) -> ApiReader {
        ApiReader {
            kubeconfig,
            requests: Mutex::new(None),
        }
    }

    /// The object or list at `path`, as `kubectl get -o json` prints it; the API server's
    /// message when it refuses.
    pub fn get(&self, path: &ApiPath) -> Result<serde_json::Value, String> {
        let text = self.get_text(&path.path)?;
        let mut value: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.path))?;
        if path.list {
            as_kubectl_list(&mut value);
        }
        Ok(value)
    }

    /// The body at `path` (`/readyz`, `/openapi/v3/...`) as text, as `kubectl get --raw`
    /// prints it; the API server's message, or why it could not be asked, when it fails.
    pub fn get_text(&self, path: &str) -> Result<String, String> {
        let (reply, answer) = mpsc::channel();
        self.sender()?
            .send((path.to_string(), reply))
            .map_err(|_| "the API reader's thread ended".to_string())?;
        answer
            .recv()
            .map_err(|_| "the API reader's thread ended".to_string())?
    }

    /// The channel to the reader's thread, started on first use.
    fn sender(&self) -> Result<mpsc::Sender<Request>, String> {
        let mut requests = self
            .requests
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(tx) = requests.as_ref() {
            return Ok(tx.clone());
        }
        let (tx, rx) = mpsc::channel::<Request>();
        let kubeconfig = self.kubeconfig.clone();
        std::thread::Builder::new()
            .name("api-reader".into())
            .spawn(move || serve(&kubeconfig, rx))
            .map_err(|e| format!("starting the API reader: {e}"))?;
        *requests = Some(tx.clone());
        Ok(tx)
    }
}

/// The reader's thread: answers each request with a GET through one client (made again after
/// a failure to make one: the API server may not have been up yet).
fn serve(kubeconfig: &std::path::Path, requests: mpsc::Receiver<Request>) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            for (_, reply) in requests {
                let _ = reply.send(Err(format!("the API reader's runtime: {e}")));
            }
            return;
        }
    };
    let mut made = None;
    for (path, reply) in requests {
        if made.is_none() {
            made = runtime.block_on(client(kubeconfig)).ok();
        }
        let answer = match &made {
            Some(client) => runtime.block_on(get(client, &path)),
            None => Err(format!(
                "no client of the API server from {}",
                kubeconfig.display()
            )),
        };
        let _ = reply.send(answer);
    }
}

/// A kube client with the credentials in `kubeconfig` (also the lab's kube clients',
/// `Kubectl::client_as`).
pub(crate) async fn client(kubeconfig: &std::path::Path) -> Result<kube::Client, String> {
    let kubeconfig = kube::config::Kubeconfig::read_from(kubeconfig).map_err(|e| e.to_string())?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .map_err(|e| e.to_string())?;
    kube::Client::try_from(config).map_err(|e| e.to_string())
}

/// GET `path`, its body; the API server's message (as kubectl prints it) when it refuses.
async fn get(client: &kube::Client, path: &str) -> Result<String, String> {
    let request = http::Request::get(path)
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
    client.request_text(request).await.map_err(|e| match e {
        kube::Error::Api(status) => {
            format!("Error from server ({}): {}", status.reason, status.message)
        }
        e => e.to_string(),
    })
}

/// A list as kubectl prints it: `kind: List`, `apiVersion: v1`, and each item with the kind
/// and API version of its list (which the API server leaves out of the items).
fn as_kubectl_list(list: &mut serde_json::Value) {
    let kind = list["kind"]
        .as_str()
        .and_then(|k| k.strip_suffix("List"))
        .map(str::to_string);
    let api_version = list["apiVersion"].clone();
    if let (Some(kind), Some(items)) = (kind, list["items"].as_array_mut()) {
        for item in items {
            item["kind"] = kind.clone().into();
            item["apiVersion"] = api_version.clone();
        }
    }
    list["kind"] = "List".into();
    list["apiVersion"] = "v1".into();
    list["metadata"] = serde_json::json!({ "resourceVersion": "" });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_of_the_gets_the_tests_poll() {
        let path = |args: &[&str]| ApiPath::of(args).map(|p| (p.path, p.list));
        assert_eq!(
            path(&["get", "networktuning", "edge"]),
            Some((
                "/apis/hoststack.dev/v1alpha1/networktunings/edge".into(),
                false
            ))
        );
        assert_eq!(
            path(&["get", "nodetuning"]),
            Some(("/apis/hoststack.dev/v1alpha1/nodetunings".into(), true))
        );
        assert_eq!(
            path(&["get", "pods", "-n", "hs", "-l", "app=hoststack-agent,tier in (a)"]),
            Some((
                "/api/v1/namespaces/hs/pods?labelSelector=app%3Dhoststack-agent%2Ctier%20in%20%28a%29"
                    .into(),
                true
            ))
        );
        assert_eq!(
            path(&["get", "deployment", "-n", "hs", "hoststack-operator"]),
            Some((
                "/apis/apps/v1/namespaces/hs/deployments/hoststack-operator".into(),
                false
            ))
        );
    }

    #[test]
    fn what_the_reader_does_not_know_goes_to_kubectl() {
        for args in [
            &["get", "configmap", "x"][..],
            &["get", "node", "a", "b"],
            &["get", "node", "a", "-o", "yaml"],
            &["get", "nodes", "--show-labels"],
            &["get", "networktuning", "-n", "x"],
            &["get", "pods", "p", "-l", "a=b"],
            &["get", "pods", "-n"],
            &["describe", "node", "a"],
        ] {
            assert_eq!(ApiPath::of(args), None, "{args:?}");
        }
    }

    #[test]
    fn a_list_reads_as_kubectl_prints_it() {
        let mut list = serde_json::json!({
            "kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "7"},
            "items": [{"metadata": {"name": "a"}}],
        });
        as_kubectl_list(&mut list);
        assert_eq!(list["kind"], "List");
        assert_eq!(list["items"][0]["kind"], "Pod");
        assert_eq!(list["items"][0]["apiVersion"], "v1");
        assert_eq!(list["items"][0]["metadata"]["name"], "a");
    }
}
