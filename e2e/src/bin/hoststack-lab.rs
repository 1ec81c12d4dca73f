//! `hoststack-lab`: the local lab from the command line.
//!
//! - `hoststack-lab up [--nodes 3]` starts a lab of real nodes (kubelet and containerd in each
//!   node's namespace; node-a and node-b labelled pool=edge, node-c pool=core), installs the
//!   chart with `helm install`, applies examples/, and shows `kubectl get
//!   networktunings,nodetunings` every few seconds until Ctrl-C or SIGTERM, then tears
//!   everything down.
//! - `hoststack-lab up --process-nodes [--vm-nodes 1]`: the faster lab without kubelets (the
//!   operator and agents as processes), with VM node vm-a labelled pool=vm.
//! - `hoststack-lab faults [--schedules 200] [--first-seed 1] [--seed N] [--vm]` runs the fault
//!   campaign (hoststack_e2e::faults) on a lab of four process nodes (`--vm`: three and a VM
//!   node, whose power it cuts): seeded schedules of real
//!   faults while a rollout script runs, the invariants checked over each history; it prints a
//!   line per schedule and the report, and exits 1 when any schedule found something wrong.
//! - `hoststack-lab soak [--minutes 60] [--every 60]` runs the campaign's script over and over
//!   under the faults that leave the operator and agents running, samples their memory and open
//!   descriptors at quiet points, and prints the slopes; it exits 1 on a leak or a failed
//!   schedule.
//! - `hoststack-lab scale --nodes 1000` brings up a control plane with a large cluster's flags,
//!   the operator, N Node objects and a fleet of N real agents in one process
//!   (`hoststack-fleet`), runs the scale scenarios (hoststack_e2e::scale: apply, idle, a judged
//!   rollout with nodes joining and leaving, a regression rolled back, delete), prints the
//!   JSON report and tears everything down. Build it with `--release` for figures that mean
//!   something (docs/operator.md, Scale).
//! - `hoststack-lab evaluate [--seconds 30] [--warmup 10] [--write docs]` runs the evaluation's
//!   rows on a VM node's netem link, Linux's TCP beside the user-space stack
//!   (hoststack_e2e::evaluation, `userstack-eval link` in the guest), keeps the measurements
//!   in `--out` (docs/evaluation/link.json) and with `--write` regenerates
//!   DIR/evaluation.md from them and the simulator (docs/evaluation.md).
//! - `hoststack-lab down [--all]` removes what dead labs left behind (processes, namespaces,
//!   devices, directories); `--all` also stops labs that are still running.

use clap::{Parser, Subcommand};
use hoststack_e2e::{Lab, LabConfig, NodeSpec};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};
use tokio::signal::unix::{signal, SignalKind};

