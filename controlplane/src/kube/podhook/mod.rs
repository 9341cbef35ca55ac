//! The optional pod webhook, for clusters that relied on Go Carina's: a
//! mutating admission webhook on Pod creation that sends Pods with Carina
//! claims to the scheduler running the Carina extender and copies the
//! StorageClass's pod-migration consent onto them ([`decide`] says what
//! changes). Off unless `--pod-webhook-configuration` names the
//! MutatingWebhookConfiguration (the chart's `podWebhook.enabled`, or its
//! `goCarinaCompat` preset).
//!
//! It is served on the node-identity issuer's TLS port, path
//! [`PATH`], with the issuer's certificate (the Service
//! `carina-controller`'s names); [`ca_bundle`] keeps the CA that signed it
//! in the configuration's `caBundle`. It never refuses a Pod: a claim or a
//! class it cannot read leaves the Pod as it is, with a warning to the
//! client and in the log, and the chart registers it with
//! `failurePolicy: Ignore`, so Pods are created while the controller is
//! down (then without the scheduler name).

pub mod ca_bundle;
pub mod decide;

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::response::Response;
use http::StatusCode;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use kube::{Api, Client, ResourceExt};

use self::decide::mutation;

/// The URL path the webhook answers on.
pub const PATH: &str = "/mutate-pods";

/// The webhook's state: the API client and the scheduler's name.
#[derive(Clone)]
pub struct PodHook {
    client: Client,
    scheduler: String,
}

impl std::fmt::Debug for PodHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodHook")
            .field("scheduler", &self.scheduler)
            .finish_non_exhaustive()
    }
}

impl PodHook {
    pub fn new(client: Client, scheduler: String) -> Self {
        Self { client, scheduler }
    }

    /// The route serving the webhook, for the issuer's server.
    pub fn router(self) -> axum::Router {
        axum::Router::new()
            .route(PATH, axum::routing::post(handle))
            .with_state(Arc::new(self))
    }

    /// The answer to one AdmissionReview body.
    pub async fn review(&self, body: &[u8]) -> (StatusCode, AdmissionReview<DynamicObject>) {
        let bad = |reason: String| {
            (
                StatusCode::BAD_REQUEST,
                AdmissionResponse::invalid(reason).into_review(),
            )
        };
        let review: AdmissionReview<Pod> = match serde_json::from_slice(body) {
            Ok(r) => r,
            Err(e) => return bad(format!("not an AdmissionReview of a Pod: {e}")),
        };
        let request: AdmissionRequest<Pod> = match review.try_into() {
            Ok(r) => r,
            Err(e) => return bad(format!("an AdmissionReview without a request: {e}")),
        };
        (StatusCode::OK, self.respond(&request).await.into_review())
    }

    async fn respond(&self, request: &AdmissionRequest<Pod>) -> AdmissionResponse {
        let allowed = AdmissionResponse::from(request);
        let (Operation::Create, Some(pod)) = (&request.operation, &request.object) else {
            return allowed;
        };
        // A Pod made from a template may carry no namespace yet.
        let namespace = pod
            .namespace()
            .or_else(|| request.namespace.clone())
            .unwrap_or_default();
        let who = pod_name(pod, &namespace);
        let classes = match self.classes(pod, &namespace).await {
            Ok(classes) => classes,
            Err(e) => {
                tracing::warn!(pod = %who, error = %e, "pod webhook: left the pod as it is");
                let mut response = allowed;
                response.warnings = Some(vec![format!(
                    "Carina: could not read the pod's claims ({e}); its scheduler is left as it is"
                )]);
                return response;
            }
        };
        let m = mutation(pod, &classes, &self.scheduler);
        if !m.patch.is_empty() {
            tracing::info!(pod = %who, scheduler = %self.scheduler, changes = m.patch.len(), "pod webhook: mutated");
        }
        let warnings = (!m.warnings.is_empty()).then_some(m.warnings);
        match allowed.clone().with_patch(json_patch::Patch(m.patch)) {
            Ok(mut response) => {
                response.warnings = warnings;
                response
            }
            Err(e) => {
                tracing::error!(pod = %who, error = %e, "pod webhook: the patch does not serialize");
                allowed
            }
        }
    }

