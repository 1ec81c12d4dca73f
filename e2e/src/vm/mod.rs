//! VM nodes: a lab node that is a qemu virtual machine with real PCI devices, MSI-X
//! interrupts, two NUMA nodes and an emulated Intel IOMMU, so that the agent's host appliers
//! (hugepages per NUMA node, NIC channels and rings, IRQ affinity, DPDK binding to vfio-pci)
//! meet a real kernel and real devices. See docs/vm-node.md.
//!
//! The guest boots Debian's kernel ([`kernel`]) with an initramfs the lab builds
//! ([`initramfs`]), mounts the host's root read-only over 9p and runs the host's agent binary
//! in a chroot of it, with the same flags as on a process node. Its management NIC carries
//! the node's address (198.18.k.(10+i)) and its default route via the lab bridge; its data
//! NIC (`eth1`, [`DATA_PCI`]) has 4 queue pairs and no address. The node's writable share
//! (`<lab>/nodes/<node>/vm/`) holds the agent's launcher, its log and the command channel
//! ([`channel`]) through which tests run commands in the guest.

mod channel;
mod initramfs;
mod kernel;
mod progress;
mod qemu;
mod vcpus;
mod wiring;

pub use channel::GuestOutput;
pub use progress::{Exhausted, SILENCE, WALL_CLOCK_CAP};
pub use qemu::{DATA_PCI, MGMT_PCI};

use crate::process::{tail, Managed};
use crate::{Error, Result};
use channel::{Channel, Shell};
use progress::Heartbeat;
use std::io::{Read, Write};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The management NIC's name in the guest.
pub const MGMT_IF: &str = "eth0";
/// The data NIC's name in the guest.
pub const DATA_IF: &str = "eth1";
/// The agent's `--state-dir` in the guest: the share's [`SHARE_STATE_DIR`], bind-mounted, so
/// that the journal outlives a reboot as it does on a node's disk.
pub const GUEST_STATE_DIR: &str = "/run/hoststack/state";
/// The agent's state directory in the node's share (`<lab>/nodes/<node>/vm/state` on the host).
const SHARE_STATE_DIR: &str = "state";
/// The node's share in its node directory.
const SHARE: &str = "vm";
/// The agent's `--bpffs-root` in the guest (the guest's own bpffs).
pub const GUEST_BPFFS_ROOT: &str = "/sys/fs/bpf/hoststack";
/// The agent's pid file in the guest.
const AGENT_PID: &str = "/run/hoststack/agent.pid";
/// The emulator.
const QEMU: &str = "qemu-system-x86_64";
/// How much of the guest's progress a guest command may take by default (TCG is slow; see
/// [`progress`]).
const EXEC_BUDGET: Duration = Duration::from_secs(120);
/// How long the guest gets to stop its agent and power off before qemu is killed.
const POWER_OFF_GRACE: Duration = Duration::from_secs(15);
/// How long listing the guest's processes may take.
const PROCESSES_TIMEOUT: Duration = Duration::from_secs(20);
/// Busybox script: pid, state, command line and (unless R or S) the kernel stack of every process.
const GUEST_PROCESSES: &str = r#"for d in /proc/[0-9]*; do
    st=$(sed -n 's/^State:[[:space:]]*//p' $d/status 2>/dev/null)
    echo "${d#/proc/} $st $(tr '\0' ' ' < $d/cmdline 2>/dev/null | cut -c1-160)"
    case $st in R*|S*) ;; *) sed 's/^/    /' $d/stack 2>/dev/null ;; esac
done
"#;

/// How the agent is started inside the guest.
#[derive(Clone, Debug)]
pub(crate) struct AgentLaunch {
    /// The agent binary (a host path, the same inside the chroot).
    pub program: PathBuf,
    /// Its flags.
    pub args: Vec<String>,
    /// Its environment.
    pub env: Vec<(String, String)>,
}

