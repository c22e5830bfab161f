//! [`KubeRuntime`]: the controller's [`EngineRuntime`] for an engine running in a pod.
//!
//! Starting an engine is a server-side apply of the job's ConfigMap and engine Deployment at a
//! parallelism (and `--restore` savepoint); the engine is then reached through its Service (or
//! the `streamscale.dev/engine-url` annotation). The reconciler drives the same operations one
//! persisted step at a time (see [`crate::rescale`]), so that an operator restart resumes a
//! rescale; `streamscale run` drives [`streamscale_controller::runtime::LocalRuntime`] through
//! the same trait.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Service};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use std::future::Future;

use streamscale_controller::api::{ApiError, EngineApi, JobStatus};
use streamscale_controller::runtime::{
    EngineHandle, EngineRuntime, RuntimeError, Savepoint, StopOutcome,
};

use crate::crd::StreamJob;
use crate::engine_token::EngineTokens;
use crate::resources::{self, FIELD_MANAGER, ResourceError};

/// Errors applying owned objects.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The API server refused or failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// An object could not be built.
    #[error(transparent)]
    Resource(#[from] ResourceError),
}

fn runtime_error(e: ApplyError) -> RuntimeError {
    RuntimeError::Io {
        path: "kubernetes".to_string(),
        source: std::io::Error::other(e.to_string()),
    }
}

/// Engines of one StreamJob, run as a Deployment.
#[derive(Clone)]
pub struct KubeRuntime {
    client: Client,
    http: reqwest::Client,
    job: StreamJob,
    start_timeout: Duration,
    tokens: Option<EngineTokens>,
}

impl KubeRuntime {
    /// A runtime for `job` (its namespace, name, spec and owner reference are used).
    pub fn new(client: Client, http: reqwest::Client, job: StreamJob) -> KubeRuntime {
        KubeRuntime {
            client,
            http,
            job,
            start_timeout: Duration::from_secs(120),
            tokens: None,
        }
    }

    /// Sends `tokens.current` on the engine's state-changing requests (and each of
    /// `tokens.previous` after a 401, see [`KubeRuntime::authorized`]).
    pub fn with_tokens(mut self, tokens: EngineTokens) -> KubeRuntime {
        self.tokens = Some(tokens);
        self
    }

    /// The engine's REST client, with the current token.
    pub fn api(&self) -> EngineApi {
        self.api_at(&resources::engine_url(&self.job))
    }

    fn api_at(&self, base_url: &str) -> EngineApi {
        EngineApi::new(self.http.clone(), base_url)
            .with_token(self.tokens.as_ref().map(|t| t.current.as_str()))
    }

    /// Runs the state-changing `call` with the current token; while the engine answers 401,
    /// again with each previous token, newest first (an engine started before rotations still
    /// requires the token it read at start).
    ///
    /// # Errors
    /// `call`'s error (the first 401 when no token is accepted).
    pub async fn authorized<T, F, Fut>(&self, call: F) -> Result<T, ApiError>
    where
        F: Fn(EngineApi) -> Fut,
        Fut: Future<Output = Result<T, ApiError>>,
    {
        let first = call(self.api()).await;
        if !matches!(first, Err(ApiError::Status { status: 401, .. })) {
            return first;
        }
        let previous = self.tokens.as_ref().map_or(&[][..], |t| &t.previous[..]);
        for token in previous {
            let again = call(
                EngineApi::new(self.http.clone(), &resources::engine_url(&self.job))
                    .with_token(Some(token)),
            )
            .await;
            if !matches!(again, Err(ApiError::Status { status: 401, .. })) {
                return again;
            }
        }
        first
    }

    fn params() -> PatchParams {
        PatchParams::apply(FIELD_MANAGER).force()
    }

