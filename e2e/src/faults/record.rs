//! A real lab's [`History`], read from what the lab records rather than from what a test
//! believes happened:
//!
//! - the API server's audit log ([`crate::Lab::audit_events`]), which holds every write to a
//!   NodeTuning or a NetworkTuning with the object as stored: the operator's assignments
//!   (`spec.revision`, `spec.config.sysctls` and the generation), the agents' reports
//!   (`status.state`, `status.observedRevision`, the generation their conditions answer), the
//!   tuning's stable revision and phase, and its deletion;
//! - each agent's write log (`--write-log`, hoststack_agent::hooks): every host write with the
//!   revision it was for, and every journal save, whose originals give what was journaled and
//!   released.
//!
//! Each source yields [`Timed`] events; [`merge`] orders them by time into one history. The
//! audit log stamps an event when the API server answered (`stageTimestamp`), the write log when
//! the agent wrote; both read the same clock.

use super::history::{Event, History, Node, Outcome, Purpose, Values};
use hoststack_crds::GROUP;
use k8s_openapi::jiff::Timestamp;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// An event and when it happened (microseconds since the Unix epoch).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Timed {
    /// When.
    pub micros: u64,
    /// What.
    pub event: Event,
}

/// The events of the audit log's hoststack writes answered at or after `since`: assignments
/// (one per new generation of a NodeTuning; a write that changed nothing is none),
/// definitions of the revisions they carry, reports, the rollout's stable revision (with
/// `max_unavailable` nodes in flight allowed), rollbacks and deletions. Requests the API server
/// refused are left out.
pub fn from_audit(events: &[Value], since: u64, max_unavailable: usize) -> Vec<Timed> {
    let mut out = Vec::new();
    let mut defined = BTreeSet::new();
    let mut generations: BTreeMap<Node, i64> = BTreeMap::new();
    let mut stable: Option<Option<String>> = None;
    let mut rolled_back = BTreeSet::new();
    for event in events {
        let object_ref = &event["objectRef"];
        let code = event["responseStatus"]["code"].as_u64().unwrap_or(0);
        if object_ref["apiGroup"] != GROUP || !(200..300).contains(&code) {
            continue;
        }
        let Some(micros) = micros_of(&event["stageTimestamp"]).filter(|&m| m >= since) else {
            continue;
        };
        let mut push = |event: Event| out.push(Timed { micros, event });
        let object = &event["responseObject"];
        let verb = event["verb"].as_str().unwrap_or_default();
        let subresource = object_ref["subresource"].as_str().unwrap_or_default();
        match (object_ref["resource"].as_str(), subresource, verb) {
            (Some("nodetunings"), "", "create" | "patch" | "update") => {
                let node = name(object);
                let generation = object["metadata"]["generation"].as_i64().unwrap_or(0);
                if generations.insert(node.clone(), generation) == Some(generation) {
                    continue;
                }
                let spec = &object["spec"];
                let revision = spec["revision"].as_str().map(str::to_string);
                if let Some(r) = revision.as_ref().filter(|r| !defined.contains(*r)) {
                    defined.insert(r.clone());
                    push(Event::Defined {
                        revision: r.clone(),
                        values: sysctls(&spec["config"]["sysctls"]),
                    });
                }
                push(Event::Assigned {
                    node,
                    revision,
                    generation,
                });
            }
            (Some("nodetunings"), "status", "patch" | "update") => {
                if let Some(reported) = report(object) {
                    push(reported);
                }
            }
            (Some("networktunings"), "status", "patch" | "update") => {
                let status = &object["status"];
                let now_stable = status["stableRevision"].as_str().map(str::to_string);
                if stable.as_ref() != Some(&now_stable) {
                    stable = Some(now_stable.clone());
                    push(Event::Rollout {
                        stable: now_stable,
                        max_unavailable,
                    });
                }
                if status["phase"] == "RolledBack" {
                    if let Some(r) = status["currentRevision"].as_str() {
                        if rolled_back.insert(r.to_string()) {
                            push(Event::RolledBack {
                                revision: r.to_string(),
                            });
                        }
                    }
                }
            }
            (Some("networktunings"), "", "delete") => push(Event::Deleted),
            _ => {}
        }
    }
    out
}

