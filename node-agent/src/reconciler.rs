//! The reconciler: what the agent does with one intent, without the API server.
//!
//! It turns the NodeTuning into an [`Intent`], decides whether the host needs a transaction,
//! runs it through the [`Transactor`], and remembers what it reported and which revisions
//! failed ([`Failures`]), so that each assignment of a revision is tried once: a failed one is
//! tried again only when the operator assigns it again under a newer spec generation, never
//! because the same spec came back (a restart retries it once).
//!
//! Every decision re-reads the host, so every reconcile (each event and each
//! `--resync-interval`) is also a drift check: when settings of the applied revision no longer
//! hold their desired values, [`Reconciler::drifted`] lists them and
//! `NodeConfig.driftPolicy` decides — `Reapply` runs a transaction that writes them again,
//! `Report` changes nothing and reports the host as it is until it matches again or the spec
//! changes.

use std::net::IpAddr;

use hoststack_crds::{DriftPolicy, ItemResult, ItemState, Mode, NodeState};

use crate::appliers::{dpdk, irq};
use crate::confirmation::Checks;
use crate::destinations::Destinations;
use crate::drift::{self, Drift};
use crate::expand::{expand, Discovery, Expansion};
use crate::failures::{Failures, SpecGeneration};
use crate::hooks::Hooks;
use crate::intent::Intent;
use crate::model::{Kind, Reading};
use crate::transaction::{Goal, Outcome, Prepared, Progress, Readings, SelfRevert, Transactor};
use crate::{Error, Result};

/// What to do next for an intent.
#[derive(Clone, Debug, PartialEq)]
pub enum Next {
    /// Nothing to change on the host: report this.
    Report(Outcome),
    /// Run a transaction ([`Reconciler::transact`]); report `applying` first when present.
    Transaction {
        /// The status to show while the transaction runs (state Applying).
        applying: Option<Outcome>,
    },
}

/// Decides and runs transactions for one node.
#[derive(Debug)]
pub struct Reconciler {
    transactor: Transactor,
    hooks: Hooks,
    /// The last outcome and what it was for.
    last: Option<(Intent, Outcome)>,
    /// Revisions whose transaction failed; each is not retried until assigned again.
    failed: Failures,
    /// The API server's address, whose route DPDK binding must not cut.
    api_server: Option<IpAddr>,
    /// Where the probes of a revision's targets may connect.
    probe_destinations: Destinations,
    /// Settings of the applied revision that drifted, as the last decision found them.
    drifted: Vec<Drift>,
    /// The last transaction stopped on an error of the agent itself (its journal could not be
    /// read or saved, an undo failed), not of an item: it is to be retried soon.
    agent_error: bool,
}

impl Reconciler {
    /// A reconciler whose transactions `hooks` observe ([`Hooks::default`]: none).
    pub fn new(transactor: Transactor, hooks: Hooks) -> Self {
        Reconciler {
            transactor,
            hooks,
            last: None,
            failed: Failures::default(),
            api_server: None,
            probe_destinations: Destinations::default(),
            drifted: Vec::new(),
            agent_error: false,
        }
    }

    /// The settings of the applied revision whose host value is not the desired one, as the
    /// last [`Reconciler::next`] read them (cleared by a transaction that succeeds). Empty
    /// unless the spec asks to apply the revision the host is on.
    pub fn drifted(&self) -> &[Drift] {
        &self.drifted
    }

    /// Sets the API server's address (from the client configuration): the interface that routes
    /// to it is never bound away.
    pub fn set_api_server(&mut self, address: Option<IpAddr>) {
        self.api_server = address;
    }

    /// Sets where the probes of a revision's targets may connect (the agent's
    /// `--probe-allowed-destinations`): a revision with a target outside fails before anything
    /// changes.
    pub fn set_probe_destinations(&mut self, destinations: Destinations) {
        self.probe_destinations = destinations;
    }

    /// Reads the host and expands what `intent` asks for: a revision's config into its goal and
    /// the requests this host cannot carry out; anything else into the goal of a revert.
    pub fn expand(&self, intent: &Intent) -> Result<Expansion> {
        let (Intent::Revision { config, .. }, Some(revision)) = (intent, intent.target()) else {
            return Ok(Expansion::revert());
        };
        let journal = self.transactor.journal()?;
        let discovery = Discovery::read(self.transactor.host(), self.api_server, &journal);
        Ok(expand(revision, config, &discovery))
    }

