//! The command line: `kubectl hoststack <command> <tuning> [flags]`.

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Watch and steer hoststack rollouts: a NetworkTuning's waves, nodes and host settings, and
/// promote, pause, resume, abort and undo; status waits for a rollout to end; report draws a
/// rollout over time from Prometheus.
///
/// Exit codes: 0 done; 1 the cluster could not be reached or refused, or the request does not
/// fit the rollout's state; 2 bad command line; 3 no such tuning or revision; 4 no permission;
/// plan only: 5 something would fail on a node, 6 a selected node gave no plan; status only:
/// 10 rolled back, 11 failed, 12 paused, 13 timed out.
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
    /// Wait until the rollout of the tuning's current spec ends, printing a line at each change
    /// of its state, and exit with how it ended: 0 Complete, 10 RolledBack, 11 Failed,
    /// 12 Paused, 13 `--timeout` passed (for CI pipelines).
    Status(Status),
    /// Preview what a tuning (a file, possibly not applied yet, or an existing tuning) would
    /// change on each node it selects: the agents plan it against their hosts, changing
    /// nothing. Exit 5 when something would fail, 6 when a node gave no plan.
    Plan(Plan),
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
    /// Draw the rollout over time from Prometheus: canary against baseline for the retransmit
    /// ratio, SACK recoveries and D-SACKs per 1000 segments, with each wave and the rollback
    /// marked, as an SVG.
    Report(Report),
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
    /// Print again whenever the tuning or one of its nodes changes, until the rollout ends
    /// (Complete, RolledBack, Failed or Paused, other than the ending it started on) or it is
    /// interrupted.
    #[arg(short, long)]
    pub watch: bool,
}

/// `status`'s arguments.
#[derive(Debug, Args)]
pub struct Status {
    /// The NetworkTuning's name.
    pub tuning: String,
    /// Give up after this long (e.g. 90s, 30m, 1h30m) with exit code 13; default: wait until
    /// the rollout ends.
    #[arg(long, value_parser = duration)]
    pub timeout: Option<std::time::Duration>,
}

/// `plan`'s arguments.
#[derive(Debug, Args)]
pub struct Plan {
    /// A file with one NetworkTuning (`-` reads stdin), or the name of an existing tuning.
    /// A path that exists, contains `/` or ends in .yaml, .yml or .json is a file.
    pub tuning: String,
    /// Plan only this node (it must be one the tuning selects).
    #[arg(long)]
    pub node: Option<String>,
    /// Print the plan as JSON or YAML, for scripts.
    #[arg(short, long, value_enum)]
    pub output: Option<Output>,
    /// How long to wait for the agents' answers (e.g. 30s, 2m).
    #[arg(long, value_parser = duration, default_value = "30s")]
    pub timeout: std::time::Duration,
}

impl Plan {
    /// Whether `tuning` names a file (or stdin) rather than an existing tuning.
    pub fn is_file(&self) -> bool {
        let t = &self.tuning;
        t == "-"
            || t.contains('/')
            || [".yaml", ".yml", ".json"]
                .iter()
                .any(|ext| t.to_ascii_lowercase().ends_with(ext))
            || std::path::Path::new(t).exists()
    }
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
    #[arg(short, long, default_value = hoststack_crds::DEFAULT_NAMESPACE)]
    pub namespace: String,
}

/// `report`'s arguments.
#[derive(Debug, Args)]
pub struct Report {
    /// The NetworkTuning's name.
    pub tuning: String,
    /// The Prometheus server that scrapes the agents (`http://host:port[/prefix]`).
    #[arg(long, value_parser = prometheus_url)]
    pub prometheus: hoststack_promql::Endpoint,
    /// Where to write the picture (an .svg file).
    #[arg(long, value_parser = svg_path)]
    pub out: std::path::PathBuf,
    /// Also write the plotted series and markers here, as JSON.
    #[arg(long)]
    pub data: Option<std::path::PathBuf>,
    /// Show this much time up to now (e.g. 90s, 15m, 1h30m); default: from a minute before
    /// the first wave.
    #[arg(long, value_parser = duration)]
    pub since: Option<std::time::Duration>,
}

fn prometheus_url(url: &str) -> Result<hoststack_promql::Endpoint, String> {
    hoststack_promql::Endpoint::parse(url).map_err(|e| match e {
        hoststack_promql::Error::Address { address, reason } => format!("{address:?}: {reason}"),
        other => other.to_string(),
    })
}

fn svg_path(path: &str) -> Result<std::path::PathBuf, String> {
    if path.to_ascii_lowercase().ends_with(".svg") {
        Ok(path.into())
    } else {
        Err(format!("{path:?}: only SVG is drawn; name an .svg file"))
    }
}