/// The hoststack local lab: a real etcd and kube-apiserver, nodes as network namespaces, the
/// operator and one agent per node.
#[derive(Parser)]
#[command(name = "hoststack-lab", version)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Start a lab, apply examples/, show the tunings until Ctrl-C, then tear it down.
    Up {
        /// Number of nodes (node-a, node-b, ...; the last is pool=core, the others pool=edge).
        #[arg(long, default_value_t = 3)]
        nodes: usize,
        /// Process nodes instead of real ones: Node objects without kubelets, the operator and
        /// agents as plain processes (faster; no images, no Helm).
        #[arg(long)]
        process_nodes: bool,
        /// Number of VM nodes (vm-a, vm-b, ...: qemu guests with an IOMMU, 2 NUMA nodes and a
        /// 4-queue data NIC, pool=vm; see docs/vm-node.md), after the namespace nodes; with
        /// --process-nodes only (default 1 there).
        #[arg(long)]
        vm_nodes: Option<usize>,
        /// Directory of NetworkTuning examples to apply (default: the repository's examples/).
        #[arg(long)]
        examples: Option<PathBuf>,
        /// Seconds between status prints.
        #[arg(long, default_value_t = 5)]
        interval: u64,
    },
    /// Run the fault campaign: seeded schedules of faults while rollouts run, the invariants
    /// checked over each schedule's history.
    Faults {
        /// How many schedules (seeds first-seed, first-seed+1, ...).
        #[arg(long, default_value_t = 200)]
        schedules: u64,
        /// The first seed.
        #[arg(long, default_value_t = 1)]
        first_seed: u64,
        /// Replay this one seed instead (e.g. one a failed run printed).
        #[arg(long, conflicts_with_all = ["schedules", "first_seed"])]
        seed: Option<u64>,
        /// The VM campaign: power cuts of a VM node in its transactions, on three process nodes
        /// and the VM node.
        #[arg(long)]
        vm: bool,
    },
    /// Run the soak: the fault campaign's script over and over, the operator's and agents'
    /// memory and open descriptors sampled at quiet points.
    Soak {
        /// How long.
        #[arg(long, default_value_t = 60)]
        minutes: u64,
        /// Seconds between samples (at least; samples are taken when all is quiet).
        #[arg(long, default_value_t = 60)]
        every: u64,
    },
    /// Run the scale scenarios on a fleet of real agents and print the JSON report.
    Scale {
        /// Nodes in the fleet.
        #[arg(long, default_value_t = 100)]
        nodes: usize,
        /// Nodes joining and leaving during the rollout (default: 10% of the fleet, at most
        /// 100).
        #[arg(long)]
        churn: Option<usize>,
        /// Agents per HTTP/2 connection.
        #[arg(long, default_value_t = 200)]
        agents_per_connection: usize,
        /// The agents' heartbeat interval in seconds.
        #[arg(long, default_value_t = 10)]
        heartbeat_seconds: u64,
        /// Seconds of the idle measurement.
        #[arg(long, default_value_t = 60)]
        idle_seconds: u64,
        /// The tunings' probe timeout in seconds (`probes.timeout`; default: the agent's 5 s).
        #[arg(long, requires = "confirm_timeout_seconds")]
        probe_timeout_seconds: Option<u64>,
        /// The tunings' confirm timeout in seconds (`probes.confirmTimeout`; default: the
        /// agent's 60 s).
        #[arg(long, requires = "probe_timeout_seconds")]
        confirm_timeout_seconds: Option<u64>,
    },
    /// Run the evaluation's rows on a VM node's netem link, Linux's TCP beside the user-space
    /// stack, and regenerate docs/evaluation.md.
    Evaluate(EvaluateArgs),
    /// Remove leftovers of labs whose owner died.
    Down {
        /// Also stop and remove labs that are still running.
        #[arg(long)]
        all: bool,
    },
}

/// `hoststack-lab evaluate`'s arguments.
#[derive(clap::Args)]
struct EvaluateArgs {
    /// Seconds per run, warm-up included.
    #[arg(long, default_value_t = 30)]
    seconds: u64,
    /// Seconds at the start of each run left out of the figures.
    #[arg(long, default_value_t = 10)]
    warmup: u64,
    /// Rows to run, labels separated by ';' (default: every row).
    #[arg(long)]
    rows: Option<String>,
    /// Pairings to run, comma-separated: linux-linux, userstack-linux, linux-userstack
    /// (default: all three).
    #[arg(long)]
    pairings: Option<String>,
    /// Where the measurements are written (JSON).
    #[arg(long, default_value = "docs/evaluation/link.json")]
    out: PathBuf,
    /// Regenerate DIR/evaluation.md and its plots from the measurements and the simulator.
    #[arg(long)]
    write: Option<PathBuf>,
    /// The simulator's seeds for --write.
    #[arg(long, default_value_t = 5)]
    seeds: u64,
    /// Keep this guest core busy with a spinning thread during every run (a control:
    /// Linux → Linux without the core the runner takes).
    #[arg(long)]
    spin_core: Option<u32>,
    /// Run every row and pairing this many times, in interleaved rounds; the tables give
    /// medians and the lowest run.
    #[arg(long, default_value_t = 1)]
    repeat: u32,
    /// Keep the kernel's packet work off the runner's core in every pairing (RPS on every
    /// veth): on or off.
    #[arg(long, default_value = "on", value_parser = ["on", "off"])]
    steer: String,
    /// Add to each row a run of Linux → Linux with the runner's core kept busy (the control
    /// that gives Linux the CPUs the userstack pairings leave it): on or off.
    #[arg(long, default_value = "on", value_parser = ["on", "off"])]
    control: String,
    /// How the runner's shard waits when idle: park (sleep in poll(2), the runner's default)
    /// or spin (poll without pause, so no frame waits for a wake-up).
    #[arg(long, default_value = "park", value_parser = str::parse::<hoststack_runner_api::IdlePolicy>)]
    runner_idle: hoststack_runner_api::IdlePolicy,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Cmd::Up {
            nodes,
            process_nodes,
            vm_nodes,
            examples,
            interval,
        } => up(
            nodes,
            process_nodes,
            vm_nodes,
            examples,
            Duration::from_secs(interval.max(1)),
        ),
        Cmd::Faults {
            schedules,
            first_seed,
            seed,
            vm,
        } => match seed {
            Some(seed) => faults(seed..seed + 1, vm),
            None => faults(first_seed..first_seed.saturating_add(schedules), vm),
        },
        Cmd::Soak { minutes, every } => soak(
            Duration::from_secs(minutes * 60),
            Duration::from_secs(every),
        ),
        Cmd::Scale {
            nodes,
            churn,
            agents_per_connection,
            heartbeat_seconds,
            idle_seconds,
            probe_timeout_seconds,
            confirm_timeout_seconds,
        } => {
            let mut config = hoststack_e2e::scale::ScaleConfig::for_nodes(nodes);
            config.churn = churn.unwrap_or(config.churn);
            config.agents_per_connection = agents_per_connection;
            config.heartbeat_interval = Duration::from_secs(heartbeat_seconds.max(1));
            config.idle = Duration::from_secs(idle_seconds);
            config.probe_timeouts = probe_timeout_seconds
                .zip(confirm_timeout_seconds)
                .map(|(p, c)| (Duration::from_secs(p), Duration::from_secs(c)));
            scale(&config)
        }
        Cmd::Evaluate(args) => evaluate(args),
        Cmd::Down { all } => down(all),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hoststack-lab: {e}");
            ExitCode::FAILURE
        }
    }
}