    /// Adds notes to the items of an outcome: a warning on IRQ items while irqbalance runs, the
    /// IOMMU group and /dev/vfio node of bound devices.
    pub fn annotate(&self, outcome: &mut Outcome) {
        let roots = self.transactor.host().roots();
        let irqbalance = outcome
            .items
            .iter()
            .any(|i| i.kind == Kind::IrqAffinity.as_str())
            && irq::irqbalance_running(&roots.proc_root);
        for item in &mut outcome.items {
            if item.message.is_some() {
                continue;
            }
            let in_effect = matches!(
                item.state,
                ItemState::Applied | ItemState::Unchanged | ItemState::WouldChange
            );
            if irqbalance && in_effect && item.kind == Kind::IrqAffinity.as_str() {
                item.message = Some(
                    "warning: irqbalance is running and may move this IRQ again; stop it or ban \
                     the IRQ (IRQBALANCE_BANNED_CPUS/--banirq)"
                        .into(),
                );
            } else if item.kind == Kind::PciDriver.as_str()
                && matches!(item.state, ItemState::Applied | ItemState::Unchanged)
            {
                item.message = dpdk::note(roots, &item.target);
            }
        }
    }

    /// Undoes a transaction the journal says was interrupted, and a revision that was applied
    /// provisionally and never confirmed (the agent stopped inside its window); whether there
    /// was either.
    pub fn recover(&self) -> Result<bool> {
        let mut observe = self.observer();
        let interrupted = self.transactor.recover(&mut observe)?;
        let unconfirmed = self.transactor.abandon(&mut observe)?;
        if let Some(revision) = &unconfirmed {
            tracing::warn!(?revision, "reverted a revision that was never confirmed");
        }
        Ok(interrupted || unconfirmed.is_some())
    }

    /// The checks that confirm `intent`'s revision (`None`: it is never provisional, or the
    /// intent is not an Apply of a revision).
    pub fn checks(&self, intent: &Intent) -> Result<Option<Checks>> {
        match intent {
            Intent::Revision {
                config,
                mode: Mode::Apply,
                ..
            } => Checks::of(config.probes.as_ref(), &self.probe_destinations)
                .map_err(Error::InvalidProbes),
            _ => Ok(None),
        }
    }

    /// The revision the host is on, when it is provisional.
    pub fn provisional(&self) -> Result<Option<String>> {
        let journal = self.transactor.journal()?;
        Ok(journal.provisional.and(journal.applied).map(|a| a.revision))
    }

    /// Confirms the provisional revision: nothing undoes it any more.
    pub fn confirm(&self) -> Result<bool> {
        self.transactor.confirm(&mut self.observer())
    }

    /// Reverts the provisional revision of `intent` by itself, for `reason` and `cause` (a probe failed,
    /// the confirmation did not come in time): the host goes back to what it was before, and
    /// the revision counts as failed for this assignment, like one whose transaction failed.
    pub fn abandon(
        &mut self,
        intent: &Intent,
        spec: &SpecGeneration,
        reason: String,
        cause: SelfRevert,
    ) -> Outcome {
        let mut observe = self.observer();
        let (mut outcome, reverted) = match self.transactor.abandon(&mut observe) {
            Ok(_) => {
                let journal = self.transactor.journal();
                // The items of the transaction that applied it, as it left them.
                let items = self
                    .last
                    .as_ref()
                    .map(|(_, o)| o.items.clone())
                    .unwrap_or_default();
                let outcome = Outcome {
                    state: NodeState::Failed,
                    items,
                    message: Some(reason),
                    applied: journal.ok().and_then(|j| j.applied),
                    self_revert: Some(cause),
                };
                (outcome, true)
            }
            Err(e) => (self.error_outcome(&e), false),
        };
        self.agent_error = !reverted;
        self.annotate(&mut outcome);
        if reverted {
            self.failed.remember(intent, spec, &outcome);
        }
        self.last = Some((intent.clone(), outcome.clone()));
        outcome
    }

