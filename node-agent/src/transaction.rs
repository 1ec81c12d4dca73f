//! The agent's transaction: apply one revision (or revert everything) all-or-nothing.
//!
//! [`plan`] is the pure core: from the desired settings, the journal's originals and the values
//! read from the host it computes the writes, touching nothing. [`Transactor`] is the I/O shell:
//! it recovers an interrupted transaction, reads the host, journals the plan before the first
//! write, writes and verifies each setting, and on any failure restores every setting it wrote,
//! in reverse, from the journal's `before` values.

use std::collections::{BTreeMap, BTreeSet};

use hoststack_crds::{ItemResult, ItemState, NodeState};

use crate::appliers::{self, applier};
use crate::host::Host;
use crate::journal::{Applied, Entry, InFlight, Journal, JournalStore, Provisional};
use crate::model::{Reading, Setting};
use crate::{Error, Result};

/// The target value of each setting of a revision: what the transaction makes the host hold.
pub type TargetValues = BTreeMap<Setting, String>;

/// What reading each setting from the host gave.
pub type Readings = BTreeMap<Setting, Reading>;

/// What a transaction has just done, told to the observer its caller passes in: the lab's test
/// hooks pause on each write and log both (`--step-delay`, `--write-log`); a user's build ignores
/// it.
#[derive(Clone, Copy, Debug)]
pub enum Progress<'a> {
    /// A write of `value` to `setting` was attempted (whether the kernel took it or not).
    Wrote {
        /// The setting written.
        setting: &'a Setting,
        /// The value written.
        value: &'a str,
        /// The revision the write is for; `None` when it restores an original or a `before`
        /// value (a revert, an undo, a recovery).
        target: Option<&'a Applied>,
    },
    /// The journal was saved as this.
    Saved(&'a Journal),
}

/// Where a transaction goes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Goal {
    /// The revision to apply; `None` reverts everything hoststack changed.
    pub target: Option<Applied>,
    /// The settings of that revision and their target values; empty for a revert.
    pub values: TargetValues,
}

impl Goal {
    /// The goal that reverts everything.
    pub fn revert() -> Self {
        Goal::default()
    }
}

/// Why a setting is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Set to the desired value of the revision.
    Set,
    /// Restored to its original value: the new revision no longer manages it.
    Restore,
}

/// One write of a plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Write {
    /// The setting written.
    pub setting: Setting,
    /// Its value before the transaction.
    pub before: String,
    /// The value written.
    pub value: String,
    /// Why.
    pub action: Action,
}

/// What a transaction will do, computed without touching the host.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Settings that cannot be applied, with the reason; any of them fails the whole plan.
    pub failures: Vec<(Setting, String)>,
    /// The writes, in order: restores (newest managed setting first), then sets.
    pub writes: Vec<Write>,
    /// Settings managed for the first time, with their current (original) value.
    pub added: Vec<Entry>,
    /// Managed settings the goal no longer manages; their originals are dropped on success.
    pub released: Vec<Setting>,
}

impl Plan {
    /// Whether carrying out the plan would change neither the host nor the originals.
    pub fn changes_nothing(&self) -> bool {
        self.writes.is_empty() && self.added.is_empty() && self.released.is_empty()
    }
}

/// The settings a plan needs read: the target ones and every managed one.
pub fn settings_to_read(values: &TargetValues, originals: &[Entry]) -> BTreeSet<Setting> {
    values
        .keys()
        .cloned()
        .chain(originals.iter().map(Entry::setting))
        .collect()
}