/// Where a VM node sits in the lab.
pub(crate) struct Placement<'a> {
    /// The lab directory.
    pub lab_dir: &'a Path,
    /// The lab index k.
    pub index: u8,
    /// The node's position i in the lab's node list.
    pub position: usize,
    /// The node name.
    pub node: &'a str,
    /// The node's network namespace.
    pub netns: &'a str,
    /// The management NIC's address.
    pub ip: Ipv4Addr,
    /// The lab bridge's address (default route, API server).
    pub gateway: Ipv4Addr,
}

/// Why a guest did not come up.
#[derive(Debug)]
pub(crate) enum BootFailure {
    /// qemu exited first; the message has the console's tail.
    Exited(String),
    /// The timeout passed with qemu running; the message has the console's tail and where the
    /// vCPUs are.
    NotReady(String),
}

impl From<BootFailure> for Error {
    fn from(failure: BootFailure) -> Error {
        match failure {
            BootFailure::Exited(why) | BootFailure::NotReady(why) => Error::Setup(why),
        }
    }
}

/// A VM node: its files, its command channel and what it took to start.
#[derive(Debug)]
pub struct Vm {
    node: String,
    netns: String,
    share: PathBuf,
    console_log: PathBuf,
    monitor: PathBuf,
    heartbeat: Heartbeat,
    kernel_release: String,
    kallsyms: PathBuf,
    qemu_args: Vec<String>,
    channel: Channel,
    prepared_in: Duration,
    booted_in: OnceLock<Duration>,
}

impl Vm {
    /// Fetches (or takes from the cache) the kernel, builds the initramfs, wires the node's
    /// namespace and writes the share (config.env, agent.sh). `agent`: `None` boots the
    /// guest without starting an agent.
    pub(crate) fn prepare(place: &Placement<'_>, agent: Option<&AgentLaunch>) -> Result<Vm> {
        let started = Instant::now();
        let kernel = kernel::ensure()?;
        let node_dir = place.lab_dir.join("nodes").join(place.node);
        let share = node_dir.join(SHARE);
        let heartbeat = Heartbeat::in_share(&share);
        let channel = Channel::create(share.join("cmd"), heartbeat.clone())?;
        let monitor = node_dir.join("monitor.sock");
        let initramfs = node_dir.join("initramfs.cpio");
        initramfs::build(&kernel, &initramfs)?;
        let console_log = place
            .lab_dir
            .join("logs")
            .join(format!("console-{}.log", place.node));
        let mac = |kind: u8| {
            format!(
                "52:54:00:{kind:02x}:{:02x}:{:02x}",
                place.index,
                u8::try_from(place.position).unwrap_or(u8::MAX)
            )
        };
        let spec = qemu::QemuSpec {
            kernel: kernel.image.clone(),
            initramfs,
            console_log: console_log.clone(),
            monitor: monitor.clone(),
            share: share.clone(),
            mgmt_mac: mac(0x12),
            data_mac: mac(0x13),
        };
        let config = format!(
            "MGMT_MAC={}\nDATA_MAC={}\nMGMT_ADDR={}/24\nGATEWAY={}\nHOST_SHARE={}\nSTATE_DIR={}\n",
            spec.mgmt_mac,
            spec.data_mac,
            place.ip,
            place.gateway,
            quote(&share.display().to_string()),
            quote(GUEST_STATE_DIR)
        );
        write(&share.join("config.env"), &config)?;
        if let Some(agent) = agent {
            write(
                &share.join("agent.sh"),
                &agent_script(place.node, &share, agent),
            )?;
        }
        wiring::wire(place.netns)?;
        Ok(Vm {
            node: place.node.to_string(),
            netns: place.netns.to_string(),
            share,
            console_log,
            monitor,
            heartbeat,
            kernel_release: kernel.release,
            kallsyms: kernel.kallsyms,
            qemu_args: qemu::args(&spec),
            channel,
            prepared_in: started.elapsed(),
            booted_in: OnceLock::new(),
        })
    }

