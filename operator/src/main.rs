//! `streamscale-operator`: runs the StreamJob and FlinkScaler controllers, serves `/metrics` and `/healthz`.
//!
//! Settings (flags or environment):
//! * `--namespace` / `WATCH_NAMESPACE`: watch one namespace (default: all).
//! * `--metrics-addr` / `METRICS_ADDR`: address of `/metrics` and `/healthz` (default `0.0.0.0:8080`).
//! * `--leader-election` / `LEADER_ELECTION`: hold the Lease `--lease-name` / `LEASE_NAME`
//!   (default `streamscale-operator`) in `--lease-namespace` / `POD_NAMESPACE` before
//!   reconciling (default off);
//!   `--lease-duration-seconds` / `LEASE_DURATION_SECONDS` (default 15) is how long a leader
//!   that stopped renewing (killed) keeps it: the time another replica may wait to take over.
//! * `--flink-support` / `FLINK_SUPPORT`: also run the FlinkScaler controller (default true).
//! * `--network-policy` / `NETWORK_POLICY` (default true): a NetworkPolicy `NAME-engine` per
//!   StreamJob admitting the engine port only from pods labelled `--operator-pod-labels` /
//!   `OPERATOR_POD_LABELS` in `POD_NAMESPACE`, and from namespaces labelled
//!   `--prometheus-namespace-selector` / `PROMETHEUS_NAMESPACE_SELECTOR` when given.
//! * `--log-format` / `LOG_FORMAT`: `text` or `json`; `RUST_LOG` sets the level.
//!
//! The Kubernetes connection comes from the environment (in-cluster service account, or
//! `KUBECONFIG`). For tests and development the annotation `streamscale.dev/engine-url` on a
//! StreamJob points the operator at an engine outside the cluster, and
//! `streamscale.dev/savepoint-dir` sets the engine's savepoint directory.

use std::sync::Arc;

use anyhow::Context as _;
use clap::Parser;
use kube::Client;
use kube::runtime::events::Reporter;
use streamscale_operator::metrics::Metrics;
use streamscale_operator::network_policy::{NetworkPolicySettings, parse_labels};
use streamscale_operator::reconciler::{self, Context};

