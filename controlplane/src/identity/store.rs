//! The CA's home in Kubernetes: the `kubernetes.io/tls` Secret that holds
//! it and the ConfigMap that publishes its certificate to the nodes.
//!
//! - [`load_or_create_ca`]: reads the Secret; when there is none, makes a
//!   new CA and creates the Secret. Replicas starting together race on
//!   the create: the loser gets `AlreadyExists` and reads the winner's, so
//!   every replica ends with the same CA. A Secret the user provides
//!   (cert-manager, their own PKI) is used as it is, never rewritten.
//! - [`publish_ca`]: creates or updates the ConfigMap's `ca.crt` (the
//!   trust anchors, nothing secret) and `ca-endorsements.crt` (the
//!   cross-certificates that let nodes move to new anchors, see
//!   `endorse.rs`) when they differ.
//! - [`keep_published`]: re-checks both every interval until stopped: a
//!   deleted or edited ConfigMap is put back; a Secret whose CA differs
//!   from the one in use is endorsed with the CA in use (still in memory)
//!   and published beside it, and reported (issuing from it starts when
//!   the controllers restart).
//!
//! Verbs used: `secrets get,create`, `configmaps get,create,update`.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};
use tokio::sync::watch;

use super::ca::{CaError, ClusterCa};
use super::endorse::{ENDORSEMENTS_KEY, Publication, publication};

/// The ConfigMap key holding the CA certificate(s).
pub const CA_CONFIGMAP_KEY: &str = "ca.crt";
/// The Secret keys (`kubernetes.io/tls`, plus cert-manager's `ca.crt`).
pub const TLS_CRT: &str = "tls.crt";
pub const TLS_KEY: &str = "tls.key";
pub const CA_CRT: &str = "ca.crt";

/// Common name of a CA made on first start.
pub const GENERATED_CA_NAME: &str = "carina.storage.io node identity CA";

/// Why the CA could not be read, made or published.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{what}: {source}")]
    Api {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("Secret {secret}: {reason}")]
    Secret { secret: String, reason: String },
    #[error("Secret {secret}: {source}")]
    Ca {
        secret: String,
        #[source]
        source: CaError,
    },
}

fn api_err(what: impl Into<String>) -> impl FnOnce(kube::Error) -> StoreError {
    let what = what.into();
    move |source| StoreError::Api { what, source }
}

/// Where the CA lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaLocation {
    pub namespace: String,
    pub secret: String,
    pub configmap: String,
}

impl CaLocation {
    fn secret_name(&self) -> String {
        format!("{}/{}", self.namespace, self.secret)
    }

    fn configmap_name(&self) -> String {
        format!("{}/{}", self.namespace, self.configmap)
    }
}

fn text(secret: &Secret, key: &str) -> Option<String> {
    let data = secret.data.as_ref()?.get(key)?;
    String::from_utf8(data.0.clone()).ok()
}

/// The CA a Secret holds.
pub fn ca_from_secret(secret: &Secret, name: &str) -> Result<ClusterCa, StoreError> {
    let missing = |key: &str| StoreError::Secret {
        secret: name.to_string(),
        reason: format!("no {key} (a kubernetes.io/tls Secret with the CA's certificate and key)"),
    };
    let crt = text(secret, TLS_CRT).ok_or_else(|| missing(TLS_CRT))?;
    let key = text(secret, TLS_KEY).ok_or_else(|| missing(TLS_KEY))?;
    let anchors = text(secret, CA_CRT);
    ClusterCa::from_pem(&crt, &key, anchors.as_deref()).map_err(|source| StoreError::Ca {
        secret: name.to_string(),
        source,
    })
}

fn new_secret(at: &CaLocation, ca: &ClusterCa) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(at.secret.clone()),
            namespace: Some(at.namespace.clone()),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/managed-by".to_string(),
                "carina-controller".to_string(),
            )])),
            ..ObjectMeta::default()
        },
        type_: Some("kubernetes.io/tls".to_string()),
        data: Some(BTreeMap::from([
            (
                TLS_CRT.to_string(),
                ByteString(ca.cert_pem().as_bytes().to_vec()),
            ),
            (
                TLS_KEY.to_string(),
                ByteString(ca.key_pem().as_bytes().to_vec()),
            ),
        ])),
        ..Secret::default()
    }
}

/// The CA of the Secret at `at`, made and stored first if there is none.
pub async fn load_or_create_ca(client: &Client, at: &CaLocation) -> Result<ClusterCa, StoreError> {
    let api: Api<Secret> = Api::namespaced(client.clone(), &at.namespace);
    let name = at.secret_name();
    if let Some(secret) = api
        .get_opt(&at.secret)
        .await
        .map_err(api_err(format!("get Secret {name}")))?
    {
        let ca = ca_from_secret(&secret, &name)?;
        tracing::info!(carina.ca.secret = %name, "using the CA of the Secret");
        return Ok(ca);
    }
    let ca = ClusterCa::generate(GENERATED_CA_NAME).map_err(|source| StoreError::Ca {
        secret: name.clone(),
        source,
    })?;
    match api
        .create(&PostParams::default(), &new_secret(at, &ca))
        .await
    {
        Ok(_) => {
            tracing::info!(carina.ca.secret = %name, "no CA Secret: made a new CA and stored it");
            Ok(ca)
        }
        Err(kube::Error::Api(s)) if s.is_already_exists() => {
            // Another replica created it between our get and create.
            let secret = api
                .get(&at.secret)
                .await
                .map_err(api_err(format!("get Secret {name}")))?;
            let ca = ca_from_secret(&secret, &name)?;
            tracing::info!(carina.ca.secret = %name, "another replica stored the CA first: using it");
            Ok(ca)
        }
        Err(e) => Err(api_err(format!("create Secret {name}"))(e)),
    }
}

