//! The node pods of the identity tests: a namespace with the node
//! ServiceAccount and DaemonSet, Pods bound to a node as the DaemonSet's
//! controller would have made them (no kubelet runs them), and real
//! TokenRequest tokens bound to those Pods.

use anyhow::{Context, Result};
use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetSpec};
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{
    Container, Namespace, Pod, PodSpec, PodTemplateSpec, ServiceAccount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, OwnerReference};
use kube::api::{Api, ObjectMeta, PostParams};

use super::{NODE_DS, NODE_SA};
use crate::kube::KubeCluster;
use crate::unique;

/// A namespace of node pods, their ServiceAccounts and DaemonSet.
#[derive(Clone)]
pub struct NodePods {
    client: kube::Client,
    pub namespace: String,
    /// The uid of the DaemonSet [`NODE_DS`].
    pub daemonset_uid: String,
}

impl std::fmt::Debug for NodePods {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodePods")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

/// A cluster with the CRDs, a namespace (named from `prefix`) holding the
/// node ServiceAccount and DaemonSet, and a scratch directory: what every
/// issuer test starts from.
pub async fn cluster_with_node_pods(
    prefix: &str,
) -> Result<(KubeCluster, NodePods, tempfile::TempDir)> {
    let cluster = KubeCluster::start().await?;
    cluster.install_crds().await?;
    let pods = NodePods::create(&cluster.client(), &unique(prefix)).await?;
    Ok((cluster, pods, tempfile::tempdir()?))
}

impl NodePods {
    /// Creates `namespace`, the ServiceAccount [`NODE_SA`] and the
    /// DaemonSet [`NODE_DS`] in it (no controller runs it).
    pub async fn create(client: &kube::Client, namespace: &str) -> Result<NodePods> {
        Api::<Namespace>::all(client.clone())
            .create(
                &PostParams::default(),
                &Namespace {
                    metadata: ObjectMeta {
                        name: Some(namespace.to_string()),
                        ..ObjectMeta::default()
                    },
                    ..Namespace::default()
                },
            )
            .await
            .with_context(|| format!("create namespace {namespace}"))?;
        let mut pods = NodePods {
            client: client.clone(),
            namespace: namespace.to_string(),
            daemonset_uid: String::new(),
        };
        pods.service_account(NODE_SA).await?;
        pods.daemonset_uid = pods
            .daemonset(NODE_DS)
            .await?
            .metadata
            .uid
            .context("a DaemonSet without uid")?;
        Ok(pods)
    }

    /// Creates DaemonSet `name` of node pods (ServiceAccount [`NODE_SA`]).
    pub async fn daemonset(&self, name: &str) -> Result<DaemonSet> {
        let labels = std::collections::BTreeMap::from([("app".to_string(), name.to_string())]);
        let ds = DaemonSet {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                ..ObjectMeta::default()
            },
            spec: Some(DaemonSetSpec {
                selector: LabelSelector {
                    match_labels: Some(labels.clone()),
                    ..LabelSelector::default()
                },
                template: PodTemplateSpec {
                    metadata: Some(ObjectMeta {
                        labels: Some(labels),
                        ..ObjectMeta::default()
                    }),
                    spec: Some(PodSpec {
                        service_account_name: Some(NODE_SA.into()),
                        containers: vec![Container {
                            name: "carina-node".into(),
                            image: Some("carina-node:test".into()),
                            ..Container::default()
                        }],
                        ..PodSpec::default()
                    }),
                },
                ..DaemonSetSpec::default()
            }),
            ..DaemonSet::default()
        };
        Api::<DaemonSet>::namespaced(self.client.clone(), &self.namespace)
            .create(&PostParams::default(), &ds)
            .await
            .with_context(|| format!("create DaemonSet {name}"))
    }

    /// The controller reference the DaemonSet [`NODE_DS`] puts on its pods.
    pub fn node_daemonset_owner(&self) -> OwnerReference {
        owner("apps/v1", "DaemonSet", NODE_DS, &self.daemonset_uid)
    }

    /// Creates ServiceAccount `name` (no RBAC binding).
    pub async fn service_account(&self, name: &str) -> Result<()> {
        Api::<ServiceAccount>::namespaced(self.client.clone(), &self.namespace)
            .create(
                &PostParams::default(),
                &ServiceAccount {
                    metadata: ObjectMeta {
                        name: Some(name.to_string()),
                        ..ObjectMeta::default()
                    },
                    ..ServiceAccount::default()
                },
            )
            .await
            .with_context(|| format!("create ServiceAccount {name}"))?;
        Ok(())
    }

    /// Creates Pod `name` of ServiceAccount `sa` already bound to `node`
    /// (as the scheduler would have; no kubelet runs it), controlled by the
    /// DaemonSet [`NODE_DS`].
    pub async fn pod(&self, name: &str, sa: &str, node: &str) -> Result<Pod> {
        self.pod_owned(name, sa, node, vec![self.node_daemonset_owner()])
            .await
    }

    /// [`NodePods::pod`] with the owner references `owners`.
    pub async fn pod_owned(
        &self,
        name: &str,
        sa: &str,
        node: &str,
        owners: Vec<OwnerReference>,
    ) -> Result<Pod> {
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                owner_references: Some(owners),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                service_account_name: Some(sa.to_string()),
                node_name: Some(node.to_string()),
                containers: vec![Container {
                    name: "carina-node".into(),
                    image: Some("carina-node:test".into()),
                    ..Container::default()
                }],
                ..PodSpec::default()
            }),
            ..Pod::default()
        };
        Api::<Pod>::namespaced(self.client.clone(), &self.namespace)
            .create(&PostParams::default(), &pod)
            .await
            .with_context(|| format!("create Pod {name}"))
    }

    /// Deletes Pod `name` at once (grace period 0).
    pub async fn delete_pod(&self, name: &str) -> Result<()> {
        let params = kube::api::DeleteParams {
            grace_period_seconds: Some(0),
            ..kube::api::DeleteParams::default()
        };
        Api::<Pod>::namespaced(self.client.clone(), &self.namespace)
            .delete(name, &params)
            .await
            .with_context(|| format!("delete Pod {name}"))?;
        Ok(())
    }

    /// A TokenRequest token of ServiceAccount `sa` for `audiences` (empty:
    /// the apiserver's own), valid ten minutes, bound to `pod` if given.
    pub async fn token(&self, sa: &str, audiences: &[&str], pod: Option<&Pod>) -> Result<String> {
        let bound = pod.map(|p| BoundObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: p.metadata.name.clone(),
            uid: p.metadata.uid.clone(),
        });
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                audiences: Some(audiences.iter().map(|a| a.to_string()).collect()),
                expiration_seconds: Some(600),
                bound_object_ref: bound,
            }),
            ..TokenRequest::default()
        };
        let answer = Api::<ServiceAccount>::namespaced(self.client.clone(), &self.namespace)
            .create_token_request(sa, &PostParams::default(), &request)
            .await
            .with_context(|| format!("TokenRequest for {sa}"))?;
        answer
            .status
            .and_then(|s| s.token)
            .filter(|t| !t.is_empty())
            .context("TokenRequest answered no token")
    }
}

/// A controller owner reference (`controller: true`).
pub fn owner(api_version: &str, kind: &str, name: &str, uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: api_version.into(),
        kind: kind.into(),
        name: name.into(),
        uid: uid.into(),
        controller: Some(true),
        ..OwnerReference::default()
    }
}
