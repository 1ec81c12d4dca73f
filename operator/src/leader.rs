//! Leader election on a Lease, fenced: a replica writes to the cluster only while it provably
//! holds the lease.
//!
//! Two replicas are safe only if the old leader has stopped writing before the new one starts.
//! A replica that was paused (SIGSTOP, a VM migration, a long GC-like stall) or whose lease
//! writes fail cannot know it lost the lease by looking at it; what it can know is when it last
//! renewed. Every other replica judges the lease by when it *saw* the holder's last renewal
//! change the Lease, on its own clock (as client-go's leader election does), and waits the
//! lease's duration after that; that renewal reached the API server after this replica sent it.
//! So this replica holds the lease until the send time of its last successful write of the
//! Lease plus the lease's duration, less a margin for the clocks' rates: [`Elector::holds`],
//! on this process's monotonic clock, which keeps running while the process is stopped and is
//! not stepped by NTP. Past that instant [`Fence`] refuses every write the operator's client
//! would send ([`Fence::layer`]), whatever the reconcile that asked for it planned, and the
//! election reports the lease lost.
//!
//! [`Elector`] is the pure decision (what was seen of the Lease and when, what to do next);
//! [`Election::join`] is the thin loop that reads and writes the Lease for it. A write of the
//! Lease carries the `resourceVersion` it was decided from, so two replicas that both decide to
//! take an expired lease cannot both succeed.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hoststack_crds::OPERATOR_FIELD_MANAGER;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::Client;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::Result;

/// The terms of the election: how long a lease lasts, and how often a replica looks and renews.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Terms {
    /// How long the lease stays the holder's after the others saw its last renewal.
    pub duration: Duration,
    /// How long after its last successful write the holder renews.
    pub renew_after: Duration,
    /// How often a replica that does not hold the lease (or failed to renew it) looks again.
    pub retry: Duration,
    /// Taken off the holder's own reckoning of its lease, for clocks that run at slightly
    /// different rates on two machines.
    pub margin: Duration,
    /// The longest one call to the API server may take before it counts as failed.
    pub call_timeout: Duration,
}

/// The operator's terms: a 15 s lease renewed every 5 s, 10 s before the others could take it
/// (so that a renewal slowed by a saturated API server is tried again before the holder's own
/// 13 s run out: renewing every 10 s, a 5,000-node apply on a saturated API server lost the
/// lease 28 times in 21 minutes), looked at every 2 s by a standby, and held by its holder 13 s
/// after each renewal it sent.
pub const TERMS: Terms = Terms {
    duration: Duration::from_secs(15),
    renew_after: Duration::from_secs(5),
    retry: Duration::from_secs(2),
    margin: Duration::from_secs(2),
    call_timeout: Duration::from_secs(5),
};

/// What the election needs of a Lease as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// The holder, if any.
    pub holder: Option<String>,
    /// The duration the holder asked for, in seconds.
    pub duration_seconds: Option<i32>,
    /// The object's resourceVersion: any write of the Lease changes it.
    pub resource_version: String,
}

impl Record {
    /// The parts of `lease` the election reads.
    pub fn of(lease: &Lease) -> Self {
        let spec = lease.spec.clone().unwrap_or_default();
        Self {
            holder: spec.holder_identity.filter(|h| !h.is_empty()),
            duration_seconds: spec.lease_duration_seconds,
            resource_version: lease.metadata.resource_version.clone().unwrap_or_default(),
        }
    }
}

/// What the loop does next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Next {
    /// Write the Lease: create it, take it (free or expired) or renew it.
    Write,
    /// Read the Lease again after this long.
    Wait(Duration),
}

/// The pure state of one replica's election.
#[derive(Clone, Debug)]
pub struct Elector {
    identity: String,
    terms: Terms,
    /// The Lease as last read (`None`: it does not exist), and when this replica first saw it
    /// so; `None` before the first read.
    seen: Option<(Option<Record>, Instant)>,
    /// The send time of this replica's last successful write of the Lease.
    last_write: Option<Instant>,
}

