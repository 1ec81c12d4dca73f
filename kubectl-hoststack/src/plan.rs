//! `plan`'s pure parts: reading a NetworkTuning from a file, which nodes it selects, what each
//! node's agent answered to the preview, the per-node diff as text, and the exit code.
//!
//! The agents answer in `NodeTuning.status.preview` ([`PreviewResult`]): for each setting the
//! value on the host now (`actual`), the value it would get (`desired`) and whether it would
//! change, stay or fail. The I/O that asks and waits lives in [`crate::preview`].

use std::collections::BTreeMap;
use std::fmt::Write;

use hoststack_crds::{
    ItemResult, ItemState, NetworkTuning, NodeSelector, NodeState, PreviewResult,
};
use kube::core::SelectorExt;
use serde::Serialize;

use crate::error::{Error, Result};
use crate::render::{Colour, Tone};

/// Exit code of `plan`: an item would fail on some node (or its agent could not plan).
pub const EXIT_WOULD_FAIL: u8 = 5;
/// Exit code of `plan`: nothing would fail where agents answered, but some selected node gave
/// no answer (no agent, none in time, or another plan replaced the request).
pub const EXIT_INCOMPLETE: u8 = 6;

/// The one NetworkTuning in a YAML (or JSON) text; `source` names it in errors.
pub fn parse_tuning(text: &str, source: &str) -> Result<NetworkTuning> {
    let mut found = Vec::new();
    for document in serde_yaml::Deserializer::from_str(text) {
        let value: serde_yaml::Value = serde::Deserialize::deserialize(document)
            .map_err(|e| Error::Invalid(format!("{source}: not YAML: {e}")))?;
        if !value.is_null() {
            found.push(value);
        }
    }
    let [value] = <[serde_yaml::Value; 1]>::try_from(found).map_err(|found| {
        Error::Invalid(format!(
            "{source}: holds {} objects; plan takes exactly one NetworkTuning",
            found.len()
        ))
    })?;
    let kind = value.get("kind").and_then(|k| k.as_str()).unwrap_or("");
    if kind != "NetworkTuning" {
        return Err(Error::Invalid(format!(
            "{source}: kind {kind:?}, not NetworkTuning"
        )));
    }
    serde_yaml::from_value(value).map_err(|e| Error::Invalid(format!("{source}: {e}")))
}

/// The nodes (name → labels) `selector` selects, by name; `only` narrows them to one node,
/// which must exist and be selected.
pub fn select(
    selector: &NodeSelector,
    nodes: &BTreeMap<String, BTreeMap<String, String>>,
    only: Option<&str>,
) -> Result<Vec<String>> {
    let selector = selector.to_selector();
    if let Some(node) = only {
        let labels = nodes
            .get(node)
            .ok_or_else(|| Error::NotFound(format!("no node named \"{node}\"")))?;
        if !selector.matches(labels) {
            return Err(Error::Invalid(format!(
                "node {node} is not selected by the tuning's nodeSelector"
            )));
        }
        return Ok(vec![node.to_string()]);
    }
    Ok(nodes
        .iter()
        .filter(|(_, labels)| selector.matches(labels))
        .map(|(name, _)| name.clone())
        .collect())
}

/// A whole plan: the tuning's config on each selected node.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    /// The NetworkTuning's name.
    pub tuning: String,
    /// The revision of its config.
    pub revision: String,
    /// The selected nodes, by name.
    pub nodes: Vec<NodePlan>,
}

/// One selected node's part of a plan.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodePlan {
    /// The node's name.
    pub node: String,
    /// The tuning that governs the node now (its NodeTuning's `spec.tuning`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub governed_by: Option<String>,
    /// What came back.
    pub answer: Answer,
}

/// What a node's agent said to the preview request.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "result", rename_all = "camelCase")]
pub enum Answer {
    /// The agent's plan.
    Planned {
        /// Its answer, as it wrote it in `status.preview`.
        preview: PreviewResult,
    },
    /// The node has no NodeTuning, so no agent answers for it (an agent runs on a node once a
    /// tuning governs it).
    NoAgent,
    /// The agent did not answer within the time allowed.
    NoAnswer {
        /// How long the plugin waited, e.g. `30s`.
        waited: String,
    },
    /// Another request replaced this one before the agent answered it.
    Replaced {
        /// The id of the request now on the node, if any.
        by: Option<String>,
    },
}