/// The audit events of the status writes of `node`'s NodeTuning, in the order written.
pub fn status_writes<'a>(events: &'a [Value], node: &'a str) -> impl Iterator<Item = &'a Value> {
    events.iter().filter(move |e| {
        e["objectRef"]["resource"] == "nodetunings"
            && e["objectRef"]["subresource"] == "status"
            && e["objectRef"]["name"] == node
    })
}

/// Every answer an agent wrote at or after `since`, as (when, node, generation answered): a
/// status write whose state is a verdict (Applied, Failed or Reverted, not Applying), with the
/// newest generation its conditions name.
pub fn answers(events: &[Value], since: u64) -> Vec<(u64, Node, i64)> {
    events
        .iter()
        .filter(|e| {
            e["objectRef"]["resource"] == "nodetunings" && e["objectRef"]["subresource"] == "status"
        })
        .filter_map(|e| {
            let status = &e["responseObject"]["status"];
            if !matches!(
                status["state"].as_str(),
                Some("Applied" | "Failed" | "Reverted")
            ) {
                return None;
            }
            let generation = status["conditions"]
                .as_array()?
                .iter()
                .filter_map(|c| c["observedGeneration"].as_i64())
                .max()?;
            let micros = micros_of(&e["stageTimestamp"]).filter(|&m| m >= since)?;
            Some((micros, name(&e["responseObject"]), generation))
        })
        .collect()
}

/// Every status `node`'s agent wrote, as (when, `status.state`, `status.message`), from the
/// audit log.
pub fn from_audit_reports(events: &[Value], node: &str) -> Vec<(u64, String, String)> {
    status_writes(events, node)
        .filter_map(|e| {
            let status = &e["responseObject"]["status"];
            Some((
                micros_of(&e["stageTimestamp"])?,
                status["state"].as_str()?.to_string(),
                status["message"].as_str().unwrap_or_default().to_string(),
            ))
        })
        .collect()
}

/// The report in a NodeTuning's status: the outcome of the revision its last transaction was
/// about, answering the newest generation its conditions name. `None` while the agent is still
/// applying or has nothing to say of a revision.
fn report(object: &Value) -> Option<Event> {
    let status = &object["status"];
    let outcome = match status["state"].as_str()? {
        "Applied" => Outcome::Applied,
        "Failed" => Outcome::Failed,
        "Reverted" => Outcome::Reverted,
        _ => return None,
    };
    let generation = status["conditions"]
        .as_array()?
        .iter()
        .filter_map(|c| c["observedGeneration"].as_i64())
        .max()?;
    Some(Event::Reported {
        node: name(object),
        revision: status["observedRevision"].as_str()?.to_string(),
        generation,
        outcome,
    })
}

/// The events of `node`'s write log: its host writes, and the originals each journal save added
/// or dropped. A line that is not JSON (the last one, cut by a SIGKILL) is skipped.
pub fn from_write_log(node: &str, log: &str) -> Vec<Timed> {
    let mut out = Vec::new();
    let mut held: BTreeMap<String, String> = BTreeMap::new();
    for line in log.lines() {
        let Ok(entry) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let Some(micros) = entry["micros"].as_u64() else {
            continue;
        };
        let wrote = &entry["wrote"];
        if let Some(key) = wrote["target"].as_str() {
            let purpose = match wrote["revision"].as_str() {
                Some(revision) => Purpose::Apply(revision.to_string()),
                None => Purpose::Revert,
            };
            out.push(Timed {
                micros,
                event: Event::HostWrite {
                    node: node.to_string(),
                    purpose,
                    key: key.to_string(),
                    value: wrote["value"].as_str().unwrap_or_default().to_string(),
                },
            });
        }
        if let Some(originals) = entry["journal"]["originals"].as_array() {
            let now: BTreeMap<String, String> = originals
                .iter()
                .filter_map(|e| Some((e["target"].as_str()?.into(), e["value"].as_str()?.into())))
                .collect();
            for (key, original) in &now {
                if held.get(key) != Some(original) {
                    let event = Event::Journaled {
                        node: node.to_string(),
                        key: key.clone(),
                        original: original.clone(),
                    };
                    out.push(Timed { micros, event });
                }
            }
            for key in held.keys().filter(|k| !now.contains_key(*k)) {
                let event = Event::Released {
                    node: node.to_string(),
                    key: key.clone(),
                };
                out.push(Timed { micros, event });
            }
            held = now;
        }
    }
    out
}