impl Elector {
    /// A replica named `identity` that has seen nothing yet.
    pub fn new(identity: impl Into<String>, terms: Terms) -> Self {
        Self {
            identity: identity.into(),
            terms,
            seen: None,
            last_write: None,
        }
    }

    /// The Lease (or its absence) as read by a request that returned at `at`. Only a change
    /// resets the time it was seen: another holder's lease runs from when this replica saw its
    /// last renewal, never from the renewal time written in it (another machine's clock).
    pub fn observe(&mut self, lease: Option<Record>, at: Instant) {
        if self.seen.as_ref().is_some_and(|(seen, _)| *seen == lease) {
            return;
        }
        if lease.as_ref().and_then(|l| l.holder.as_deref()) != Some(self.identity.as_str()) {
            self.last_write = None;
        }
        self.seen = Some((lease, at));
    }

    /// This replica's write of the Lease, sent at `sent`, succeeded and left `lease`.
    pub fn wrote(&mut self, lease: Record, sent: Instant, at: Instant) {
        self.seen = Some((Some(lease), at));
        self.last_write = Some(sent);
    }

    /// Until when this replica provably holds the lease, if it holds it.
    pub fn held_until(&self) -> Option<Instant> {
        let sent = self.last_write?;
        let (Some(lease), _) = self.seen.as_ref()? else {
            return None;
        };
        (lease.holder.as_deref() == Some(self.identity.as_str()))
            .then(|| sent + self.terms.duration.saturating_sub(self.terms.margin))
    }

    /// Whether this replica provably holds the lease at `now`.
    pub fn holds(&self, now: Instant) -> bool {
        self.held_until().is_some_and(|until| now < until)
    }

    /// What to do at `now`.
    pub fn next(&self, now: Instant) -> Next {
        let Some((lease, seen_at)) = &self.seen else {
            return Next::Wait(self.terms.retry);
        };
        let Some(lease) = lease else {
            return Next::Write;
        };
        match lease.holder.as_deref() {
            None => Next::Write,
            Some(holder) if holder == self.identity => match self.last_write {
                // Ours from an earlier run of this identity: take it up again.
                None => Next::Write,
                Some(sent) => match (sent + self.terms.renew_after).checked_duration_since(now) {
                    Some(wait) if !wait.is_zero() => Next::Wait(wait),
                    _ => Next::Write,
                },
            },
            Some(_) => {
                let duration = lease
                    .duration_seconds
                    .and_then(|s| u64::try_from(s).ok())
                    .map_or(self.terms.duration, Duration::from_secs);
                match (*seen_at + duration).checked_duration_since(now) {
                    Some(left) if !left.is_zero() => Next::Wait(left.min(self.terms.retry)),
                    _ => Next::Write,
                }
            }
        }
    }

    /// The Lease this replica writes at `wall_now` to take or renew `current` (`None`: create).
    pub fn lease_to_write(&self, current: Option<&Lease>, wall_now: Timestamp) -> Lease {
        let mut lease = current.cloned().unwrap_or_default();
        // Left out of the request, the server keeps them as they are.
        lease.metadata.managed_fields = None;
        let mut spec = lease.spec.take().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            spec.holder_identity = Some(self.identity.clone());
            spec.acquire_time = Some(MicroTime(wall_now));
            if current.is_some() {
                spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
            }
        }
        spec.lease_duration_seconds =
            Some(i32::try_from(self.terms.duration.as_secs()).unwrap_or(i32::MAX));
        spec.renew_time = Some(MicroTime(wall_now));
        lease.spec = Some(spec);
        lease
    }
}

/// What refuses the operator's writes once its lease may have passed.
#[derive(Clone, Default)]
pub struct Fence {
    held_until: Arc<Mutex<Option<Instant>>>,
}

impl Fence {
    /// Whether a write may be sent at `now`.
    pub fn open(&self, now: Instant) -> bool {
        self.held_until
            .lock()
            .expect("the fence's lock is never poisoned")
            .is_some_and(|until| now < until)
    }