/// What a node's answer comes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Verdict {
    /// Every setting already has its value.
    NoChange,
    /// Settings would change and none would fail.
    WouldChange,
    /// No plan from this node.
    Unanswered,
    /// A setting would fail (or the agent could not plan).
    WouldFail,
}

/// Whether an item stops the revision from being applied.
fn fails(item: &ItemResult) -> bool {
    matches!(
        item.state,
        ItemState::WouldFail | ItemState::Failed | ItemState::NotSupported
    )
}

impl NodePlan {
    /// What this node's answer comes to.
    pub fn verdict(&self) -> Verdict {
        match &self.answer {
            Answer::Planned { preview } => {
                if preview.state == NodeState::Failed || preview.items.iter().any(fails) {
                    Verdict::WouldFail
                } else if preview
                    .items
                    .iter()
                    .any(|i| i.state == ItemState::WouldChange)
                {
                    Verdict::WouldChange
                } else {
                    Verdict::NoChange
                }
            }
            Answer::NoAgent | Answer::NoAnswer { .. } | Answer::Replaced { .. } => {
                Verdict::Unanswered
            }
        }
    }
}

impl Plan {
    /// The exit code: 0 when every node answered and nothing would fail,
    /// [`EXIT_WOULD_FAIL`] when something would fail anywhere, else [`EXIT_INCOMPLETE`] when
    /// a node gave no answer.
    pub fn exit_code(&self) -> u8 {
        match self.nodes.iter().map(NodePlan::verdict).max() {
            Some(Verdict::WouldFail) => EXIT_WOULD_FAIL,
            Some(Verdict::Unanswered) => EXIT_INCOMPLETE,
            _ => crate::error::EXIT_OK,
        }
    }
}

/// The value of a setting, or `(missing)` when the host has none.
fn value(v: &Option<String>) -> &str {
    v.as_deref().unwrap_or("(missing)")
}

/// The plan as text: a header, each node with its changing and failing settings (current →
/// desired, and why a failing one fails), the number of settings that stay, and a summary.
pub fn render(plan: &Plan, colour: Colour) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} {} revision {}: {} node{} selected",
        colour.paint(Tone::Bold, "Plan of NetworkTuning"),
        colour.paint(Tone::Bold, &plan.tuning),
        plan.revision,
        plan.nodes.len(),
        if plan.nodes.len() == 1 { "" } else { "s" }
    );
    for node in &plan.nodes {
        out.push('\n');
        node_text(&mut out, plan, node, colour);
    }
    let _ = writeln!(out, "\n{}", summary(plan, colour));
    out
}

