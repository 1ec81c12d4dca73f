//! Two operator replicas are safe: one holds the Lease and reconciles; the other writes nothing
//! until it holds the lease. The leader is SIGKILLed in the middle of a rollout, so it dies
//! holding the lease; once the lease has expired the standby takes it and finishes the rollout
//! without repeating or skipping a wave. Then the lab's operator comes back as the standby and
//! takes the lease over at once when the other replica stops (SIGTERM releases the lease). A
//! leader paused (SIGSTOP) or cut off from its Lease writes nothing once its lease may have
//! passed, and stands by again in the same process; so does a leader whose API server stops
//! answering for longer than the lease, which then leads again.
//!
//! Who wrote what, and when, comes from the API server's audit log ([`Lab::audit_events`]), not
//! from a wait: the standby's token is bound to a Pod of its name, so its requests carry the
//! `authentication.kubernetes.io/pod-name` claim that the lab operator's lack, and the election
//! Lease is logged with its response, which names the holder after each write.

use std::time::Duration;

use hoststack_e2e::{Lab, LabConfig, Signal, NAMESPACE};
use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

/// The standby's leader-election identity (and the name of its token's Pod).
const STANDBY: &str = "replica-2";
/// The election Lease.
const LEASE: &str = "hoststack-operator";
/// How long a step may take: the lease lasts 15 s after the leader's last renewal.
const STEP: Duration = Duration::from_secs(90);

fn lease_holder(lab: &Lab) -> String {
    let out = lab.kubectl(&[
        "get",
        "lease",
        LEASE,
        "-n",
        NAMESPACE,
        "-o",
        "jsonpath={.spec.holderIdentity}",
    ]);
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn status(lab: &Lab) -> Value {
    lab.get_json(&["get", "networktuning", "takeover"])["status"].clone()
}

/// Which replica made a request: the standby (its token's pod-name claim) or the lab operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Replica {
    LabOperator,
    Standby,
}

/// One write of an operator replica, from the audit log.
#[derive(Debug)]
struct Write {
    by: Replica,
    at: Timestamp,
    verb: String,
    /// resource/name, e.g. "nodetunings/node-b", "leases/hoststack-operator".
    object: String,
    code: u64,
    /// For the election Lease: the holder after the write, as the API server answered.
    holder: Option<String>,
}

impl Write {
    fn on_the_lease(&self) -> bool {
        self.object == format!("leases/{LEASE}")
    }

    /// Whether this write made `identity` the holder of the lease.
    fn acquired_by(&self, identity: &str) -> bool {
        self.on_the_lease()
            && (200..300).contains(&self.code)
            && self.holder.as_deref() == Some(identity)
    }
}

/// Every write of the operator's ServiceAccount in the audit log so far, in order.
fn operator_writes(lab: &Lab) -> Vec<Write> {
    let user = format!("system:serviceaccount:{NAMESPACE}:hoststack-operator");
    lab.audit_events()
        .iter()
        .filter(|e| e["user"]["username"] == user.as_str())
        .map(|e| {
            let pod = &e["user"]["extra"]["authentication.kubernetes.io/pod-name"];
            let by = if *pod == serde_json::json!([STANDBY]) {
                Replica::Standby
            } else {
                assert!(pod.is_null(), "a write of an unknown replica: {e}");
                Replica::LabOperator
            };
            let o = &e["objectRef"];
            let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
            let mut object = text(&o["resource"]);
            if let Some(sub) = o["subresource"].as_str() {
                object = format!("{object}/{sub}");
            }
            Write {
                by,
                at: text(&e["requestReceivedTimestamp"])
                    .parse()
                    .unwrap_or_else(|err| panic!("a timestamp ({err}): {e}")),
                verb: text(&e["verb"]),
                object: format!("{object}/{}", text(&o["name"])),
                code: e["responseStatus"]["code"].as_u64().unwrap_or_default(),
                holder: e["responseObject"]["spec"]["holderIdentity"]
                    .as_str()
                    .map(str::to_string),
            }
        })
        .collect()
}

