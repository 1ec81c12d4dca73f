//! The agent's copy of its NodeTuning, which never goes back in time.
//!
//! Copies reach the watch loop by two roads that nothing orders: the watch (its events, and the
//! objects of a relist) and the object each status write returns. A status write can return a
//! copy newer than watch events still queued behind it (the operator withdrew the spec while a
//! transaction ran), and taking such an event afterwards would bring the withdrawn spec back.
//! [`Latest`] is the one place that takes a copy: a newer one replaces the copy, an older one is
//! ignored (logged at debug level), an equal one is taken again (it is the same object).
//!
//! "Newer" is by `metadata.resourceVersion` ([`hoststack_crds::resource_version`]): the agent
//! relies on every copy of its NodeTuning coming from one etcd, whose revisions only grow. A
//! copy whose resourceVersion does not parse as an integer is refused with an error: taken
//! unordered, it would bring the race back (docs/install.md, Requirements). The newest version seen
//! outlives a deletion, so that nothing older than the deletion comes back after it; an object
//! created again later has a newer version.
//!
//! A relist (the watcher's restart after an error or a desync) goes through the same rule: its
//! objects are read with a quorum read (the watcher's default `ListSemantic::MostRecent`), so
//! they are never older than what the agent saw before the relist began, but a status write
//! made while the relist was under way can be newer than them. A relist that no longer finds
//! the object means that it was deleted in between: that is taken as a deletion.

use std::cmp::Ordering;

use hoststack_crds::resource_version;
use hoststack_crds::NodeTuning;

/// Where a copy came from, for the log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Road {
    /// A watch event.
    Watch,
    /// A relist of the watch.
    Relist,
    /// The answer to the agent's own status write.
    StatusWrite,
}

impl Road {
    /// The road's name in log lines.
    pub fn as_str(self) -> &'static str {
        match self {
            Road::Watch => "watch",
            Road::Relist => "relist",
            Road::StatusWrite => "status write",
        }
    }
}

/// The node's NodeTuning as last taken, and the newest resourceVersion seen.
#[derive(Clone, Debug, Default)]
pub struct Latest {
    object: Option<NodeTuning>,
    /// The resourceVersion of the newest copy or deletion taken (kept after a deletion).
    version: Option<String>,
}

impl Latest {
    /// The copy, or `None` when the object does not exist (or was never seen).
    pub fn object(&self) -> Option<&NodeTuning> {
        self.object.as_ref()
    }

    /// Takes `object` from `road` unless it is older than the copy the agent has; whether it
    /// was taken.
    pub fn offer(&mut self, object: NodeTuning, road: Road) -> bool {
        if !self.is_current(object.metadata.resource_version.as_deref(), road) {
            return false;
        }
        self.version = object.metadata.resource_version.clone();
        self.object = Some(object);
        true
    }

    /// The object was deleted: `last` is its final state from a watch's Delete event (`None`
    /// when a relist no longer found it). Taken unless the deletion is older than the copy;
    /// whether it was taken.
    pub fn deleted(&mut self, last: Option<&NodeTuning>, road: Road) -> bool {
        let version = last.and_then(|o| o.metadata.resource_version.clone());
        if version.is_some() && !self.is_current(version.as_deref(), road) {
            return false;
        }
        if version.is_some() {
            self.version = version;
        }
        self.object = None;
        true
    }

