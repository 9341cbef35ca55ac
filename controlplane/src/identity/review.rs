//! Who is asking: the node's token checked with the Kubernetes TokenReview
//! API, then the pod it is bound to looked up.
//!
//! [`KubeTokenChecker`] accepts a token only when Kubernetes authenticates
//! it for the identity audience, it belongs to the node ServiceAccount, it
//! is bound to a pod (the `authentication.kubernetes.io/pod-name` and
//! `pod-uid` extras of a projected token), that pod still exists with the
//! same uid, and its `spec.nodeName` is the node named in the request. The
//! node's own ServiceAccount needs no permission for any of this: the
//! controller makes both API calls.

use std::fmt;

use async_trait::async_trait;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, UserInfo};
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, PostParams};

use super::error::Refusal;

/// The extra of a bound token naming its pod.
pub const POD_NAME_EXTRA: &str = "authentication.kubernetes.io/pod-name";
/// The extra of a bound token holding its pod's uid.
pub const POD_UID_EXTRA: &str = "authentication.kubernetes.io/pod-uid";

/// The ServiceAccount whose tokens may ask for node certificates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceAccountRef {
    pub namespace: String,
    pub name: String,
}

impl ServiceAccountRef {
    /// `<namespace>:<name>`.
    pub fn parse(text: &str) -> Result<ServiceAccountRef, String> {
        match text.split_once(':') {
            Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains(':') => {
                Ok(ServiceAccountRef {
                    namespace: ns.to_string(),
                    name: name.to_string(),
                })
            }
            _ => Err(format!(
                "{text:?} is not <namespace>:<name> of a ServiceAccount"
            )),
        }
    }

    /// The user name Kubernetes gives its tokens.
    pub fn username(&self) -> String {
        format!("system:serviceaccount:{}:{}", self.namespace, self.name)
    }
}

impl fmt::Display for ServiceAccountRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.namespace, self.name)
    }
}

/// The pod a token proved to be, on the node asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodIdentity {
    pub namespace: String,
    pub name: String,
}

impl fmt::Display for PodIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Decides whether a token may have a certificate for a node.
#[async_trait]
pub trait TokenChecker: Send + Sync + 'static {
    /// The pod `token` proves to be, when that pod runs on `node_name`.
    async fn check(&self, token: &str, node_name: &str) -> Result<PodIdentity, Refusal>;
}

/// [`TokenChecker`] through the Kubernetes API.
#[derive(Clone)]
pub struct KubeTokenChecker {
    client: Client,
    audience: String,
    service_account: ServiceAccountRef,
}

impl fmt::Debug for KubeTokenChecker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KubeTokenChecker")
            .field("audience", &self.audience)
            .field("service_account", &self.service_account)
            .finish_non_exhaustive()
    }
}

impl KubeTokenChecker {
    pub fn new(client: Client, audience: String, service_account: ServiceAccountRef) -> Self {
        KubeTokenChecker {
            client,
            audience,
            service_account,
        }
    }

    /// Asks TokenReview, for our audience, who `token` is.
    async fn review(&self, token: &str) -> Result<UserInfo, Refusal> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_string(),
                audiences: Some(vec![self.audience.clone()]),
            },
            ..TokenReview::default()
        };
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let reviewed = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|source| Refusal::Kubernetes {
                what: "TokenReview".into(),
                source,
            })?;
        let status = reviewed.status.unwrap_or_default();
        if status.authenticated != Some(true) {
            let reason = status
                .error
                .filter(|e| !e.is_empty())
                .unwrap_or_else(|| "not authenticated".into());
            return Err(Refusal::TokenRejected { reason });
        }
        let audiences = status.audiences.unwrap_or_default();
        if !audiences.contains(&self.audience) {
            return Err(Refusal::WrongAudience {
                found: audiences,
                expected: self.audience.clone(),
            });
        }
        status.user.ok_or_else(|| Refusal::TokenRejected {
            reason: "the review names no user".into(),
        })
    }
}

/// The one value of extra `key`, if the user has exactly one.
fn single_extra<'a>(user: &'a UserInfo, key: &str) -> Option<&'a str> {
    match user.extra.as_ref()?.get(key)?.as_slice() {
        [one] if !one.is_empty() => Some(one),
        _ => None,
    }
}

/// The pod a reviewed token is bound to, with the uid it was bound to:
/// the user must be `expected` and the token bound to a pod.
pub fn bound_pod(
    user: &UserInfo,
    expected: &ServiceAccountRef,
) -> Result<(PodIdentity, String), Refusal> {
    let username = user.username.clone().unwrap_or_default();
    if username != expected.username() {
        return Err(Refusal::WrongServiceAccount {
            found: username,
            expected: expected.username(),
        });
    }
    let (Some(pod_name), Some(pod_uid)) = (
        single_extra(user, POD_NAME_EXTRA),
        single_extra(user, POD_UID_EXTRA),
    ) else {
        return Err(Refusal::NotBoundToPod);
    };
    let identity = PodIdentity {
        namespace: expected.namespace.clone(),
        name: pod_name.to_string(),
    };
    Ok((identity, pod_uid.to_string()))
}

