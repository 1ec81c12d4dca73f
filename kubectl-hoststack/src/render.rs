//! `get`'s picture of a rollout: a pure function from a tuning and its nodes' NodeTunings to
//! text — the phase and revisions, then a tree of waves → nodes → items, each wave with its
//! analysis, and last the governed nodes no wave has reached. Colour is a parameter, so the
//! same tree prints plain for pipes and files.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

use hoststack_crds::{
    AnalysisStatus, ItemResult, ItemState, NetworkTuning, NodeTuning, Phase, WaveStatus,
};
use kube::ResourceExt;

/// Whether to colour the output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Colour {
    /// ANSI colours, for a terminal.
    Ansi,
    /// Plain text.
    Plain,
}

/// What a word means, which decides its colour.
#[derive(Clone, Copy)]
pub enum Tone {
    /// Done or as wanted: green.
    Good,
    /// Under way or changing: yellow.
    Busy,
    /// Failed or would fail: red.
    Bad,
    /// Beside the point: dim.
    Dim,
    /// A heading: bold.
    Bold,
}

impl Colour {
    /// `text` in the colour of `tone` (unchanged when plain).
    pub fn paint(self, tone: Tone, text: &str) -> String {
        if self == Colour::Plain {
            return text.to_string();
        }
        let code = match tone {
            Tone::Good => "32",
            Tone::Busy => "33",
            Tone::Bad => "31",
            Tone::Dim => "2",
            Tone::Bold => "1",
        };
        format!("\x1b[{code}m{text}\x1b[0m")
    }
}

fn phase_tone(phase: Phase) -> Tone {
    match phase {
        Phase::Complete => Tone::Good,
        Phase::Pending | Phase::Progressing | Phase::Paused | Phase::Superseded => Tone::Busy,
        Phase::RolledBack | Phase::Failed => Tone::Bad,
    }
}

fn word_tone(word: &str) -> Tone {
    match word {
        "Applied" | "Pass" | "Unchanged" | "Reverted" | "Planned" | "WouldChange" => Tone::Good,
        "Failed" | "Fail" | "RolledBack" | "WouldFail" | "NotSupported" => Tone::Bad,
        _ => Tone::Busy,
    }
}

fn item_tone(state: ItemState) -> Tone {
    word_tone(&state.to_string())
}

/// The rollout's state on one line, as `status` prints it at each change: phase, revisions,
/// node counts and the status' message, and a note while the status describes an older spec.
pub fn state_line(tuning: &NetworkTuning, colour: Colour) -> String {
    let status = tuning.status.clone().unwrap_or_default();
    let phase = status.phase.unwrap_or_default();
    let dash = "-".to_string();
    let mut line = format!(
        "NetworkTuning {}: {}  current {}  stable {}  {}/{} applied",
        tuning.name_any(),
        colour.paint(phase_tone(phase), &phase.to_string()),
        status.current_revision.as_ref().unwrap_or(&dash),
        status.stable_revision.as_ref().unwrap_or(&dash),
        status.applied_nodes,
        status.matched_nodes,
    );
    if status.failed_nodes > 0 {
        let _ = write!(line, ", {} failed", status.failed_nodes);
    }
    if let Some(message) = &status.message {
        let _ = write!(line, "  — {message}");
    }
    if let Some(generation) = tuning
        .metadata
        .generation
        .filter(|g| status.observed_generation != Some(*g))
    {
        let _ = write!(
            line,
            "  (generation {generation} not yet seen by the operator)"
        );
    }
    line.push('\n');
    line
}

