//! Leader election on a Lease, so that two replicas are safe: only the holder reconciles.

use kube::Client;
use kube_lease_manager::LeaseManagerBuilder;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::Result;

/// Seconds a lease stays valid without renewal.
const LEASE_SECONDS: u64 = 15;
/// Seconds before expiry that the holder renews.
const GRACE_SECONDS: u64 = 5;

/// A running election: `is_leader` says whether this replica holds the lease.
pub struct Election {
    /// True while this replica holds the lease.
    pub is_leader: watch::Receiver<bool>,
    task: JoinHandle<kube_lease_manager::Result<kube_lease_manager::LeaseManager>>,
}

impl Election {
    /// Joins the election for `lease_name` in `namespace` as `identity`.
    pub async fn join(
        client: Client,
        namespace: &str,
        lease_name: &str,
        identity: &str,
    ) -> Result<Self> {
        let manager = LeaseManagerBuilder::new(client, lease_name)
            .with_namespace(namespace)
            .with_identity(identity)
            .with_duration(LEASE_SECONDS)
            .with_grace(GRACE_SECONDS)
            .with_field_manager(hoststack_crds::OPERATOR_FIELD_MANAGER)
            .build()
            .await?;
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
