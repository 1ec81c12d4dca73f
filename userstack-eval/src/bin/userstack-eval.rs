//! userstack-eval: the evaluation of userstack against Linux.
//!
//!     userstack-eval sim [--seeds N]
//!     userstack-eval link --runner PATH --out FILE [--seconds S] [--warmup S] [--core N]
//!                         [--rows LABEL;LABEL...] [--pairings NAME,NAME...] [--spin-core N]
//!                         [--repeat N] [--steer on|off] [--control on|off]
//!                         [--runner-idle park|spin]
//!     userstack-eval docs --write DIR [--seeds N] [--link FILE[,FILE...]]
//!
//! `sim` prints the simulator's table (seeds 1..=N, default 5). `link` runs the rows on a
//! real netem link between network namespaces (root, a kernel with netem and XDP: the VM
//! node's guest) in the pairings linux-linux, userstack-linux and linux-userstack (default:
//! all rows, all pairings, 30 s with 10 s of warm-up, the runner on core 1) and writes the
//! measurements as JSON, after each run; `--spin-core N` keeps core N busy with a spinning
//! thread during every run (a control: Linux → Linux without the core the runner takes);
//! `--repeat N` runs every row and pairing N times, in interleaved rounds; `--steer off`
//! lets the kernel process packets on the runner's core too (on by default: every veth's RPS
//! mask leaves that core out, in every pairing); `--control on` adds to each row a run of
//! Linux → Linux with the runner's core kept busy; `--runner-idle spin` makes the runner's
//! shard poll without ever sleeping (default `park`: it sleeps in poll(2) when idle). `docs` writes
//! DIR/evaluation.md and its plots from the simulator and, with `--link`, those measurements
//! (the runs of several files together).

use hoststack_runner_api::IdlePolicy;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;
use userstack_eval::docs;
use userstack_eval::link::{self, Options};
use userstack_eval::report::{Measurement, Pairing};
use userstack_eval::rows::{self, Row, ROWS};

const USAGE: &str = "usage: userstack-eval sim [--seeds N]
       userstack-eval link --runner PATH --out FILE [--seconds S] [--warmup S] [--core N] [--rows LABEL;LABEL...] [--pairings NAME,NAME...] [--spin-core N] [--repeat N] [--steer on|off] [--control on|off] [--runner-idle park|spin]
       userstack-eval docs --write DIR [--seeds N] [--link FILE[,FILE...]]";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("sim") => flags(&args[1..]).and_then(|f| sim_command(&f)),
        Some("link") => flags(&args[1..]).and_then(|f| link_command(&f)),
        Some("docs") => flags(&args[1..]).and_then(|f| docs_command(&f)),
        Some("-h" | "--help") => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        _ => Err(Problem::Usage(
            "a command is needed: sim, link or docs".into(),
        )),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Problem::Usage(problem)) => {
            eprintln!("{problem}\n{USAGE}");
            ExitCode::from(2)
        }
        Err(Problem::Failed(problem)) => {
            eprintln!("userstack-eval: {problem}");
            ExitCode::FAILURE
        }
    }
}

enum Problem {
    Usage(String),
    Failed(String),
}

/// `--flag value` pairs.
struct Flags(Vec<(String, String)>);

fn flags(args: &[String]) -> Result<Flags, Problem> {
    let mut pairs = Vec::new();
    let mut iter = args.iter();
    while let Some(flag) = iter.next() {
        if !flag.starts_with("--") {
            return Err(Problem::Usage(format!("unexpected argument {flag}")));
        }
        let value = iter
            .next()
            .ok_or_else(|| Problem::Usage(format!("{flag} needs a value")))?;
        pairs.push((flag.clone(), value.clone()));
    }
    Ok(Flags(pairs))
}

impl Flags {
    fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .rev()
            .find(|(f, _)| f == name)
            .map(|(_, v)| v.as_str())
    }

    fn only(&self, allowed: &[&str]) -> Result<(), Problem> {
        match self.0.iter().find(|(f, _)| !allowed.contains(&f.as_str())) {
            Some((flag, _)) => Err(Problem::Usage(format!("unknown flag {flag}"))),
            None => Ok(()),
        }
    }

    fn number(&self, name: &str, default: f64) -> Result<f64, Problem> {
        match self.get(name) {
            None => Ok(default),
            Some(v) => v
                .parse::<f64>()
                .ok()
                .filter(|n| *n > 0.0 && n.is_finite())
                .ok_or_else(|| Problem::Usage(format!("{name} {v:?} is not a positive number"))),
        }
    }

    /// An `on`/`off` flag, `default` when absent.
    fn switch(&self, name: &str, default: bool) -> Result<bool, Problem> {
        match self.get(name) {
            None => Ok(default),
            Some("on") => Ok(true),
            Some("off") => Ok(false),
            Some(v) => Err(Problem::Usage(format!("{name} {v:?} is not on or off"))),
        }
    }

    fn seeds(&self) -> Result<u64, Problem> {
        let n = self.number("--seeds", 5.0)?;
        if n.fract() != 0.0 {
            return Err(Problem::Usage("--seeds needs a whole number".into()));
        }
        Ok(n as u64)
    }
}

fn sim_command(flags: &Flags) -> Result<(), Problem> {
    flags.only(&["--seeds"])?;
    print!("{}", docs::sim_table(&docs::simulate(flags.seeds()?)));
    Ok(())
}