    /// The command that starts qemu inside the node's namespace: `ip` and its arguments.
    pub(crate) fn launch_args(&self) -> Vec<String> {
        let mut args = vec![
            "netns".into(),
            "exec".into(),
            self.netns.clone(),
            QEMU.into(),
        ];
        args.extend(self.qemu_args.iter().cloned());
        args
    }

    /// The node this VM is.
    pub(crate) fn node(&self) -> &str {
        &self.node
    }

    /// The name of the lab process that runs qemu.
    pub(crate) fn process_name(&self) -> String {
        format!("vm {}", self.node)
    }

    /// Waits until the guest has written `ready` (modules loaded, shares mounted, NICs up);
    /// fails early when `exited` reports qemu's exit status.
    pub(crate) fn await_boot(
        &self,
        launched: Instant,
        timeout: Duration,
        mut exited: impl FnMut() -> Option<String>,
    ) -> std::result::Result<Duration, BootFailure> {
        let ready = self.share.join("ready");
        let deadline = launched + timeout;
        while !ready.exists() {
            if let Some(status) = exited() {
                return Err(BootFailure::Exited(format!(
                    "qemu of VM node {} exited ({status}) before the guest was ready; console \
                     ({}):\n{}",
                    self.node,
                    self.console_log.display(),
                    tail(&self.console_log, 40)
                )));
            }
            if Instant::now() >= deadline {
                return Err(BootFailure::NotReady(format!(
                    "VM node {} was not ready after {timeout:?}; console ({}):\n{}\n{}",
                    self.node,
                    self.console_log.display(),
                    tail(&self.console_log, 40),
                    self.vcpu_places()
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let took = launched.elapsed();
        let _ = self.booted_in.set(took);
        Ok(took)
    }

    /// Where the guest's vCPUs are ([`vcpus`]): one line each, its instruction pointer named
    /// by the kernel's symbols ([`Vm::keep_kallsyms`]) once a guest has listed them, or why
    /// the registers could not be read.
    fn vcpu_places(&self) -> String {
        match self.monitor_command("info registers -a") {
            Ok(registers) => {
                let symbols = std::fs::read_to_string(&self.kallsyms).ok();
                format!(
                    "the guest's vCPUs (info registers -a; symbols: {}):\n{}",
                    if symbols.is_some() {
                        self.kallsyms.display().to_string()
                    } else {
                        "none listed yet".to_string()
                    },
                    vcpus::describe(&vcpus::parse(&registers), symbols.as_deref())
                )
            }
            Err(e) => format!("(the monitor did not answer info registers: {e})"),
        }
    }

    /// Keeps the kernel's text symbols, as this guest lists them in /proc/kallsyms, in the
    /// kernel's cache, unless a guest of the same kernel did so before: the guest boots with
    /// `nokaslr`, so they name the vCPUs' places at every later boot, including one that does
    /// not come up ([`Vm::vcpu_places`]).
    pub(crate) fn keep_kallsyms(&self) -> Result<()> {
        if self.kallsyms.exists() {
            return Ok(());
        }
        let listed = self.channel.run(
            "grep -E '^[0-9a-f]+ [tT] ' /proc/kallsyms | grep -v '\\['",
            Shell::Busybox,
            EXEC_BUDGET,
        )?;
        // Addresses read as zeros where the kernel hides them (kptr_restrict).
        if !listed.success()
            || !listed
                .stdout
                .lines()
                .any(|l| !l.starts_with("0000000000000000"))
        {
            return Err(Error::Setup(format!(
                "VM node {} listed no kernel symbols' addresses (exit {}): {}",
                self.node, listed.status, listed.stderr
            )));
        }
        // Written beside and renamed, so that a lab reading it never sees half of it.
        let staged = self
            .kallsyms
            .with_extension(format!("{}.tmp", std::process::id()));
        write(&staged, &listed.stdout)?;
        std::fs::rename(&staged, &self.kallsyms)
            .map_err(|e| Error::io(format!("renaming {}", staged.display()), e))
    }

    /// Forgets the guest's last boot after its power was cut: its `ready` mark, its heartbeat
    /// and the requests it had not answered, so that [`Vm::await_boot`] waits for the next boot
    /// and the next runner starts from an empty channel.
    pub(crate) fn forget_boot(&self) -> Result<()> {
        for file in [self.share.join("ready"), self.share.join("heartbeat")] {
            match std::fs::remove_file(&file) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(Error::io(format!("removing {}", file.display()), e))
                }
                _ => {}
            }
        }
        self.channel.clear()
    }

    /// Asks the guest to stop its agent (SIGTERM, 5 s) and power off, waits for qemu to exit
    /// (killing it after 15 s) and deletes the taps; the failures.
    pub(crate) fn power_off(&self, qemu: Option<Managed>) -> Vec<String> {
        let mut errors = Vec::new();
        if let Some(mut qemu) = qemu {
            if qemu.exited().is_none() {
                let script = format!(
                    "p=$(cat /host{AGENT_PID} 2>/dev/null) && kill -TERM \"$p\" 2>/dev/null\n\
                     i=0; while [ -n \"$p\" ] && [ $i -lt 25 ] && kill -0 \"$p\" 2>/dev/null; \
                     do sleep 0.2; i=$((i+1)); done\n\
                     poweroff -f\n"
                );
                let asked = self.channel.submit(&script, Shell::Busybox).is_ok();
                if !asked || qemu.wait_timeout(POWER_OFF_GRACE).is_none() {
                    if let Err(e) = qemu.kill() {
                        errors.push(format!("killing qemu of {}: {e}", self.node));
                    }
                }
            }
        }
        errors.extend(wiring::unwire(&self.netns));
        errors
    }

    // ---- What tests use ----------------------------------------------------------------

    /// Runs `script` with the host's /bin/sh in the guest's chroot of the host root (the
    /// host's tools on the guest's kernel); panics when the channel fails, when the guest stops
    /// answering, or after 120 s of the guest's progress ([`progress`]).
    pub fn exec(&self, script: &str) -> GuestOutput {
        self.exec_with_budget(script, EXEC_BUDGET)
    }

    /// [`Vm::exec`] with another budget (e.g. for dpdk-testpmd).
    pub fn exec_with_budget(&self, script: &str, budget: Duration) -> GuestOutput {
        self.channel
            .run(script, Shell::HostTools, budget)
            .unwrap_or_else(|e| {
                panic!(
                    "running {script:?} in VM node {}: {e}\n{}",
                    self.node,
                    self.diagnostics()
                )
            })
    }

    /// Polls `check` every 250 ms until it returns `Some`, for as long as `budget`'s worth of the
    /// guest's progress lasts ([`progress`]): a guest slowed down by a busy host gets more wall
    /// time, and one that stops answering ends the wait at once.
    pub fn wait_for<T>(
        &self,
        budget: Duration,
        mut check: impl FnMut() -> Option<T>,
    ) -> std::result::Result<T, Exhausted> {
        let mut progress = self.heartbeat.budget(budget);
        loop {
            if let Some(value) = check() {
                return Ok(value);
            }
            progress.check()?;
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// What to look at when the guest fails a test: the console's tail and [`Vm::guest_state`].
    pub fn diagnostics(&self) -> String {
        format!(
            "console ({}):\n{}\n{}",
            self.console_log.display(),
            tail(&self.console_log, 30),
            self.guest_state()
        )
    }

    /// qemu's translation statistics (`info jit`: a translation cache that fills, or blocks
    /// invalidated by the hundred thousand, slow the guest down) and the guest's processes.
    pub fn guest_state(&self) -> String {
        format!(
            "qemu's translated code (info jit):\n{}\n{}",
            self.monitor_command("info jit")
                .unwrap_or_else(|e| format!("(the monitor did not answer: {e})")),
            self.processes()
        )
    }

    /// Runs one command of qemu's human monitor (its unix socket) and returns what it printed.
    fn monitor_command(&self, command: &str) -> std::io::Result<String> {
        let mut socket = std::os::unix::net::UnixStream::connect(&self.monitor)?;
        socket.set_read_timeout(Some(Duration::from_secs(10)))?;
        let read_prompt = |socket: &mut std::os::unix::net::UnixStream| {
            let mut text = Vec::new();
            let mut byte = [0u8; 1024];
            while !text.ends_with(b"(qemu) ") {
                let n = socket.read(&mut byte)?;
                if n == 0 {
                    break;
                }
                text.extend_from_slice(&byte[..n]);
            }
            Ok::<_, std::io::Error>(String::from_utf8_lossy(&text).into_owned())
        };
        read_prompt(&mut socket)?;
        socket.write_all(format!("{command}\n").as_bytes())?;
        let answer = read_prompt(&mut socket)?;
        // The monitor echoes the command line with terminal escapes; the answer follows it.
        Ok(answer
            .lines()
            .skip(1)
            .filter(|l| !l.starts_with("(qemu)"))
            .map(|l| l.trim_end_matches('\r'))
            .collect::<Vec<_>>()
            .join("\n"))
    }

    /// The guest's processes with their state and, for those not running or sleeping
    /// interruptibly, their kernel stack; read by the initramfs' busybox, outside the chroot, so
    /// that it answers when the chroot's commands hang.
    fn processes(&self) -> String {
        match self
            .channel
            .run(GUEST_PROCESSES, Shell::Busybox, PROCESSES_TIMEOUT)
        {
            Ok(out) => format!("the guest's processes:\n{}{}", out.stdout, out.stderr),
            Err(e) => format!("the guest's processes could not be listed: {e}"),
        }
    }

    /// [`Vm::exec`], returning standard output; panics with standard error unless it exits 0.
    pub fn run(&self, script: &str) -> String {
        let out = self.exec(script);
        assert!(
            out.success(),
            "{script:?} in VM node {} exited {}: {}{}",
            self.node,
            out.status,
            out.stdout,
            out.stderr
        );
        out.stdout
    }

    /// The guest's sysctl `key` (e.g. `net.core.somaxconn`), with runs of whitespace collapsed
    /// to one space, as [`crate::Lab::sysctl`] reads a process node's.
    pub fn sysctl(&self, key: &str) -> String {
        self.run(&format!("cat /proc/sys/{}", key.replace('.', "/")))
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// The driver the guest's PCI device `pci` (e.g. `0000:00:03.0`) is bound to, or `none`.
    pub fn pci_driver(&self, pci: &str) -> String {
        self.run(&format!(
            "readlink /sys/bus/pci/devices/{pci}/driver || echo none"
        ))
        .trim()
        .rsplit('/')
        .next()
        .unwrap_or_default()
        .to_string()
    }

    /// Sends SIGKILL to the guest's agent and waits until it is gone. Panics if it does not
    /// run.
    pub fn kill_agent(&self) {
        self.run(&format!(
            "p=$(cat {AGENT_PID}) && kill -KILL \"$p\" && \
             while kill -0 \"$p\" 2>/dev/null; do sleep 0.1; done"
        ));
    }

    /// Starts the guest's agent with the lab's flags plus `extra` (e.g. `["--resync-interval",
    /// "5s"]`). Panics if it runs already.
    pub fn start_agent(&self, extra: &[&str]) {
        self.start_agent_with_env(&[], extra);
    }

    /// [`Vm::start_agent`] with extra environment variables (e.g. the DPDK applier's
    /// `HOSTSTACK_DPDK_UNBIND_PAUSE` kill-test hook).
    pub fn start_agent_with_env(&self, env: &[(&str, &str)], extra: &[&str]) {
        assert!(
            !self.agent_running(),
            "the agent on {} already runs",
            self.node
        );
        let env: Vec<String> = env
            .iter()
            .map(|(k, v)| format!("{k}={}", quote(v)))
            .collect();
        let extra: Vec<String> = extra.iter().map(|a| quote(a)).collect();
        self.run(&format!(
            "{} setsid /bin/sh {} {} </dev/null >/dev/null 2>&1 &",
            env.join(" "),
            quote(&self.share.join("agent.sh").display().to_string()),
            extra.join(" ")
        ));
    }

    /// Whether the guest's agent runs.
    pub fn agent_running(&self) -> bool {
        self.exec(&format!("kill -0 \"$(cat {AGENT_PID})\" 2>/dev/null"))
            .success()
    }

    /// The serial console's log file (`<lab>/logs/console-<node>.log`).
    pub fn console_log(&self) -> &Path {
        &self.console_log
    }

    /// The node's share, `<lab>/nodes/<node>/vm/`: writable by the guest, and at the same
    /// path inside the guest's chroot.
    pub fn share(&self) -> &Path {
        &self.share
    }

    /// The guest agent's log (`<lab>/nodes/<node>/vm/agent.log`, also linked as
    /// `<lab>/logs/agent-<node>.log`).
    pub fn agent_log(&self) -> PathBuf {
        self.share.join("agent.log")
    }

    /// The guest kernel's release (`6.1.0-57-amd64`).
    pub fn kernel_release(&self) -> &str {
        &self.kernel_release
    }

    /// How long fetching the kernel (or finding it cached), building the initramfs and
    /// wiring the namespace took.
    pub fn prepared_in(&self) -> Duration {
        self.prepared_in
    }

    /// How long from starting qemu until the guest was ready (before the agent starts).
    pub fn booted_in(&self) -> Option<Duration> {
        self.booted_in.get().copied()
    }
}

/// The agent's state directory of the VM node whose node directory is `node_dir`, as the host
/// sees it (the guest's [`GUEST_STATE_DIR`]).
pub(crate) fn host_state_dir(node_dir: &Path) -> PathBuf {
    node_dir.join(SHARE).join(SHARE_STATE_DIR)
}

/// The launcher the guest runs in its chroot: the agent with the lab's flags plus `"$@"`, its
/// pid in /run/hoststack/agent.pid, its output appended to the share's agent.log.
fn agent_script(node: &str, share: &Path, agent: &AgentLaunch) -> String {
    let mut script = format!(
        "#!/bin/sh\n# The hoststack agent of VM node {node}, run by the guest in its chroot of \
         the host root; \"$@\": extra flags.\n\
         export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n"
    );
    for (key, value) in &agent.env {
        script.push_str(&format!("export {key}={}\n", quote(value)));
    }
    script.push_str(&format!(
        "mkdir -p {GUEST_STATE_DIR}\necho $$ > {AGENT_PID}\nexec {}",
        quote(&agent.program.display().to_string())
    ));
    for arg in &agent.args {
        script.push(' ');
        script.push_str(&quote(arg));
    }
    script.push_str(&format!(
        " \"$@\" >> {} 2>&1\n",
        quote(&share.join("agent.log").display().to_string())
    ));
    script
}

/// `s` single-quoted for sh.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(|e| Error::io(format!("writing {}", path.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_launcher_quotes_every_flag_and_keeps_extra_ones() {
        let agent = AgentLaunch {
            program: "/t/hoststack-agent".into(),
            args: vec![
                "--node-name".into(),
                "vm-a".into(),
                "--x".into(),
                "it's".into(),
            ],
            env: vec![("NODE_NAME".into(), "vm-a".into())],
        };
        let script = agent_script("vm-a", Path::new("/lab/nodes/vm-a/vm"), &agent);
        assert!(script.contains("export NODE_NAME='vm-a'\n"));
        assert!(script.contains(
            "exec '/t/hoststack-agent' '--node-name' 'vm-a' '--x' 'it'\\''s' \"$@\" >> \
             '/lab/nodes/vm-a/vm/agent.log' 2>&1\n"
        ));
        assert!(script.contains(&format!("echo $$ > {AGENT_PID}")));
    }
}