    /// Decides what `intent`, asked for by `spec`, needs: a report (reading the host, changing
    /// nothing but an interrupted transaction), or a transaction.
    pub fn next(&mut self, intent: &Intent, spec: &SpecGeneration) -> Result<Next> {
        self.failed.observe(intent, spec);
        let mut observe = self.observer();
        self.transactor.recover(&mut observe)?;
        if let Intent::Refused { reason, .. } = intent {
            let outcome = self.refusal(reason)?;
            self.last = Some((intent.clone(), outcome.clone()));
            return Ok(Next::Report(outcome));
        }
        let expansion = self.expand(intent)?;
        let blockers = blocking_items(intent, &expansion, &self.probe_destinations);
        let goal = expansion.goal;
        let prepared = self.transactor.prepare(&goal, &mut observe)?;
        self.drifted = match intent {
            Intent::Revision {
                mode: Mode::Apply, ..
            } if blockers.is_empty() => drift::detect(
                &drift::applied_settings(&goal, &prepared.journal),
                &prepared.readings,
            ),
            _ => Vec::new(),
        };
        if let Some(failure) = self.failed.of(intent) {
            if blockers.is_empty() && prepared.is_settled(&goal) {
                // The host came to match the failed revision without the agent (a re-apply of
                // drift failed, then someone put the values back): nothing left to retry.
                self.failed.forget(intent);
            } else {
                // Reported as it failed, on the revision the host is on now.
                let mut outcome = failure.outcome().clone();
                outcome.applied = prepared.journal.applied.clone();
                return Ok(Next::Report(outcome));
            }
        }
        let report_drift = intent.drift_policy() == Some(DriftPolicy::Report)
            && drift::only_drift(&prepared.plan, &self.drifted);
        let mut outcome = match intent {
            Intent::Revision { mode, .. } => {
                if *mode == Mode::Plan {
                    planned(&prepared, &goal, blockers)
                } else if !blockers.is_empty() {
                    not_supported(prepared.preview(&goal), blockers)
                } else if prepared.is_settled(&goal) || report_drift {
                    // Settled, or drifted under the Report policy: report the host as it is.
                    self.reuse(intent, NodeState::Applied, &prepared.readings)
                        .unwrap_or_else(|| prepared.settled(&goal))
                } else if !prepared.plan.failures.is_empty() {
                    // Fails before any write: no Applying in between.
                    return Ok(Next::Transaction { applying: None });
                } else {
                    let mut applying = prepared.preview(&goal);
                    applying.state = NodeState::Applying;
                    applying.message = None;
                    for item in &mut applying.items {
                        item.state = ItemState::Pending;
                        item.message = None;
                    }
                    return Ok(Next::Transaction {
                        applying: Some(applying),
                    });
                }
            }
            Intent::Absent | Intent::Withdrawn => {
                if !prepared.is_settled(&goal) {
                    return Ok(Next::Transaction { applying: None });
                }
                self.reuse(intent, NodeState::Reverted, &prepared.readings)
                    .unwrap_or_else(|| prepared.settled(&goal))
            }
            // Answered before anything was read.
            Intent::Refused { reason, .. } => self.refusal(reason)?,
        };
        self.annotate(&mut outcome);
        self.last = Some((intent.clone(), outcome.clone()));
        Ok(Next::Report(outcome))
    }

    /// The report of a refused revision ([`Intent::Refused`]): Failed with `reason`, nothing
    /// of it applied, the host on the revision it runs.
    fn refusal(&self, reason: &str) -> Result<Outcome> {
        Ok(Outcome {
            state: NodeState::Failed,
            items: Vec::new(),
            message: Some(reason.to_string()),
            applied: self.transactor.journal()?.applied,
            self_revert: None,
        })
    }

    /// Plan mode for a config other than the spec's (`spec.preview`): what a transaction to
    /// `desired` would do on the host now, from the journal and fresh readings. Writes nothing
    /// (beyond undoing an interrupted transaction, as every reconcile does) and leaves the
    /// reconciler's memory of the spec's own outcome alone.
    pub fn preview(&self, intent: &Intent) -> Result<Outcome> {
        let expansion = self.expand(intent)?;
        let blockers = blocking_items(intent, &expansion, &self.probe_destinations);
        let goal = expansion.goal;
        let prepared = self.transactor.prepare(&goal, &mut self.observer())?;
        let mut outcome = planned(&prepared, &goal, blockers);
        self.annotate(&mut outcome);
        Ok(outcome)
    }

