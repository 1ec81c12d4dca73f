//! Whether an injected fault landed where it was aimed, decided from what the lab recorded (the
//! API server's audit log, an agent's journal on disk), never assumed. One pure decision per
//! aim, each a function of its evidence only:
//!
//! - an operator kill aims at the leader: the lease was held at the kill, and a live process
//!   held it after ([`lease_passed_on`]);
//! - an API server or etcd restart aims at a rollout in flight: a node assigned a generation it
//!   had not answered yet when the control plane went down ([`rollout_in_flight`]);
//! - a cut-off aims at the heartbeat: it expired while the node was cut off
//!   ([`heartbeat_expired`]);
//! - an unwritable state directory aims at a journal save: the agent reported a journal error
//!   inside the window ([`journal_save_refused`]);
//! - a kill or a power cut in a transaction aims at its inside: the journal on disk still held
//!   the transaction ([`inside_transaction`]);
//! - a kill in the dead-man window aims between the transaction and its confirmation: the
//!   journal on disk still held the revision provisional ([`inside_window`]);
//! - a cut-off in the dead-man window aims at the undo at its deadline: a journal save inside
//!   the cut-off dropped the provisional revision and went back to the one before it
//!   ([`undone_unconfirmed`]).
//!
//! Times are microseconds since the Unix epoch, as the audit log and the write logs give them.

use super::history::Node;
use super::record::micros_of;
use serde_json::Value;
use std::collections::BTreeMap;

/// One successful write of a Lease, as the audit log recorded its answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseWrite {
    /// When the API server answered.
    pub micros: u64,
    /// `spec.holderIdentity` after the write (`None`: released).
    pub holder: Option<String>,
    /// When the lease expires unless renewed: `spec.renewTime` plus `leaseDurationSeconds`.
    pub expires: Option<u64>,
}

/// The successful writes of Lease `name` in the audit log, in the order answered. The holder
/// and expiry are read from the answer's body, which the lab's audit policy records for the
/// operators' election Lease only (for any other Lease both are `None`).
pub fn lease_writes(events: &[Value], name: &str) -> Vec<LeaseWrite> {
    events
        .iter()
        .filter(|e| {
            let object_ref = &e["objectRef"];
            let code = e["responseStatus"]["code"].as_u64().unwrap_or(0);
            object_ref["apiGroup"] == "coordination.k8s.io"
                && object_ref["resource"] == "leases"
                && object_ref["name"] == name
                && matches!(e["verb"].as_str(), Some("create" | "update" | "patch"))
                && (200..300).contains(&code)
        })
        .filter_map(|e| {
            let spec = &e["responseObject"]["spec"];
            let duration = spec["leaseDurationSeconds"].as_u64();
            Some(LeaseWrite {
                micros: micros_of(&e["stageTimestamp"])?,
                holder: spec["holderIdentity"].as_str().map(str::to_string),
                expires: micros_of(&spec["renewTime"])
                    .zip(duration)
                    .map(|(renewed, secs)| renewed + secs * 1_000_000),
            })
        })
        .collect()
}

/// Whether an operator killed at `killed` was the leader and leadership passed on: the last
/// write of the election Lease before the kill left it held and unexpired at `killed`, and a
/// write after the kill shows it held again. The killed process writes nothing after it died,
/// so that holder is a live process: another replica, or the same identity started again.
pub fn lease_passed_on(writes: &[LeaseWrite], killed: u64) -> bool {
    let held_at_kill = writes
        .iter()
        .rfind(|w| w.micros <= killed)
        .is_some_and(|w| w.holder.is_some() && w.expires.is_some_and(|e| e > killed));
    let held_after = writes
        .iter()
        .any(|w| w.micros > killed && w.holder.is_some());
    held_at_kill && held_after
}

/// Whether a heartbeat renewed at `renewals` (sorted) and valid for `valid_for` after each
/// renewal had expired at some instant of `[from, until]`: a renewal older than `valid_for`
/// was the latest then. A node that never renewed before has no heartbeat to expire.
pub fn heartbeat_expired(renewals: &[u64], valid_for: u64, from: u64, until: u64) -> bool {
    let mut latest = renewals.iter().copied().filter(|&r| r <= from).max();
    for &renewed in renewals.iter().filter(|&&r| r > from && r <= until) {
        if latest.is_some_and(|l| renewed - l > valid_for) {
            return true;
        }
        latest = Some(renewed);
    }
    latest.is_some_and(|l| until - l > valid_for)
}

/// Whether a rollout was in flight at `at`: some node's newest assignment before then (time,
/// node, generation) was not yet answered by a report of that generation or a newer one (time,
/// node, generation answered).
pub fn rollout_in_flight(
    assigned: &[(u64, Node, i64)],
    answered: &[(u64, Node, i64)],
    at: u64,
) -> bool {
    let answered = newest_before(answered, at);
    newest_before(assigned, at)
        .into_iter()
        .any(|(node, generation)| answered.get(node).is_none_or(|&a| a < generation))
}