/// The tuning's rollout as a tree. `nodes` are NodeTunings (those of other tunings are
/// ignored).
pub fn render(tuning: &NetworkTuning, nodes: &[NodeTuning], colour: Colour) -> String {
    let name = tuning.name_any();
    let by_node: BTreeMap<String, &NodeTuning> = nodes.iter().map(|n| (n.name_any(), n)).collect();
    let status = tuning.status.clone().unwrap_or_default();
    let mut out = String::new();
    let dash = "-".to_string();
    let _ = writeln!(
        out,
        "{} {}",
        colour.paint(Tone::Bold, "NetworkTuning"),
        name
    );
    let phase = status.phase.unwrap_or_default();
    let _ = writeln!(
        out,
        "  Phase:     {}",
        colour.paint(phase_tone(phase), &phase.to_string())
    );
    let _ = writeln!(
        out,
        "  Revision:  current {}  stable {}",
        status.current_revision.as_ref().unwrap_or(&dash),
        status.stable_revision.as_ref().unwrap_or(&dash),
    );
    let _ = writeln!(
        out,
        "  Nodes:     {} matched, {} updated, {} applied, {} failed",
        status.matched_nodes, status.updated_nodes, status.applied_nodes, status.failed_nodes
    );
    if let Some(message) = &status.message {
        let _ = writeln!(out, "  Message:   {message}");
    }
    for c in &status.conditions {
        if c.type_ == "Conflict" && c.status == "True" {
            let _ = writeln!(out, "  Conflict:  {}", c.message);
        }
    }

    let waved: BTreeSet<&str> = status
        .waves
        .iter()
        .flat_map(|w| w.nodes.iter().map(String::as_str))
        .collect();
    let rest: Vec<&str> = by_node
        .iter()
        .filter(|(n, nt)| {
            let governor = nt.spec.governed_by.as_ref().or(nt.spec.tuning.as_ref());
            governor == Some(&name) && !waved.contains(n.as_str())
        })
        .map(|(n, _)| n.as_str())
        .collect();
    if status.waves.is_empty() && rest.is_empty() {
        let _ = writeln!(out, "Waves: none yet");
        return out;
    }
    let _ = writeln!(out, "Waves");
    let mut tree = Tree::default();
    let roots = status.waves.len() + usize::from(!rest.is_empty());
    for (i, wave) in status.waves.iter().enumerate() {
        tree.child(i + 1 == roots, |t| wave_tree(t, wave, &by_node, colour));
    }
    if !rest.is_empty() {
        tree.child(true, |t| {
            t.line("not in a wave (stable)".to_string());
            for (i, node) in rest.iter().enumerate() {
                t.child(i + 1 == rest.len(), |t| {
                    node_tree(t, node, by_node.get(*node).copied(), colour)
                });
            }
        });
    }
    out.push_str(&tree.text);
    out
}

/// One wave: its line, its analysis, its nodes.
fn wave_tree(
    t: &mut Tree,
    wave: &WaveStatus,
    by_node: &BTreeMap<String, &NodeTuning>,
    colour: Colour,
) {
    let what = if wave.index == 0 { "canary" } else { "wave" };
    let mut line = format!(
        "{what} {}  {}",
        wave.index,
        colour.paint(word_tone(&wave.result), &wave.result)
    );
    if let Some(at) = &wave.applied_at {
        let _ = write!(line, "  applied {at}");
    }
    t.line(line);
    let count = wave.nodes.len() + usize::from(wave.analysis.is_some());
    let mut i = 0;
    if let Some(analysis) = &wave.analysis {
        i += 1;
        t.child(i == count, |t| analysis_tree(t, analysis, colour));
    }
    for node in &wave.nodes {
        i += 1;
        t.child(i == count, |t| {
            node_tree(t, node, by_node.get(node).copied(), colour)
        });
    }
}

/// A wave's analysis: the verdict and message, then one line per metric.
fn analysis_tree(t: &mut Tree, analysis: &AnalysisStatus, colour: Colour) {
    let mut line = format!(
        "analysis {}",
        colour.paint(word_tone(&analysis.verdict), &analysis.verdict)
    );
    if let Some(m) = &analysis.message {
        let _ = write!(line, ": {m}");
    }
    t.line(line);
    let n = analysis.metrics.len();
    for (i, m) in analysis.metrics.iter().enumerate() {
        let value = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
        let verdict = if m.passed { "pass" } else { "FAIL" };
        let tone = if m.passed { Tone::Good } else { Tone::Bad };
        let line = format!(
            "{}  judged {}  baseline {}  limit {}  {}",
            m.metric,
            value(&m.judged),
            value(&m.baseline),
            value(&m.limit),
            colour.paint(tone, verdict)
        );
        t.child(i + 1 == n, |t| t.line(line));
    }
}