    /// Runs the transaction to `intent`, asked for by `spec`. A revision whose items failed is
    /// remembered and not retried until assigned again; an error of the agent itself (journal
    /// I/O) is retried on the next reconcile.
    pub fn transact(&mut self, intent: &Intent, spec: &SpecGeneration) -> Outcome {
        if let Intent::Refused { reason, .. } = intent {
            return self
                .refusal(reason)
                .unwrap_or_else(|e| self.error_outcome(&e));
        }
        let mut observe = self.observer();
        let result = self.expand(intent).and_then(|expansion| {
            let blockers = blocking_items(intent, &expansion, &self.probe_destinations);
            let goal = expansion.goal;
            if blockers.is_empty() {
                match self.checks(intent)? {
                    Some(checks) => {
                        let now = std::time::SystemTime::now()
                            .duration_since(std::time::UNIX_EPOCH)
                            .map_or(0, |d| d.as_secs());
                        let deadline = now + checks.confirm_timeout.as_secs();
                        self.transactor
                            .execute_provisional(&goal, deadline, &mut observe)
                    }
                    None => self.transactor.execute(&goal, &mut observe),
                }
            } else {
                let prepared = self.transactor.prepare(&goal, &mut observe)?;
                Ok(not_supported(prepared.preview(&goal), blockers))
            }
        });
        let (mut outcome, ran) = match result {
            Ok(outcome) => (outcome, true),
            Err(e) => {
                tracing::error!(error = %e, "transaction aborted; retrying soon");
                (self.error_outcome(&e), false)
            }
        };
        self.agent_error = !ran;
        self.annotate(&mut outcome);
        if ran && outcome.state == NodeState::Failed && matches!(intent, Intent::Revision { .. }) {
            self.failed.remember(intent, spec, &outcome);
        } else if ran {
            // Every setting was written and read back: nothing is drifted any more.
            self.drifted.clear();
        }
        self.last = Some((intent.clone(), outcome.clone()));
        outcome
    }

    /// Whether the last transaction stopped on an error of the agent itself, so that the watch
    /// loop reconciles again soon rather than at the next resync.
    pub fn retry_soon(&self) -> bool {
        self.agent_error
    }

    /// The outcome to report when the agent itself failed (journal I/O, an undo that failed):
    /// still Applying, with the error as its message (the Degraded condition's reason is
    /// AgentError), never Failed. The revision was not tried, or its undo is unfinished; it is
    /// no verdict on the revision, and the agent tries again ([`Reconciler::retry_soon`]).
    pub fn error_outcome(&self, error: &crate::Error) -> Outcome {
        Outcome {
            state: NodeState::Applying,
            items: Vec::new(),
            message: Some(format!("agent error: {error}")),
            applied: self.transactor.journal().ok().and_then(|j| j.applied),
            self_revert: None,
        }
    }

    /// The last outcome, when it was for `desired` and in `state`: a settled host keeps the
    /// items of the transaction that settled it, with `actual` as `readings` found it now.
    fn reuse(&self, intent: &Intent, state: NodeState, readings: &Readings) -> Option<Outcome> {
        let (_, last) = self
            .last
            .as_ref()
            .filter(|(d, o)| d == intent && o.state == state)?;
        let mut outcome = last.clone();
        for item in &mut outcome.items {
            let reading = readings
                .iter()
                .find(|(s, _)| s.kind.as_str() == item.kind && s.target == item.target);
            if let Some((_, reading)) = reading {
                item.actual = match reading {
                    Reading::Value(v) => Some(v.clone()),
                    Reading::Missing(_) | Reading::Unreadable(_) => None,
                };
            }
        }
        Some(outcome)
    }

    /// The observer of a transaction: the hooks.
    fn observer(&self) -> impl FnMut(Progress<'_>) {
        let hooks = self.hooks.clone();
        move |progress| hooks.observe(progress)
    }
}

/// The items of the requests `expansion` refused: Failed, or WouldFail in Plan mode. Any of
/// them fails the revision before any write.
fn blocking_items(
    intent: &Intent,
    expansion: &Expansion,
    probe_destinations: &Destinations,
) -> Vec<ItemResult> {
    let state = match intent {
        Intent::Revision {
            mode: Mode::Plan, ..
        } => ItemState::WouldFail,
        _ => ItemState::Failed,
    };
    let mut blockers = expansion.blockers(state);
    // Probes that cannot be carried out: nothing is applied that could not be confirmed.
    if let Intent::Revision { config, .. } = intent {
        if let Err(message) = Checks::of(config.probes.as_ref(), probe_destinations) {
            blockers.push(ItemResult {
                kind: "probes".into(),
                target: "probes".into(),
                original: None,
                desired: None,
                actual: None,
                state,
                message: Some(message),
            });
        }
    }
    blockers
}

