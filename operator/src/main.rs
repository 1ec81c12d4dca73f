//! hoststack-operator: joins leader election, and while it leads, owns the agent DaemonSet and
//! reconciles NetworkTunings.

use std::process::ExitCode;
use std::sync::Arc;

use clap::{CommandFactory, Parser};
use hoststack_crds::OPERATOR_FIELD_MANAGER;
use hoststack_operator::config::Args;
use hoststack_operator::daemonset::{agent_daemonset, AGENT_NAME};
use hoststack_operator::leader::{Election, TERMS};
use hoststack_operator::metrics::Metrics;
use hoststack_operator::{controller, Result};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use kube::api::{Api, Patch, PatchParams};
use kube::client::ClientBuilder;
use kube::{Client, Config, Resource};
use tracing::{error, info};

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let args = Args::parse();
    if let Err(why) = args.prometheus.check() {
        Args::command()
            .error(clap::error::ErrorKind::ArgumentConflict, why)
            .exit();
    }
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!(error = %e, "operator stopped");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<()> {
    let config = Config::infer().await.map_err(kube::Error::InferConfig)?;
    // The election reads and writes its Lease with a client of its own; every other request
    // goes through the fence, which sends a write only while this replica holds the lease.
    let election_client = Client::try_from(config.clone())?;
    let metrics = Arc::new(Metrics::default());
    let bound = hoststack_operator::metrics::serve(args.metrics_bind_address, metrics.clone())
        .await
        .map_err(hoststack_operator::Error::Metrics)?;
    info!(address = %bound, "serving /metrics");
    let identity = args
        .identity
        .clone()
        .unwrap_or_else(|| format!("hoststack-operator-{}", std::process::id()));
    let mut election = Election::join(
        election_client,
        &args.namespace,
        &args.lease_name,
        &identity,
        TERMS,
    )
    .await?;
    let client = ClientBuilder::try_from(config)?
        .with_layer(&election.fence().layer())
        .build();
    info!(identity, "waiting to lead");
    tokio::select! {
        acquired = election.acquired() => if !acquired { return election.leave().await },
        _ = shutdown_signal() => return election.leave().await,
    }
    info!(identity, "leading");

    let mut agents = agent_daemonset(&args.namespace, &args.agent);
    if let Some(owner) = &args.owner_deployment {
        let deployment = Api::<Deployment>::namespaced(client.clone(), &args.namespace)
            .get(owner)
            .await?;
        agents.metadata.owner_references = deployment.owner_ref(&()).map(|o| vec![o]);
    }
    let daemonsets = Api::<DaemonSet>::namespaced(client.clone(), &args.namespace);
    daemonsets
        .patch(
            AGENT_NAME,
            &PatchParams::apply(OPERATOR_FIELD_MANAGER).force(),
            &Patch::Apply(agents),
        )
        .await?;

    let lost = election.lost();
    let (lost_tx, mut lost_rx) = tokio::sync::oneshot::channel::<bool>();
    let stop = async move {
        let lost_lease = tokio::select! {
            _ = lost => true,
            _ = shutdown_signal() => false,
        };
        let _ = lost_tx.send(lost_lease);
    };
    controller::run(
        client,
        &identity,
        &args.namespace,
        args.revert_timeout,
        args.prometheus,
        metrics,
        stop,
    )
    .await?;
    election.leave().await?;
    if lost_rx.try_recv().unwrap_or(false) {
        error!("lost the lease; exiting so that a restart rejoins the election");
        return Err(hoststack_operator::Error::LeaseTask("lease lost".into()));
    }
    info!("stopped");
    Ok(())
}

/// Completes on SIGTERM or SIGINT.
async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("a SIGTERM handler can be installed");
    tokio::select! {
        _ = term.recv() => {},
        _ = tokio::signal::ctrl_c() => {},
    }
}
