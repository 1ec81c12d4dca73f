//! Which of two copies of one object is the newer, by `metadata.resourceVersion`.
//!
//! The operator and the agent each hold copies of objects that reach them by two roads: a watch
//! (or the cache it fills) and the answer to their own writes. Nothing orders the two, so each
//! side keeps the newer copy and ignores an older one, and they order copies the same way here.
//!
//! Kubernetes says to treat a resourceVersion as opaque. What this relies on is narrower, and
//! true of every API server backed by etcd: the resourceVersion of an object is the etcd
//! revision of its last write, a decimal integer, and the revisions of one etcd only grow, so
//! two copies of one object read from one cluster compare as integers. When either does not
//! parse as one (another storage backend), there is no order: [`compare`] says `None` and each
//! caller picks its own fallback. Revisions keep growing across an etcd restore only when it
//! is made with `etcdutl snapshot restore --bump-revision N --mark-compacted`, as etcd's
//! recovery guide says to for Kubernetes; after a restore without it, copies read before it
//! look newer than everything the API server serves until the processes holding them restart.

use std::cmp::Ordering;

/// How the copy of resourceVersion `a` compares with the copy of resourceVersion `b` of the
/// same object (`Less`: `a` is older); `None` when either is missing or not a decimal integer.
pub fn compare(a: Option<&str>, b: Option<&str>) -> Option<Ordering> {
    let parse = |v: Option<&str>| v?.parse::<u64>().ok();
    Some(parse(a)?.cmp(&parse(b)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_compare_as_integers_or_not_at_all() {
        // (a, b, a compared with b)
        let table = [
            (Some("9"), Some("10"), Some(Ordering::Less)),
            (Some("10"), Some("9"), Some(Ordering::Greater)),
            (Some("42"), Some("42"), Some(Ordering::Equal)),
            (
                Some("18446744073709551615"),
                Some("1"),
                Some(Ordering::Greater),
            ),
            (Some("abc"), Some("1"), None),
            (Some("1"), Some(""), None),
            (Some("-1"), Some("1"), None),
            (None, Some("1"), None),
            (Some("1"), None, None),
        ];
        for (a, b, want) in table {
            assert_eq!(compare(a, b), want, "{a:?} vs {b:?}");
        }
    }
}