    fn set(&self, until: Option<Instant>) {
        *self
            .held_until
            .lock()
            .expect("the fence's lock is never poisoned") = until;
    }

    /// A client layer that passes reads and, while the fence is open, writes; any other write
    /// fails at once with [`NotLeader`], unsent.
    pub fn layer(
        &self,
    ) -> tower::filter::FilterLayer<
        impl Fn(
                http::Request<kube::client::Body>,
            ) -> Result<http::Request<kube::client::Body>, NotLeader>
            + Clone,
    > {
        let fence = self.clone();
        tower::filter::FilterLayer::new(move |request: http::Request<kube::client::Body>| {
            if is_read(request.method()) || fence.open(Instant::now()) {
                Ok(request)
            } else {
                Err(NotLeader {
                    method: request.method().clone(),
                    path: request.uri().path().to_string(),
                })
            }
        })
    }
}

/// Whether a request with `method` only reads.
fn is_read(method: &http::Method) -> bool {
    matches!(
        *method,
        http::Method::GET | http::Method::HEAD | http::Method::OPTIONS
    )
}

/// A write refused because this replica does not provably hold the lease.
#[derive(Debug, thiserror::Error)]
#[error("not sent: {method} {path} (this replica does not provably hold the leader lease)")]
pub struct NotLeader {
    method: http::Method,
    path: String,
}

/// A running election.
pub struct Election {
    /// True while this replica provably holds the lease.
    pub is_leader: watch::Receiver<bool>,
    fence: Fence,
    stop: tokio::sync::oneshot::Sender<()>,
    task: JoinHandle<Result<()>>,
}

impl Election {
    /// Joins the election for `lease_name` in `namespace` as `identity`, reading and writing the
    /// Lease with `client` (which must not be fenced). A failed or slow call is tried again at
    /// the next turn; only the lease's expiry makes a leader lose it.
    pub async fn join(
        client: Client,
        namespace: &str,
        lease_name: &str,
        identity: &str,
        terms: Terms,
    ) -> Result<Self> {
        let api = Api::<Lease>::namespaced(client, namespace);
        let (leader_tx, is_leader) = watch::channel(false);
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let fence = Fence::default();
        let elector = Elector::new(identity, terms);
        let task = tokio::spawn(run(
            api,
            lease_name.to_string(),
            elector,
            fence.clone(),
            leader_tx,
            stopped,
        ));
        Ok(Self {
            is_leader,
            fence,
            stop,
            task,
        })
    }

    /// The fence that this election opens while it holds the lease.
    pub fn fence(&self) -> &Fence {
        &self.fence
    }

    /// Waits until this replica holds the lease; false if the election ended first.
    pub async fn acquired(&mut self) -> bool {
        self.is_leader.wait_for(|leader| *leader).await.is_ok()
    }

    /// A future that completes when this replica no longer provably holds the lease.
    pub fn lost(&self) -> impl std::future::Future<Output = ()> + Send + Sync + 'static {
        let mut rx = self.is_leader.clone();
        async move {
            let _ = rx.wait_for(|leader| !*leader).await;
        }
    }

    /// Leaves the election, releasing the lease if still held.
    pub async fn leave(self) -> Result<()> {
        let _ = self.stop.send(());
        self.task
            .await
            .map_err(|e| crate::Error::LeaseTask(e.to_string()))?
    }
}