    /// Whether a copy of `version` is not older than the newest seen. A version that cannot
    /// be ordered (not a decimal integer, or none) is refused, loudly: taking it would let an
    /// older copy bring a withdrawn spec back.
    fn is_current(&self, version: Option<&str>, road: Road) -> bool {
        if resource_version::compare(version, version).is_none() {
            tracing::error!(
                road = road.as_str(),
                resource_version = version,
                "refusing a NodeTuning whose resourceVersion is not an integer: the agent orders \
                 copies by it and needs an API server whose resourceVersions are integers \
                 (docs/install.md, Requirements)"
            );
            return false;
        }
        let Some(known) = self.version.as_deref() else {
            return true;
        };
        match resource_version::compare(version, Some(known)) {
            Some(Ordering::Less) => {
                tracing::debug!(
                    road = road.as_str(),
                    resource_version = version,
                    newest = known,
                    "ignoring a NodeTuning older than the one the agent has"
                );
                false
            }
            Some(Ordering::Equal | Ordering::Greater) | None => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hoststack_crds::NodeTuningSpec;

    /// The NodeTuning at `version` for `tuning` (`None`: a withdrawn spec).
    fn copy(version: &str, tuning: Option<&str>) -> NodeTuning {
        let mut nt = NodeTuning::new(
            "node-a",
            NodeTuningSpec {
                tuning: tuning.map(Into::into),
                ..NodeTuningSpec::default()
            },
        );
        nt.metadata.resource_version = Some(version.into());
        nt
    }

    fn tuning_of(latest: &Latest) -> Option<Option<&str>> {
        latest.object().map(|o| o.spec.tuning.as_deref())
    }

    #[test]
    fn an_older_copy_never_replaces_a_newer_one() {
        let mut latest = Latest::default();
        assert!(latest.offer(copy("10", Some("edge")), Road::Relist));
        // The status write returns the spec the operator withdrew meanwhile...
        assert!(latest.offer(copy("13", None), Road::StatusWrite));
        // ...and the watch events queued before it arrive afterwards: ignored.
        assert!(!latest.offer(copy("11", Some("edge")), Road::Watch));
        assert!(!latest.offer(copy("12", None), Road::Watch));
        assert_eq!(tuning_of(&latest), Some(None));
        // The watch's copy of the write itself, and anything newer, are taken.
        assert!(latest.offer(copy("13", None), Road::Watch));
        assert!(latest.offer(copy("14", Some("core")), Road::Watch));
        assert_eq!(tuning_of(&latest), Some(Some("core")));
    }

    #[test]
    fn a_deletion_holds_back_older_copies_and_a_new_object_is_taken() {
        let mut latest = Latest::default();
        assert!(latest.offer(copy("20", Some("edge")), Road::Watch));
        assert!(!latest.deleted(Some(&copy("19", Some("edge"))), Road::Watch));
        assert_eq!(tuning_of(&latest), Some(Some("edge")));
        assert!(latest.deleted(Some(&copy("21", Some("edge"))), Road::Watch));
        assert_eq!(tuning_of(&latest), None);
        assert!(!latest.offer(copy("20", Some("edge")), Road::StatusWrite));
        assert_eq!(tuning_of(&latest), None);
        // Created again: a newer version.
        assert!(latest.offer(copy("30", None), Road::Watch));
        assert_eq!(tuning_of(&latest), Some(None));
        // A relist that does not find it: deleted, and what it knew still holds.
        assert!(latest.deleted(None, Road::Relist));
        assert_eq!(tuning_of(&latest), None);
        assert!(!latest.offer(copy("29", Some("edge")), Road::Watch));
    }

    #[test]
    fn a_version_that_is_no_integer_is_refused() {
        let mut latest = Latest::default();
        assert!(!latest.offer(copy("opaque", Some("edge")), Road::Watch));
        assert_eq!(tuning_of(&latest), None);
        assert!(latest.offer(copy("10", Some("edge")), Road::Watch));
        assert!(!latest.offer(copy("opaque", None), Road::Watch));
        assert_eq!(tuning_of(&latest), Some(Some("edge")));
        // A copy without a version at all cannot be ordered either.
        let mut bare = copy("1", Some("core"));
        bare.metadata.resource_version = None;
        assert!(!latest.offer(bare, Road::StatusWrite));
        assert_eq!(tuning_of(&latest), Some(Some("edge")));
        // Nor can a deletion.
        assert!(!latest.deleted(Some(&copy("v11", None)), Road::Watch));
        assert_eq!(tuning_of(&latest), Some(Some("edge")));
    }
}