/// A Prometheus-style duration: whole numbers with units s, m, h or d, e.g. `1h30m`.
fn duration(text: &str) -> Result<std::time::Duration, String> {
    let bad = || format!("{text:?}: not a duration like 90s, 15m or 1h30m");
    let mut seconds = 0u64;
    let mut number = String::new();
    for c in text.chars() {
        if c.is_ascii_digit() {
            number.push(c);
            continue;
        }
        let unit = match c {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            'd' => 86400,
            _ => return Err(bad()),
        };
        let n: u64 = number.parse().map_err(|_| bad())?;
        seconds += n * unit;
        number.clear();
    }
    if !number.is_empty() || seconds == 0 {
        return Err(bad());
    }
    Ok(std::time::Duration::from_secs(seconds))
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

    #[test]
    fn status_takes_a_tuning_and_an_optional_timeout() {
        let parse = |args: &[&str]| {
            let mut all = vec!["kubectl-hoststack", "status"];
            all.extend_from_slice(args);
            match Cli::try_parse_from(all).map(|c| c.command) {
                Ok(Command::Status(s)) => Ok(s),
                Ok(other) => panic!("not status: {other:?}"),
                Err(e) => Err(e),
            }
        };
        let s = parse(&["edge"]).unwrap();
        assert_eq!((s.tuning.as_str(), s.timeout), ("edge", None));
        let s = parse(&["edge", "--timeout", "30m"]).unwrap();
        assert_eq!(s.timeout, Some(std::time::Duration::from_secs(1800)));
        for bad in [
            &[][..],
            &["edge", "--timeout"],
            &["edge", "--timeout", "soon"],
            &["edge", "--timeout", "0s"],
            &["edge", "core"],
            &["edge", "--watch"],
        ] {
            let e = parse(bad).unwrap_err();
            assert_eq!(e.exit_code(), crate::error::EXIT_USAGE as i32, "{bad:?}");
        }
    }

    #[test]
    fn plan_takes_a_file_or_a_tuning_a_node_and_a_timeout() {
        let parse = |args: &[&str]| {
            let mut all = vec!["kubectl-hoststack", "plan"];
            all.extend_from_slice(args);
            match Cli::try_parse_from(all).map(|c| c.command) {
                Ok(Command::Plan(p)) => Ok(p),
                Ok(other) => panic!("not plan: {other:?}"),
                Err(e) => Err(e),
            }
        };
        let p = parse(&["edge"]).unwrap();
        assert!(!p.is_file());
        assert_eq!(p.timeout, std::time::Duration::from_secs(30));
        assert_eq!((p.node, p.output), (None, None));
        for file in ["-", "t.yaml", "T.YML", "x.json", "./edge", "dir/edge"] {
            assert!(parse(&[file]).unwrap().is_file(), "{file}");
        }
        let p = parse(&["edge", "--node", "node-a", "-o", "json", "--timeout", "2m"]).unwrap();
        assert_eq!(p.node.as_deref(), Some("node-a"));
        assert_eq!(p.output, Some(Output::Json));
        assert_eq!(p.timeout, std::time::Duration::from_secs(120));
        for bad in [
            &[][..],
            &["edge", "--timeout", "soon"],
            &["edge", "-o", "xml"],
        ] {
            let e = parse(bad).unwrap_err();
            assert_eq!(e.exit_code(), crate::error::EXIT_USAGE as i32, "{bad:?}");
        }
    }

    #[test]
    fn report_takes_an_http_prometheus_an_svg_file_and_a_duration() {
        let report = |extra: &[&str]| {
            let mut args = vec!["kubectl-hoststack", "report", "edge"];
            args.extend_from_slice(extra);
            Cli::try_parse_from(args)
        };
        let cli = report(&[
            "--prometheus",
            "http://127.0.0.1:9090",
            "--out",
            "r.svg",
            "--since",
            "1h30m",
        ])
        .unwrap();
        let Command::Report(r) = cli.command else {
            panic!("not report: {:?}", cli.command)
        };
        assert_eq!(r.prometheus.authority(), "127.0.0.1:9090");
        assert_eq!(r.since, Some(std::time::Duration::from_secs(5400)));
        assert_eq!(r.data, None);
        for bad in [
            &["--prometheus", "http://p:9090", "--out", "r.png"][..],
            &["--prometheus", "ftp://p:9090", "--out", "r.svg"],
            &[
                "--prometheus",
                "http://p:9090",
                "--out",
                "r.svg",
                "--since",
                "5",
            ],
            &[
                "--prometheus",
                "http://p:9090",
                "--out",
                "r.svg",
                "--since",
                "5x",
            ],
            &["--out", "r.svg"],
        ] {
            let e = report(bad).unwrap_err();
            assert_eq!(e.exit_code(), crate::error::EXIT_USAGE as i32, "{bad:?}");
        }
        assert_eq!(duration("90s"), Ok(std::time::Duration::from_secs(90)));
        assert_eq!(duration("2d"), Ok(std::time::Duration::from_secs(172800)));
        assert!(duration("0s").is_err());
        assert!(duration("m").is_err());
    }
}