    /// Applies the ConfigMap, PVC, Service and engine Deployment at `parallelism`, restored
    /// from `restore`, with pod restart counter `restart` (server-side apply, owned by the
    /// StreamJob). Idempotent.
    ///
    /// # Errors
    /// The API server's error.
    pub async fn deploy(
        &self,
        parallelism: &BTreeMap<String, u32>,
        restore: Option<&str>,
        restart: u32,
    ) -> Result<(), ApplyError> {
        let ns = self.job.namespace().unwrap_or_else(|| "default".into());
        let pp = Self::params();
        let cm = resources::configmap(&self.job, parallelism)?;
        Api::<ConfigMap>::namespaced(self.client.clone(), &ns)
            .patch(
                &resources::configmap_name(&self.job),
                &pp,
                &Patch::Apply(&cm),
            )
            .await?;
        if let Some(pvc) = resources::pvc(&self.job)? {
            Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), &ns)
                .patch(&resources::pvc_name(&self.job), &pp, &Patch::Apply(&pvc))
                .await?;
        }
        let svc = resources::service(&self.job)?;
        Api::<Service>::namespaced(self.client.clone(), &ns)
            .patch(&resources::engine_name(&self.job), &pp, &Patch::Apply(&svc))
            .await?;
        let d = resources::deployment(&self.job, parallelism, restore, restart)?;
        Api::<Deployment>::namespaced(self.client.clone(), &ns)
            .patch(&resources::engine_name(&self.job), &pp, &Patch::Apply(&d))
            .await?;
        Ok(())
    }

    /// Whether the deployed engine runs without a token (an operator from before the engine
    /// token deployed it); `false` without a Deployment.
    ///
    /// # Errors
    /// The API server's error.
    pub async fn deployed_without_token(&self) -> Result<bool, kube::Error> {
        let ns = self.job.namespace().unwrap_or_else(|| "default".into());
        let d = Api::<Deployment>::namespaced(self.client.clone(), &ns)
            .get_opt(&resources::engine_name(&self.job))
            .await?;
        Ok(d.as_ref().is_some_and(resources::runs_without_token))
    }

    /// The deployed engine's `--parallelism` and `--restore`, `None` without a Deployment.
    ///
    /// # Errors
    /// The API server's error.
    pub async fn workload(&self) -> Result<Option<crate::rescale::WorkloadObs>, kube::Error> {
        let ns = self.job.namespace().unwrap_or_else(|| "default".into());
        let d = Api::<Deployment>::namespaced(self.client.clone(), &ns)
            .get_opt(&resources::engine_name(&self.job))
            .await?;
        Ok(d.as_ref().and_then(resources::workload_of))
    }

    fn handle(
        &self,
        parallelism: &BTreeMap<String, u32>,
        restore: Option<&Savepoint>,
    ) -> EngineHandle {
        EngineHandle {
            id: 0,
            base_url: resources::engine_url(&self.job),
            parallelism: parallelism.clone(),
            restored_from: restore.cloned(),
        }
    }
}

impl EngineRuntime for KubeRuntime {
    /// Applies the workload at `parallelism` from `restore` and waits until the engine behind
    /// the Service answers with that parallelism. `job` is ignored: the job graph is the
    /// StreamJob's.
    async fn start(
        &self,
        _job: &Path,
        parallelism: &BTreeMap<String, u32>,
        restore: Option<&Savepoint>,
    ) -> Result<EngineHandle, RuntimeError> {
        let restart = self.job.status.as_ref().map_or(0, |s| s.restarts);
        self.deploy(parallelism, restore.map(|s| s.path.as_str()), restart)
            .await
            .map_err(runtime_error)?;
        let started = tokio::time::Instant::now();
        loop {
            if let Ok(job) = self.api().job().await {
                let running: BTreeMap<String, u32> = job
                    .operators
                    .iter()
                    .map(|o| (o.name.clone(), o.parallelism))
                    .collect();
                let wanted = parallelism.iter().all(|(k, v)| running.get(k) == Some(v));
                if wanted && job.restored_from.as_deref() == restore.map(|s| s.path.as_str()) {
                    return Ok(self.handle(parallelism, restore));
                }
            }
            if started.elapsed() > self.start_timeout {
                return Err(RuntimeError::StartTimeout {
                    seconds: self.start_timeout.as_secs_f64(),
                });
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    async fn stop_with_savepoint(
        &self,
        _handle: &EngineHandle,
        drain: bool,
    ) -> Result<StopOutcome, RuntimeError> {
        let out = self
            .authorized(|api| async move {
                api.stop_with_savepoint(drain, Duration::from_secs(120))
                    .await
            })
            .await?;
        Ok(StopOutcome {
            savepoint: Savepoint { path: out.path },
            final_job: Some(out.final_job),
        })
    }

    async fn job_status(&self, handle: &EngineHandle) -> Result<JobStatus, RuntimeError> {
        Ok(self.api_at(&handle.base_url).job().await?)
    }

    /// Nothing to release: the next deploy replaces the pod (strategy `Recreate`).
    async fn shutdown(&self, _handle: &EngineHandle) -> Result<(), RuntimeError> {
        Ok(())
    }

    fn auth_token(&self) -> Option<&str> {
        self.tokens.as_ref().map(|t| t.current.as_str())
    }

    /// Scales the engine Deployment to zero.
    async fn kill(&self, _handle: &EngineHandle) -> Result<(), RuntimeError> {
        let ns = self.job.namespace().unwrap_or_else(|| "default".into());
        let patch = serde_json::json!({"spec": {"replicas": 0}});
        Api::<Deployment>::namespaced(self.client.clone(), &ns)
            .patch(
                &resources::engine_name(&self.job),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .map_err(|e| runtime_error(e.into()))?;
        Ok(())
    }

    async fn exited(&self, handle: &EngineHandle) -> Option<RuntimeError> {
        match self.job_status(handle).await {
            Ok(job) if job.state == "failed" => Some(RuntimeError::Exited {
                status: "job failed".into(),
                last_error: "the engine reports state failed".into(),
            }),
            _ => None,
        }
    }
}