/// The pure plan step: what to write to go from the host as read to `values`, given the
/// originals of the settings hoststack already manages.
///
/// - A desired setting that does not exist or cannot be read is a failure.
/// - A desired setting not managed yet gets its current value recorded as its original.
/// - A desired setting whose value differs (as its kind compares values: whitespace runs
///   collapsed, CPU sets, numbers) is set.
/// - A managed setting no longer desired is restored to its original when it differs from it in
///   any byte (a restore puts back exactly what was read), and released; one that no longer
///   exists on the host is released without a write.
pub fn plan(values: &TargetValues, originals: &[Entry], readings: &Readings) -> Plan {
    let mut plan = Plan::default();
    let not_read = || Reading::Unreadable("not read".into());
    for original in originals.iter().rev() {
        let setting = original.setting();
        if values.contains_key(&setting) {
            continue;
        }
        match readings.get(&setting).cloned().unwrap_or_else(not_read) {
            Reading::Value(current) => {
                if current != original.value {
                    plan.writes.push(Write {
                        setting: setting.clone(),
                        before: current,
                        value: original.value.clone(),
                        action: Action::Restore,
                    });
                }
                plan.released.push(setting);
            }
            Reading::Missing(_) => plan.released.push(setting),
            Reading::Unreadable(reason) => plan.failures.push((setting, reason)),
        }
    }
    for (setting, value) in values {
        match readings.get(setting).cloned().unwrap_or_else(not_read) {
            Reading::Value(current) => {
                let managed = originals.iter().any(|e| e.setting() == *setting);
                if !managed {
                    plan.added.push(Entry::new(setting, current.clone()));
                }
                if !applier(setting.kind).same_value(&current, value) {
                    plan.writes.push(Write {
                        setting: setting.clone(),
                        before: current,
                        value: value.clone(),
                        action: Action::Set,
                    });
                }
            }
            Reading::Missing(reason) | Reading::Unreadable(reason) => {
                plan.failures.push((setting.clone(), reason));
            }
        }
    }
    plan
}

/// The result of a transaction (or of a plan-only run), ready for status.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    /// Applied, Reverted, Failed or Planned.
    pub state: NodeState,
    /// One entry per setting involved.
    pub items: Vec<ItemResult>,
    /// Why it failed (or would fail).
    pub message: Option<String>,
    /// The revision the host is on afterwards.
    pub applied: Option<Applied>,
    /// Set when the agent reverted a provisional revision by itself, and why.
    pub self_revert: Option<SelfRevert>,
}

/// Why the agent reverted a provisional revision by itself (docs/agent.md, "Post-apply probes
/// and the dead-man revert").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SelfRevert {
    /// A probe target (or the default gateway) failed.
    ProbeFailed,
    /// The revision was not confirmed within `confirmTimeout`.
    Unconfirmed,
}

impl SelfRevert {
    /// The reason of the node's Degraded condition.
    pub fn condition_reason(self) -> &'static str {
        match self {
            SelfRevert::ProbeFailed => "ProbeFailed",
            SelfRevert::Unconfirmed => "Unconfirmed",
        }
    }

    /// The `reason` label of `hoststack_agent_self_reverts_total`.
    pub fn metric_label(self) -> &'static str {
        match self {
            SelfRevert::ProbeFailed => "probe",
            SelfRevert::Unconfirmed => "unconfirmed",
        }
    }
}

/// The host and journal as read before a transaction, and the plan made from them.
#[derive(Clone, Debug)]
pub struct Prepared {
    /// The journal (with no transaction in flight).
    pub journal: Journal,
    /// The settings as read.
    pub readings: Readings,
    /// What to do.
    pub plan: Plan,
}

impl Prepared {
    /// Whether the host already is at the goal: nothing to write, journal already says so.
    pub fn is_settled(&self, goal: &Goal) -> bool {
        self.plan.failures.is_empty()
            && self.plan.changes_nothing()
            && self.journal.applied == goal.target
    }

    /// The report of a host that is already at the goal.
    pub fn settled(&self, goal: &Goal) -> Outcome {
        let mut items = base_items(goal, &self.journal, &self.readings);
        for item in &mut items {
            settle(item, None);
        }
        let items = results(items);
        Outcome {
            state: if goal.target.is_some() {
                NodeState::Applied
            } else {
                NodeState::Reverted
            },
            items,
            message: None,
            applied: self.journal.applied.clone(),
            self_revert: None,
        }
    }

