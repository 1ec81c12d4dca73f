//! Each command as a thin shell: read from the cluster, decide with the pure modules
//! ([`render`](crate::render), [`outcome`](crate::outcome), [`steer`](crate::steer),
//! [`undo`](crate::undo), [`report`](crate::report)), write, and say what was done.

use std::io::{IsTerminal, Write};

use futures::StreamExt;
use hoststack_crds::{NetworkTuning, NodeTuning, Phase};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use crate::cli::{Cli, Command, Get, Output, Promote, Status, Target, Undo};
use crate::cluster;
use crate::error::{Error, Result, EXIT_TIMEOUT};
use crate::outcome::{self, Outcome};
use crate::render::{self, render, Colour};
use crate::steer;
use crate::undo;

/// Runs the parsed command line, printing to stdout; returns the exit code (not 0 only for a
/// plan where something would fail or a node gave no plan, and for `status` of a rollout that
/// did not complete).
pub async fn run(cli: Cli) -> Result<u8> {
    let client = cluster::connect(&cli.connection).await?;
    let done = match cli.command {
        Command::Plan(args) => return plan(&client, &args).await,
        Command::Get(args) => get(&client, &args).await,
        Command::Status(args) => return status(&client, &args).await,
        Command::Promote(args) => promote(&client, &args).await,
        Command::Pause(t) => set_paused(&client, &t, true).await,
        Command::Resume(t) => set_paused(&client, &t, false).await,
        Command::Abort(t) => abort(&client, &t).await,
        Command::Undo(args) => undo(&client, &args).await,
        Command::Report(args) => report(&client, &args).await,
    };
    done.map(|()| crate::error::EXIT_OK)
}

fn say(text: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|_| out.flush())
        .map_err(|e| Error::Output(e.to_string()))
}

/// Colour when stdout is a terminal and NO_COLOR is unset or empty (https://no-color.org).
fn colour() -> Colour {
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    if std::io::stdout().is_terminal() && !no_color {
        Colour::Ansi
    } else {
        Colour::Plain
    }
}

/// The tuning and its nodes as text in the asked format.
fn show(tuning: &NetworkTuning, nodes: &[NodeTuning], output: Option<Output>) -> Result<String> {
    let list = || {
        let mut items = vec![json!(tuning)];
        items.extend(nodes.iter().map(|n| json!(n)));
        json!({"apiVersion": "v1", "kind": "List", "items": items})
    };
    match output {
        None => Ok(render(tuning, nodes, colour())),
        Some(Output::Json) => serde_json::to_string_pretty(&list())
            .map(|s| s + "\n")
            .map_err(|e| Error::Output(e.to_string())),
        Some(Output::Yaml) => serde_yaml::to_string(&list())
            .map(|s| format!("---\n{s}"))
            .map_err(|e| Error::Output(e.to_string())),
    }
}

async fn snapshot(client: &Client, name: &str) -> Result<(NetworkTuning, Vec<NodeTuning>)> {
    let tuning = cluster::tuning(client, name).await?;
    let nodes = cluster::node_tunings(client, &tuning).await?;
    Ok((tuning, nodes))
}

/// Reads the tuning and its nodes, then again after every change to them, giving each reading
/// to `step`, until `step` returns a value.
async fn follow<T>(
    client: &Client,
    name: &str,
    mut step: impl FnMut(NetworkTuning, Vec<NodeTuning>) -> Result<Option<T>>,
) -> Result<T> {
    let (tuning, nodes) = snapshot(client, name).await?;
    if let Some(done) = step(tuning, nodes)? {
        return Ok(done);
    }
    let by_name =
        hoststack_crds::api_client::watch_config().fields(&format!("metadata.name={name}"));
    let tunings = watcher(Api::<NetworkTuning>::all(client.clone()), by_name)
        .default_backoff()
        .map(|e| e.map(drop));
    let node_tunings = watcher(
        Api::<NodeTuning>::all(client.clone()),
        hoststack_crds::api_client::watch_config(),
    )
    .default_backoff()
    .map(|e| e.map(drop));
    let mut changes = std::pin::pin!(futures::stream::select(tunings, node_tunings));
    while let Some(change) = changes.next().await {
        if let Err(e) = change {
            return Err(Error::Unreachable(format!("watching {name}: {e}")));
        }
        let (tuning, nodes) = snapshot(client, name).await?;
        if let Some(done) = step(tuning, nodes)? {
            return Ok(done);
        }
    }
    Err(Error::Unreachable(format!(
        "watching {name}: the watch ended"
    )))
}

