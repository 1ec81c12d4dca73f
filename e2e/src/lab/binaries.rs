//! Where the lab finds its programs: the control plane (cached outside the repo by
//! scripts/build-control-plane.sh) and the workspace's own binaries (the cargo target dir).
//! The lab's agent is built with the test hooks (the `test-hooks` feature of hoststack-agent:
//! `--step-delay`, the DPDK unbind pause), which the tests use and a user's build lacks.

use crate::{command, Error, Result};
use std::path::{Path, PathBuf};

/// The cargo feature that gives the agent its test hooks.
const AGENT_TEST_HOOKS: &str = "hoststack-agent/test-hooks";

/// Default directory of the control-plane binaries.
const CONTROL_PLANE_DEFAULT: &str = "/var/cache/hoststack/bin";

/// Absolute paths of every program the lab runs.
#[derive(Clone, Debug)]
pub(crate) struct Binaries {
    pub etcd: PathBuf,
    pub kube_apiserver: PathBuf,
    pub kubectl: PathBuf,
    pub helm: PathBuf,
    pub operator: PathBuf,
    pub agent: PathBuf,
    pub plugin: PathBuf,
    /// The user-space stack's runner, which the agents start for `userspaceStack`.
    pub userstack: PathBuf,
    /// Many agents in one process, for scale runs (`hoststack-lab scale`).
    pub fleet: PathBuf,
    /// The evaluation of the user-space stack (`hoststack-lab evaluate`).
    pub eval: PathBuf,
}

impl Binaries {
    /// Locates the control plane (env `HOSTSTACK_CONTROL_PLANE_BIN`, else
    /// /var/cache/hoststack/bin) and the workspace binaries (env `HOSTSTACK_BIN_DIR`, else the
    /// directory of the running executable, leaving `deps/`). When the workspace binaries are
    /// taken from the target dir and `HOSTSTACK_LAB_BUILD` is not `0`, runs `cargo build` for
    /// the operator, agent (with its test hooks) and kubectl plugin first, so a test never runs
    /// stale binaries; an agent without the test hooks is refused with the command that builds
    /// one. `workload`: whether operator and agent are needed at all.
    pub fn locate(workload: bool) -> Result<Binaries> {
        let cp = control_plane_dir();
        let explicit = std::env::var_os("HOSTSTACK_BIN_DIR").map(PathBuf::from);
        let bin_dir = match &explicit {
            Some(dir) => dir.clone(),
            None => target_bin_dir()?,
        };
        let bins = Binaries {
            etcd: cp.join("etcd"),
            kube_apiserver: cp.join("kube-apiserver"),
            kubectl: cp.join("kubectl"),
            helm: cp.join("helm"),
            operator: bin_dir.join("hoststack-operator"),
            agent: bin_dir.join("hoststack-agent"),
            plugin: bin_dir.join("kubectl-hoststack"),
            userstack: bin_dir.join("hoststack-userstack"),
            fleet: bin_dir.join("hoststack-fleet"),
            eval: bin_dir.join("userstack-eval"),
        };
        for path in [&bins.etcd, &bins.kube_apiserver, &bins.kubectl, &bins.helm] {
            if !is_executable(path) {
                return Err(Error::Setup(format!(
                    "{} is missing: run scripts/setup.sh (or scripts/build-control-plane.sh), \
                     or point HOSTSTACK_CONTROL_PLANE_BIN at a directory with etcd, \
                     kube-apiserver, kubectl and helm",
                    path.display()
                )));
            }
        }
        if workload {
            let build = std::env::var("HOSTSTACK_LAB_BUILD").map_or(true, |v| v != "0");
            if explicit.is_none() && build {
                cargo_build(&bin_dir)?;
            }
            for path in [
                &bins.operator,
                &bins.agent,
                &bins.plugin,
                &bins.userstack,
                &bins.fleet,
            ] {
                if !is_executable(path) {
                    return Err(Error::Setup(format!(
                        "{} is missing: run `cargo build --workspace --bins` (scripts/setup.sh \
                         does), or set HOSTSTACK_BIN_DIR",
                        path.display()
                    )));
                }
            }
            require_test_hooks(&bins.agent)?;
        }
        Ok(bins)
    }
}

/// The directory of the control-plane binaries (etcd, kube-apiserver, kubectl, helm, the
/// kubelet's set): env `HOSTSTACK_CONTROL_PLANE_BIN`, else /var/cache/hoststack/bin.
pub fn control_plane_dir() -> PathBuf {
    std::env::var_os("HOSTSTACK_CONTROL_PLANE_BIN")
        .map_or_else(|| PathBuf::from(CONTROL_PLANE_DEFAULT), PathBuf::from)
}

/// The repository root: env `HOSTSTACK_REPO_ROOT`, else the parent of this crate's manifest
/// directory.
pub(crate) fn repo_root() -> PathBuf {
    std::env::var_os("HOSTSTACK_REPO_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .parent()
                .expect("e2e/ has a parent")
                .to_path_buf()
        })
}

/// target/<profile> of the running executable (test binaries live in target/<profile>/deps).
fn target_bin_dir() -> Result<PathBuf> {
    let exe = std::env::current_exe().map_err(|e| Error::io("locating the running binary", e))?;
    let mut dir = exe
        .parent()
        .ok_or_else(|| Error::Setup(format!("{} has no parent", exe.display())))?
        .to_path_buf();
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.pop();
    }
    Ok(dir)
}

/// Brings the operator, agent, kubectl-plugin and user-space stack binaries in `bin_dir` (a
/// cargo target profile dir) up to date with the sources.
fn cargo_build(bin_dir: &Path) -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let mut build = command::cmd(
        &cargo,
        &[
            "build",
            "--quiet",
            "-p",
            "hoststack-operator",
            "-p",
            "hoststack-agent",
            "-p",
            "kubectl-hoststack",
            "-p",
            "userstack-runner",
            "-p",
            "hoststack-fleet",
            "-p",
            "userstack-eval",
            "--bins",
            "--features",
            AGENT_TEST_HOOKS,
        ],
    );
    if bin_dir.file_name().is_some_and(|n| n == "release") {
        build.arg("--release");
    }
    if let Some(target) = bin_dir.parent() {
        build.env("CARGO_TARGET_DIR", target);
    }
    build.current_dir(repo_root());
    command::run(&mut build, None).map(drop)
}

/// Fails unless `agent` was built with [`AGENT_TEST_HOOKS`]: its `--help` lists `--step-delay`.
/// (`cargo test` of the workspace without the feature replaces target/debug/hoststack-agent
/// with an agent that has none.)
fn require_test_hooks(agent: &Path) -> Result<()> {
    let help = command::run(
        &mut command::cmd(&agent.display().to_string(), &["--help"]),
        None,
    )?;
    if help.contains("--step-delay") {
        return Ok(());
    }
    Err(Error::Setup(format!(
        "{} was built without its test hooks, which the lab's tests use: run `cargo build \
         --workspace --bins --features {AGENT_TEST_HOOKS}` (scripts/setup.sh does)",
        agent.display()
    )))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}