fn up(
    nodes: usize,
    process_nodes: bool,
    vm_nodes: Option<usize>,
    examples: Option<PathBuf>,
    interval: Duration,
) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    // Catch SIGINT and SIGTERM before starting, so a Ctrl-C during start-up still ends in an
    // orderly teardown.
    let (mut sigint, mut sigterm) = runtime
        .block_on(async {
            Ok::<_, std::io::Error>((
                signal(SignalKind::interrupt())?,
                signal(SignalKind::terminate())?,
            ))
        })
        .map_err(|e| e.to_string())?;

    let started = Instant::now();
    let config = if process_nodes {
        let vm_nodes = vm_nodes.unwrap_or(1);
        eprintln!(
            "hoststack-lab: starting a lab with {nodes} process nodes and {vm_nodes} VM nodes ..."
        );
        let mut config = LabConfig::with_nodes(nodes);
        config
            .nodes
            .extend((0..vm_nodes).map(|i| NodeSpec::vm(vm_node_name(i)).label("pool", "vm")));
        config
    } else {
        if vm_nodes.is_some_and(|n| n > 0) {
            return Err(
                "VM nodes run with --process-nodes only (a real pool is all kubelets)".into(),
            );
        }
        eprintln!("hoststack-lab: starting a lab with {nodes} real (kubelet) nodes ...");
        LabConfig::real_pool(nodes)
    };
    let lab = Lab::start(config).map_err(|e| e.to_string())?;
    if !process_nodes {
        install_chart(&lab)?;
    }
    eprintln!(
        "hoststack-lab: lab {} up in {:.1}s at {} (directory {})",
        lab.index(),
        started.elapsed().as_secs_f64(),
        lab.api_url(),
        lab.dir().display()
    );
    let kubectl_dir = hoststack_e2e::control_plane_dir();
    println!("# Use kubectl against the lab from another shell:");
    println!("export KUBECONFIG={}", lab.kubeconfig().display());
    println!("export PATH={}:$PATH", kubectl_dir.display());
    for node in lab.node_names() {
        if lab.is_vm(&node) {
            let vm = lab.vm(&node);
            println!(
                "#   {node}: VM ({}), kernel {} ready in {:.1}s, booted in {:.1}s; console: less \
                 {}; agent log: {}",
                lab.node_ip(&node),
                vm.kernel_release(),
                vm.prepared_in().as_secs_f64(),
                vm.booted_in().unwrap_or_default().as_secs_f64(),
                vm.console_log().display(),
                vm.agent_log().display()
            );
            continue;
        }
        println!(
            "#   {node}: ip netns exec {} ...   ({})",
            lab.netns(&node),
            lab.node_ip(&node)
        );
    }

    let examples = examples.unwrap_or_else(|| {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("e2e/ has a parent")
            .join("examples")
    });
    apply_examples(&lab, &examples);

    println!("# Showing the tunings every {interval:?}; Ctrl-C tears the lab down.");
    runtime.block_on(async {
        loop {
            show(&lab);
            tokio::select! {
                _ = sigint.recv() => break,
                _ = sigterm.recv() => break,
                _ = tokio::time::sleep(interval) => {}
            }
        }
    });

    eprintln!("hoststack-lab: tearing down ...");
    let stopping = Instant::now();
    let result = lab.stop().map_err(|e| e.to_string());
    eprintln!(
        "hoststack-lab: torn down in {:.1}s",
        stopping.elapsed().as_secs_f64()
    );
    result
}

