//! Leader election on a Lease, so that two replicas are safe: only the holder reconciles.

use std::time::{Duration, Instant};

use kube::Client;
use kube_lease_manager::{LeaseManagerBuilder, LeaseManagerError};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::Result;

/// Seconds a lease stays valid without renewal.
const LEASE_SECONDS: u64 = 15;
/// Seconds before expiry that the holder renews.
const GRACE_SECONDS: u64 = 5;

/// How long a replica waits to join the election again after the API server did not answer:
/// the first wait, doubled after each failure up to [`JOIN_RETRY_MAX`].
const JOIN_RETRY_FIRST: Duration = Duration::from_secs(1);
/// The longest wait between attempts to join the election.
const JOIN_RETRY_MAX: Duration = Duration::from_secs(30);
/// How long a replica keeps trying to join while the API server refuses it the Lease (403),
/// from the first refusal: a kube-apiserver that has just started serves requests before its
/// RBAC authorizer has read the roles, and refuses them meanwhile (the fault campaign saw it
/// 0.1 s before "Caches are synced"). A refusal that lasts longer is the installer's and ends
/// the join.
const JOIN_REFUSED_PATIENCE: Duration = Duration::from_secs(60);

/// A running election: `is_leader` says whether this replica holds the lease.
pub struct Election {
    /// True while this replica holds the lease.
    pub is_leader: watch::Receiver<bool>,
    task: JoinHandle<kube_lease_manager::Result<kube_lease_manager::LeaseManager>>,
}

impl Election {
    /// Joins the election for `lease_name` in `namespace` as `identity`. While the API server
    /// cannot be reached or answers with a server error (it restarts, etcd is away), it tries
    /// again, waiting longer each time; so it does while the Lease is forbidden, for up to
    /// [`JOIN_REFUSED_PATIENCE`] from the first refusal (a restarted API server's authorizer
    /// catching up); other errors end it.
    pub async fn join(
        client: Client,
        namespace: &str,
        lease_name: &str,
        identity: &str,
    ) -> Result<Self> {
        let mut wait = JOIN_RETRY_FIRST;
        let mut refused_since: Option<Instant> = None;
        let manager = loop {
            let built = LeaseManagerBuilder::new(client.clone(), lease_name)
                .with_namespace(namespace)
                .with_identity(identity)
                .with_duration(LEASE_SECONDS)
                .with_grace(GRACE_SECONDS)
                .with_field_manager(hoststack_crds::OPERATOR_FIELD_MANAGER)
                .build()
                .await;
            match built {
                Ok(manager) => break manager,
                Err(e)
                    if transient(&e)
                        || forbidden(&e)
                            && refused_since.get_or_insert_with(Instant::now).elapsed()
                                < JOIN_REFUSED_PATIENCE =>
                {
                    tracing::warn!(error = %e, retry_in = ?wait, "could not join the leader election; trying again");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(JOIN_RETRY_MAX);
                }
                Err(e) => return Err(e.into()),
            }
        };
        let (is_leader, task) = manager.watch().await;
        Ok(Self { is_leader, task })
    }

    /// Waits until this replica holds the lease; false if the election ended first.
    pub async fn acquired(&mut self) -> bool {
        self.is_leader.wait_for(|leader| *leader).await.is_ok()
    }

    /// A future that completes when this replica loses the lease.
    pub fn lost(&self) -> impl std::future::Future<Output = ()> + Send + Sync + 'static {
        let mut rx = self.is_leader.clone();
        async move {
            let _ = rx.wait_for(|leader| !*leader).await;
        }
    }

    /// Leaves the election, releasing the lease if held.
    pub async fn leave(self) -> Result<()> {
        drop(self.is_leader);
        let manager = self
            .task
            .await
            .map_err(|e| crate::Error::LeaseTask(e.to_string()))??;
        drop(manager);
        Ok(())
    }
}

/// Whether `error` may pass by itself: the API server unreachable, overloaded or failing
/// (a connection error, 429 or 5xx), as opposed to an answer that will not change (403, 404).
fn transient(error: &LeaseManagerError) -> bool {
    match error {
        LeaseManagerError::KubeError(kube::Error::Api(status)) => {
            status.code == 429 || status.code >= 500
        }
        LeaseManagerError::KubeError(kube::Error::HyperError(_) | kube::Error::Service(_)) => true,
        _ => false,
    }
}

/// Whether `error` is the API server refusing the Lease (403).
fn forbidden(error: &LeaseManagerError) -> bool {
    matches!(error, LeaseManagerError::KubeError(kube::Error::Api(status)) if status.code == 403)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;

    fn api(code: u16) -> LeaseManagerError {
        let mut status = Status::failure("", "");
        status.code = code;
        LeaseManagerError::KubeError(kube::Error::Api(Box::new(status)))
    }

    #[test]
    fn an_unreachable_or_failing_api_server_is_transient_a_refusal_is_not() {
        let unreachable = LeaseManagerError::KubeError(kube::Error::Service(
            std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into(),
        ));
        assert!(transient(&unreachable));
        assert!(transient(&api(503)) && transient(&api(500)) && transient(&api(429)));
        assert!(!transient(&api(403)) && !transient(&api(404)) && !transient(&api(409)));
        assert!(!transient(&LeaseManagerError::NonexistentLease("x".into())));
    }

    #[test]
    fn only_a_403_is_a_refusal_of_the_lease() {
        assert!(forbidden(&api(403)));
        assert!(!forbidden(&api(404)) && !forbidden(&api(401)) && !forbidden(&api(503)));
        assert!(!forbidden(&LeaseManagerError::NonexistentLease("x".into())));
    }
}