    /// The StorageClass of each claim `pod` uses, in its volumes' order:
    /// a persistent claim's by the claim (`None` while the claim or its
    /// class does not exist), a generic ephemeral volume's by its template.
    /// Each class is read once, however many claims name it.
    async fn classes(
        &self,
        pod: &Pod,
        namespace: &str,
    ) -> Result<Vec<Option<StorageClass>>, kube::Error> {
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), namespace);
        let classes: Api<StorageClass> = Api::all(self.client.clone());
        let volumes = pod.spec.as_ref().and_then(|s| s.volumes.as_ref());
        let mut read: BTreeMap<String, Option<StorageClass>> = BTreeMap::new();
        let mut out = Vec::new();
        for volume in volumes.into_iter().flatten() {
            let class_name = if let Some(source) = &volume.persistent_volume_claim {
                claims
                    .get_opt(&source.claim_name)
                    .await?
                    .and_then(|c| c.spec.and_then(|s| s.storage_class_name))
            } else if let Some(ephemeral) = &volume.ephemeral {
                ephemeral
                    .volume_claim_template
                    .as_ref()
                    .and_then(|t| t.spec.storage_class_name.clone())
            } else {
                continue;
            };
            let class = match class_name.filter(|n| !n.is_empty()) {
                Some(name) => match read.get(&name) {
                    Some(class) => class.clone(),
                    None => {
                        let class = classes.get_opt(&name).await?;
                        read.insert(name, class.clone());
                        class
                    }
                },
                None => None,
            };
            out.push(class);
        }
        Ok(out)
    }
}

/// `namespace/name`, or `namespace/<generateName>*` for a Pod whose name
/// the API server has not chosen yet.
fn pod_name(pod: &Pod, namespace: &str) -> String {
    match (&pod.metadata.name, &pod.metadata.generate_name) {
        (Some(name), _) => format!("{namespace}/{name}"),
        (None, Some(prefix)) => format!("{namespace}/{prefix}*"),
        (None, None) => format!("{namespace}/?"),
    }
}

async fn handle(State(hook): State<Arc<PodHook>>, body: Bytes) -> Response {
    let (status, review) = hook.review(&body).await;
    let bytes = match serde_json::to_vec(&review) {
        Ok(b) => b,
        Err(e) => {
            tracing::error!(error = %e, "pod webhook: the answer does not serialize");
            return Response::builder()
                .status(StatusCode::INTERNAL_SERVER_ERROR)
                .body(Body::empty())
                .unwrap_or_default();
        }
    };
    Response::builder()
        .status(status)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Body::from(bytes))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A hook whose API calls go nowhere: the answers below need none.
    fn hook() -> PodHook {
        let config = kube::Config::new("http://127.0.0.1:9".parse().expect("url"));
        let client = Client::try_from(config).expect("client");
        PodHook::new(client, "carina-scheduler".into())
    }

    #[tokio::test]
    async fn what_is_not_a_pod_creation_is_answered_without_api_calls() {
        let hook = hook();
        for body in [
            &b"not json"[..],
            br#"{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1"}"#,
        ] {
            let (status, review) = hook.review(body).await;
            assert_eq!(status, StatusCode::BAD_REQUEST);
            let response = review.response.expect("a response");
            assert!(!response.allowed);
        }
        // An update (the webhook is registered for creates only) passes
        // untouched, with the request's uid.
        let update = json!({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1",
            "request": {"uid": "u-1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "operation": "UPDATE", "userInfo": {}, "namespace": "n",
                "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                    "spec": {"containers": [], "volumes": [
                        {"name": "v", "persistentVolumeClaim": {"claimName": "c"}}]}}}});
        let (status, review) = hook.review(update.to_string().as_bytes()).await;
        assert_eq!(status, StatusCode::OK);
        let response = review.response.expect("a response");
        assert!(response.allowed);
        assert_eq!(response.uid, "u-1");
        assert!(response.patch.is_none());
    }
}
