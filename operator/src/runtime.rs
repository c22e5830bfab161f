//! [`KubeRuntime`]: a StreamJob's engine running in a pod.
//!
//! Starting an engine is a server-side apply of the job's ConfigMap and engine Deployment at a
//! parallelism (and `--restore` savepoint); the engine is then reached through its Service (or
//! the `streamscale.dev/engine-url` annotation), with the job's token. The reconciler drives a
//! rescale one persisted step at a time through the controller's rescale machine
//! ([`streamscale_controller::rescale`]) with this as its pod backend, so that an operator
//! restart resumes it; `streamscale run` drives the same machine over its local process.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Service};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use std::future::Future;

use streamscale_controller::api::{ApiError, EngineApi};

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
    /// The API server refused an owned object as invalid or forbidden (400, 403, 404, 413 or
    /// 422: the spec or the cluster's rules, not the moment, are at fault; retrying will not
    /// help until one of them changes).
    #[error("the API server refused {object}: {message}")]
    Refused {
        /// The object's kind and name, e.g. `PersistentVolumeClaim demo-savepoints`.
        object: String,
        /// The API server's message.
        message: String,
    },
}

impl ApplyError {
    /// What a StreamJob's status should say about this error: the refusal of an object
    /// ([`ApplyError::Refused`]) or an object that could not be built; `None` for errors that
    /// may pass (the API server unreachable or failing).
    pub fn spec_fault(&self) -> Option<String> {
        match self {
            ApplyError::Refused { .. } | ApplyError::Resource(_) => Some(self.to_string()),
            ApplyError::Kube(_) => None,
        }
    }
}

/// `error` as an [`ApplyError`]: an answer that the object itself is at fault (400 Bad
/// Request, 403 Forbidden, 404 Not Found, 413 Too Large, 422 Invalid) as the refusal of `kind`
/// `name`; anything that may pass (401 while a token is reloaded, 408, 409, 429 throttling,
/// 5xx, no answer) as it is.
fn refused(kind: &str, name: &str, error: kube::Error) -> ApplyError {
    match error {
        kube::Error::Api(status) if matches!(status.code, 400 | 403 | 404 | 413 | 422) => {
            ApplyError::Refused {
                object: format!("{kind} {name}"),
                message: status.message,
            }
        }
        other => ApplyError::Kube(other),
    }
}

/// Engines of one StreamJob, run as a Deployment.
#[derive(Clone)]
pub struct KubeRuntime {
    client: Client,
    http: reqwest::Client,
    job: StreamJob,
    tokens: Option<EngineTokens>,
}

impl KubeRuntime {
    /// A runtime for `job` (its namespace, name, spec and owner reference are used).
    pub fn new(client: Client, http: reqwest::Client, job: StreamJob) -> KubeRuntime {
        KubeRuntime {
            client,
            http,
            job,
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
        let name = resources::configmap_name(&self.job);
        Api::<ConfigMap>::namespaced(self.client.clone(), &ns)
            .patch(&name, &pp, &Patch::Apply(&cm))
            .await
            .map_err(|e| refused("ConfigMap", &name, e))?;
        if let Some(pvc) = resources::pvc(&self.job)? {
            let name = resources::pvc_name(&self.job);
            Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), &ns)
                .patch(&name, &pp, &Patch::Apply(&pvc))
                .await
                .map_err(|e| refused("PersistentVolumeClaim", &name, e))?;
        }
        let svc = resources::service(&self.job)?;
        let name = resources::engine_name(&self.job);
        Api::<Service>::namespaced(self.client.clone(), &ns)
            .patch(&name, &pp, &Patch::Apply(&svc))
            .await
            .map_err(|e| refused("Service", &name, e))?;
        let deployments = Api::<Deployment>::namespaced(self.client.clone(), &ns);
        // The Deployment replaced, for the checkpoint directory the new engine keeps and the
        // lineages it supersedes (only a job that takes checkpoints has any).
        let previous = match self.job.spec.job.checkpoint {
            Some(_) => {
                deployments
                    .get_opt(&resources::engine_name(&self.job))
                    .await?
            }
            None => None,
        };
        let d = resources::deployment(&self.job, parallelism, restore, restart, previous.as_ref())?;
        deployments
            .patch(&name, &pp, &Patch::Apply(&d))
            .await
            .map_err(|e| refused("Deployment", &name, e))?;
        Ok(())
    }

    /// The engine Deployment, `None` without one.
    ///
    /// # Errors
    /// The API server's error.
    pub async fn deployment(&self) -> Result<Option<Deployment>, kube::Error> {
        let ns = self.job.namespace().unwrap_or_else(|| "default".into());
        Api::<Deployment>::namespaced(self.client.clone(), &ns)
            .get_opt(&resources::engine_name(&self.job))
            .await
    }

    /// The deployed engine's `--parallelism` and `--restore`, `None` without a Deployment.
    ///
    /// # Errors
    /// The API server's error.
    pub async fn workload(&self) -> Result<Option<crate::rescale::WorkloadObs>, kube::Error> {
        let d = self.deployment().await?;
        Ok(d.as_ref().and_then(resources::workload_of))
    }
}