/// The election's loop: read, decide, write or wait; on `stopped`, release the lease if held.
async fn run(
    api: Api<Lease>,
    name: String,
    mut elector: Elector,
    fence: Fence,
    leader: watch::Sender<bool>,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
) -> Result<()> {
    let terms = elector.terms;
    let mut current: Option<Lease> = None;
    loop {
        match tokio::time::timeout(terms.call_timeout, api.get_opt(&name)).await {
            Ok(Ok(lease)) => {
                elector.observe(lease.as_ref().map(Record::of), Instant::now());
                current = lease;
            }
            Ok(Err(e)) if transient(&e) => {
                tracing::warn!(lease = %name, error = %e, "could not read the leader lease; trying again")
            }
            // A refusal is tried again too: an API server that has just restarted refuses
            // everything for a moment, until its authorizer has read the RBAC objects. Where
            // it persists, the Role lacks the Lease's verbs (docs/install.md).
            Ok(Err(e)) => tracing::error!(
                lease = %name,
                error = %e,
                "the API server refused to read the leader lease; trying again (the operator's Role must allow get, create and patch on it)"
            ),
            Err(_) => tracing::warn!(lease = %name, "reading the leader lease timed out"),
        }
        let mut wait = match elector.next(Instant::now()) {
            Next::Wait(wait) => wait,
            Next::Write => {
                let sent = Instant::now();
                let lease = elector.lease_to_write(current.as_ref(), Timestamp::now());
                match tokio::time::timeout(terms.call_timeout, write(&api, &name, lease)).await {
                    Ok(Ok(written)) => {
                        elector.wrote(Record::of(&written), sent, Instant::now());
                        current = Some(written);
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(lease = %name, error = %e, "could not write the leader lease")
                    }
                    Err(_) => tracing::warn!(lease = %name, "writing the leader lease timed out"),
                }
                match elector.next(Instant::now()) {
                    Next::Wait(wait) => wait,
                    Next::Write => terms.retry,
                }
            }
        };
        let held_until = elector.held_until();
        fence.set(held_until);
        let holds = elector.holds(Instant::now());
        leader.send_if_modified(|was| std::mem::replace(was, holds) != holds);
        if let Some(left) = held_until.and_then(|u| u.checked_duration_since(Instant::now())) {
            // Wake when the lease may pass, to report it lost at once.
            wait = wait.min(left);
        }
        tokio::select! {
            _ = &mut stopped => break,
            _ = tokio::time::sleep(wait) => {}
        }
    }
    fence.set(None);
    leader.send_replace(false);
    release(&api, &name, &elector, current, terms).await
}

/// Whether `error` may pass by itself: the API server unreachable, overloaded or failing
/// (a connection error, 429 or 5xx), as opposed to an answer that will not change (403, 404).
fn transient(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(status) => status.code == 429 || status.code >= 500,
        kube::Error::HyperError(_) | kube::Error::Service(_) => true,
        _ => false,
    }
}

/// Creates the Lease (`lease` has no resourceVersion), or patches it on the condition that it
/// is still the version the decision was made from (a resourceVersion in a patch is a
/// precondition: the API server answers 409 if the Lease changed since).
async fn write(api: &Api<Lease>, name: &str, mut lease: Lease) -> kube::Result<Lease> {
    let Some(version) = lease.metadata.resource_version.take() else {
        lease.metadata = ObjectMeta {
            name: Some(name.to_string()),
            ..ObjectMeta::default()
        };
        let params = PostParams {
            field_manager: Some(OPERATOR_FIELD_MANAGER.to_string()),
            ..PostParams::default()
        };
        return api.create(&params, &lease).await;
    };
    let mut spec = serde_json::to_value(lease.spec.unwrap_or_default())
        .expect("a LeaseSpec serializes to JSON");
    if let Some(spec) = spec.as_object_mut() {
        // Absent from a merge patch, a field stays as it was: a release names the holder null.
        spec.entry("holderIdentity")
            .or_insert(serde_json::Value::Null);
    }
    let patch = serde_json::json!({"metadata": {"resourceVersion": version}, "spec": spec});
    let params = PatchParams {
        field_manager: Some(OPERATOR_FIELD_MANAGER.to_string()),
        ..PatchParams::default()
    };
    api.patch(name, &params, &Patch::Merge(&patch)).await
}