/// Each node's newest generation among `events` (time, node, generation) before `at`.
fn newest_before(events: &[(u64, Node, i64)], at: u64) -> BTreeMap<&str, i64> {
    let mut by_node: BTreeMap<&str, i64> = BTreeMap::new();
    for (_, node, generation) in events.iter().filter(|(m, _, _)| *m < at) {
        let newest = by_node.entry(node).or_insert(*generation);
        *newest = (*newest).max(*generation);
    }
    by_node
}

/// Whether an agent tried to save its journal while its state directory was unwritable
/// (`from` to `until`): one of its reports then (time, `status.state`, `status.message`) is
/// the agent error of a journal it could not save (Applying, naming the journal). A save that
/// fails is in no write log (only saves that succeed are), so its report is the evidence.
pub fn journal_save_refused(reports: &[(u64, String, String)], from: u64, until: u64) -> bool {
    reports.iter().any(|(micros, state, message)| {
        (from..=until).contains(micros)
            && state == "Applying"
            && message.starts_with("agent error: ")
            && message.contains("journal")
    })
}

/// Whether the journal on disk (`journal.json` as read, null when unreadable) held a
/// transaction in flight: a kill or a power cut then landed inside it.
pub fn inside_transaction(journal: &Value) -> bool {
    !journal["transaction"].is_null()
}

/// Whether the journal on disk (`journal.json` as read, null when unreadable) held a revision
/// applied and not confirmed yet: a kill then landed in the dead-man window.
pub fn inside_window(journal: &Value) -> bool {
    !journal["provisional"].is_null()
}