/// The host writes in `node`'s write log at or after `since` that were not journaled first:
/// every write must come while the journal on disk holds a transaction whose `before` names the
/// setting, to the same revision. A write that restores a value may also come under the
/// journal's provisional revision (applied, not confirmed), whose transaction's `before` names
/// it: the dead-man window's undo restores from there, with no transaction in flight. That is
/// what makes an interrupted transaction, and an unconfirmed one, revertible, whatever happens
/// to the state directory after the journal was saved.
pub fn unjournaled_writes(node: &str, log: &str, since: u64) -> Vec<String> {
    let mut found = Vec::new();
    let mut transaction = Value::Null;
    let mut provisional = Value::Null;
    for entry in log
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
    {
        if let Some(journal) = entry.get("journal") {
            transaction = journal["transaction"].clone();
            provisional = journal["provisional"]["transaction"].clone();
            continue;
        }
        let wrote = &entry["wrote"];
        let Some(key) = wrote["target"].as_str() else {
            continue;
        };
        if entry["micros"].as_u64().is_none_or(|m| m < since) {
            continue;
        }
        let lists = |t: &Value| {
            t["before"]
                .as_array()
                .is_some_and(|b| b.iter().any(|e| e["target"] == key))
        };
        let revision = wrote["revision"].as_str();
        let to = transaction["target"]["revision"].as_str();
        let journaled = match revision {
            Some(_) => lists(&transaction) && revision == to,
            None => lists(&transaction) || lists(&provisional),
        };
        if !journaled {
            found.push(format!(
                "{node} wrote {key}={} for {} with no journaled transaction to it (journal: {transaction})",
                wrote["value"],
                revision.unwrap_or("a restore")
            ));
        }
    }
    found
}

/// One history of every part's events at or after `since`, in time order (events of one
/// instant keep the order of the parts, and their order within a part).
pub fn merge(parts: Vec<Vec<Timed>>, since: u64) -> History {
    let mut all: Vec<Timed> = parts
        .into_iter()
        .flatten()
        .filter(|t| t.micros >= since)
        .collect();
    all.sort_by_key(|t| t.micros);
    History {
        events: all.into_iter().map(|t| t.event).collect(),
    }
}

/// Microseconds since the epoch of an RFC 3339 time such as `2026-12-04T21:30:01.123456Z`.
pub fn micros_of(time: &Value) -> Option<u64> {
    let timestamp: Timestamp = time.as_str()?.parse().ok()?;
    u64::try_from(timestamp.as_microsecond()).ok()
}