fn link_command(flags: &Flags) -> Result<(), Problem> {
    flags.only(&[
        "--runner",
        "--out",
        "--seconds",
        "--warmup",
        "--core",
        "--rows",
        "--pairings",
        "--spin-core",
        "--repeat",
        "--steer",
        "--control",
        "--runner-idle",
    ])?;
    let runner = flags
        .get("--runner")
        .ok_or_else(|| Problem::Usage("--runner is required".into()))?;
    let out = PathBuf::from(
        flags
            .get("--out")
            .ok_or_else(|| Problem::Usage("--out is required".into()))?,
    );
    let chosen: Vec<&Row> = match flags.get("--rows") {
        None => ROWS.iter().collect(),
        Some(labels) => rows::parse_list(labels).map_err(Problem::Usage)?,
    };
    let pairings = match flags.get("--pairings") {
        None => Pairing::ALL.to_vec(),
        Some(names) => Pairing::parse_list(names).map_err(Problem::Usage)?,
    };
    let core = flags.number("--core", 1.0)?;
    let options = Options {
        runner: PathBuf::from(runner),
        duration: Duration::from_secs_f64(flags.number("--seconds", 30.0)?),
        warmup: Duration::from_secs_f64(flags.number("--warmup", 10.0)?),
        core: core as u32,
        spin_core: flags
            .get("--spin-core")
            .map(|v| {
                v.parse()
                    .map_err(|_| Problem::Usage(format!("--spin-core {v:?} is not a core number")))
            })
            .transpose()?,
        steer: flags.switch("--steer", true)?,
        runner_idle: flags
            .get("--runner-idle")
            .map_or(Ok(IdlePolicy::Park), str::parse)
            .map_err(|e| Problem::Usage(format!("--runner-idle {e}")))?,
        dir: out
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
            .to_path_buf(),
    };
    let repeat = flags.number("--repeat", 1.0)?;
    if repeat.fract() != 0.0 {
        return Err(Problem::Usage("--repeat needs a whole number".into()));
    }
    // Each row's runs: its pairings, and with `--control on` Linux → Linux once more with the
    // runner's core kept busy.
    let mut runs: Vec<(Pairing, Option<u32>)> =
        pairings.iter().map(|&p| (p, options.spin_core)).collect();
    if flags.switch("--control", false)? {
        runs.push((Pairing::LinuxToLinux, Some(options.core)));
    }
    let mut measurements = Vec::new();
    // Round after round over every row and pairing, so that each pairing's runs spread over
    // the same stretch of time.
    for (row, &(pairing, spin_core)) in (0..repeat as usize).flat_map(|_| {
        chosen
            .iter()
            .flat_map(|row| runs.iter().map(move |r| (row, r)))
    }) {
        let options = Options {
            spin_core,
            ..options.clone()
        };
        let m = link::measure(row, pairing, &options).map_err(|e| {
            Problem::Failed(format!("{} with {}: {e}", row.label, pairing.as_str()))
        })?;
        let percent =
            |share: Option<f64>| share.map_or("—".into(), |s| format!("{:.1} %", s * 100.0));
        eprintln!(
            "{} | {} | {:.2} Mbit/s | Jain {:.3} | retransmitted/sent {:.2} % | vCPUs busy {:?} | \
             held by the receive window {} | runner busy {} | lost at the runner's queue {:?} | \
             frames' mean wait at the runner {}",
            row.label,
            pairing.as_str(),
            m.goodput_mbps(),
            m.jain(),
            m.retransmitted_per_sent() * 100.0,
            m.load
                .cpu_busy
                .iter()
                .map(|b| (b * 100.0).round())
                .collect::<Vec<_>>(),
            percent(m.load.rwnd_limited),
            percent(m.load.runner_busy),
            m.load.runner_drops.map(|d| d.lost()),
            match (&m.load.runner_rx_wait, &m.load.runner_rx_stamps_unavailable) {
                (_, Some(reason)) => format!("— (no receive stamps: {reason})"),
                (wait, None) => wait
                    .as_ref()
                    .and_then(|w| w.mean_micros())
                    .map_or("—".into(), |us| format!("{us:.0} µs")),
            },
        );
        measurements.push(m);
        write_json(&out, &measurements)?;
    }
    Ok(())
}

fn write_json(path: &Path, measurements: &[Measurement]) -> Result<(), Problem> {
    let text =
        serde_json::to_string_pretty(measurements).map_err(|e| Problem::Failed(e.to_string()))?;
    std::fs::write(path, text + "\n")
        .map_err(|e| Problem::Failed(format!("writing {}: {e}", path.display())))
}

fn docs_command(flags: &Flags) -> Result<(), Problem> {
    flags.only(&["--write", "--seeds", "--link"])?;
    let dir = flags
        .get("--write")
        .ok_or_else(|| Problem::Usage("--write is required".into()))?;
    let seeds = flags.seeds()?;
    let link: Option<Vec<Measurement>> = match flags.get("--link") {
        None => None,
        Some(files) => {
            let mut all = Vec::new();
            for file in files.split(',') {
                let text = std::fs::read_to_string(file)
                    .map_err(|e| Problem::Failed(format!("reading {file}: {e}")))?;
                let runs: Vec<Measurement> = serde_json::from_str(&text)
                    .map_err(|e| Problem::Failed(format!("{file}: {e}")))?;
                all.extend(runs);
            }
            Some(all)
        }
    };
    let mut command = format!("userstack-eval docs --seeds {seeds}");
    if let Some(file) = flags.get("--link") {
        command.push_str(&format!(" --link {file}"));
    }
    command.push_str(&format!(" --write {dir}"));
    let how = format!("`{command}`");
    docs::write(Path::new(dir), seeds, link.as_deref(), &how).map_err(Problem::Failed)
}