#[derive(Parser, Debug)]
#[command(version, about = "Kubernetes operator for streamscale StreamJobs")]
struct Args {
    /// Watch only this namespace (default: all namespaces).
    #[arg(long, env = "WATCH_NAMESPACE")]
    namespace: Option<String>,
    /// Address of /metrics and /healthz.
    #[arg(long, env = "METRICS_ADDR", default_value = "0.0.0.0:8080")]
    metrics_addr: String,
    /// Hold a Lease before reconciling, so that two replicas never act on one job.
    #[arg(long, env = "LEADER_ELECTION", default_value_t = false)]
    leader_election: bool,
    /// Seconds a Lease stays held without renewal (at least 2); the leader renews it a third
    /// of that before it expires.
    #[arg(long, env = "LEASE_DURATION_SECONDS", default_value_t = 15)]
    lease_duration_seconds: u64,
    /// Name of the leader-election Lease.
    #[arg(long, env = "LEASE_NAME", default_value = "streamscale-operator")]
    lease_name: String,
    /// Namespace of the leader-election Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    lease_namespace: String,
    /// Identity in the Lease (default: the host name).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// Autoscale FlinkScalers (needs the chart's Flink RBAC, value `flink.enabled`).
    #[arg(long, env = "FLINK_SUPPORT", default_value_t = true, action = clap::ArgAction::Set)]
    flink_support: bool,
    /// Apply a NetworkPolicy per StreamJob admitting the engine port only from the operator's
    /// pods (and the Prometheus namespaces); off for clusters without a policy controller.
    #[arg(long, env = "NETWORK_POLICY", default_value_t = true, action = clap::ArgAction::Set)]
    network_policy: bool,
    /// Labels of the operator's pods, `KEY=VALUE,...` (the NetworkPolicy admits these pods of
    /// the operator's namespace, POD_NAMESPACE).
    #[arg(
        long,
        env = "OPERATOR_POD_LABELS",
        default_value = "app.kubernetes.io/name=streamscale"
    )]
    operator_pod_labels: String,
    /// Namespace labels, `KEY=VALUE,...`, of the Prometheus admitted to the engine port
    /// (empty: none).
    #[arg(long, env = "PROMETHEUS_NAMESPACE_SELECTOR", default_value = "")]
    prometheus_namespace_selector: String,
    /// Log format: text or json.
    #[arg(long, env = "LOG_FORMAT", default_value = "text")]
    log_format: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    if args.log_format == "json" {
        tracing_subscriber::fmt()
            .json()
            .with_env_filter(filter)
            .init();
    } else {
        tracing_subscriber::fmt().with_env_filter(filter).init();
    }
    let client = Client::try_default()
        .await
        .context("cannot connect to Kubernetes")?;
    let metrics = Metrics::new();
    let m = metrics.clone();
    let app = axum::Router::new()
        .route(
            "/metrics",
            axum::routing::get(move || async move { m.render() }),
        )
        .route("/healthz", axum::routing::get(|| async { "ok" }));
    let listener = tokio::net::TcpListener::bind(&args.metrics_addr)
        .await
        .with_context(|| format!("--metrics-addr {}", args.metrics_addr))?;
    tracing::info!(addr = %listener.local_addr()?, "serving /metrics");
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!("metrics server: {e}");
        }
    });
    let identity = args
        .identity
        .clone()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| format!("streamscale-operator-{}", std::process::id()));

    let _lease = if args.leader_election {
        anyhow::ensure!(
            args.lease_duration_seconds >= 2,
            "--lease-duration-seconds must be at least 2, not {}",
            args.lease_duration_seconds
        );
        let grace = (args.lease_duration_seconds / 3).max(1);
        let manager =
            kube_lease_manager::LeaseManagerBuilder::new(client.clone(), &args.lease_name)
                .with_namespace(&args.lease_namespace)
                .with_identity(&identity)
                .with_duration(args.lease_duration_seconds)
                .with_grace(grace)
                .build()
                .await
                .context("cannot create the leader-election lease manager")?;
        let (mut rx, task) = manager.watch().await;
        tracing::info!(%identity, "waiting for leadership");
        while !*rx.borrow_and_update() {
            rx.changed().await.context("lease manager stopped")?;
        }
        tracing::info!(%identity, "leading");
        // Losing leadership ends the process: a restarted replica waits for the lease again.
        tokio::spawn(async move {
            while rx.changed().await.is_ok() {
                if !*rx.borrow() {
                    tracing::error!("lost leadership; exiting");
                    std::process::exit(1);
                }
            }
        });
        Some(task)
    } else {
        None
    };

    let reporter = Reporter {
        controller: "streamscale-operator".into(),
        instance: Some(identity),
    };
    let mut ctx = Context::new(client, metrics, reporter);
    if args.network_policy {
        let operator_pod_labels = parse_labels("OPERATOR_POD_LABELS", &args.operator_pod_labels)?;
        anyhow::ensure!(
            !operator_pod_labels.is_empty(),
            "OPERATOR_POD_LABELS is empty: the NetworkPolicy would admit every pod of {}",
            args.lease_namespace
        );
        let prometheus = parse_labels(
            "PROMETHEUS_NAMESPACE_SELECTOR",
            &args.prometheus_namespace_selector,
        )?;
        ctx = ctx.with_network_policy(NetworkPolicySettings {
            operator_namespace: args.lease_namespace.clone(),
            operator_pod_labels,
            prometheus_namespace_labels: (!prometheus.is_empty()).then_some(prometheus),
        });
    }
    let ctx = Arc::new(ctx);
    if args.flink_support {
        tokio::join!(
            reconciler::run(ctx.clone(), args.namespace.clone()),
            reconciler::run_flink_scalers(ctx, args.namespace)
        );
    } else {
        reconciler::run(ctx, args.namespace).await;
    }
    Ok(())
}
