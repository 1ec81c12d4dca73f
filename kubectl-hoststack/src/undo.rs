//! What `undo` writes: which recorded revision to go back to, and the JSON merge patch (RFC
//! 7386) that turns the tuning's node config into that revision's, removing what the old one
//! did not have. Pure; the command reads the ControllerRevisions and sends the patch.

use serde_json::{Map, Value};

use crate::error::{Error, Result};

/// One recorded revision of a tuning.
#[derive(Clone, Debug, PartialEq)]
pub struct Recorded {
    /// The revision hash.
    pub revision: String,
    /// The operator's sequence number (1 is the tuning's first revision).
    pub sequence: i64,
    /// The node config of the revision, as the operator recorded it.
    pub config: Value,
}

/// The revision to go back to: `to` when given, else the newest recorded revision other than
/// `current` (so two undos in a row go back and forth, like `kubectl rollout undo`).
pub fn pick<'a>(
    tuning: &str,
    history: &'a [Recorded],
    current: &str,
    to: Option<&str>,
) -> Result<&'a Recorded> {
    if let Some(to) = to {
        return history.iter().find(|r| r.revision == to).ok_or_else(|| {
            Error::NotFound(format!(
                "NetworkTuning {tuning} has no recorded revision {to} (recorded: {})",
                listing(history)
            ))
        });
    }
    history
        .iter()
        .filter(|r| r.revision != current)
        .max_by_key(|r| r.sequence)
        .ok_or_else(|| {
            Error::Invalid(format!(
                "NetworkTuning {tuning} has no revision before {current} to go back to (recorded: {})",
                listing(history)
            ))
        })
}

fn listing(history: &[Recorded]) -> String {
    if history.is_empty() {
        return "none".into();
    }
    let mut sorted: Vec<&Recorded> = history.iter().collect();
    sorted.sort_by_key(|r| r.sequence);
    sorted
        .iter()
        .map(|r| format!("{} (#{})", r.revision, r.sequence))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The merge patch that turns `from` into `to`: changed values replaced, objects merged key by
/// key, keys only `from` has set to null (removed). Arrays are replaced whole, as merge patch
/// does.
pub fn merge_patch(from: &Value, to: &Value) -> Value {
    match (from, to) {
        (Value::Object(f), Value::Object(t)) => {
            let mut patch = Map::new();
            for key in f.keys().filter(|k| !t.contains_key(*k)) {
                patch.insert(key.clone(), Value::Null);
            }
            for (key, value) in t {
                match f.get(key) {
                    Some(old) if old == value => {}
                    Some(old) if old.is_object() && value.is_object() => {
                        patch.insert(key.clone(), merge_patch(old, value));
                    }
                    _ => {
                        patch.insert(key.clone(), value.clone());
                    }
                }
            }
            Value::Object(patch)
        }
        _ => to.clone(),
    }
}

/// Applies a merge patch (RFC 7386), to check [`merge_patch`] against.
#[cfg(test)]
fn apply(target: &Value, patch: &Value) -> Value {
    match patch {
        Value::Object(p) => {
            let mut out = target.as_object().cloned().unwrap_or_default();
            for (k, v) in p {
                if v.is_null() {
                    out.remove(k);
                } else {
                    let merged = apply(out.get(k).unwrap_or(&Value::Null), v);
                    out.insert(k.clone(), merged);
                }
            }
            Value::Object(out)
        }
        _ => patch.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rec(revision: &str, sequence: i64) -> Recorded {
        Recorded {
            revision: revision.into(),
            sequence,
            config: json!({}),
        }
    }

    #[test]
    fn the_previous_revision_is_the_newest_other_one() {
        let history = [rec("a", 1), rec("c", 3), rec("b", 2)];
        assert_eq!(pick("edge", &history, "c", None).unwrap().revision, "b");
        // Back on a after an undo: the next undo goes to c, the newest other one.
        assert_eq!(pick("edge", &history, "a", None).unwrap().revision, "c");
        assert_eq!(
            pick("edge", &history, "c", Some("a")).unwrap().revision,
            "a"
        );
        let e = pick("edge", &history, "c", Some("z")).unwrap_err();
        assert_eq!(e.exit_code(), crate::error::EXIT_NOT_FOUND);
        assert_eq!(
            e.to_string(),
            "NetworkTuning edge has no recorded revision z (recorded: a (#1), b (#2), c (#3))"
        );
        let e = pick("edge", &[rec("c", 1)], "c", None).unwrap_err();
        assert!(e.to_string().contains("no revision before c"), "{e}");
    }

    #[test]
    fn the_patch_turns_the_config_into_the_old_one_and_removes_what_it_lacked() {
        let from = json!({
            "sysctls": {"net.ipv4.tcp_sack": "0", "net.ipv4.tcp_ecn": "1"},
            "hugepages": [{"size": "2Mi", "count": 4}],
            "firewall": {"table": "x"}
        });
        let to = json!({
            "sysctls": {"net.ipv4.tcp_sack": "0", "net.ipv4.tcp_dsack": "0"},
            "hugepages": [{"size": "2Mi", "count": 8}]
        });
        let patch = merge_patch(&from, &to);
        assert_eq!(
            patch,
            json!({
                "sysctls": {"net.ipv4.tcp_ecn": null, "net.ipv4.tcp_dsack": "0"},
                "hugepages": [{"size": "2Mi", "count": 8}],
                "firewall": null
            })
        );
        assert_eq!(apply(&from, &patch), to);
        assert_eq!(merge_patch(&to, &to), json!({}));
    }
}