async fn get(client: &Client, args: &Get) -> Result<()> {
    if !args.watch {
        let (tuning, nodes) = snapshot(client, &args.tuning).await?;
        return say(&show(&tuning, &nodes, args.output)?);
    }
    let redraw = args.output.is_none() && std::io::stdout().is_terminal();
    // The last reading and its text: the watch prints a reading whose text differs, and
    // ends when a reading reaches a new ending.
    let mut last: Option<(NetworkTuning, String)> = None;
    follow(client, &args.tuning, |tuning, nodes| {
        let now = show(&tuning, &nodes, args.output)?;
        let (changed, ended) = match &last {
            None => (true, None),
            Some((before, shown)) => (*shown != now, outcome::reached(before, &tuning)),
        };
        if changed && last.is_some() {
            if redraw {
                say("\x1b[2J\x1b[H")?;
            } else if args.output.is_none() {
                say("\n")?;
            }
        }
        if changed {
            say(&now)?;
        }
        last = Some((tuning, now));
        Ok(ended)
    })
    .await
    .map(drop)
}

/// Waits for the rollout to end, printing its state line at each change; the exit code says
/// how it ended, or that `--timeout` passed first.
async fn status(client: &Client, args: &Status) -> Result<u8> {
    let mut shown = String::new();
    let ended = follow(client, &args.tuning, |tuning, _| {
        let line = render::state_line(&tuning, colour());
        if line != shown {
            say(&line)?;
            shown = line;
        }
        Ok(outcome::outcome(&tuning))
    });
    let Some(timeout) = args.timeout else {
        return ended.await.map(Outcome::exit_code);
    };
    match tokio::time::timeout(timeout, ended).await {
        Ok(ended) => ended.map(Outcome::exit_code),
        Err(_) => {
            eprintln!(
                "timed out: the rollout of NetworkTuning {} did not end within {}s",
                args.tuning,
                timeout.as_secs()
            );
            Ok(EXIT_TIMEOUT)
        }
    }
}

fn wave_nodes(tuning: &NetworkTuning, index: u32) -> String {
    tuning
        .status
        .as_ref()
        .and_then(|s| s.waves.iter().find(|w| w.index == index))
        .map(|w| w.nodes.join(", "))
        .unwrap_or_default()
}

fn revision(tuning: &NetworkTuning, stable: bool) -> String {
    tuning
        .status
        .as_ref()
        .and_then(|s| {
            if stable {
                s.stable_revision.clone()
            } else {
                s.current_revision.clone()
            }
        })
        .unwrap_or_else(|| "-".into())
}

async fn promote(client: &Client, args: &Promote) -> Result<()> {
    let tuning = cluster::tuning(client, &args.tuning).await?;
    let index = steer::wave_to_promote(&tuning, args.wave)?;
    let current = revision(&tuning, false);
    let patch = steer::promote_patch(&current, index);
    cluster::patch_tuning(client, &args.tuning, &patch, "promotion").await?;
    let what = if index == 0 { "canary" } else { "wave" };
    let mut text = format!(
        "NetworkTuning {}: promoted {what} {index} ({}) of revision {current} ({}={})\n",
        args.tuning,
        wave_nodes(&tuning, index),
        steer::PROMOTE_ANNOTATION,
        hoststack_crds::wave_id(&current, index as usize),
    );
    if steer::is_paused(&tuning) {
        text.push_str("note: spec.rollout.paused is set; the next wave starts after `resume`\n");
    }
    say(&text)
}

async fn set_paused(client: &Client, target: &Target, paused: bool) -> Result<()> {
    let name = &target.tuning;
    let tuning = cluster::tuning(client, name).await?;
    let word = if paused { "paused" } else { "resumed" };
    if steer::is_paused(&tuning) == paused {
        let already = if paused { "paused" } else { "not paused" };
        return say(&format!(
            "NetworkTuning {name}: already {already}; nothing changed\n"
        ));
    }
    let phase = tuning.status.as_ref().and_then(|s| s.phase);
    cluster::patch_tuning(
        client,
        name,
        &steer::paused_patch(paused),
        if paused { "pausing" } else { "resuming" },
    )
    .await?;
    let mut text = format!("NetworkTuning {name}: {word} (spec.rollout.paused={paused})\n");
    if matches!(phase, Some(Phase::RolledBack | Phase::Failed)) {
        text.push_str(&format!(
            "note: the rollout of revision {} had ended ({}); this spec change starts it again\n",
            revision(&tuning, false),
            phase.unwrap_or_default()
        ));
    }
    say(&text)
}