/// One node: its heading, then one line per setting that would change or fail.
fn node_text(out: &mut String, plan: &Plan, node: &NodePlan, colour: Colour) {
    let verdict = node.verdict();
    let (tone, word) = match verdict {
        Verdict::NoChange => (Tone::Good, "no change"),
        Verdict::WouldChange => (Tone::Busy, "would change"),
        Verdict::WouldFail => (Tone::Bad, "would fail"),
        Verdict::Unanswered => (Tone::Dim, "no plan"),
    };
    let mut heading = format!(
        "{}  {}",
        colour.paint(Tone::Bold, &node.node),
        colour.paint(tone, word)
    );
    let preview = match &node.answer {
        Answer::Planned { preview } => Some(preview),
        _ => None,
    };
    let on = match (
        &node.governed_by,
        preview.and_then(|p| p.applied_revision.as_ref()),
    ) {
        (Some(t), Some(r)) => format!("on {t} revision {r}"),
        (Some(t), None) => format!("governed by {t}, nothing applied"),
        (None, Some(r)) => format!("on revision {r}"),
        (None, None) => String::new(),
    };
    if !on.is_empty() {
        let _ = write!(heading, "  ({on})");
    }
    let _ = writeln!(out, "{heading}");
    if let Some(other) = node.governed_by.as_ref().filter(|t| **t != plan.tuning) {
        let _ = writeln!(
            out,
            "  {} {other} governs this node now; {} changes it only if it wins (priority, then age)",
            colour.paint(Tone::Busy, "note:"),
            plan.tuning
        );
    }
    let Some(preview) = preview else {
        let why = match &node.answer {
            Answer::NoAgent => {
                "no agent: the node has no NodeTuning (its agent starts once a tuning governs it)"
                    .to_string()
            }
            Answer::NoAnswer { waited } => format!("no answer from its agent within {waited}"),
            Answer::Replaced { by: Some(id) } => {
                format!("another plan ({id}) replaced this request before the agent answered")
            }
            Answer::Replaced { by: None } => {
                "the request was removed before the agent answered".to_string()
            }
            Answer::Planned { .. } => String::new(),
        };
        let _ = writeln!(out, "  {}", colour.paint(Tone::Dim, &why));
        return;
    };
    if preview.state == NodeState::Failed {
        let why = preview
            .message
            .as_deref()
            .unwrap_or("the agent could not plan");
        let _ = writeln!(out, "  {} {why}", colour.paint(Tone::Bad, "!"));
    }
    let mut unchanged = 0;
    for item in &preview.items {
        let (mark, tone) = match item.state {
            ItemState::Unchanged => {
                unchanged += 1;
                continue;
            }
            ItemState::WouldChange => ("~", Tone::Busy),
            _ if fails(item) => ("!", Tone::Bad),
            _ => ("?", Tone::Dim),
        };
        let mut line = format!(
            "  {} {} {}: {} → {}",
            colour.paint(tone, mark),
            item.kind,
            item.target,
            value(&item.actual),
            value(&item.desired)
        );
        if fails(item) {
            let why = item.message.as_deref().unwrap_or("no reason given");
            let _ = write!(
                line,
                "  {}",
                colour.paint(Tone::Bad, &format!("{}: {why}", item.state))
            );
        } else if let Some(note) = &item.message {
            let _ = write!(line, "  ({note})");
        }
        let _ = writeln!(out, "{line}");
    }
    if unchanged > 0 {
        let _ = writeln!(
            out,
            "  {}",
            colour.paint(
                Tone::Dim,
                &format!(
                    "= {unchanged} setting{} already as desired",
                    if unchanged == 1 { "" } else { "s" }
                )
            )
        );
    }
}

