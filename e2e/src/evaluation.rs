//! The evaluation's real link on a VM node (docs/evaluation.md): a lab whose only node is a
//! VM (no operator, no agents), in whose guest — a kernel with netem, which this machine
//! lacks — `userstack-eval link` runs the rows between Linux's TCP and the runner
//! `hoststack-userstack`, both the host's builds seen through the guest's 9p chroot. The
//! measurements come back through the node's share.

use crate::{Error, Lab, LabConfig, NodeSpec, Result};
use hoststack_runner_api::IdlePolicy;
use std::time::Duration;
use userstack_eval::report::{Measurement, Pairing};

/// The VM node's name.
pub const NODE: &str = "vm-eval";
/// The guest's time to build and remove one run's link and start its ends, beyond the run.
const PER_RUN_OVERHEAD: Duration = Duration::from_secs(60);

/// What to run.
#[derive(Clone, Debug)]
pub struct Evaluation {
    /// Row labels (`userstack_eval::rows`); empty: every row.
    pub rows: Vec<String>,
    /// Pairings; empty: all three.
    pub pairings: Vec<Pairing>,
    /// Each run, warm-up included.
    pub duration: Duration,
    /// The start of each run left out of the figures.
    pub warmup: Duration,
    /// A guest core kept busy by a spinning thread during every run (`userstack-eval link
    /// --spin-core`).
    pub spin_core: Option<u32>,
    /// Runs of every row and pairing, in interleaved rounds (at least 1).
    pub repeat: u32,
    /// Keep the kernel's packet work off the runner's core in every pairing (`userstack-eval
    /// link --steer`).
    pub steer: bool,
    /// Add to each row a run of Linux → Linux with the runner's core kept busy
    /// (`userstack-eval link --control`).
    pub control: bool,
    /// Whether the runner's shard sleeps when idle or polls without pause (`userstack-eval
    /// link --runner-idle`).
    pub runner_idle: IdlePolicy,
}

/// Boots a lab with one VM node, runs `evaluation` in its guest and returns the measurements;
/// the lab is gone when it returns, whatever happened.
pub fn on_vm(evaluation: &Evaluation) -> Result<Vec<Measurement>> {
    let mut config = LabConfig::with_nodes(0);
    config.nodes.push(NodeSpec::vm(NODE));
    config.start_operator = false;
    config.start_agents = false;
    let lab = Lab::start(config)?;
    let measured = in_guest(&lab, evaluation);
    let stopped = lab.stop();
    let measurements = measured?;
    stopped?;
    Ok(measurements)
}

/// Runs `evaluation` in the guest of `lab`'s VM node [`NODE`].
pub fn in_guest(lab: &Lab, evaluation: &Evaluation) -> Result<Vec<Measurement>> {
    for binary in [lab.eval_binary(), lab.userstack_binary()] {
        if !binary.is_file() {
            return Err(Error::Setup(format!(
                "{} is missing: run `cargo build -p userstack-eval -p userstack-runner --bins`",
                binary.display()
            )));
        }
    }
    let vm = lab.vm(NODE);
    let out = vm.share().join("evaluation.json");
    let rows = if evaluation.rows.is_empty() {
        userstack_eval::rows::ROWS.len()
    } else {
        evaluation.rows.len()
    };
    let pairings = if evaluation.pairings.is_empty() {
        Pairing::ALL.len()
    } else {
        evaluation.pairings.len()
    };
    let runs =
        (rows * (pairings + usize::from(evaluation.control))) as u32 * evaluation.repeat.max(1);
    let mut script = format!(
        "{} link --runner {} --out {} --seconds {} --warmup {}",
        lab.eval_binary().display(),
        lab.userstack_binary().display(),
        out.display(),
        evaluation.duration.as_secs_f64(),
        evaluation.warmup.as_secs_f64()
    );
    if !evaluation.rows.is_empty() {
        script.push_str(&format!(" --rows '{}'", evaluation.rows.join(";")));
    }
    if !evaluation.pairings.is_empty() {
        let names: Vec<&str> = evaluation.pairings.iter().map(|p| p.as_str()).collect();
        script.push_str(&format!(" --pairings {}", names.join(",")));
    }
    if let Some(core) = evaluation.spin_core {
        script.push_str(&format!(" --spin-core {core}"));
    }
    script.push_str(&format!(" --repeat {}", evaluation.repeat.max(1)));
    script.push_str(if evaluation.steer {
        " --steer on"
    } else {
        " --steer off"
    });
    if evaluation.runner_idle == IdlePolicy::Spin {
        script.push_str(" --runner-idle spin");
    }
    if evaluation.control {
        script.push_str(" --control on");
    }
    let budget = (evaluation.duration + PER_RUN_OVERHEAD) * runs;
    let output = vm.exec_with_budget(&script, budget);
    if !output.success() {
        return Err(Error::Setup(format!(
            "userstack-eval link in the guest failed: {}\n{}",
            output.stderr.trim(),
            output.stdout.trim()
        )));
    }
    eprint!("{}", output.stderr);
    let text = std::fs::read_to_string(&out)
        .map_err(|e| Error::io(format!("reading {}", out.display()), e))?;
    serde_json::from_str(&text).map_err(|e| Error::Setup(format!("{}: {e}", out.display())))
}
