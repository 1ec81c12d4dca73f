//! hoststack-operator: joins leader election, and while it leads, owns the agent DaemonSet and
//! reconciles NetworkTunings.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

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
use tracing::{error, info, warn};

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
    let config = hoststack_crds::api_client::bounded(
        Config::infer().await.map_err(kube::Error::InferConfig)?,
    );
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
    loop {
        info!(identity, "waiting to lead");
        tokio::select! {
            acquired = election.acquired() => if !acquired { break },
            _ = shutdown_signal() => break,
        }
        info!(identity, "leading");
        match lead(&args, client.clone(), &identity, metrics.clone(), &election).await {
            Ok(Term::Shutdown) => break,
            // A leader that loses the lease stops reconciling and stands by again, in this
            // process: the API server away longer than the lease (a restart) ends a term,
            // not the replica.
            Ok(Term::LeaseLost) => warn!(identity, "lost the lease; stopped reconciling"),
            Err(e) if !election.fence().open(Instant::now()) => {
                warn!(identity, error = %e, "lost the lease; stopped reconciling")
            }
            // The API server refused or failed a call the term cannot go on without (an API
            // server that has just restarted refuses everything until its authorizer has
            // synced; CRDs that are not installed answer 404 until they are): the term ends,
            // and the next one starts after a pause, while this replica keeps the lease.
            Err(e) => {
                error!(identity, error = %e, "the term as leader failed; trying again in {TERM_RETRY:?}");
                tokio::select! {
                    _ = tokio::time::sleep(TERM_RETRY) => {}
                    _ = shutdown_signal() => break,
                }
            }
        }
    }
    election.leave().await?;
    info!("stopped");
    Ok(())
}

/// How long a replica that holds the lease waits before it leads again after a failed term.
const TERM_RETRY: Duration = Duration::from_secs(5);

/// How a term as leader ended.
enum Term {
    /// SIGTERM or SIGINT: the replica stops.
    Shutdown,
    /// The lease may have passed: the replica stands by again.
    LeaseLost,
}

/// One term as leader: applies the agent DaemonSet and reconciles until the lease may have
/// passed or the replica is asked to stop.
async fn lead(
    args: &Args,
    client: Client,
    identity: &str,
    metrics: Arc<Metrics>,
    election: &Election,
) -> Result<Term> {
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
    let (ended_tx, mut ended_rx) = tokio::sync::oneshot::channel::<Term>();
    let stop = async move {
        let term = tokio::select! {
            _ = lost => Term::LeaseLost,
            _ = shutdown_signal() => Term::Shutdown,
        };
        let _ = ended_tx.send(term);
    };
    controller::run(
        client,
        identity,
        &args.namespace,
        args.revert_timeout,
        args.prometheus.clone(),
        metrics,
        stop,
    )
    .await?;
    Ok(ended_rx.try_recv().unwrap_or(Term::Shutdown))
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