/// `helm install` of charts/hoststack into the real pool with the lab's image, waiting for the
/// operator.
fn install_chart(lab: &Lab) -> Result<(), String> {
    let installing = Instant::now();
    let values = lab.lab_chart_values("");
    let chart = lab.chart_dir();
    let out = lab.helm(&[
        "install",
        "hoststack",
        &chart.display().to_string(),
        "--namespace",
        hoststack_e2e::NAMESPACE,
        "--create-namespace",
        "--values",
        &values.display().to_string(),
        "--wait",
        "--timeout",
        "300s",
    ]);
    if !out.status.success() {
        return Err(format!(
            "helm install: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    println!("{}", String::from_utf8_lossy(&out.stdout).trim());
    eprintln!(
        "hoststack-lab: chart installed, operator ready in {:.1}s",
        installing.elapsed().as_secs_f64()
    );
    Ok(())
}

/// `kubectl apply` of every YAML file in `dir`, each reported.
fn apply_examples(lab: &Lab, dir: &Path) {
    let mut files: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.extension()
                    .is_some_and(|e| e == "yaml" || e == "yml" || e == "json")
            })
            .collect(),
        Err(e) => {
            eprintln!(
                "hoststack-lab: no examples applied ({}: {e})",
                dir.display()
            );
            return;
        }
    };
    files.sort();
    if files.is_empty() {
        eprintln!("hoststack-lab: {} holds no examples", dir.display());
    }
    for file in files {
        let path = file.display().to_string();
        let out = lab.kubectl(&["apply", "-f", &path]);
        let text = if out.status.success() {
            String::from_utf8_lossy(&out.stdout).into_owned()
        } else {
            format!("FAILED: {}", String::from_utf8_lossy(&out.stderr))
        };
        println!("kubectl apply -f {path}: {}", text.trim());
    }
}