/// Gives the lease up, if this replica still provably holds it, so that a standby takes it at
/// its next look. A lease that may have passed is left alone (another replica may hold it), and
/// a release that fails is only logged: the lease expires by itself.
async fn release(
    api: &Api<Lease>,
    name: &str,
    elector: &Elector,
    current: Option<Lease>,
    terms: Terms,
) -> Result<()> {
    let Some(mut lease) = current.filter(|_| elector.holds(Instant::now())) else {
        return Ok(());
    };
    lease.spec = Some(LeaseSpec {
        holder_identity: None,
        ..lease.spec.unwrap_or_default()
    });
    match tokio::time::timeout(terms.call_timeout, write(api, name, lease)).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => {
            tracing::warn!(lease = %name, error = %e, "could not release the leader lease; it expires by itself")
        }
        Err(_) => {
            tracing::warn!(lease = %name, "releasing the leader lease timed out; it expires by itself")
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME: &str = "replica-1";

    fn record(holder: Option<&str>, version: &str) -> Record {
        Record {
            holder: holder.map(str::to_string),
            duration_seconds: Some(15),
            resource_version: version.to_string(),
        }
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn a_free_or_missing_lease_is_taken_and_held_from_the_send_time_of_the_write() {
        let t0 = Instant::now();
        let mut e = Elector::new(ME, TERMS);
        assert_eq!(e.next(t0), Next::Wait(TERMS.retry), "read first");
        e.observe(None, t0);
        assert_eq!(e.next(t0), Next::Write);
        e.wrote(record(Some(ME), "2"), t0 + secs(1), t0 + secs(3));
        // Held from the send time (t0+1), not from when the answer came back (t0+3).
        assert_eq!(e.held_until(), Some(t0 + secs(1) + secs(13)));
        assert!(e.holds(t0 + secs(13)) && !e.holds(t0 + secs(14)));
        assert_eq!(e.next(t0 + secs(3)), Next::Wait(secs(3)));
        assert_eq!(
            e.next(t0 + secs(6)),
            Next::Write,
            "renewed 5 s after the last write"
        );

        let mut e = Elector::new(ME, TERMS);
        e.observe(Some(record(None, "5")), t0);
        assert_eq!(e.next(t0), Next::Write, "a released lease is free");
    }

    #[test]
    fn another_holders_lease_runs_from_when_its_last_renewal_was_seen_on_this_clock() {
        let t0 = Instant::now();
        let mut e = Elector::new(ME, TERMS);
        e.observe(Some(record(Some("other"), "1")), t0);
        assert_eq!(e.next(t0), Next::Wait(TERMS.retry));
        // Read again unchanged: the lease still runs from t0.
        e.observe(Some(record(Some("other"), "1")), t0 + secs(10));
        assert_eq!(e.next(t0 + secs(14)), Next::Wait(secs(1)));
        assert_eq!(e.next(t0 + secs(15)), Next::Write, "expired: taken over");
        // A renewal seen at t0+14 starts the lease again from there.
        e.observe(Some(record(Some("other"), "2")), t0 + secs(14));
        assert_eq!(e.next(t0 + secs(15)), Next::Wait(TERMS.retry));
        assert_eq!(e.next(t0 + secs(29)), Next::Write);
        assert!(!e.holds(t0 + secs(15)));
    }

    #[test]
    fn a_holder_whose_renewals_fail_stops_holding_when_its_lease_may_have_passed() {
        let t0 = Instant::now();
        let mut e = Elector::new(ME, TERMS);
        e.observe(Some(record(Some("other"), "1")), t0);
        e.wrote(record(Some(ME), "2"), t0 + secs(15), t0 + secs(15));
        // Renewals from t0+25 on fail (or the process was stopped): nothing extends the lease.
        e.observe(Some(record(Some(ME), "2")), t0 + secs(27));
        assert!(e.holds(t0 + secs(27)));
        assert_eq!(e.next(t0 + secs(27)), Next::Write, "still trying to renew");
        assert!(
            !e.holds(t0 + secs(28)),
            "15 s after the last renewal sent, less the margin"
        );
        // Resumed after a pause, it reads the lease taken over: it holds nothing.
        e.observe(Some(record(Some("standby"), "3")), t0 + secs(60));
        assert_eq!(e.held_until(), None);
        assert_eq!(e.next(t0 + secs(60)), Next::Wait(TERMS.retry));
    }

    #[test]
    fn a_lease_left_by_an_earlier_run_of_the_same_identity_is_taken_up_but_not_held_until_written()
    {
        let t0 = Instant::now();
        let mut e = Elector::new(ME, TERMS);
        e.observe(Some(record(Some(ME), "7")), t0);
        assert!(!e.holds(t0), "no write of this run proves anything yet");
        assert_eq!(e.next(t0), Next::Write);
    }

    #[test]
    fn the_lease_written_takes_over_with_a_transition_and_renews_without_one() {
        let e = Elector::new(ME, TERMS);
        let wall = Timestamp::from_second(1_000).unwrap();
        let created = e.lease_to_write(None, wall);
        let spec = created.spec.clone().unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some(ME));
        assert_eq!(spec.lease_duration_seconds, Some(15));
        assert_eq!(spec.lease_transitions, None);
        assert_eq!(spec.acquire_time, Some(MicroTime(wall)));

        let mut theirs = created.clone();
        theirs.metadata.resource_version = Some("4".into());
        theirs.spec.as_mut().unwrap().holder_identity = Some("other".into());
        theirs.spec.as_mut().unwrap().lease_transitions = Some(2);
        let later = Timestamp::from_second(2_000).unwrap();
        let taken = e.lease_to_write(Some(&theirs), later);
        let spec = taken.spec.clone().unwrap();
        assert_eq!(spec.lease_transitions, Some(3));
        assert_eq!(spec.acquire_time, Some(MicroTime(later)));
        assert_eq!(
            taken.metadata.resource_version.as_deref(),
            Some("4"),
            "written on the condition that nobody wrote it since"
        );

        let renewed = e.lease_to_write(Some(&taken), Timestamp::from_second(2_010).unwrap());
        let spec = renewed.spec.unwrap();
        assert_eq!(spec.lease_transitions, Some(3));
        assert_eq!(spec.acquire_time, Some(MicroTime(later)));
        assert_eq!(
            spec.renew_time,
            Some(MicroTime(Timestamp::from_second(2_010).unwrap()))
        );
    }

    #[test]
    fn an_unreachable_or_failing_api_server_is_transient_a_refusal_is_not() {
        let api = |code: u16| {
            let mut status = kube::core::Status::failure("", "");
            status.code = code;
            kube::Error::Api(Box::new(status))
        };
        let unreachable = kube::Error::Service(
            std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into(),
        );
        assert!(transient(&unreachable));
        assert!(transient(&api(503)) && transient(&api(500)) && transient(&api(429)));
        assert!(!transient(&api(403)) && !transient(&api(404)) && !transient(&api(409)));
    }

    #[test]
    fn the_fence_passes_reads_always_and_writes_only_while_the_lease_is_held() {
        use tower::{Layer, Service, ServiceExt};
        let fence = Fence::default();
        let sent = Arc::new(Mutex::new(Vec::new()));
        let inner = tower::service_fn({
            let sent = sent.clone();
            move |r: http::Request<kube::client::Body>| {
                sent.lock().unwrap().push(r.method().clone());
                async { Ok::<_, std::convert::Infallible>(()) }
            }
        });
        let svc = fence.layer().layer(inner);
        let request = |method: http::Method| {
            http::Request::builder()
                .method(method)
                .uri("/apis/hoststack.dev/v1alpha1/nodetunings/node-a")
                .body(kube::client::Body::empty())
                .unwrap()
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            let call = |m| {
                let r = request(m);
                let mut svc = svc.clone();
                async move { svc.ready().await.unwrap().call(r).await }
            };
            assert!(call(http::Method::GET).await.is_ok());
            let refused = call(http::Method::PATCH).await.unwrap_err();
            assert!(
                refused.to_string().contains("does not provably hold"),
                "{refused}"
            );
            fence.set(Some(Instant::now() + secs(60)));
            assert!(call(http::Method::PATCH).await.is_ok());
            fence.set(Some(Instant::now()));
            assert!(call(http::Method::DELETE).await.is_err());
        });
        assert_eq!(
            *sent.lock().unwrap(),
            [http::Method::GET, http::Method::PATCH],
            "refused writes were never sent"
        );
    }
}