/// Makes the ConfigMap at `at` hold what `ca` (and the CA of the Secret,
/// `successor`, when it differs) should publish ([`publication`]: the
/// endorsements already published are read back); returns whether it had
/// to be written.
pub async fn publish_ca(
    client: &Client,
    at: &CaLocation,
    ca: &ClusterCa,
    successor: Option<&ClusterCa>,
) -> Result<bool, StoreError> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &at.namespace);
    let name = at.configmap_name();
    let found = api
        .get_opt(&at.configmap)
        .await
        .map_err(api_err(format!("get ConfigMap {name}")))?;
    let value = |key: &str| {
        found
            .as_ref()
            .and_then(|c| c.data.as_ref())
            .and_then(|d| d.get(key))
            .cloned()
    };
    let Publication {
        bundle_pem,
        endorsements_pem,
        endorsed,
    } = publication(ca, &value(ENDORSEMENTS_KEY).unwrap_or_default(), successor).map_err(
        |source| StoreError::Ca {
            secret: at.secret_name(),
            source,
        },
    )?;
    for subject in &endorsed {
        tracing::warn!(
            carina.ca.secret = %at.secret_name(),
            carina.ca.endorsed = %subject,
            "the CA Secret holds a new CA: endorsed it with the CA in use and published both, so the nodes trust it; restart the controllers to issue from it"
        );
    }
    let data = BTreeMap::from([
        (CA_CONFIGMAP_KEY.to_string(), bundle_pem.clone()),
        (ENDORSEMENTS_KEY.to_string(), endorsements_pem.clone()),
    ]);
    let same = value(CA_CONFIGMAP_KEY).as_deref() == Some(bundle_pem.as_str())
        && value(ENDORSEMENTS_KEY).unwrap_or_default() == endorsements_pem;
    match found {
        Some(_) if same => Ok(false),
        Some(mut current) => {
            current.data.get_or_insert_with(BTreeMap::new).extend(data);
            // Update (not patch) carries the resourceVersion read above: a
            // concurrent writer makes this fail and the next round retry.
            api.replace(&at.configmap, &PostParams::default(), &current)
                .await
                .map_err(api_err(format!("update ConfigMap {name}")))?;
            tracing::info!(carina.ca.configmap = %name, "published the CA certificate");
            Ok(true)
        }
        None => {
            let cm = ConfigMap {
                metadata: ObjectMeta {
                    name: Some(at.configmap.clone()),
                    namespace: Some(at.namespace.clone()),
                    labels: Some(BTreeMap::from([(
                        "app.kubernetes.io/managed-by".to_string(),
                        "carina-controller".to_string(),
                    )])),
                    ..ObjectMeta::default()
                },
                data: Some(data),
                ..ConfigMap::default()
            };
            match api.create(&PostParams::default(), &cm).await {
                Ok(_) => {
                    tracing::info!(carina.ca.configmap = %name, "published the CA certificate");
                    Ok(true)
                }
                // Another replica published it meanwhile; the next round
                // compares.
                Err(kube::Error::Api(s)) if s.is_already_exists() => Ok(false),
                Err(e) => Err(api_err(format!("create ConfigMap {name}"))(e)),
            }
        }
    }
}

/// Every `interval` until `stop`: reads the Secret, and puts the ConfigMap
/// back to what `ca` publishes (with the Secret's CA endorsed beside it
/// when the Secret holds another one); warns when the Secret no longer
/// holds the CA in use. Errors are logged and tried again next round.
pub async fn keep_published(
    client: Client,
    at: CaLocation,
    ca: std::sync::Arc<ClusterCa>,
    interval: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &at.namespace);
    let mut warned = false;
    loop {
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            _ = tokio::time::sleep(interval) => {}
        }
        let successor = match secrets.get_opt(&at.secret).await {
            Ok(secret) => {
                let same = secret
                    .as_ref()
                    .and_then(|s| text(s, TLS_CRT))
                    .is_some_and(|crt| crt.trim() == ca.cert_pem().trim());
                if !same && !warned {
                    tracing::warn!(
                        carina.ca.secret = %at.secret_name(),
                        "the CA Secret no longer holds the CA in use; restart the controllers (then the nodes renew from the new CA)"
                    );
                }
                warned = !same;
                match secret.filter(|_| !same) {
                    Some(s) => match ca_from_secret(&s, &at.secret_name()) {
                        Ok(next) => Some(next),
                        Err(e) => {
                            tracing::warn!(error = %e, "the CA Secret holds no usable CA: not endorsed");
                            None
                        }
                    },
                    None => None,
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the CA Secret; trying again");
                None
            }
        };
        if let Err(e) = publish_ca(&client, &at, &ca, successor.as_ref()).await {
            tracing::warn!(error = %e, "cannot publish the CA certificate; trying again");
        }
    }
}
