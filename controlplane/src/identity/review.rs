//! Who is asking: the node's token checked with the Kubernetes TokenReview
//! API, then the pod it is bound to looked up.
//!
//! [`KubeTokenChecker`] accepts a token only when Kubernetes authenticates
//! it for the identity audience, it belongs to the node ServiceAccount, it
//! is bound to a pod (the `authentication.kubernetes.io/pod-name` and
//! `pod-uid` extras of a projected token), that pod still exists with the
//! same uid, is neither terminating (`deletionTimestamp`) nor finished
//! (phase `Succeeded`/`Failed`), its `spec.nodeName` is the node named in
//! the request, and its controller (the `ownerReferences` entry with
//! `controller: true`) is the node DaemonSet: kind `DaemonSet` of `apps/v1`,
//! its name, and the uid the DaemonSet has now (read back, so a pod made
//! with a forged reference, or left over from a deleted DaemonSet of the
//! same name, is refused). The node's own ServiceAccount needs no
//! permission for any of this: the controller makes the API calls.

use std::fmt;

use async_trait::async_trait;
use k8s_openapi::api::apps::v1::DaemonSet;
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

/// The DaemonSet whose pods run carina-node unless configured (the
/// chart's).
pub const DEFAULT_NODE_DAEMONSET: &str = "carina-node";

/// The pod a token proved to be, on the node asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodIdentity {
    pub namespace: String,
    pub name: String,
    /// The uid the token is bound to (and the pod has).
    pub uid: String,
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
    daemonset: String,
}

impl fmt::Debug for KubeTokenChecker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KubeTokenChecker")
            .field("audience", &self.audience)
            .field("service_account", &self.service_account)
            .field("daemonset", &self.daemonset)
            .finish_non_exhaustive()
    }
}