    /// Plan mode: what a transaction would do, with items WouldChange, Unchanged or WouldFail.
    pub fn preview(&self, goal: &Goal) -> Outcome {
        let mut items = base_items(goal, &self.journal, &self.readings);
        let failures: BTreeMap<_, _> = self.plan.failures.iter().cloned().collect();
        let writes: BTreeSet<_> = self.plan.writes.iter().map(|s| &s.setting).collect();
        for item in &mut items {
            let r = &mut item.result;
            if let Some(reason) = failures.get(&item.setting) {
                r.state = ItemState::WouldFail;
                r.message = Some(reason.clone());
            } else if writes.contains(&item.setting) {
                r.state = ItemState::WouldChange;
            } else {
                r.state = ItemState::Unchanged;
            }
        }
        let items = results(items);
        Outcome {
            state: NodeState::Planned,
            items,
            message: failure_message(&self.plan.failures).map(|m| format!("would fail: {m}")),
            applied: self.journal.applied.clone(),
            self_revert: None,
        }
    }
}

/// The I/O shell of the transaction: host settings plus the journal that makes changes to them
/// revertible.
#[derive(Clone, Debug)]
pub struct Transactor {
    host: Host,
    store: JournalStore,
}

impl Transactor {
    /// A transactor over `host`, journaling in `store`.
    pub fn new(host: Host, store: JournalStore) -> Self {
        Transactor { host, store }
    }

    /// The host it works on.
    pub fn host(&self) -> &Host {
        &self.host
    }

    /// The journal as it is on disk.
    pub fn journal(&self) -> Result<Journal> {
        self.store.load()
    }