/// The Failed outcome of a revision with blockers (refused requests, parts this agent does not
/// implement): nothing is changed; the other items stay Pending (or Failed when they could not
/// be applied either).
fn not_supported(preview: Outcome, blockers: Vec<ItemResult>) -> Outcome {
    let mut items = preview.items;
    let mut reasons: Vec<String> = Vec::new();
    for item in &mut items {
        if item.state == ItemState::WouldFail {
            item.state = ItemState::Failed;
            reasons.push(format!(
                "{} {}: {}",
                item.kind,
                item.target,
                item.message.clone().unwrap_or_default()
            ));
        } else {
            item.state = ItemState::Pending;
            item.message = None;
        }
    }
    reasons.push(messages(&blockers));
    items.extend(blockers);
    Outcome {
        state: NodeState::Failed,
        items,
        message: Some(reasons.join("; ")),
        applied: preview.applied,
        self_revert: None,
    }
}

/// The Planned outcome of a goal: what the transaction would do, with the blockers (refused
/// requests, unimplemented parts) as items that would fail.
fn planned(prepared: &Prepared, goal: &Goal, blockers: Vec<ItemResult>) -> Outcome {
    let mut outcome = prepared.preview(goal);
    if !blockers.is_empty() {
        let reasons = messages(&blockers);
        outcome.message = Some(match outcome.message {
            Some(m) => format!("{m}; {reasons}"),
            None => format!("would fail: {reasons}"),
        });
        outcome.items.extend(blockers);
    }
    outcome
}