async fn abort(client: &Client, target: &Target) -> Result<()> {
    let name = &target.tuning;
    let tuning = cluster::tuning(client, name).await?;
    let aborted = steer::revision_to_abort(&tuning)?;
    cluster::patch_tuning(client, name, &steer::abort_patch(&aborted), "abort").await?;
    let updated: Vec<String> = tuning
        .status
        .iter()
        .flat_map(|s| s.waves.iter().flat_map(|w| w.nodes.iter().cloned()))
        .collect();
    let updated = if updated.is_empty() {
        "none yet".to_string()
    } else {
        updated.join(", ")
    };
    say(&format!(
        "NetworkTuning {name}: rollout of revision {aborted} aborted ({}={aborted}); the operator returns its updated nodes ({updated}) to the stable revision {}\n",
        steer::ABORT_ANNOTATION,
        revision(&tuning, true),
    ))
}

async fn undo(client: &Client, args: &Undo) -> Result<()> {
    let name = &args.tuning;
    let tuning = cluster::tuning(client, name).await?;
    let current = tuning.spec.config.revision();
    let history = cluster::history(client, &args.namespace, &tuning).await?;
    let back = undo::pick(name, &history, &current, args.to_revision.as_deref())?;
    if back.revision == current {
        return say(&format!(
            "NetworkTuning {name}: the spec is already revision {current}; nothing changed\n"
        ));
    }
    let from =
        serde_json::to_value(&tuning.spec.config).map_err(|e| Error::Output(e.to_string()))?;
    let mut patch = json!({"spec": undo::merge_patch(&from, &back.config)});
    // Refused (409) if someone changed the tuning since it was read.
    patch["metadata"] = json!({"resourceVersion": tuning.resource_version()});
    let clear_abort = steer::aborts(&tuning, &back.revision);
    if clear_abort {
        patch["metadata"]["annotations"] = json!({steer::ABORT_ANNOTATION: null});
    }
    let patched = cluster::patch_tuning(client, name, &patch, "undo").await?;
    let now = patched.spec.config.revision();
    let mut text = format!(
        "NetworkTuning {name}: spec set back from revision {current} to revision {} (#{} in {}/{}-{}); the operator rolls it out like any change\n",
        back.revision, back.sequence, args.namespace, name, back.revision
    );
    if clear_abort {
        text.push_str(&format!(
            "removed {}={}, which would abort it again\n",
            steer::ABORT_ANNOTATION,
            back.revision
        ));
    }
    if now != back.revision {
        text.push_str(&format!(
            "note: the spec now hashes to {now}, not {}: the recorded config reads differently today\n",
            back.revision
        ));
    }
    say(&text)
}

async fn report(client: &Client, args: &crate::cli::Report) -> Result<()> {
    use crate::report::{self, Panel, Report};
    let tuning = cluster::tuning(client, &args.tuning).await?;
    let markers = report::markers(&tuning.status.clone().unwrap_or_default());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|e| Error::Invalid(format!("the clock is before 1970: {e}")))?
        .as_secs_f64();
    let span = report::span(&markers, now, args.since.map(|d| d.as_secs_f64()));
    let prometheus = hoststack_promql::Client::new(args.prometheus.clone());
    let range = hoststack_promql::Range {
        start: span.start,
        end: span.end,
        step: span.step as f64,
    };
    let mut panels = Vec::new();
    for metric in &report::METRICS {
        let query = report::query(metric, &args.tuning, span.rate_window);
        let matrix = prometheus
            .query_range(&query, range)
            .await
            .map_err(|e| Error::from_prometheus(e, &format!("the range query {query:?}")))?;
        panels.push(Panel {
            title: metric.title.to_string(),
            query,
            series: report::series(matrix),
        });
    }
    let report = Report {
        tuning: args.tuning.clone(),
        span,
        panels,
        markers,
    };
    let write = |path: &std::path::Path, text: &str| {
        std::fs::write(path, text).map_err(|e| Error::Output(format!("{}: {e}", path.display())))
    };
    write(&args.out, &report::draw(&report)?)?;
    let mut text = format!(
        "NetworkTuning {}: wrote {} ({} panels, {} to {} UTC at {} s steps, {} markers)\n",
        args.tuning,
        args.out.display(),
        report.panels.len(),
        report::clock(report::time_axis(&report).0),
        report::clock(report.span.end),
        report.span.step,
        report.markers.len()
    );
    if let Some(path) = &args.data {
        let json =
            serde_json::to_string_pretty(&report).map_err(|e| Error::Output(e.to_string()))?;
        write(path, &(json + "\n"))?;
        text.push_str(&format!(
            "wrote the series and markers to {}\n",
            path.display()
        ));
    }
    say(&text)
}