impl KubeTokenChecker {
    /// Accepts tokens for `audience` of `service_account` whose pods the
    /// DaemonSet `daemonset` (in the ServiceAccount's namespace) controls.
    pub fn new(
        client: Client,
        audience: String,
        service_account: ServiceAccountRef,
        daemonset: String,
    ) -> Self {
        KubeTokenChecker {
            client,
            audience,
            service_account,
            daemonset,
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
pub fn bound_pod(user: &UserInfo, expected: &ServiceAccountRef) -> Result<PodIdentity, Refusal> {
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
    Ok(PodIdentity {
        namespace: expected.namespace.clone(),
        name: pod_name.to_string(),
        uid: pod_uid.to_string(),
    })
}

/// `identity` as the API has it (`pod`; `None`: gone) must still be the
/// pod of its uid, not terminating or finished, and run on `node_name`.
/// Returns the pod for [`check_owner`].
pub fn check_pod(
    identity: &PodIdentity,
    pod: Option<Pod>,
    node_name: &str,
) -> Result<Pod, Refusal> {
    let Some(pod) = pod else {
        return Err(Refusal::PodGone {
            pod: identity.to_string(),
        });
    };
    if pod.metadata.uid.as_deref() != Some(identity.uid.as_str()) {
        return Err(Refusal::PodReplaced {
            pod: identity.to_string(),
        });
    }
    if let Some(at) = &pod.metadata.deletion_timestamp {
        return Err(Refusal::PodNotRunning {
            pod: identity.to_string(),
            state: format!("terminating (deleted at {})", at.0),
        });
    }
    if let Some(phase @ ("Succeeded" | "Failed")) =
        pod.status.as_ref().and_then(|s| s.phase.as_deref())
    {
        return Err(Refusal::PodNotRunning {
            pod: identity.to_string(),
            state: format!("finished (phase {phase})"),
        });
    }
    match pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .filter(|n| !n.is_empty())
    {
        Some(n) if n == node_name => Ok(pod),
        Some(pod_node) => Err(Refusal::WrongNode {
            pod: identity.to_string(),
            pod_node: pod_node.to_string(),
            node: node_name.to_string(),
        }),
        None => Err(Refusal::NotScheduled {
            pod: identity.to_string(),
            node: node_name.to_string(),
        }),
    }
}

/// The uid of the DaemonSet `daemonset` that `pod`'s controller reference
/// names: the reference with `controller: true` must be kind `DaemonSet`
/// of `apps/v1` named `daemonset`.
pub fn controller_daemonset(
    identity: &PodIdentity,
    pod: &Pod,
    daemonset: &str,
) -> Result<String, Refusal> {
    let refuse = |found: String| Refusal::NotDaemonSetPod {
        pod: identity.to_string(),
        daemonset: format!("{}/{daemonset}", identity.namespace),
        found,
    };
    let owners = pod.metadata.owner_references.as_deref().unwrap_or_default();
    let Some(owner) = owners.iter().find(|o| o.controller == Some(true)) else {
        return Err(refuse(format!(
            "it has no controller ({} owner reference(s), none with controller: true)",
            owners.len()
        )));
    };
    if owner.kind != "DaemonSet" || owner.api_version != "apps/v1" || owner.name != daemonset {
        return Err(refuse(format!(
            "its controller is {} {}/{}",
            owner.api_version, owner.kind, owner.name
        )));
    }
    Ok(owner.uid.clone())
}

/// The DaemonSet as the API has it (`None`: absent) must have the uid the
/// pod's controller reference holds.
pub fn check_owner(
    identity: &PodIdentity,
    daemonset: &str,
    owner_uid: &str,
    found: Option<DaemonSet>,
) -> Result<(), Refusal> {
    let refuse = |found: String| Refusal::NotDaemonSetPod {
        pod: identity.to_string(),
        daemonset: format!("{}/{daemonset}", identity.namespace),
        found,
    };
    match found.and_then(|d| d.metadata.uid) {
        Some(uid) if uid == owner_uid => Ok(()),
        Some(uid) => Err(refuse(format!(
            "its controller reference holds uid {owner_uid}, the DaemonSet is uid {uid}"
        ))),
        None => Err(refuse(format!(
            "its controller reference holds uid {owner_uid}, and the DaemonSet does not exist"
        ))),
    }
}

#[async_trait]
impl TokenChecker for KubeTokenChecker {
    async fn check(&self, token: &str, node_name: &str) -> Result<PodIdentity, Refusal> {
        let user = self.review(token).await?;
        // A stranger's token costs no Pod read.
        let identity = bound_pod(&user, &self.service_account)?;
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &identity.namespace);
        let pod = pods
            .get_opt(&identity.name)
            .await
            .map_err(|source| Refusal::Kubernetes {
                what: format!("get Pod {identity}"),
                source,
            })?;
        let pod = check_pod(&identity, pod, node_name)?;
        let owner_uid = controller_daemonset(&identity, &pod, &self.daemonset)?;
        let daemonsets: Api<DaemonSet> = Api::namespaced(self.client.clone(), &identity.namespace);
        let found = daemonsets
            .get_opt(&self.daemonset)
            .await
            .map_err(|source| Refusal::Kubernetes {
                what: format!("get DaemonSet {}/{}", identity.namespace, self.daemonset),
                source,
            })?;
        check_owner(&identity, &self.daemonset, &owner_uid, found)?;
        Ok(identity)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::{PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
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
        let identity = bound_pod(&bound, &sa()).expect("bound");
        assert_eq!(identity.to_string(), "kube-system/carina-node-x");
        assert_eq!(identity.uid, "uid-1");
    }

    fn id() -> PodIdentity {
        PodIdentity {
            namespace: "kube-system".into(),
            name: "carina-node-x".into(),
            uid: "u".into(),
        }
    }

    #[test]
    fn the_pod_must_be_the_same_and_on_the_node() {
        assert!(check_pod(&id(), Some(pod("u", Some("node-a"))), "node-a").is_ok());
        let wrong = check_pod(&id(), Some(pod("u", Some("node-b"))), "node-a");
        assert!(matches!(wrong, Err(Refusal::WrongNode { .. })), "{wrong:?}");
        let replaced = check_pod(&id(), Some(pod("v", Some("node-a"))), "node-a");
        assert!(matches!(replaced, Err(Refusal::PodReplaced { .. })));
        let gone = check_pod(&id(), None, "node-a");
        assert!(matches!(gone, Err(Refusal::PodGone { .. })));
        let pending = check_pod(&id(), Some(pod("u", None)), "node-a");
        assert!(matches!(pending, Err(Refusal::NotScheduled { .. })));
    }

    #[test]
    fn terminating_and_finished_pods_are_refused() {
        let mut deleted = pod("u", Some("node-a"));
        deleted.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        let err = check_pod(&id(), Some(deleted), "node-a").expect_err("terminating");
        assert!(err.to_string().contains("terminating"), "{err}");
        for phase in ["Succeeded", "Failed"] {
            let mut done = pod("u", Some("node-a"));
            done.status = Some(PodStatus {
                phase: Some(phase.into()),
                ..PodStatus::default()
            });
            let err = check_pod(&id(), Some(done), "node-a").expect_err("finished");
            assert!(err.to_string().contains(phase), "{err}");
        }
        for phase in ["Running", "Pending"] {
            let mut live = pod("u", Some("node-a"));
            live.status = Some(PodStatus {
                phase: Some(phase.into()),
                ..PodStatus::default()
            });
            assert!(check_pod(&id(), Some(live), "node-a").is_ok(), "{phase}");
        }
    }

    fn owned(owners: Vec<OwnerReference>) -> Pod {
        let mut p = pod("u", Some("node-a"));
        p.metadata.owner_references = Some(owners);
        p
    }

    fn owner(api_version: &str, kind: &str, name: &str, controller: bool) -> OwnerReference {
        OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: name.into(),
            uid: "ds-uid".into(),
            controller: Some(controller),
            ..OwnerReference::default()
        }
    }

    #[test]
    fn only_pods_the_node_daemonset_controls_pass() {
        let ok = owned(vec![owner("apps/v1", "DaemonSet", "carina-node", true)]);
        assert_eq!(
            controller_daemonset(&id(), &ok, "carina-node").expect("owned"),
            "ds-uid"
        );
        let cases = [
            (owned(vec![]), "no controller"),
            (
                owned(vec![owner("apps/v1", "DaemonSet", "carina-node", false)]),
                "no controller",
            ),
            (
                owned(vec![owner("apps/v1", "ReplicaSet", "carina-node", true)]),
                "ReplicaSet",
            ),
            (
                owned(vec![owner("apps/v1", "DaemonSet", "other", true)]),
                "DaemonSet/other",
            ),
            (
                owned(vec![owner(
                    "example.com/v1",
                    "DaemonSet",
                    "carina-node",
                    true,
                )]),
                "example.com/v1",
            ),
        ];
        for (pod, text) in cases {
            let err = controller_daemonset(&id(), &pod, "carina-node").expect_err(text);
            assert_eq!(err.code(), tonic::Code::PermissionDenied);
            assert!(err.to_string().contains(text), "{err}");
        }
        let ds = |uid: &str| DaemonSet {
            metadata: ObjectMeta {
                uid: Some(uid.into()),
                ..ObjectMeta::default()
            },
            ..DaemonSet::default()
        };
        assert!(check_owner(&id(), "carina-node", "ds-uid", Some(ds("ds-uid"))).is_ok());
        let forged =
            check_owner(&id(), "carina-node", "ds-uid", Some(ds("other"))).expect_err("uid");
        assert!(forged.to_string().contains("uid other"), "{forged}");
        let absent = check_owner(&id(), "carina-node", "ds-uid", None).expect_err("absent");
        assert!(absent.to_string().contains("does not exist"), "{absent}");
    }
}