/// An object's name.
fn name(object: &Value) -> Node {
    object["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// A NodeConfig's sysctls as strings (the API takes numbers too).
fn sysctls(map: &Value) -> Values {
    map.as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| {
            let value = v.as_str().map_or_else(|| v.to_string(), str::to_string);
            (k.clone(), value)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn audit(
        time: &str,
        verb: &str,
        resource: &str,
        subresource: &str,
        object: Value,
        code: u64,
    ) -> Value {
        json!({
            "verb": verb,
            "stageTimestamp": time,
            "objectRef": {"apiGroup": "hoststack.dev", "resource": resource, "subresource": subresource},
            "responseStatus": {"code": code},
            "responseObject": object,
        })
    }

    fn node_tuning(name: &str, generation: i64, revision: &str) -> Value {
        json!({
            "metadata": {"name": name, "generation": generation},
            "spec": {"revision": revision, "config": {"sysctls": {"net.core.somaxconn": "1024", "net.ipv4.tcp_fin_timeout": 30}}},
        })
    }

    #[test]
    fn the_audit_log_gives_new_assignments_reports_the_stable_revision_and_rollbacks_since_a_time()
    {
        let mut reported = node_tuning("node-a", 2, "r1");
        reported["status"] = json!({
            "state": "Failed", "observedRevision": "r1",
            "conditions": [{"type": "Applied", "observedGeneration": 2}, {"type": "Degraded", "observedGeneration": 1}],
        });
        let mut applying = node_tuning("node-a", 2, "r1");
        applying["status"] =
            json!({"state": "Applying", "observedRevision": "r1", "conditions": []});
        let tuning = |stable: Option<&str>, phase: &str| json!({"status": {"stableRevision": stable, "currentRevision": "r1", "phase": phase}});
        let events = vec![
            audit(
                "2026-12-04T21:30:00.000001Z",
                "create",
                "nodetunings",
                "",
                node_tuning("node-a", 2, "r1"),
                201,
            ),
            audit(
                "2026-12-04T21:29:59Z",
                "create",
                "nodetunings",
                "",
                node_tuning("node-b", 1, "r0"),
                201,
            ),
            audit(
                "2026-12-04T21:30:00.000002Z",
                "patch",
                "nodetunings",
                "",
                node_tuning("node-a", 3, "r1"),
                409,
            ),
            audit(
                "2026-12-04T21:30:00.000003Z",
                "patch",
                "nodetunings",
                "",
                node_tuning("node-a", 2, "r1"),
                200,
            ),
            audit(
                "2026-12-04T21:30:01Z",
                "patch",
                "nodetunings",
                "status",
                applying,
                200,
            ),
            audit(
                "2026-12-04T21:30:02Z",
                "patch",
                "nodetunings",
                "status",
                reported,
                200,
            ),
            audit(
                "2026-12-04T21:30:03Z",
                "patch",
                "networktunings",
                "status",
                tuning(None, "Progressing"),
                200,
            ),
            audit(
                "2026-12-04T21:30:04Z",
                "patch",
                "networktunings",
                "status",
                tuning(None, "RolledBack"),
                200,
            ),
            audit(
                "2026-12-04T21:30:05Z",
                "patch",
                "networktunings",
                "status",
                tuning(None, "RolledBack"),
                200,
            ),
            audit(
                "2026-12-04T21:30:06Z",
                "delete",
                "networktunings",
                "",
                json!({}),
                200,
            ),
            json!({"verb": "patch", "objectRef": {"apiGroup": "coordination.k8s.io", "resource": "leases"}}),
        ];
        let timed = from_audit(&events, 1_796_419_800_000_000, 1);
        let got: Vec<&Event> = timed.iter().map(|t| &t.event).collect();
        let values: Values = [
            ("net.core.somaxconn", "1024"),
            ("net.ipv4.tcp_fin_timeout", "30"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(
            got,
            vec![
                &Event::Defined {
                    revision: "r1".into(),
                    values
                },
                &Event::Assigned {
                    node: "node-a".into(),
                    revision: Some("r1".into()),
                    generation: 2
                },
                &Event::Reported {
                    node: "node-a".into(),
                    revision: "r1".into(),
                    generation: 2,
                    outcome: Outcome::Failed
                },
                &Event::Rollout {
                    stable: None,
                    max_unavailable: 1
                },
                &Event::RolledBack {
                    revision: "r1".into()
                },
                &Event::Deleted,
            ]
        );
        assert_eq!(timed[0].micros, 1_796_419_800_000_001);
        assert_eq!(timed[2].micros, 1_796_419_802_000_000);
    }

    #[test]
    fn a_revert_s_report_is_in_the_history_with_the_revision_it_reverted() {
        // The spec withdrawn (no revision) in generation 4; the agent reverted r1.
        let mut withdrawn = node_tuning("node-a", 4, "r1");
        withdrawn["spec"]["revision"] = Value::Null;
        withdrawn["status"] = json!({
            "state": "Reverted", "observedRevision": "r1",
            "conditions": [{"type": "Reverted", "observedGeneration": 4}],
        });
        let events = [audit(
            "2026-12-04T21:30:00Z",
            "patch",
            "nodetunings",
            "status",
            withdrawn,
            200,
        )];
        let got: Vec<Event> = from_audit(&events, 0, 1)
            .into_iter()
            .map(|t| t.event)
            .collect();
        assert_eq!(
            got,
            vec![Event::Reported {
                node: "node-a".into(),
                revision: "r1".into(),
                generation: 4,
                outcome: Outcome::Reverted
            }]
        );
    }

    #[test]
    fn an_answer_is_a_verdict_on_a_generation_not_an_applying() {
        let mut applying = node_tuning("node-a", 2, "r1");
        applying["status"] =
            json!({"state": "Applying", "conditions": [{"observedGeneration": 2}]});
        let mut applied = node_tuning("node-b", 3, "r1");
        applied["status"] = json!({"state": "Applied", "conditions": [{"observedGeneration": 1}, {"observedGeneration": 3}]});
        let events = [
            audit(
                "2026-12-04T21:30:00Z",
                "patch",
                "nodetunings",
                "status",
                applying,
                200,
            ),
            audit(
                "2026-12-04T21:30:01Z",
                "patch",
                "nodetunings",
                "status",
                applied.clone(),
                200,
            ),
            audit(
                "2026-12-04T21:29:00Z",
                "patch",
                "nodetunings",
                "status",
                applied,
                200,
            ),
        ];
        assert_eq!(
            answers(&events, 1_796_419_800_000_000),
            vec![(1_796_419_801_000_000, "node-b".to_string(), 3)]
        );
    }

    #[test]
    fn a_nodes_reports_come_with_their_state_and_message() {
        let mut failed = node_tuning("node-a", 2, "r1");
        failed["status"] = json!({"state": "Failed", "message": "agent error: journal"});
        let mut other = node_tuning("node-b", 2, "r1");
        other["status"] = json!({"state": "Applied"});
        let mut events = vec![
            audit(
                "2026-12-04T21:30:00Z",
                "patch",
                "nodetunings",
                "status",
                failed,
                200,
            ),
            audit(
                "2026-12-04T21:30:01Z",
                "patch",
                "nodetunings",
                "status",
                other,
                200,
            ),
        ];
        events[0]["objectRef"]["name"] = json!("node-a");
        events[1]["objectRef"]["name"] = json!("node-b");
        assert_eq!(
            from_audit_reports(&events, "node-a"),
            vec![(
                1_796_419_800_000_000,
                "Failed".into(),
                "agent error: journal".into()
            )]
        );
    }

    #[test]
    fn the_write_log_gives_writes_and_what_each_journal_save_added_and_dropped() {
        let log = r#"{"micros": 10, "journal": {"version": 1, "originals": [{"kind": "sysctl", "target": "a", "value": "1"}]}}
{"micros": 11, "wrote": {"kind": "sysctl", "target": "a", "value": "2", "revision": "r1"}}
{"micros": 12, "journal": {"version": 1, "originals": [{"kind": "sysctl", "target": "a", "value": "1"}, {"kind": "sysctl", "target": "b", "value": "5"}]}}
{"micros": 13, "wrote": {"kind": "sysctl", "target": "a", "value": "1", "revision": null}}
{"micros": 14, "journal": {"version": 1, "originals": []}}
{"micros": 15, "wro"#;
        let got: Vec<(u64, Event)> = from_write_log("n", log)
            .into_iter()
            .map(|t| (t.micros, t.event))
            .collect();
        let journaled = |key: &str, original: &str| Event::Journaled {
            node: "n".into(),
            key: key.into(),
            original: original.into(),
        };
        let write = |purpose: Purpose, value: &str| Event::HostWrite {
            node: "n".into(),
            purpose,
            key: "a".into(),
            value: value.into(),
        };
        let released = |key: &str| Event::Released {
            node: "n".into(),
            key: key.into(),
        };
        assert_eq!(
            got,
            vec![
                (10, journaled("a", "1")),
                (11, write(Purpose::Apply("r1".into()), "2")),
                (12, journaled("b", "5")),
                (13, write(Purpose::Revert, "1")),
                (14, released("a")),
                (14, released("b")),
            ]
        );
    }

    #[test]
    fn a_write_must_follow_a_journal_save_of_its_transaction() {
        let log = r#"{"micros": 1, "journal": {"transaction": {"target": {"revision": "r1"}, "before": [{"target": "a", "value": "1"}]}}}
{"micros": 2, "wrote": {"target": "a", "value": "2", "revision": "r1"}}
{"micros": 3, "wrote": {"target": "b", "value": "2", "revision": "r1"}}
{"micros": 4, "wrote": {"target": "a", "value": "2", "revision": "r2"}}
{"micros": 5, "wrote": {"target": "a", "value": "1", "revision": null}}
{"micros": 6, "journal": {"originals": []}}
{"micros": 7, "wrote": {"target": "a", "value": "1", "revision": null}}"#;
        let found = unjournaled_writes("n", log, 0);
        assert_eq!(found.len(), 3, "{found:?}");
        assert!(found[0].starts_with("n wrote b=\"2\" for r1"));
        assert!(found[1].starts_with("n wrote a=\"2\" for r2"));
        assert!(found[2].starts_with("n wrote a=\"1\" for a restore"));
        assert_eq!(unjournaled_writes("n", log, 6).len(), 1);
    }

    #[test]
    fn the_dead_man_window_s_undo_restores_under_the_provisional_revision() {
        // Applied r1 provisionally (no transaction in flight), then undone unconfirmed: the
        // restore of a is journaled by the provisional transaction; b is in no journal, and a
        // write to r1 is never journaled by a provisional revision.
        let log = r#"{"micros": 1, "journal": {"transaction": {"target": {"revision": "r1"}, "before": [{"target": "a", "value": "1"}]}}}
{"micros": 2, "wrote": {"target": "a", "value": "2", "revision": "r1"}}
{"micros": 3, "journal": {"applied": {"revision": "r1"}, "provisional": {"transaction": {"target": {"revision": "r1"}, "before": [{"target": "a", "value": "1"}]}, "deadline": 9}}}
{"micros": 4, "wrote": {"target": "a", "value": "1", "revision": null}}
{"micros": 5, "wrote": {"target": "b", "value": "1", "revision": null}}
{"micros": 6, "wrote": {"target": "a", "value": "2", "revision": "r1"}}
{"micros": 7, "journal": {"originals": []}}
{"micros": 8, "wrote": {"target": "a", "value": "1", "revision": null}}"#;
        let found = unjournaled_writes("n", log, 0);
        assert_eq!(found.len(), 3, "{found:?}");
        assert!(found[0].starts_with("n wrote b=\"1\" for a restore"));
        assert!(found[1].starts_with("n wrote a=\"2\" for r1"));
        assert!(found[2].starts_with("n wrote a=\"1\" for a restore"));
    }

    #[test]
    fn merge_orders_by_time_and_drops_what_came_before() {
        let at = |micros, event| Timed { micros, event };
        let history = merge(
            vec![
                vec![at(5, Event::Deleted), at(9, Event::Deleted)],
                vec![
                    at(
                        7,
                        Event::RolledBack {
                            revision: "r".into(),
                        },
                    ),
                    at(1, Event::Deleted),
                ],
            ],
            2,
        );
        assert_eq!(
            history.events,
            vec![
                Event::Deleted,
                Event::RolledBack {
                    revision: "r".into()
                },
                Event::Deleted
            ]
        );
    }
}