/// The tuning to plan: read from a file (or stdin), or the existing one of that name.
async fn tuning_to_plan(client: &Client, args: &crate::cli::Plan) -> Result<NetworkTuning> {
    if !args.is_file() {
        return cluster::tuning(client, &args.tuning).await;
    }
    let text = if args.tuning == "-" {
        std::io::read_to_string(std::io::stdin())
    } else {
        std::fs::read_to_string(&args.tuning)
    }
    .map_err(|e| Error::Invalid(format!("{}: {e}", args.tuning)))?;
    crate::plan::parse_tuning(&text, &args.tuning)
}

async fn plan(client: &Client, args: &crate::cli::Plan) -> Result<u8> {
    use crate::plan::{self, Answer, NodePlan, Plan};
    use crate::preview;
    let tuning = tuning_to_plan(client, args).await?;
    let name = tuning.metadata.name.clone();
    let all_nodes = preview::nodes(client).await?;
    let selected = plan::select(&tuning.spec.node_selector, &all_nodes, args.node.as_deref())?;
    let before = preview::node_tunings(client).await?;
    let request = preview::request(name.clone(), tuning.spec.config.clone());
    let id = request.id.clone();
    // Every node written to is remembered before its write, so that a Ctrl-C or an error
    // still removes the request from it.
    let mut written: Vec<String> = Vec::new();
    let asked = async {
        let mut answers = std::collections::BTreeMap::new();
        let mut waiting = Vec::new();
        for node in &selected {
            if !before.contains_key(node) {
                answers.insert(node.clone(), Answer::NoAgent);
                continue;
            }
            written.push(node.clone());
            if preview::ask(client, node, &request).await? {
                waiting.push(node.clone());
            } else {
                answers.insert(node.clone(), Answer::NoAgent);
            }
        }
        answers.extend(preview::collect(client, &waiting, &id, args.timeout).await?);
        Ok::<_, Error>(answers)
    };
    let answers = tokio::select! {
        answers = asked => Some(answers),
        _ = tokio::signal::ctrl_c() => None,
    };
    let failed = preview::withdraw(client, &written, &id).await;
    for failure in &failed {
        eprintln!("warning: removing the preview request from {failure}");
    }
    if !failed.is_empty() {
        eprintln!("remove it by hand: kubectl patch nodetuning NODE --type=json -p '[{{\"op\":\"remove\",\"path\":\"/spec/preview\"}}]'");
    }
    let Some(answers) = answers else {
        eprintln!("interrupted: the preview requests are removed; nothing was changed");
        return Ok(130);
    };
    let mut answers = answers?;
    let plan = Plan {
        tuning: name.unwrap_or_else(|| "(unnamed)".into()),
        revision: tuning.spec.config.revision(),
        nodes: selected
            .iter()
            .map(|node| NodePlan {
                node: node.clone(),
                governed_by: before.get(node).and_then(|nt| nt.spec.tuning.clone()),
                answer: answers.remove(node).unwrap_or(Answer::NoAgent),
            })
            .collect(),
    };
    let text = match args.output {
        None => plan::render(&plan, colour()),
        Some(Output::Json) => serde_json::to_string_pretty(&plan)
            .map(|s| s + "\n")
            .map_err(|e| Error::Output(e.to_string()))?,
        Some(Output::Yaml) => serde_yaml::to_string(&plan)
            .map(|s| format!("---\n{s}"))
            .map_err(|e| Error::Output(e.to_string()))?,
    };
    say(&text)?;
    Ok(plan.exit_code())
}

#[cfg(test)]
mod tests {
    use super::*;
    use hoststack_crds::{NetworkTuningSpec, NodeTuningSpec};
    use serde_json::Value;

    #[test]
    fn json_and_yaml_print_a_list_of_the_tuning_then_its_nodes() {
        let t = NetworkTuning::new("edge", NetworkTuningSpec::default());
        let n = NodeTuning::new("node-a", NodeTuningSpec::default());
        let text = show(&t, std::slice::from_ref(&n), Some(Output::Json)).unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["kind"], "List");
        assert_eq!(v["items"][0]["kind"], "NetworkTuning");
        assert_eq!(v["items"][1]["metadata"]["name"], "node-a");
        let text = show(&t, &[n], Some(Output::Yaml)).unwrap();
        assert!(text.starts_with("---\napiVersion: v1\n"), "{text}");
        let v: Value = serde_yaml::from_str(&text).unwrap();
        assert_eq!(v["items"][0]["metadata"]["name"], "edge");
    }
}