/// `N would change, N would fail, N unchanged, N without a plan`, leaving out zeros.
fn summary(plan: &Plan, colour: Colour) -> String {
    let count = |v: Verdict| plan.nodes.iter().filter(|n| n.verdict() == v).count();
    let parts: Vec<String> = [
        (Verdict::WouldChange, "would change", Tone::Busy),
        (Verdict::WouldFail, "would fail", Tone::Bad),
        (Verdict::NoChange, "unchanged", Tone::Good),
        (Verdict::Unanswered, "without a plan", Tone::Dim),
    ]
    .into_iter()
    .filter_map(|(v, word, tone)| {
        let n = count(v);
        (n > 0).then(|| colour.paint(tone, &format!("{n} {word}")))
    })
    .collect();
    let nodes = if parts.is_empty() {
        "no node selected".to_string()
    } else {
        parts.join(", ")
    };
    format!("Nodes: {nodes}. Nothing was changed.")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(target: &str, actual: Option<&str>, desired: &str, state: ItemState) -> ItemResult {
        ItemResult {
            kind: "sysctl".into(),
            target: target.into(),
            original: actual.map(str::to_string),
            desired: Some(desired.into()),
            actual: actual.map(str::to_string),
            state,
            message: (state == ItemState::WouldFail)
                .then(|| format!("no such sysctl: /proc/sys/{}", target.replace('.', "/"))),
        }
    }

    fn planned(items: Vec<ItemResult>, state: NodeState) -> Answer {
        Answer::Planned {
            preview: PreviewResult {
                id: "p1".into(),
                revision: "r2".into(),
                applied_revision: Some("r1".into()),
                state,
                message: None,
                items,
                observed_at: "2026-11-30T04:00:00Z".into(),
            },
        }
    }

    fn plan() -> Plan {
        let ecn = |actual| {
            item(
                "net.ipv4.tcp_ecn",
                Some(actual),
                "1",
                ItemState::WouldChange,
            )
        };
        let sack = item("net.ipv4.tcp_sack", Some("1"), "1", ItemState::Unchanged);
        let rp = "net.ipv4.conf.plan0.rp_filter";
        Plan {
            tuning: "edge".into(),
            revision: "r2".into(),
            nodes: vec![
                NodePlan {
                    node: "node-a".into(),
                    governed_by: Some("edge".into()),
                    answer: planned(
                        vec![
                            ecn("2"),
                            sack.clone(),
                            item(rp, Some("0"), "2", ItemState::WouldChange),
                        ],
                        NodeState::Planned,
                    ),
                },
                NodePlan {
                    node: "node-b".into(),
                    governed_by: Some("edge".into()),
                    answer: planned(
                        vec![ecn("0"), sack, item(rp, None, "2", ItemState::WouldFail)],
                        NodeState::Planned,
                    ),
                },
                NodePlan {
                    node: "node-c".into(),
                    governed_by: Some("core".into()),
                    answer: Answer::NoAnswer {
                        waited: "30s".into(),
                    },
                },
                NodePlan {
                    node: "node-d".into(),
                    governed_by: None,
                    answer: Answer::NoAgent,
                },
            ],
        }
    }

    #[test]
    fn each_node_shows_what_would_change_and_what_would_fail_and_why() {
        let text = render(&plan(), Colour::Plain);
        let want = "\
Plan of NetworkTuning edge revision r2: 4 nodes selected

node-a  would change  (on edge revision r1)
  ~ sysctl net.ipv4.tcp_ecn: 2 → 1
  ~ sysctl net.ipv4.conf.plan0.rp_filter: 0 → 2
  = 1 setting already as desired

node-b  would fail  (on edge revision r1)
  ~ sysctl net.ipv4.tcp_ecn: 0 → 1
  ! sysctl net.ipv4.conf.plan0.rp_filter: (missing) → 2  WouldFail: no such sysctl: /proc/sys/net/ipv4/conf/plan0/rp_filter
  = 1 setting already as desired

node-c  no plan  (governed by core, nothing applied)
  note: core governs this node now; edge changes it only if it wins (priority, then age)
  no answer from its agent within 30s

node-d  no plan
  no agent: the node has no NodeTuning (its agent starts once a tuning governs it)

Nodes: 1 would change, 1 would fail, 2 without a plan. Nothing was changed.
";
        assert_eq!(text, want);
    }

    #[test]
    fn ansi_colours_marks_and_verdicts_and_plain_has_no_escapes() {
        let ansi = render(&plan(), Colour::Ansi);
        assert!(ansi.contains("\x1b[31mwould fail\x1b[0m"), "{ansi}");
        assert!(ansi.contains("\x1b[33m~\x1b[0m"), "{ansi}");
        assert!(!render(&plan(), Colour::Plain).contains('\x1b'));
    }

    #[test]
    fn the_exit_code_says_whether_anything_would_fail_or_went_unanswered() {
        let mut p = plan();
        assert_eq!(p.exit_code(), EXIT_WOULD_FAIL);
        p.nodes.remove(1);
        assert_eq!(p.exit_code(), EXIT_INCOMPLETE);
        p.nodes.truncate(1);
        assert_eq!(p.exit_code(), crate::error::EXIT_OK);
        assert_eq!(p.nodes[0].verdict(), Verdict::WouldChange);
        // An agent that could not plan fails the plan even without items.
        p.nodes[0].answer = planned(Vec::new(), NodeState::Failed);
        assert_eq!(p.exit_code(), EXIT_WOULD_FAIL);
        p.nodes[0].answer = planned(
            vec![item(
                "net.ipv4.tcp_sack",
                Some("1"),
                "1",
                ItemState::Unchanged,
            )],
            NodeState::Planned,
        );
        assert_eq!(p.nodes[0].verdict(), Verdict::NoChange);
        assert_eq!(p.exit_code(), crate::error::EXIT_OK);
        p.nodes.clear();
        assert_eq!(p.exit_code(), crate::error::EXIT_OK);
        assert_eq!(
            render(&p, Colour::Plain),
            "Plan of NetworkTuning edge revision r2: 0 nodes selected\n\nNodes: no node selected. Nothing was changed.\n"
        );
    }

    #[test]
    fn json_says_which_answer_each_node_gave() {
        let v = serde_json::to_value(plan()).unwrap();
        assert_eq!(v["nodes"][0]["answer"]["result"], "planned");
        assert_eq!(
            v["nodes"][0]["answer"]["preview"]["items"][0]["state"],
            "WouldChange"
        );
        assert_eq!(v["nodes"][2]["answer"]["result"], "noAnswer");
        assert_eq!(v["nodes"][2]["answer"]["waited"], "30s");
        assert_eq!(v["nodes"][3]["answer"]["result"], "noAgent");
        assert!(v["nodes"][3].get("governedBy").is_none());
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn selection_is_the_tunings_selector_narrowed_by_node() {
        let nodes: BTreeMap<String, BTreeMap<String, String>> = [
            ("node-a", labels(&[("pool", "edge")])),
            ("node-b", labels(&[("pool", "edge"), ("zone", "x")])),
            ("node-d", labels(&[("pool", "core")])),
        ]
        .into_iter()
        .map(|(n, l)| (n.to_string(), l))
        .collect();
        let tuning = parse_tuning(
            "apiVersion: hoststack.dev/v1alpha1\nkind: NetworkTuning\nmetadata:\n  name: edge\nspec:\n  nodeSelector:\n    matchLabels:\n      pool: edge\n",
            "t.yaml",
        )
        .unwrap();
        let selector = &tuning.spec.node_selector;
        assert_eq!(
            select(selector, &nodes, None).unwrap(),
            ["node-a", "node-b"]
        );
        assert_eq!(
            select(selector, &nodes, Some("node-b")).unwrap(),
            ["node-b"]
        );
        let e = select(selector, &nodes, Some("node-d")).unwrap_err();
        assert_eq!(e.exit_code(), crate::error::EXIT_ERROR);
        assert_eq!(
            e.to_string(),
            "node node-d is not selected by the tuning's nodeSelector"
        );
        let e = select(selector, &nodes, Some("node-x")).unwrap_err();
        assert_eq!(e.exit_code(), crate::error::EXIT_NOT_FOUND);
        assert_eq!(
            select(&NodeSelector::default(), &nodes, None)
                .unwrap()
                .len(),
            3
        );
    }

    #[test]
    fn a_file_must_hold_exactly_one_network_tuning() {
        let one = "---\napiVersion: hoststack.dev/v1alpha1\nkind: NetworkTuning\nmetadata:\n  name: edge\nspec:\n  nodeSelector: {}\n  sysctls:\n    net.ipv4.tcp_ecn: \"1\"\n---\n";
        let t = parse_tuning(one, "t.yaml").unwrap();
        assert_eq!(t.metadata.name.as_deref(), Some("edge"));
        assert_eq!(t.spec.config.sysctls.len(), 1);
        let two = format!("{one}{one}");
        let e = parse_tuning(&two, "t.yaml").unwrap_err();
        assert_eq!(
            e.to_string(),
            "t.yaml: holds 2 objects; plan takes exactly one NetworkTuning"
        );
        let e = parse_tuning("kind: ConfigMap\n", "c.yaml").unwrap_err();
        assert_eq!(
            e.to_string(),
            "c.yaml: kind \"ConfigMap\", not NetworkTuning"
        );
        let e = parse_tuning("kind: NetworkTuning\nspec: 3\n", "b.yaml").unwrap_err();
        assert!(e.to_string().starts_with("b.yaml: "), "{e}");
        let e = parse_tuning(": : :\n", "x.yaml").unwrap_err();
        assert!(e.to_string().starts_with("x.yaml: not YAML"), "{e}");
    }
}
