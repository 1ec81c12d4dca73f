//! The command line: `kubectl hoststack <command> <tuning> [flags]`.

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Watch and steer hoststack rollouts: a NetworkTuning's waves, nodes and host settings, and
/// promote, pause, resume, abort and undo.
///
/// Exit codes: 0 done; 1 the cluster could not be reached or refused, or the request does not
/// fit the rollout's state; 2 bad command line; 3 no such tuning or revision; 4 no permission.
#[derive(Debug, Parser)]
#[command(name = "kubectl-hoststack", bin_name = "kubectl hoststack", version)]
pub struct Cli {
    /// Where to connect.
    #[command(flatten)]
    pub connection: Connection,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The usual kubectl connection flags.
#[derive(Debug, Args)]
pub struct Connection {
    /// Path to the kubeconfig file (default: the files in $KUBECONFIG, merged, then
    /// ~/.kube/config).
    #[arg(long, global = true)]
    pub kubeconfig: Option<std::path::PathBuf>,
    /// The kubeconfig context to use (default: its current context).
    #[arg(long, global = true)]
    pub context: Option<String>,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Show a tuning's rollout: phase, revisions, and waves → nodes → host settings, with each
    /// wave's analysis against the baseline.
    Get(Get),
    /// Promote the wave in flight (or `--wave N`) past its manual gate or inconclusive analysis.
    Promote(Promote),
    /// Hold the rollout where it is (sets spec.rollout.paused).
    Pause(Target),
    /// Let a paused rollout go on (clears spec.rollout.paused).
    Resume(Target),
    /// Roll the rollout in flight back to the stable revision now.
    Abort(Target),
    /// Put the previous revision's node config (from the revision history) back into the
    /// tuning's spec; the operator rolls it out like any change.
    Undo(Undo),
}

/// A command that acts on one tuning.
#[derive(Debug, Args)]
pub struct Target {
    /// The NetworkTuning's name.
    pub tuning: String,
}

/// `get`'s arguments.
#[derive(Debug, Args)]
pub struct Get {
    /// The NetworkTuning's name.
    pub tuning: String,
    /// Print the tuning and its nodes' NodeTunings as a List, for scripts.
    #[arg(short, long, value_enum)]
    pub output: Option<Output>,
    /// Print again whenever the tuning or one of its nodes changes, until interrupted.
    #[arg(short, long)]
    pub watch: bool,
}

/// Machine-readable formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// JSON.
    Json,
    /// YAML.
    Yaml,
}

/// `promote`'s arguments.
#[derive(Debug, Args)]
pub struct Promote {
    /// The NetworkTuning's name.
    pub tuning: String,
    /// The wave to promote (0 is the canary); default: the wave in flight.
    #[arg(long)]
    pub wave: Option<u32>,
}

/// `undo`'s arguments.
#[derive(Debug, Args)]
pub struct Undo {
    /// The NetworkTuning's name.
    pub tuning: String,
    /// Go back to this revision instead of the previous one.
    #[arg(long)]
    pub to_revision: Option<String>,
    /// The namespace of the revision history (the operator's --namespace).
    #[arg(short, long, default_value = "hoststack-system")]
    pub namespace: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent_and_parses() {
        Cli::command().debug_assert();
        let cli = Cli::try_parse_from([
            "kubectl-hoststack",
            "promote",
            "edge",
            "--wave",
            "2",
            "--context",
            "lab",
        ])
        .unwrap();
        assert_eq!(cli.connection.context.as_deref(), Some("lab"));
        assert!(matches!(
            cli.command,
            Command::Promote(Promote { wave: Some(2), .. })
        ));
        let cli =
            Cli::try_parse_from(["kubectl-hoststack", "get", "edge", "-o", "yaml", "-w"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Get(Get {
                output: Some(Output::Yaml),
                watch: true,
                ..
            })
        ));
        let e = Cli::try_parse_from(["kubectl-hoststack", "get"]).unwrap_err();
        assert_eq!(e.exit_code(), crate::error::EXIT_USAGE as i32);
        let e = Cli::try_parse_from(["kubectl-hoststack", "get", "edge", "-o", "xml"]).unwrap_err();
        assert_eq!(e.exit_code(), crate::error::EXIT_USAGE as i32);
    }
}