/// Checks that `replica`, waiting since `since`, wrote nothing but the election Lease before
/// the write that made `identity` its holder, and nothing at all before `not_before` (while
/// the other replica's lease was still valid); returns when it acquired the lease.
fn quiet_until_it_led(
    writes: &[Write],
    replica: Replica,
    identity: &str,
    since: Timestamp,
    not_before: Timestamp,
) -> Timestamp {
    let mine: Vec<&Write> = writes
        .iter()
        .filter(|w| w.by == replica && w.at >= since)
        .collect();
    let acquired = mine
        .iter()
        .position(|w| w.acquired_by(identity))
        .unwrap_or_else(|| panic!("{identity} never acquired the lease: {mine:#?}"));
    for w in &mine[..acquired] {
        assert!(
            w.on_the_lease(),
            "{identity} wrote before it held the lease: {w:?}"
        );
        assert!(
            w.at >= not_before,
            "{identity} wrote while the lease was still the other replica's: {w:?}"
        );
    }
    let led = mine[acquired].at;
    // It carried on, so the check above had something to be quiet about.
    assert!(
        mine[acquired..].iter().any(|w| !w.on_the_lease()),
        "{identity} wrote nothing once it led: {mine:#?}"
    );
    led
}

#[test]
fn a_standby_writes_nothing_until_it_takes_over_from_a_crashed_leader() {
    let lab = Lab::start(LabConfig::with_nodes(3)).expect("lab starts");
    let leader = lab.wait_for("the lab's operator to hold the lease", STEP, || {
        let holder = lease_holder(&lab);
        (!holder.is_empty()).then_some(holder)
    });
    assert_ne!(leader, STANDBY);
    let original = lab.sysctl("node-b", "net.ipv4.tcp_sack");
    assert_eq!(original, "1");

    let standby_started = Timestamp::now();
    lab.start_operator_replica(STANDBY);
    lab.wait_for("the standby to wait for the lease", STEP, || {
        let log = std::fs::read_to_string(lab.log_path(&format!("operator-{STANDBY}"))).ok()?;
        log.contains("waiting to lead").then_some(())
    });

    // A rollout over node-a and node-b, the leader killed while its canary pauses.
    lab.apply_yaml(
        "apiVersion: hoststack.dev/v1alpha1\nkind: NetworkTuning\nmetadata: {name: takeover}\nspec:\n  nodeSelector: {matchLabels: {pool: edge}}\n  sysctls: {net.ipv4.tcp_sack: \"0\"}\n  rollout: {canary: 1, maxUnavailable: 1, pauseAfterCanary: 10s}\n",
    )
    .expect("accepted");
    lab.wait_for("the canary to apply", STEP, || {
        (status(&lab)["waves"][0]["result"] == "Applied").then_some(())
    });
    assert_eq!(lease_holder(&lab), leader, "the leader keeps the lease");
    assert_eq!(
        lab.sysctl("node-b", "net.ipv4.tcp_sack"),
        "1",
        "node-b waits"
    );
    let killed = Timestamp::now();
    lab.kill_operator(Signal::Kill);

    lab.wait_for("the standby to take the lease over", STEP, || {
        (lease_holder(&lab) == STANDBY).then_some(())
    });
    let done = lab.wait_for("the standby to complete the rollout", STEP, || {
        let s = status(&lab);
        (s["phase"] == "Complete").then_some(s)
    });
    let waves: Vec<Value> = done["waves"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["nodes"].clone())
        .collect();
    assert_eq!(
        waves,
        [serde_json::json!(["node-a"]), serde_json::json!(["node-b"])],
        "no wave repeated or skipped"
    );
    assert_eq!(lab.sysctl("node-b", "net.ipv4.tcp_sack"), "0");

    let writes = operator_writes(&lab);
    let leader_wrote = writes
        .iter()
        .filter(|w| {
            w.by == Replica::LabOperator && w.at < killed && w.object.starts_with("nodetunings/")
        })
        .count();
    assert!(
        leader_wrote > 0,
        "the audit log shows the leader's NodeTuning writes: {writes:#?}"
    );
    let took_over = quiet_until_it_led(&writes, Replica::Standby, STANDBY, standby_started, killed);
    assert!(
        writes.iter().any(|w| w.by == Replica::Standby
            && w.object == "nodetunings/node-b"
            && w.verb == "patch"),
        "the standby rolled node-b on once it led: {writes:#?}"
    );
    eprintln!(
        "killed the leader at {killed}; {STANDBY} took the lease at {took_over} ({:.1} s later)",
        took_over.duration_since(killed).as_secs_f64()
    );

    // The lab's operator comes back as the standby; stopping the leader hands over at once.
    let restarted = Timestamp::now();
    lab.start_operator();
    lab.wait_for("the lab's operator to wait for the lease", STEP, || {
        let log = std::fs::read_to_string(lab.log_path("operator")).ok()?;
        (log.matches("waiting to lead").count() == 2).then_some(())
    });
    assert_eq!(lease_holder(&lab), STANDBY);
    let stopped = Timestamp::now();
    lab.stop_operator_replica(STANDBY);
    lab.wait_for("the lab's operator to take the lease back", STEP, || {
        (lease_holder(&lab) == leader).then_some(())
    });
    let out = lab.kubectl(&["delete", "networktuning", "takeover", "--timeout=60s"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(lab.sysctl("node-b", "net.ipv4.tcp_sack"), original);
    let writes = operator_writes(&lab);
    quiet_until_it_led(&writes, Replica::LabOperator, &leader, restarted, stopped);
    lab.stop().expect("the lab stops cleanly");
}

/// A ValidatingAdmissionPolicy that refuses every write of the election Lease by the replica
/// whose token is bound to the Pod `pod`: its renewals fail while its other requests go
/// through, as when a partition or an overloaded API server drops only some of them.
fn cut_lease_writes_of(pod: &str) -> String {
    format!(
        r#"apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {{name: cut-lease-writes}}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
      - apiGroups: ["coordination.k8s.io"]
        apiVersions: ["*"]
        operations: ["CREATE", "UPDATE"]
        resources: ["leases"]
        resourceNames: ["{LEASE}"]
  validations:
    - expression: >-
        !('authentication.kubernetes.io/pod-name' in request.userInfo.extra) ||
        request.userInfo.extra['authentication.kubernetes.io/pod-name'] != ['{pod}']
      message: the test cuts this replica's lease writes
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {{name: cut-lease-writes}}
spec:
  policyName: cut-lease-writes
  validationActions: ["Deny"]
"#
    )
}

/// The replica's writes, other than of the election Lease, received after `after`.
fn writes_after(writes: &[Write], by: Replica, after: Timestamp) -> Vec<&Write> {
    writes
        .iter()
        .filter(|w| w.by == by && w.at > after && !w.on_the_lease())
        .collect()
}

#[test]
fn a_leader_paused_or_cut_off_from_its_lease_writes_nothing_once_the_lease_may_have_passed() {
    let lab = Lab::start(LabConfig::with_nodes(3)).expect("lab starts");
    let leader = lab.wait_for("the lab's operator to hold the lease", STEP, || {
        let holder = lease_holder(&lab);
        (!holder.is_empty()).then_some(holder)
    });
    lab.start_operator_replica(STANDBY);
    lab.wait_for("the standby to wait for the lease", STEP, || {
        let log = std::fs::read_to_string(lab.log_path(&format!("operator-{STANDBY}"))).ok()?;
        log.contains("waiting to lead").then_some(())
    });
    lab.apply_yaml(
        "apiVersion: hoststack.dev/v1alpha1\nkind: NetworkTuning\nmetadata: {name: takeover}\nspec:\n  nodeSelector: {matchLabels: {pool: edge}}\n  sysctls: {net.ipv4.tcp_sack: \"0\"}\n  rollout: {canary: 1, maxUnavailable: 1, pauseAfterCanary: 20s}\n",
    )
    .expect("accepted");
    lab.wait_for("the canary to apply", STEP, || {
        (status(&lab)["waves"][0]["result"] == "Applied").then_some(())
    });

    // 1. The leader is paused (SIGSTOP) while its canary pauses: its requeue falls due while
    // it is stopped, and it resumes after the standby has carried the rollout on.
    let paused = Timestamp::now();
    lab.kill_operator(Signal::Stop);
    lab.wait_for("the standby to take the lease over", STEP, || {
        (lease_holder(&lab) == STANDBY).then_some(())
    });
    lab.wait_for("the standby to complete the rollout", STEP, || {
        (status(&lab)["phase"] == "Complete").then_some(())
    });
    lab.kill_operator(Signal::Cont);
    // It stops reconciling and stands by again, in the same process: a term ends, not the
    // replica (an API server away longer than the lease must not stop the operator).
    lab.wait_for(
        "the resumed replica to see it lost the lease and stand by",
        STEP,
        || {
            let log = std::fs::read_to_string(lab.log_path("operator")).ok()?;
            let after = &log[log.find("lost the lease")?..];
            after.contains("waiting to lead").then_some(())
        },
    );
    assert!(
        lab.processes().iter().any(|(name, _)| name == "operator"),
        "the replica that lost the lease still runs, as a standby"
    );
    let writes = operator_writes(&lab);
    let stale = writes_after(&writes, Replica::LabOperator, paused);
    assert!(
        stale.is_empty(),
        "the paused leader wrote after it was stopped, when its lease may have passed: {stale:#?}"
    );
    assert!(
        !writes_after(&writes, Replica::Standby, paused).is_empty(),
        "the standby carried the rollout on, so the paused leader had something to be stale about"
    );

    // 2. The standby leads; its lease writes are cut, nothing else of it. Once its lease has
    // run out by its own terms the tuning changes: a replica that still believed it led would
    // roll the change out. The lab's operator, standing by since step 1, takes over.
    lab.apply_yaml(&cut_lease_writes_of(STANDBY))
        .expect("the policy is accepted");
    let refused_renewal = lab.wait_for("a renewal of the standby to be refused", STEP, || {
        operator_writes(&lab)
            .into_iter()
            .find(|w| w.by == Replica::Standby && w.on_the_lease() && w.code >= 400)
    });
    // The lab's operator takes the lease once it has run out (its holder's renewals refused).
    lab.wait_for("the lab's operator to take the lease over", STEP, || {
        (lease_holder(&lab) == leader).then_some(())
    });
    let out = lab.kubectl(&[
        "patch",
        "networktuning",
        "takeover",
        "--type=merge",
        "-p",
        r#"{"spec":{"sysctls":{"net.ipv4.tcp_sack":"1"}}}"#,
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    lab.wait_for("the new leader to complete the rollout", STEP, || {
        let s = status(&lab);
        (s["phase"] == "Complete" && lab.sysctl("node-b", "net.ipv4.tcp_sack") == "1").then_some(())
    });
    let writes = operator_writes(&lab);
    let last_renewal = writes
        .iter()
        .filter(|w| w.by == Replica::Standby && w.acquired_by(STANDBY))
        .map(|w| w.at)
        .max()
        .expect("the standby renewed its lease before the cut");
    let expiry = last_renewal + Duration::from_secs(15);
    let late = writes_after(&writes, Replica::Standby, expiry);
    assert!(
        late.is_empty(),
        "the cut-off replica wrote more than a lease duration after its last renewal \
         ({last_renewal}; first refused at {}): {late:#?}",
        refused_renewal.at
    );
    let log = std::fs::read_to_string(lab.log_path(&format!("operator-{STANDBY}")))
        .expect("the standby's log");
    assert!(
        log.contains("lost the lease"),
        "the cut-off replica reported its lease lost"
    );
    let took_over = writes
        .iter()
        .filter(|w| w.by == Replica::LabOperator && w.acquired_by(&leader) && w.at > paused)
        .map(|w| w.at)
        .min()
        .expect("the lab's operator acquired the lease again");
    assert!(
        took_over >= expiry,
        "the lease was taken over ({took_over}) before it expired ({expiry})"
    );

    lab.kubectl(&[
        "delete",
        "validatingadmissionpolicybinding",
        "cut-lease-writes",
    ]);
    lab.kubectl(&["delete", "validatingadmissionpolicy", "cut-lease-writes"]);
    lab.stop_operator_replica(STANDBY);

    // 3. The lab's operator, alone, leads while the API server stops answering for longer than
    // the lease (SIGSTOP: its connections hang, as when a control plane stalls): it loses the
    // lease, stands by in the same process, takes the lease up again once the server answers,
    // and reconciles: the tuning's deletion below waits on its revert finalizer.
    let log = || std::fs::read_to_string(lab.log_path("operator")).expect("the operator's log");
    let terms_before = log().matches("leading").count();
    let losses_before = log().matches("lost the lease").count();
    lab.pause_apiserver(Duration::from_secs(25));
    lab.wait_for("the operator to lead again after the pause", STEP, || {
        let log = log();
        (log.matches("lost the lease").count() > losses_before
            && log.matches("leading").count() > terms_before)
            .then_some(())
    });
    assert!(
        lab.processes().iter().any(|(name, _)| name == "operator"),
        "the operator outlived the API server's pause"
    );
    let out = lab.kubectl(&["delete", "networktuning", "takeover", "--timeout=60s"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    lab.stop().expect("the lab stops cleanly");
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}