/// A node: its part in the rollout, its agent's state and applied revision, then its items.
fn node_tree(t: &mut Tree, node: &str, nt: Option<&NodeTuning>, colour: Colour) {
    let Some(nt) = nt else {
        t.line(format!(
            "{node}  {}",
            colour.paint(Tone::Dim, "no NodeTuning")
        ));
        return;
    };
    let status = nt.status.clone().unwrap_or_default();
    let mut line = node.to_string();
    if let Some(phase) = nt.spec.rollout_phase {
        let _ = write!(line, "  {}", phase.as_str());
    }
    let state = status
        .state
        .map_or_else(|| "no report".to_string(), |s| s.to_string());
    let _ = write!(line, "  {}", colour.paint(word_tone(&state), &state));
    // The revision the node runs and the tuning it came from (another one's, for a node this
    // tuning took over and has not rolled onto yet).
    if let Some(r) = &status.applied_revision {
        let _ = write!(line, "  applied {r}");
        if let Some(t) = &status.applied_tuning {
            let _ = write!(line, " of {t}");
        }
    }
    if let (Some(r), Some(t)) = (&nt.spec.revision, &nt.spec.tuning) {
        let other_revision = status.applied_revision.as_ref() != Some(r);
        let other_tuning = status.applied_tuning.as_ref().is_some_and(|a| a != t);
        if other_revision || other_tuning {
            let _ = write!(line, "  asked {r} of {t}");
        }
    }
    // The post-apply probes: pending confirmation, all passed, or which failed and why.
    if let Some(c) = &status.confirmation {
        let _ = write!(line, "  provisional until {}", c.deadline);
    }
    let failed: Vec<String> = status
        .probes
        .iter()
        .filter(|p| !p.passed)
        .map(|p| {
            let why = p.message.as_deref().unwrap_or("failed");
            format!("probe {} {} FAILED: {why}", p.name, p.target)
        })
        .collect();
    if !failed.is_empty() {
        let _ = write!(line, "  {}", colour.paint(Tone::Bad, &failed.join("; ")));
    } else if !status.probes.is_empty() {
        let _ = write!(line, "  probes passed");
    }
    if let Some(m) = &status.message {
        let _ = write!(line, "  ({m})");
    }
    t.line(line);
    let n = status.items.len();
    for (i, item) in status.items.iter().enumerate() {
        let line = item_line(item, colour);
        t.child(i + 1 == n, |t| t.line(line));
    }
}

/// One item: `kind target: original → desired (actual A)  State  — message`.
fn item_line(item: &ItemResult, colour: Colour) -> String {
    let value = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
    let mut line = format!(
        "{} {}: {} → {} (actual {})  {}",
        item.kind,
        item.target,
        value(&item.original),
        value(&item.desired),
        value(&item.actual),
        colour.paint(item_tone(item.state), &item.state.to_string())
    );
    if let Some(m) = &item.message {
        let _ = write!(line, " — {m}");
    }
    line
}

/// Draws a tree with box characters: each `child` call indents one level, with `├─`/`└─` on
/// its first line and `│ ` (or spaces, under the last child) on its later lines.
#[derive(Default)]
struct Tree {
    text: String,
    /// For each open level: whether it is its parent's last child.
    levels: Vec<bool>,
    /// Whether the current level's first line is still to be written.
    first: bool,
}

impl Tree {
    fn child(&mut self, last: bool, body: impl FnOnce(&mut Tree)) {
        self.levels.push(last);
        self.first = true;
        body(self);
        self.levels.pop();
    }