/// The items' messages joined.
fn messages(items: &[ItemResult]) -> String {
    items
        .iter()
        .filter_map(|i| i.message.clone())
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use hoststack_crds::{NodeConfig, NodeTuning, NodeTuningSpec, SysctlValue, UserspaceStack};

    use crate::journal::Applied;

    use super::*;

    fn config() -> NodeConfig {
        let mut c = NodeConfig::default();
        c.sysctls
            .insert("net.ipv4.tcp_sack".into(), SysctlValue("0".into()));
        c
    }

    fn object(spec: NodeTuningSpec) -> NodeTuning {
        NodeTuning::new("node-a", spec)
    }

    #[test]
    fn desired_state_of_a_node_tuning() {
        assert_eq!(Intent::of(None), Intent::Absent);
        let withdrawn = object(NodeTuningSpec {
            mode: Some(Mode::Apply),
            ..NodeTuningSpec::default()
        });
        assert_eq!(Intent::of(Some(&withdrawn)), Intent::Withdrawn);
        assert_eq!(Intent::Withdrawn.target(), None);
        // A tuning without a config asks for nothing either.
        let half = object(NodeTuningSpec {
            tuning: Some("edge".into()),
            ..NodeTuningSpec::default()
        });
        assert_eq!(Intent::of(Some(&half)), Intent::Withdrawn);

        // Without a revision, the config's own; without a mode, Apply.
        let nt = object(NodeTuningSpec {
            tuning: Some("edge".into()),
            revision: None,
            config: Some(config()),
            mode: None,
            ..NodeTuningSpec::default()
        });
        let intent = Intent::of(Some(&nt));
        assert_eq!(intent.revision(), Some(config().revision().as_str()));
        let Intent::Revision { mode, .. } = &intent else {
            panic!("{intent:?}");
        };
        assert_eq!(*mode, Mode::Apply);
        assert_eq!(
            intent.target(),
            Some(Applied {
                tuning: "edge".into(),
                revision: config().revision(),
            })
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let r = Reconciler::new(
            Transactor::new(
                crate::host::Host::new(dir.path(), dir.path()),
                crate::journal::JournalStore::new(dir.path()),
            ),
            Hooks::default(),
        );
        let expanded = r.expand(&intent).expect("expand");
        assert!(blocking_items(&intent, &expanded, &Destinations::default()).is_empty());
        assert_eq!(
            expanded
                .goal
                .values
                .get(&crate::model::Setting::sysctl("net.ipv4.tcp_sack")),
            Some(&"0".to_string())
        );
        assert_eq!(
            r.expand(&Intent::Withdrawn).expect("expand").goal,
            Goal::revert()
        );
    }

    #[test]
    fn a_preview_plans_from_the_host_and_writes_nothing() {
        let proc_root = tempfile::tempdir().expect("tempdir");
        let state = tempfile::tempdir().expect("tempdir");
        let sack = proc_root.path().join("sys/net/ipv4/tcp_sack");
        std::fs::create_dir_all(sack.parent().unwrap()).unwrap();
        std::fs::write(&sack, "1\n").unwrap();
        let r = Reconciler::new(
            Transactor::new(
                crate::host::Host::new(proc_root.path(), proc_root.path()),
                crate::journal::JournalStore::new(state.path()),
            ),
            Hooks::default(),
        );
        let mut c = config();
        c.sysctls.insert(
            "net.ipv4.conf.plan0.rp_filter".into(),
            SysctlValue("2".into()),
        );
        let intent = Intent::Revision {
            tuning: "edge".into(),
            revision: c.revision(),
            config: Box::new(c),
            mode: Mode::Plan,
        };
        let outcome = r.preview(&intent).expect("preview");
        assert_eq!(outcome.state, NodeState::Planned);
        let item = |target: &str| {
            outcome
                .items
                .iter()
                .find(|i| i.target == target)
                .unwrap_or_else(|| panic!("no {target} in {outcome:?}"))
        };
        let sack_item = item("net.ipv4.tcp_sack");
        assert_eq!(
            (
                sack_item.state,
                sack_item.actual.as_deref(),
                sack_item.desired.as_deref()
            ),
            (ItemState::WouldChange, Some("1"), Some("0"))
        );
        let missing = item("net.ipv4.conf.plan0.rp_filter");
        assert_eq!(missing.state, ItemState::WouldFail);
        assert!(missing.message.is_some(), "{missing:?}");
        let message = outcome.message.as_deref().unwrap_or_default();
        assert!(message.starts_with("would fail: "), "{message}");
        // Nothing written: the host value stays, and no journal was made.
        assert_eq!(std::fs::read_to_string(&sack).unwrap(), "1\n");
        assert_eq!(std::fs::read_dir(state.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_refused_userspace_stack_is_an_item() {
        let dir = tempfile::tempdir().expect("tempdir");
        let r = Reconciler::new(
            Transactor::new(
                crate::host::Host::new(dir.path(), dir.path()),
                crate::journal::JournalStore::new(dir.path()),
            ),
            Hooks::default(),
        );
        let mut c = config();
        c.userspace_stack = Some(UserspaceStack::default());
        let nt = object(NodeTuningSpec {
            tuning: Some("edge".into()),
            config: Some(c),
            ..NodeTuningSpec::default()
        });
        let intent = Intent::of(Some(&nt));
        let items = blocking_items(
            &intent,
            &r.expand(&intent).expect("expand"),
            &Destinations::default(),
        );
        let kinds: Vec<&str> = items.iter().map(|i| i.kind.as_str()).collect();
        assert_eq!(kinds, ["userspaceStack"]);
        assert!(items.iter().all(|i| i.state == ItemState::Failed));
        assert_eq!(
            items[0].message.as_deref(),
            Some("userspaceStack.cores: no core given; the stack needs at least one")
        );
    }

    /// A spec whose config was changed after the operator computed its revision (issue 39):
    /// the config does not hash to `spec.revision`. Nothing of it is applied, the host stays
    /// as it is, and the node reports the revision Failed, naming both hashes.
    #[test]
    fn a_config_that_does_not_hash_to_its_revision_is_refused_and_the_host_untouched() {
        let proc_root = tempfile::tempdir().expect("tempdir");
        let state = tempfile::tempdir().expect("tempdir");
        let sack = proc_root.path().join("sys/net/ipv4/tcp_sack");
        std::fs::create_dir_all(sack.parent().unwrap()).unwrap();
        std::fs::write(&sack, "1\n").unwrap();
        let mut r = Reconciler::new(
            Transactor::new(
                crate::host::Host::new(proc_root.path(), proc_root.path()),
                crate::journal::JournalStore::new(state.path()),
            ),
            Hooks::default(),
        );
        let claimed = {
            let mut c = config();
            c.sysctls
                .insert("net.ipv4.tcp_sack".into(), SysctlValue("1".into()));
            c.revision()
        };
        let nt = object(NodeTuningSpec {
            tuning: Some("edge".into()),
            revision: Some(claimed.clone()),
            config: Some(config()),
            ..NodeTuningSpec::default()
        });
        let intent = Intent::of(Some(&nt));
        assert_eq!(intent.revision(), Some(claimed.as_str()));
        let spec = SpecGeneration {
            uid: Some("u".into()),
            generation: 1,
        };
        let outcome = match r.next(&intent, &spec).expect("decides") {
            Next::Report(outcome) => outcome,
            Next::Transaction { .. } => panic!(
                "a config that hashes to {} was accepted as revision {claimed}: the agent set out to apply it",
                config().revision()
            ),
        };
        assert_eq!(outcome.state, NodeState::Failed, "{outcome:?}");
        let message = outcome.message.as_deref().unwrap_or_default();
        assert!(
            message.starts_with("spec.config:")
                && message.contains(&claimed)
                && message.contains(&config().revision()),
            "{message}"
        );
        assert_eq!(outcome.applied, None, "the host is on no revision");
        assert_eq!(std::fs::read_to_string(&sack).unwrap(), "1\n");
        assert_eq!(std::fs::read_dir(state.path()).unwrap().count(), 0);
    }

    /// A reconcile as the watch loop runs it: decides, then transacts when told to; whether a
    /// transaction ran, and the state reported.
    fn reconcile(r: &mut Reconciler, intent: &Intent, spec: &SpecGeneration) -> (bool, NodeState) {
        match r.next(intent, spec).expect("decides") {
            Next::Report(outcome) => (false, outcome.state),
            Next::Transaction { .. } => (true, r.transact(intent, spec).state),
        }
    }

    #[test]
    fn a_failed_revision_is_tried_once_per_assignment() {
        let proc_root = tempfile::tempdir().expect("tempdir");
        let state = tempfile::tempdir().expect("tempdir");
        let sack = proc_root.path().join("sys/net/ipv4/tcp_sack");
        std::fs::create_dir_all(sack.parent().unwrap()).unwrap();
        std::fs::write(&sack, "1\n").unwrap();
        let mut r = Reconciler::new(
            Transactor::new(
                crate::host::Host::new(proc_root.path(), proc_root.path()),
                crate::journal::JournalStore::new(state.path()),
            ),
            Hooks::default(),
        );
        // A sysctl this kernel does not have fails the revision.
        let mut c = config();
        c.sysctls
            .insert("net.ipv4.no_such_sysctl".into(), SysctlValue("1".into()));
        let bad = Intent::Revision {
            tuning: "edge".into(),
            revision: c.revision(),
            config: Box::new(c),
            mode: Mode::Apply,
        };
        let at = |generation| SpecGeneration {
            uid: Some("uid-a".into()),
            generation,
        };
        // (what, intent, its spec's generation, a transaction runs, the state reported)
        let steps = [
            ("assigned", &bad, 2, true, NodeState::Failed),
            ("the same spec on resync", &bad, 2, false, NodeState::Failed),
            (
                "a preview bumps the generation",
                &bad,
                3,
                false,
                NodeState::Failed,
            ),
            (
                "withdrawn by the rollback",
                &Intent::Withdrawn,
                4,
                false,
                NodeState::Reverted,
            ),
            (
                "a stale copy brings the spec back",
                &bad,
                3,
                false,
                NodeState::Failed,
            ),
            ("the older copy too", &bad, 2, false, NodeState::Failed),
            (
                "withdrawn again",
                &Intent::Withdrawn,
                4,
                false,
                NodeState::Reverted,
            ),
            ("assigned again", &bad, 5, true, NodeState::Failed),
            ("and held again", &bad, 5, false, NodeState::Failed),
        ];
        for (what, intent, generation, transacts, state) in steps {
            assert_eq!(
                reconcile(&mut r, intent, &at(generation)),
                (transacts, state),
                "{what}"
            );
        }
        assert_eq!(std::fs::read_to_string(&sack).unwrap(), "1\n");
    }
}