/// `identity` as the API has it (`pod`; `None`: gone) must still be the
/// pod of uid `uid` and run on `node_name`.
pub fn check_pod(
    identity: PodIdentity,
    uid: &str,
    pod: Option<Pod>,
    node_name: &str,
) -> Result<PodIdentity, Refusal> {
    let Some(pod) = pod else {
        return Err(Refusal::PodGone {
            pod: identity.to_string(),
        });
    };
    if pod.metadata.uid.as_deref() != Some(uid) {
        return Err(Refusal::PodReplaced {
            pod: identity.to_string(),
        });
    }
    match pod.spec.and_then(|s| s.node_name).filter(|n| !n.is_empty()) {
        Some(n) if n == node_name => Ok(identity),
        Some(pod_node) => Err(Refusal::WrongNode {
            pod: identity.to_string(),
            pod_node,
            node: node_name.to_string(),
        }),
        None => Err(Refusal::NotScheduled {
            pod: identity.to_string(),
            node: node_name.to_string(),
        }),
    }
}

#[async_trait]
impl TokenChecker for KubeTokenChecker {
    async fn check(&self, token: &str, node_name: &str) -> Result<PodIdentity, Refusal> {
        let user = self.review(token).await?;
        // A stranger's token costs no Pod read.
        let (identity, uid) = bound_pod(&user, &self.service_account)?;
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &identity.namespace);
        let pod = pods
            .get_opt(&identity.name)
            .await
            .map_err(|source| Refusal::Kubernetes {
                what: format!("get Pod {identity}"),
                source,
            })?;
        check_pod(identity, &uid, pod, node_name)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::PodSpec;
    use kube::api::ObjectMeta;

    use super::*;

    fn sa() -> ServiceAccountRef {
        ServiceAccountRef::parse("kube-system:carina-node").expect("parses")
    }

    fn user(name: &str, pod: Option<(&str, &str)>) -> UserInfo {
        let extra = pod.map(|(name, uid)| {
            BTreeMap::from([
                (POD_NAME_EXTRA.to_string(), vec![name.to_string()]),
                (POD_UID_EXTRA.to_string(), vec![uid.to_string()]),
            ])
        });
        UserInfo {
            username: Some(name.to_string()),
            extra,
            ..UserInfo::default()
        }
    }

    fn pod(uid: &str, node: Option<&str>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                uid: Some(uid.to_string()),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                node_name: node.map(str::to_string),
                ..PodSpec::default()
            }),
            ..Pod::default()
        }
    }

    #[test]
    fn service_account_refs_parse() {
        assert_eq!(
            sa().username(),
            "system:serviceaccount:kube-system:carina-node"
        );
        for bad in ["carina-node", ":x", "x:", "a:b:c"] {
            assert!(ServiceAccountRef::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn only_the_node_account_bound_to_a_pod_passes() {
        let other = user("system:serviceaccount:default:other", Some(("p", "u")));
        assert!(matches!(
            bound_pod(&other, &sa()),
            Err(Refusal::WrongServiceAccount { .. })
        ));
        let unbound = user("system:serviceaccount:kube-system:carina-node", None);
        assert!(matches!(
            bound_pod(&unbound, &sa()),
            Err(Refusal::NotBoundToPod)
        ));
        let bound = user(
            "system:serviceaccount:kube-system:carina-node",
            Some(("carina-node-x", "uid-1")),
        );
        let (identity, uid) = bound_pod(&bound, &sa()).expect("bound");
        assert_eq!(identity.to_string(), "kube-system/carina-node-x");
        assert_eq!(uid, "uid-1");
    }

    #[test]
    fn the_pod_must_be_the_same_and_on_the_node() {
        let id = || PodIdentity {
            namespace: "kube-system".into(),
            name: "carina-node-x".into(),
        };
        assert!(check_pod(id(), "u", Some(pod("u", Some("node-a"))), "node-a").is_ok());
        let wrong = check_pod(id(), "u", Some(pod("u", Some("node-b"))), "node-a");
        assert!(matches!(wrong, Err(Refusal::WrongNode { .. })), "{wrong:?}");
        let replaced = check_pod(id(), "u", Some(pod("v", Some("node-a"))), "node-a");
        assert!(matches!(replaced, Err(Refusal::PodReplaced { .. })));
        let gone = check_pod(id(), "u", None, "node-a");
        assert!(matches!(gone, Err(Refusal::PodGone { .. })));
        let pending = check_pod(id(), "u", Some(pod("u", None)), "node-a");
        assert!(matches!(pending, Err(Refusal::NotScheduled { .. })));
    }
}