/// Whether the journal saves of a write log (`log`, JSON lines) show a provisional revision
/// undone unconfirmed between `from` and `until`: a save then that holds no provisional revision
/// and no transaction, right after one that held a provisional revision, with the applied
/// revision put back to the one before (a confirmation keeps it).
pub fn undone_unconfirmed(log: &str, from: u64, until: u64) -> bool {
    let entries: Vec<Value> = log
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .collect();
    let saves: Vec<(u64, &Value)> = entries
        .iter()
        .filter_map(|e| Some((e["micros"].as_u64()?, e.get("journal")?)))
        .collect();
    saves.windows(2).any(|pair| {
        let ((_, before), (micros, after)) = (pair[0], pair[1]);
        (from..=until).contains(&micros)
            && !before["provisional"].is_null()
            && after["provisional"].is_null()
            && after["transaction"].is_null()
            && after["applied"] == before["provisional"]["previous"]
            && after["applied"] != before["applied"]
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn write(micros: u64, holder: Option<&str>, expires: u64) -> LeaseWrite {
        LeaseWrite {
            micros,
            holder: holder.map(str::to_string),
            expires: Some(expires),
        }
    }

    #[test]
    fn lease_writes_are_read_from_the_audit_log_s_answers() {
        let event = |name: &str, code: u64, holder: Value| {
            json!({
                "verb": "patch",
                "stageTimestamp": "2026-12-04T21:30:00.000001Z",
                "objectRef": {"apiGroup": "coordination.k8s.io", "resource": "leases", "name": name},
                "responseStatus": {"code": code},
                "responseObject": {"spec": {"holderIdentity": holder, "renewTime": "2026-12-04T21:30:00.000000Z", "leaseDurationSeconds": 15}},
            })
        };
        let events = [
            event("op", 200, json!("a")),
            event("op", 409, json!("b")),
            event("other", 200, json!("c")),
            event("op", 200, Value::Null),
        ];
        let at = 1_796_419_800_000_000;
        assert_eq!(
            lease_writes(&events, "op"),
            vec![
                write(at + 1, Some("a"), at + 15_000_000),
                write(at + 1, None, at + 15_000_000)
            ]
        );
    }

    #[test]
    fn an_operator_kill_hit_when_the_leader_died_and_a_live_process_held_the_lease_after() {
        let renewed = [write(10, Some("op-0"), 25)];
        // Killed while it led, then the lease held again: hit.
        let taken = [&renewed[..], &[write(30, Some("op-0"), 45)]].concat();
        assert!(lease_passed_on(&taken, 20));
        // Nobody held the lease after the kill: no leader came back.
        assert!(!lease_passed_on(&renewed, 20));
        assert!(!lease_passed_on(
            &[&renewed[..], &[write(30, None, 45)]].concat(),
            20
        ));
        // The killed operator did not lead: its lease had expired, or it had released it.
        assert!(!lease_passed_on(&taken, 26));
        assert!(!lease_passed_on(
            &[write(10, None, 25), write(30, Some("op-0"), 45)],
            20
        ));
        // No evidence at all.
        assert!(!lease_passed_on(&[], 20));
    }

    #[test]
    fn a_cut_off_hit_when_the_heartbeat_expired_inside_it() {
        // Renewed every second, valid for three; cut off from 10 to 15.
        let cut_through: Vec<u64> = (0..=10).chain(16..=20).collect();
        assert!(heartbeat_expired(&cut_through, 3, 10, 15));
        // Still renewing through the window (the cut did not stop the heartbeat): no hit.
        let renewing: Vec<u64> = (0..=20).collect();
        assert!(!heartbeat_expired(&renewing, 3, 10, 15));
        // A gap shorter than the validity: no expiry.
        let short: Vec<u64> = (0..=10).chain(13..=20).collect();
        assert!(!heartbeat_expired(&short, 3, 10, 15));
        // Expired before the window and not yet renewed inside it: expired inside it too.
        assert!(heartbeat_expired(&[0, 1, 17], 3, 10, 15));
        // Expired only after the window.
        assert!(!heartbeat_expired(&[0, 13], 3, 14, 15));
        // Never renewed: nothing to expire.
        assert!(!heartbeat_expired(&[], 3, 10, 15));
    }

    #[test]
    fn a_control_plane_restart_hit_when_a_node_had_not_answered_its_assignment() {
        let assigned = [(1, "a".to_string(), 2), (5, "b".to_string(), 3)];
        let answered = [(4, "a".to_string(), 2), (9, "b".to_string(), 3)];
        // At 6, b waits for its answer: in flight.
        assert!(rollout_in_flight(&assigned, &answered, 6));
        // At 2, a waits.
        assert!(rollout_in_flight(&assigned, &answered, 2));
        // At 4.5 every assignment so far is answered; after 9 too.
        assert!(!rollout_in_flight(&assigned, &answered, 5));
        assert!(!rollout_in_flight(&assigned, &answered, 10));
        // Before anything was assigned: nothing in flight.
        assert!(!rollout_in_flight(&assigned, &answered, 1));
        // An answer to an older generation does not answer a newer assignment.
        assert!(rollout_in_flight(
            &[(1, "a".to_string(), 4)],
            &[(2, "a".to_string(), 3)],
            3
        ));
    }

    #[test]
    fn an_unwritable_state_directory_hit_when_a_journal_save_failed_inside_it() {
        let report =
            |micros, state: &str, message: &str| (micros, state.to_string(), message.to_string());
        let refused = report(
            12,
            "Applying",
            "agent error: journal /s/journal.json: read-only file system",
        );
        assert!(journal_save_refused(std::slice::from_ref(&refused), 10, 14));
        // Outside the window, or a report that is no journal error: no hit.
        assert!(!journal_save_refused(&[refused], 13, 14));
        assert!(!journal_save_refused(
            &[report(12, "Applied", "revision r is applied and verified")],
            10,
            14
        ));
        assert!(!journal_save_refused(
            &[report(12, "Applying", "agent error: API server timeout")],
            10,
            14
        ));
        assert!(!journal_save_refused(&[], 10, 14));
    }

    #[test]
    fn a_kill_in_a_transaction_hit_when_the_journal_still_held_it() {
        assert!(inside_transaction(
            &json!({"transaction": {"target": {"revision": "r"}}})
        ));
        assert!(inside_transaction(&json!({"transaction": {"before": []}})));
        assert!(!inside_transaction(
            &json!({"transaction": null, "originals": []})
        ));
        assert!(!inside_transaction(&Value::Null));
    }

    #[test]
    fn a_kill_in_the_window_hit_when_the_journal_still_held_the_revision_provisional() {
        assert!(inside_window(
            &json!({"applied": {"revision": "r"}, "provisional": {"deadline": 9}})
        ));
        assert!(!inside_window(&json!({"applied": {"revision": "r"}})));
        assert!(!inside_window(&Value::Null));
    }

    #[test]
    fn a_cut_off_in_the_window_hit_when_the_revision_was_undone_inside_it() {
        let provisional = r#"{"micros": 5, "journal": {"applied": {"revision": "b"}, "provisional": {"previous": {"revision": "a"}, "deadline": 9}}}"#;
        let undone = r#"{"micros": 10, "journal": {"applied": {"revision": "a"}}}"#;
        let confirmed = r#"{"micros": 10, "journal": {"applied": {"revision": "b"}}}"#;
        let log = format!("{provisional}\n{{\"micros\": 8, \"wrote\": {{}}}}\n{undone}");
        assert!(undone_unconfirmed(&log, 6, 12));
        // Undone outside the cut-off.
        assert!(!undone_unconfirmed(&log, 11, 12));
        // Confirmed, not undone.
        assert!(!undone_unconfirmed(
            &format!("{provisional}\n{confirmed}"),
            6,
            12
        ));
        // The first revision undone: nothing applied after it.
        let first = r#"{"micros": 5, "journal": {"applied": {"revision": "a"}, "provisional": {"deadline": 9}}}"#;
        let none = r#"{"micros": 10, "journal": {"originals": []}}"#;
        assert!(undone_unconfirmed(&format!("{first}\n{none}"), 6, 12));
        assert!(!undone_unconfirmed("", 6, 12));
    }
}