/// Prints the tunings and node tunings.
fn show(lab: &Lab) {
    let out = lab.kubectl(&["get", "networktunings,nodetunings", "-o", "wide"]);
    println!(
        "---- {} ----\n{}{}",
        hms(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs the fault campaign (`vm`: the VM campaign) for `seeds` on a fresh lab and prints its
/// report.
fn faults(seeds: std::ops::Range<u64>, vm: bool) -> Result<(), String> {
    use hoststack_e2e::faults::campaign::{self, KINDS, SCRIPT, VM_KINDS};
    use hoststack_e2e::faults::schedule::Schedule;
    let (config, kinds) = if vm {
        (campaign::vm_lab_config(), VM_KINDS)
    } else {
        (campaign::lab_config(), KINDS)
    };
    let lab = Lab::start(config).map_err(|e| e.to_string())?;
    let schedules: Vec<Schedule> = seeds
        .map(|seed| Schedule::from_seed(seed, SCRIPT, kinds))
        .collect();
    let report = campaign::run(&lab, &schedules);
    println!("{report}");
    lab.stop().map_err(|e| e.to_string())?;
    let failed = report.failed().len();
    if failed == 0 {
        Ok(())
    } else {
        Err(format!("{failed} schedules found something wrong"))
    }
}

/// Runs the scale scenarios and prints the report.
fn scale(config: &hoststack_e2e::scale::ScaleConfig) -> Result<(), String> {
    let report = hoststack_e2e::scale::run(config).map_err(|e| e.to_string())?;
    println!("{report:#}");
    Ok(())
}

/// Runs the soak for `duration` on a fresh lab and prints its report.
fn soak(duration: Duration, every: Duration) -> Result<(), String> {
    use hoststack_e2e::faults::{campaign, soak};
    let lab = Lab::start(campaign::lab_config()).map_err(|e| e.to_string())?;
    let report = soak::run(&lab, duration, 0, every);
    println!("{report}");
    lab.stop().map_err(|e| e.to_string())?;
    if report.passed() {
        Ok(())
    } else {
        Err("the soak found something wrong".into())
    }
}

fn evaluate(args: EvaluateArgs) -> Result<(), String> {
    use hoststack_e2e::evaluation::{on_vm, Evaluation};
    use userstack_eval::report::Pairing;
    let EvaluateArgs {
        seconds,
        warmup,
        rows,
        pairings,
        out,
        write,
        seeds,
        spin_core,
        repeat,
        steer,
        control,
        runner_idle,
    } = args;
    let (out, write) = (out.as_path(), write.as_deref());
    let rows: Vec<String> = match rows {
        Some(labels) => userstack_eval::rows::parse_list(&labels)
            .map_err(|e| format!("--rows: {e}"))?
            .iter()
            .map(|row| row.label.to_string())
            .collect(),
        None => Vec::new(),
    };
    let pairings = match pairings {
        Some(names) => Pairing::parse_list(&names).map_err(|e| format!("--pairings: {e}"))?,
        None => Vec::new(),
    };
    if seconds <= warmup {
        return Err("--seconds must be longer than --warmup".into());
    }
    let evaluation = Evaluation {
        rows,
        pairings,
        duration: Duration::from_secs(seconds),
        warmup: Duration::from_secs(warmup),
        spin_core,
        repeat,
        steer: steer == "on",
        control: control == "on",
        runner_idle,
    };
    let measurements = on_vm(&evaluation).map_err(|e| e.to_string())?;
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    }
    let text = serde_json::to_string_pretty(&measurements).map_err(|e| e.to_string())?;
    std::fs::write(out, text + "\n").map_err(|e| format!("writing {}: {e}", out.display()))?;
    println!("measurements in {}", out.display());
    if let Some(dir) = write {
        let how = format!(
            "`hoststack-lab evaluate --seconds {seconds} --warmup {warmup} --repeat {repeat} \
             --steer {steer} --control {control} --out {out} --write {dir} --seeds {seeds}` (the real link's measurements are kept in {out}; \
             `userstack-eval docs --seeds {seeds} --link {out} --write {dir}` regenerates this \
             page from them without a VM)",
            out = out.display(),
            dir = dir.display(),
        );
        userstack_eval::docs::write(dir, seeds, Some(&measurements), &how)?;
        println!("wrote {}", dir.join("evaluation.md").display());
    }
    Ok(())
}

fn down(all: bool) -> Result<(), String> {
    let report = hoststack_e2e::sweep(all).map_err(|e| e.to_string())?;
    for dir in &report.removed {
        println!("removed {}", dir.display());
    }
    for k in &report.orphans {
        println!("deleted orphaned namespaces and devices of lab {k}");
    }
    for dir in &report.live {
        println!(
            "left {} alone: its owner still runs (use --all to stop it)",
            dir.display()
        );
    }
    if report.killed > 0 {
        println!("killed {} processes", report.killed);
    }
    if report.removed.is_empty() && report.orphans.is_empty() && report.live.is_empty() {
        println!("nothing to clean up");
    }
    if report.errors.is_empty() {
        Ok(())
    } else {
        Err(report.errors.join("; "))
    }
}

/// vm-a, vm-b, ..., vm-z, vm-26, ...
fn vm_node_name(i: usize) -> String {
    match u8::try_from(i) {
        Ok(i) if i < 26 => format!("vm-{}", char::from(b'a' + i)),
        _ => format!("vm-{i}"),
    }
}

/// The current UTC time as HH:MM:SS.
fn hms() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format!(
        "{:02}:{:02}:{:02} UTC",
        secs / 3600 % 24,
        secs / 60 % 60,
        secs % 60
    )
}