    fn line(&mut self, text: String) {
        let depth = self.levels.len();
        for (i, last) in self.levels.iter().enumerate() {
            let own = i + 1 == depth;
            let mark = match (own, self.first, *last) {
                (true, true, false) => "├─ ",
                (true, true, true) => "└─ ",
                (_, _, false) => "│  ",
                (_, _, true) => "   ",
            };
            self.text.push_str(mark);
        }
        self.first = false;
        self.text.push_str(&text);
        self.text.push('\n');
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hoststack_crds::{
        MetricResult, NetworkTuningSpec, NetworkTuningStatus, NodeState, NodeTuningSpec,
        NodeTuningStatus, RolloutPhase,
    };

    fn node(name: &str, phase: RolloutPhase, applied: &str, items: Vec<ItemResult>) -> NodeTuning {
        let mut nt = NodeTuning::new(
            name,
            NodeTuningSpec {
                tuning: Some("edge".into()),
                revision: Some(applied.into()),
                rollout_phase: Some(phase),
                ..NodeTuningSpec::default()
            },
        );
        nt.status = Some(NodeTuningStatus {
            state: Some(NodeState::Applied),
            applied_revision: Some(applied.into()),
            items,
            ..NodeTuningStatus::default()
        });
        nt
    }

    fn sack(state: ItemState) -> ItemResult {
        ItemResult {
            kind: "sysctl".into(),
            target: "net.ipv4.tcp_sack".into(),
            original: Some("1".into()),
            desired: Some("0".into()),
            actual: Some("0".into()),
            state,
            message: None,
        }
    }

    fn tuning() -> NetworkTuning {
        let mut t = NetworkTuning::new("edge", NetworkTuningSpec::default());
        t.status = Some(NetworkTuningStatus {
            phase: Some(Phase::Progressing),
            current_revision: Some("r2".into()),
            stable_revision: Some("r1".into()),
            matched_nodes: 3,
            updated_nodes: 1,
            applied_nodes: 1,
            waves: vec![WaveStatus {
                index: 0,
                nodes: vec!["node-c".into()],
                result: "Applied".into(),
                applied_at: Some("2026-11-30T02:00:00Z".into()),
                analysis: Some(AnalysisStatus {
                    verdict: "Pending".into(),
                    message: Some("waiting to be promoted".into()),
                    request_id: None,
                    metrics: vec![MetricResult {
                        metric: "RetransmitRatio".into(),
                        judged: Some("0.002".into()),
                        baseline: Some("0.001".into()),
                        limit: Some("0.01".into()),
                        passed: true,
                    }],
                    prometheus_outcome: None,
                }),
                from: Vec::new(),
            }],
            ..NetworkTuningStatus::default()
        });
        t
    }

    fn nodes() -> Vec<NodeTuning> {
        let mut other = node("node-x", RolloutPhase::Stable, "z9", vec![]);
        other.spec.tuning = Some("core".into());
        vec![
            node(
                "node-c",
                RolloutPhase::Canary,
                "r2",
                vec![sack(ItemState::Applied)],
            ),
            node("node-a", RolloutPhase::Stable, "r1", vec![]),
            node("node-b", RolloutPhase::Stable, "r1", vec![]),
            other,
        ]
    }

    #[test]
    fn the_tree_has_waves_then_analysis_and_nodes_then_items_then_the_rest() {
        let text = render(&tuning(), &nodes(), Colour::Plain);
        let want = "\
NetworkTuning edge
  Phase:     Progressing
  Revision:  current r2  stable r1
  Nodes:     3 matched, 1 updated, 1 applied, 0 failed
Waves
├─ canary 0  Applied  applied 2026-11-30T02:00:00Z
│  ├─ analysis Pending: waiting to be promoted
│  │  └─ RetransmitRatio  judged 0.002  baseline 0.001  limit 0.01  pass
│  └─ node-c  canary  Applied  applied r2
│     └─ sysctl net.ipv4.tcp_sack: 1 → 0 (actual 0)  Applied
└─ not in a wave (stable)
   ├─ node-a  stable  Applied  applied r1
   └─ node-b  stable  Applied  applied r1
";
        assert_eq!(text, want, "\n{text}");
    }

    #[test]
    fn the_state_line_has_phase_revisions_counts_message_and_staleness() {
        let mut t = tuning();
        t.metadata.generation = Some(2);
        let status = t.status.as_mut().unwrap();
        status.observed_generation = Some(2);
        assert_eq!(
            state_line(&t, Colour::Plain),
            "NetworkTuning edge: Progressing  current r2  stable r1  1/3 applied\n"
        );
        let status = t.status.as_mut().unwrap();
        status.phase = Some(Phase::Paused);
        status.failed_nodes = 1;
        status.message = Some("rollout.paused is set".into());
        t.metadata.generation = Some(3);
        assert_eq!(
            state_line(&t, Colour::Plain),
            "NetworkTuning edge: Paused  current r2  stable r1  1/3 applied, 1 failed  — rollout.paused is set  (generation 3 not yet seen by the operator)\n"
        );
        assert!(state_line(&t, Colour::Ansi).contains("\x1b[33mPaused\x1b[0m"));
        let fresh = NetworkTuning::new("new", NetworkTuningSpec::default());
        assert_eq!(
            state_line(&fresh, Colour::Plain),
            "NetworkTuning new: Pending  current -  stable -  0/0 applied\n"
        );
    }

    #[test]
    fn plain_has_no_escape_codes_and_ansi_colours_the_states() {
        let plain = render(&tuning(), &nodes(), Colour::Plain);
        assert!(!plain.contains('\x1b'));
        let ansi = render(&tuning(), &nodes(), Colour::Ansi);
        assert!(ansi.contains("\x1b[33mProgressing\x1b[0m"), "{ansi}");
        assert!(ansi.contains("\x1b[32mApplied\x1b[0m"), "{ansi}");
        // Without the codes it is the same text.
        let stripped = ansi
            .split('\x1b')
            .enumerate()
            .map(|(i, part)| {
                if i == 0 {
                    part
                } else {
                    &part[part.find('m').unwrap() + 1..]
                }
            })
            .collect::<String>();
        assert_eq!(stripped, plain);
    }

    #[test]
    fn a_failed_item_shows_its_message_and_a_tuning_without_waves_says_so() {
        let mut nt = nodes();
        let mut bad = sack(ItemState::Failed);
        bad.message = Some("EINVAL".into());
        nt[0].status.as_mut().unwrap().items = vec![bad];
        let text = render(&tuning(), &nt, Colour::Plain);
        assert!(
            text.contains("sysctl net.ipv4.tcp_sack: 1 → 0 (actual 0)  Failed — EINVAL"),
            "{text}"
        );
        let fresh = NetworkTuning::new("new", NetworkTuningSpec::default());
        let text = render(&fresh, &[], Colour::Plain);
        assert!(
            text.contains("Phase:     Pending") && text.ends_with("Waves: none yet\n"),
            "{text}"
        );
    }
}