    /// Finishes an interrupted transaction by undoing it: restores its `before` values in
    /// reverse, drops the originals it added and clears it. Returns whether there was one.
    /// `observe` is told every host write and journal save.
    pub fn recover(&self, observe: &mut dyn FnMut(Progress<'_>)) -> Result<bool> {
        let mut journal = self.store.load()?;
        let Some(tx) = journal.transaction.clone() else {
            return Ok(false);
        };
        tracing::warn!(
            writes = tx.before.len(),
            "undoing a transaction interrupted before it finished"
        );
        self.restore(&tx.before, observe)?;
        undo_in_journal(&mut journal, &tx);
        self.save(&journal, observe)?;
        Ok(true)
    }

    /// Confirms the provisional revision: it stays, and nothing undoes it any more. Returns
    /// whether there was one.
    pub fn confirm(&self, observe: &mut dyn FnMut(Progress<'_>)) -> Result<bool> {
        let mut journal = self.store.load()?;
        if journal.provisional.take().is_none() {
            return Ok(false);
        }
        self.save(&journal, observe)?;
        Ok(true)
    }

    /// Undoes the provisional revision, if there is one: restores what the host had before it
    /// (in reverse write order), drops the originals it added, manages again those it released,
    /// and puts the journal back on the revision before it. Returns the revision undone.
    pub fn abandon(&self, observe: &mut dyn FnMut(Progress<'_>)) -> Result<Option<Applied>> {
        let mut journal = self.store.load()?;
        let Some(provisional) = journal.provisional.clone() else {
            return Ok(None);
        };
        tracing::warn!(
            revision = ?journal.applied,
            "undoing a revision that was not confirmed"
        );
        self.restore(&provisional.transaction.before, observe)?;
        let undone = journal.applied.take();
        journal
            .originals
            .retain(|e| !provisional.transaction.added.contains(&e.setting()));
        journal.originals.extend(provisional.released);
        journal.applied = provisional.previous;
        journal.provisional = None;
        self.save(&journal, observe)?;
        Ok(undone)
    }

    /// Recovers any interrupted transaction, reads the host and plans the way to `goal`.
    pub fn prepare(&self, goal: &Goal, observe: &mut dyn FnMut(Progress<'_>)) -> Result<Prepared> {
        self.recover(observe)?;
        let journal = self.store.load()?;
        let readings = settings_to_read(&goal.values, &journal.originals)
            .into_iter()
            .map(|s| {
                let reading = appliers::read(&self.host, &s);
                (s, reading)
            })
            .collect();
        let plan = plan(&goal.values, &journal.originals, &readings);
        Ok(Prepared {
            journal,
            readings,
            plan,
        })
    }

    /// Runs the transaction to `goal`: all of it, or (on any failure) none of it.
    ///
    /// `Err` means the journal could not be read or written, or an undo failed; item failures
    /// are an `Ok` outcome with state Failed.
    pub fn execute(&self, goal: &Goal, observe: &mut dyn FnMut(Progress<'_>)) -> Result<Outcome> {
        self.run(goal, None, observe)
    }

    /// Runs the transaction to `goal` like [`Transactor::execute`], and leaves an applied
    /// revision provisional until `deadline` (seconds since the epoch): the journal keeps what
    /// undoes it until [`Transactor::confirm`], and [`Transactor::abandon`] undoes it (the
    /// agent's startup does, for one it never confirmed). A transaction from a revision that is
    /// still provisional leaves the new one provisional in its place, undone to what the host
    /// was before the first; a revert is never provisional.
    pub fn execute_provisional(
        &self,
        goal: &Goal,
        deadline: u64,
        observe: &mut dyn FnMut(Progress<'_>),
    ) -> Result<Outcome> {
        self.run(goal, Some(deadline), observe)
    }

    /// The transaction, provisional until `confirm_by` when given.
    fn run(
        &self,
        goal: &Goal,
        confirm_by: Option<u64>,
        observe: &mut dyn FnMut(Progress<'_>),
    ) -> Result<Outcome> {
        let prepared = self.prepare(goal, observe)?;
        if prepared.is_settled(goal) {
            return Ok(prepared.settled(goal));
        }
        let Prepared {
            mut journal,
            readings,
            plan,
        } = prepared;
        let mut items = base_items(goal, &journal, &readings);
        if let Some(message) = failure_message(&plan.failures) {
            for (setting, reason) in &plan.failures {
                mark(&mut items, setting, ItemState::Failed, Some(reason.clone()));
            }
            return Ok(Outcome {
                state: NodeState::Failed,
                items: results(items),
                message: Some(message),
                applied: journal.applied,
                self_revert: None,
            });
        }

        // Journal first: originals, and what to restore if this transaction does not finish.
        let before: Vec<Entry> = plan
            .writes
            .iter()
            .map(|s| Entry::new(&s.setting, s.before.clone()))
            .collect();
        let tx = InFlight {
            target: goal.target.clone(),
            before,
            added: plan.added.iter().map(Entry::setting).collect(),
        };
        journal.originals.extend(plan.added.iter().cloned());
        journal.transaction = Some(tx.clone());
        self.save(&journal, observe)?;

        let mut actual: BTreeMap<Setting, String> = BTreeMap::new();
        for (i, write) in plan.writes.iter().enumerate() {
            let written = appliers::write(&self.host, &write.setting, &write.value);
            observe(Progress::Wrote {
                setting: &write.setting,
                value: &write.value,
                target: goal.target.as_ref(),
            });
            let result = written
                .map_err(|e| format!("the kernel refused {:?}: {e}", write.value))
                .and_then(|()| self.verify(&write.setting, &write.value));
            match result {
                Ok(read_back) => {
                    actual.insert(write.setting.clone(), read_back);
                }
                Err(reason) => {
                    let failure = Failure {
                        writes: &plan.writes,
                        failed: i,
                        reason,
                    };
                    return self.undo(journal, items, &tx, failure, observe);
                }
            }
        }

        let released: Vec<Entry> = journal
            .originals
            .iter()
            .filter(|e| plan.released.contains(&e.setting()))
            .cloned()
            .collect();
        journal
            .originals
            .retain(|e| !plan.released.contains(&e.setting()));
        journal.provisional = match (journal.provisional.take(), confirm_by) {
            // Only an applied revision is provisional: a revert is never undone.
            _ if goal.target.is_none() => None,
            // Already provisional (drift written again, or the spec moved on to another revision
            // before the first was confirmed): an undo still goes back to what the host was
            // before the first, so the settings only this transaction wrote are added to what
            // it restores.
            (Some(mut earlier), _) => {
                let first = &mut earlier.transaction;
                for entry in &tx.before {
                    if !first.before.iter().any(|e| e.setting() == entry.setting()) {
                        first.before.push(entry.clone());
                    }
                }
                first.added.extend(tx.added.iter().cloned());
                first.target = tx.target.clone();
                earlier.released.extend(released);
                Some(earlier)
            }
            (None, Some(deadline)) => Some(Provisional {
                transaction: tx.clone(),
                previous: journal.applied.clone(),
                released,
                deadline,
            }),
            (None, None) => None,
        };
        journal.applied = goal.target.clone();
        journal.transaction = None;
        self.save(&journal, observe)?;

        for item in &mut items {
            let read_back = actual.get(&item.setting).map(String::as_str);
            settle(item, read_back);
        }
        Ok(Outcome {
            state: if goal.target.is_some() {
                NodeState::Applied
            } else {
                NodeState::Reverted
            },
            items: results(items),
            message: None,
            applied: journal.applied,
            self_revert: None,
        })
    }

    /// Undoes a transaction one of whose writes failed, and reports it.
    fn undo(
        &self,
        mut journal: Journal,
        mut items: Vec<Item>,
        tx: &InFlight,
        failure: Failure,
        observe: &mut dyn FnMut(Progress<'_>),
    ) -> Result<Outcome> {
        let Failure {
            writes,
            failed,
            reason,
        } = failure;
        let write = &writes[failed];
        let mut message = format!("{}: {reason}", write.setting);
        tracing::warn!(%message, "transaction failed; restoring what it wrote");
        mark(&mut items, &write.setting, ItemState::Failed, Some(reason));
        for earlier in &writes[..failed] {
            mark(
                &mut items,
                &earlier.setting,
                ItemState::RolledBack,
                Some(format!("restored because {} failed", write.setting)),
            );
        }
        match self.restore(&tx.before[..=failed], observe) {
            Ok(()) => {
                undo_in_journal(&mut journal, tx);
                self.save(&journal, observe)?;
            }
            Err(e) => {
                // The transaction stays in the journal; the next reconcile retries the undo.
                message = format!("{message}; undoing it failed, will retry: {e}");
            }
        }
        Ok(Outcome {
            state: NodeState::Failed,
            items: results(items),
            message: Some(message),
            applied: journal.applied,
            self_revert: None,
        })
    }

    /// Saves `journal` and tells `observe`.
    fn save(&self, journal: &Journal, observe: &mut dyn FnMut(Progress<'_>)) -> Result<()> {
        self.store.save(journal)?;
        observe(Progress::Saved(journal));
        Ok(())
    }

    /// Reads a setting back after writing `value`; the value read when it matches.
    fn verify(&self, setting: &Setting, value: &str) -> Result<String, String> {
        match appliers::read(&self.host, setting) {
            Reading::Value(v) if applier(setting.kind).same_value(&v, value) => Ok(v),
            Reading::Value(v) => Err(applier(setting.kind).mismatch(value, &v)),
            Reading::Missing(reason) | Reading::Unreadable(reason) => Err(reason),
        }
    }

    /// Writes `entries` back in reverse order, skipping settings that already have exactly their
    /// value or no longer exist. Every entry is attempted; the first failure is returned.
    fn restore(&self, entries: &[Entry], observe: &mut dyn FnMut(Progress<'_>)) -> Result<()> {
        let mut first_error = None;
        for entry in entries.iter().rev() {
            let setting = entry.setting();
            match appliers::read(&self.host, &setting) {
                Reading::Value(v) if v == entry.value => continue,
                Reading::Missing(_) => continue,
                Reading::Value(_) | Reading::Unreadable(_) => {}
            }
            let written = appliers::write(&self.host, &setting, &entry.value);
            observe(Progress::Wrote {
                setting: &setting,
                value: &entry.value,
                target: None,
            });
            let result = written
                .map_err(|e| e.to_string())
                .and_then(|()| self.verify(&setting, &entry.value).map(drop));
            if let Err(reason) = result {
                tracing::error!(%setting, value = %entry.value, %reason, "restore failed");
                first_error.get_or_insert(Error::Restore {
                    target: setting.to_string(),
                    value: entry.value.clone(),
                    reason,
                });
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// A write of a transaction that failed.
struct Failure<'a> {
    /// The transaction's writes.
    writes: &'a [Write],
    /// The index of the one that failed.
    failed: usize,
    /// Why, as the kernel said it.
    reason: String,
}

/// Drops from the journal what an undone transaction added, and the transaction itself.
fn undo_in_journal(journal: &mut Journal, tx: &InFlight) {
    journal
        .originals
        .retain(|e| !tx.added.contains(&e.setting()));
    journal.transaction = None;
}

/// The node's failure message for plan failures: each setting and reason.
fn failure_message(failures: &[(Setting, String)]) -> Option<String> {
    (!failures.is_empty()).then(|| {
        failures
            .iter()
            .map(|(s, reason)| format!("{s}: {reason}"))
            .collect::<Vec<_>>()
            .join("; ")
    })
}

/// An item under construction, with the setting it is about.
struct Item {
    setting: Setting,
    /// Whether the goal releases the setting (restores its original) rather than sets it.
    released: bool,
    result: ItemResult,
}

/// One Pending item per setting involved: the desired ones (in key order), then the managed ones
/// the goal releases (newest first), whose desired value is their original.
fn base_items(goal: &Goal, journal: &Journal, readings: &Readings) -> Vec<Item> {
    let value = |s: &Setting| match readings.get(s) {
        Some(Reading::Value(v)) => Some(v.clone()),
        _ => None,
    };
    let item = |setting: &Setting, released, original: Option<String>, desired: &str| Item {
        setting: setting.clone(),
        released,
        result: ItemResult {
            kind: setting.kind.as_str().into(),
            target: setting.target.clone(),
            original,
            desired: Some(desired.to_string()),
            actual: value(setting),
            state: ItemState::Pending,
            message: None,
        },
    };
    let desired = goal.values.iter().map(|(s, want)| {
        let original = journal.original(s).map(str::to_string).or_else(|| value(s));
        item(s, false, original, want)
    });
    let released = journal
        .originals
        .iter()
        .rev()
        .filter(|e| !goal.values.contains_key(&e.setting()))
        .map(|e| item(&e.setting(), true, Some(e.value.clone()), &e.value));
    desired.chain(released).collect()
}

/// The finished items.
fn results(items: Vec<Item>) -> Vec<ItemResult> {
    items.into_iter().map(|i| i.result).collect()
}

/// Sets the state and message of the item of `setting`.
fn mark(items: &mut [Item], setting: &Setting, state: ItemState, message: Option<String>) {
    if let Some(item) = items.iter_mut().find(|i| i.setting == *setting) {
        item.result.state = state;
        item.result.message = message;
    }
}

/// Marks an item of a finished transaction: a released one Reverted; a desired one Applied when
/// hoststack changed it from its original, Unchanged when the original already was the desired
/// value. `read_back` replaces `actual` when the item was written.
fn settle(item: &mut Item, read_back: Option<&str>) {
    let r = &mut item.result;
    if let Some(v) = read_back {
        r.actual = Some(v.to_string());
    }
    r.state = if item.released {
        if r.actual.is_none() {
            r.message = Some("no longer exists on this host; nothing to restore".into());
        }
        ItemState::Reverted
    } else {
        match (&r.original, &r.desired) {
            (Some(o), Some(d)) if applier(item.setting.kind).same_value(o, d) => {
                ItemState::Unchanged
            }
            _ => ItemState::Applied,
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(key: &str) -> Setting {
        Setting::sysctl(key)
    }

    fn v(value: &str) -> Reading {
        Reading::Value(value.into())
    }

    fn set(key: &str, before: &str, value: &str) -> Write {
        Write {
            setting: s(key),
            before: before.into(),
            value: value.into(),
            action: Action::Set,
        }
    }

    fn restore(key: &str, before: &str, value: &str) -> Write {
        Write {
            action: Action::Restore,
            ..set(key, before, value)
        }
    }

    fn orig(key: &str, value: &str) -> Entry {
        Entry::new(&s(key), value)
    }

    struct Case {
        name: &'static str,
        desired: &'static [(&'static str, &'static str)],
        originals: &'static [(&'static str, &'static str)],
        readings: Vec<(&'static str, Reading)>,
        want: Plan,
    }

    #[test]
    fn plan_table() {
        let cases = vec![
            Case {
                name: "a new setting that differs is recorded and set",
                desired: &[("net.ipv4.tcp_sack", "0")],
                originals: &[],
                readings: vec![("net.ipv4.tcp_sack", v("1"))],
                want: Plan {
                    writes: vec![set("net.ipv4.tcp_sack", "1", "0")],
                    added: vec![orig("net.ipv4.tcp_sack", "1")],
                    ..Plan::default()
                },
            },
            Case {
                name: "a new setting that already has the value (tabs vs spaces) is recorded only",
                desired: &[("net.ipv4.tcp_rmem", "4096 131072  6291456")],
                originals: &[],
                readings: vec![("net.ipv4.tcp_rmem", v("4096\t131072\t6291456"))],
                want: Plan {
                    added: vec![orig("net.ipv4.tcp_rmem", "4096\t131072\t6291456")],
                    ..Plan::default()
                },
            },
            Case {
                name: "a managed setting keeps its original and is set to the new value",
                desired: &[("net.ipv4.tcp_sack", "1")],
                originals: &[("net.ipv4.tcp_sack", "1")],
                readings: vec![("net.ipv4.tcp_sack", v("0"))],
                want: Plan {
                    writes: vec![set("net.ipv4.tcp_sack", "0", "1")],
                    ..Plan::default()
                },
            },
            Case {
                name: "a settled revision plans nothing",
                desired: &[("net.ipv4.tcp_sack", "0")],
                originals: &[("net.ipv4.tcp_sack", "1")],
                readings: vec![("net.ipv4.tcp_sack", v("0"))],
                want: Plan::default(),
            },
            Case {
                name: "settings no longer desired are restored newest first, then sets",
                desired: &[("net.core.somaxconn", "8192")],
                originals: &[
                    ("net.ipv4.tcp_sack", "1"),
                    ("net.ipv4.tcp_dsack", "1"),
                    ("net.ipv4.tcp_ecn", "2"),
                    ("net.core.somaxconn", "4096"),
                ],
                readings: vec![
                    ("net.ipv4.tcp_sack", v("0")),
                    ("net.ipv4.tcp_dsack", v("0")),
                    ("net.ipv4.tcp_ecn", v("2")),
                    ("net.core.somaxconn", v("1024")),
                ],
                want: Plan {
                    writes: vec![
                        restore("net.ipv4.tcp_dsack", "0", "1"),
                        restore("net.ipv4.tcp_sack", "0", "1"),
                        set("net.core.somaxconn", "1024", "8192"),
                    ],
                    released: vec![
                        s("net.ipv4.tcp_ecn"),
                        s("net.ipv4.tcp_dsack"),
                        s("net.ipv4.tcp_sack"),
                    ],
                    ..Plan::default()
                },
            },
            Case {
                name: "a revert restores everything that differs and releases all",
                desired: &[],
                originals: &[("net.ipv4.tcp_sack", "1"), ("net.ipv4.tcp_ecn", "2")],
                readings: vec![("net.ipv4.tcp_sack", v("0")), ("net.ipv4.tcp_ecn", v("2"))],
                want: Plan {
                    writes: vec![restore("net.ipv4.tcp_sack", "0", "1")],
                    released: vec![s("net.ipv4.tcp_ecn"), s("net.ipv4.tcp_sack")],
                    ..Plan::default()
                },
            },
            Case {
                name: "a managed setting that vanished is released without a write",
                desired: &[],
                originals: &[("net.ipv4.conf.eth9.rp_filter", "1")],
                readings: vec![(
                    "net.ipv4.conf.eth9.rp_filter",
                    Reading::Missing("gone".into()),
                )],
                want: Plan {
                    released: vec![s("net.ipv4.conf.eth9.rp_filter")],
                    ..Plan::default()
                },
            },
            Case {
                name: "a desired setting missing on this kernel fails",
                desired: &[("net.ipv4.nope", "1"), ("net.ipv4.tcp_sack", "0")],
                originals: &[],
                readings: vec![
                    ("net.ipv4.nope", Reading::Missing("no such sysctl".into())),
                    ("net.ipv4.tcp_sack", v("1")),
                ],
                want: Plan {
                    failures: vec![(s("net.ipv4.nope"), "no such sysctl".into())],
                    writes: vec![set("net.ipv4.tcp_sack", "1", "0")],
                    added: vec![orig("net.ipv4.tcp_sack", "1")],
                    ..Plan::default()
                },
            },
            Case {
                name: "unreadable settings fail, desired or managed",
                desired: &[("net.ipv4.a", "1")],
                originals: &[("net.ipv4.b", "1")],
                readings: vec![
                    ("net.ipv4.a", Reading::Unreadable("denied a".into())),
                    ("net.ipv4.b", Reading::Unreadable("denied b".into())),
                ],
                want: Plan {
                    failures: vec![
                        (s("net.ipv4.b"), "denied b".into()),
                        (s("net.ipv4.a"), "denied a".into()),
                    ],
                    ..Plan::default()
                },
            },
        ];
        for case in cases {
            let desired: TargetValues = case
                .desired
                .iter()
                .map(|(k, v)| (s(k), v.to_string()))
                .collect();
            let originals: Vec<Entry> = case.originals.iter().map(|(k, v)| orig(k, v)).collect();
            let readings: Readings = case.readings.into_iter().map(|(k, r)| (s(k), r)).collect();
            assert_eq!(
                settings_to_read(&desired, &originals),
                readings.keys().cloned().collect(),
                "{}: settings to read",
                case.name
            );
            assert_eq!(
                plan(&desired, &originals, &readings),
                case.want,
                "{}",
                case.name
            );
        }
    }

    #[test]
    fn settling_marks_items_relative_to_their_original() {
        let mut changed = base_items(
            &Goal {
                target: None,
                values: [(s("net.ipv4.a"), "0".to_string())].into(),
            },
            &Journal {
                originals: vec![orig("net.ipv4.a", "1"), orig("net.ipv4.b", "5")],
                ..Journal::default()
            },
            &[(s("net.ipv4.a"), v("1")), (s("net.ipv4.b"), v("6"))].into(),
        );
        assert_eq!(changed.len(), 2);
        settle(&mut changed[0], Some("0"));
        settle(&mut changed[1], Some("5"));
        assert_eq!(changed[0].result.state, ItemState::Applied);
        assert_eq!(changed[0].result.actual.as_deref(), Some("0"));
        assert_eq!(changed[1].result.state, ItemState::Reverted);
        assert_eq!(changed[1].result.desired.as_deref(), Some("5"));

        let mut unchanged = base_items(
            &Goal {
                target: None,
                values: [(s("net.ipv4.a"), "1 2".to_string())].into(),
            },
            &Journal::default(),
            &[(s("net.ipv4.a"), v("1\t2"))].into(),
        );
        settle(&mut unchanged[0], None);
        assert_eq!(unchanged[0].result.state, ItemState::Unchanged);
        assert_eq!(unchanged[0].result.original.as_deref(), Some("1\t2"));
    }
}
