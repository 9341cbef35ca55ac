//! The CA's home in Kubernetes: the Secret that holds it and the
//! ConfigMap that publishes its certificate to the nodes. The chart makes
//! both (empty) at install; the controller reaches them only by name.
//!
//! - [`load_or_create_ca`]: reads the Secret. One with the CA's keys is
//!   used as it is (a Secret the user provides, from cert-manager or their
//!   own PKI, is never rewritten). One without them (the chart's empty
//!   Secret) means no CA yet: a new CA is made and written by an update
//!   that carries the resourceVersion read, so of replicas starting
//!   together one wins and the others get `Conflict`, read the winner's CA
//!   and use it. A missing Secret is created (installs without the chart
//!   that grant that); when that is refused the error names the Secret and
//!   says the chart creates it.
//! - [`publish_ca`]: updates the ConfigMap's `ca.crt` (the trust anchors,
//!   nothing secret) and `ca-endorsements.crt` (the cross-certificates
//!   that let nodes move to new anchors, see `endorse.rs`) when they
//!   differ. A missing ConfigMap is created, and when that is refused the
//!   error names it (a `helm upgrade` puts it back).
//! - [`keep_published`]: re-checks both every interval until stopped: an
//!   edited ConfigMap is put back; a Secret whose CA differs from the one
//!   in use is endorsed with the CA in use (still in memory) and published
//!   beside it, and reported (issuing from it starts when the controllers
//!   restart).
//!
//! Verbs used, by name: `secrets get,update`, `configmaps get,update`;
//! `create` of either only when it is missing.

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
    #[error(
        "{kind} {name} does not exist and cannot be created ({source}); the chart creates it: install or upgrade the chart, or create it"
    )]
    Missing {
        kind: &'static str,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("Secret {secret}: still no CA after {rounds} rounds of concurrent writers")]
    Contended { secret: String, rounds: usize },
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

/// Whether `secret` holds no CA yet: neither `tls.crt` nor `tls.key` has
/// a value (the chart's empty Secret). One with only one of them is an
/// error of whoever wrote it, reported by [`ca_from_secret`].
pub fn holds_no_ca(secret: &Secret) -> bool {
    let empty = |key: &str| {
        secret
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .is_none_or(|v| v.0.is_empty())
    };
    empty(TLS_CRT) && empty(TLS_KEY)
}

/// `secret` with `ca`'s certificate and key added (its other keys, its
/// type and its resourceVersion kept).
fn with_ca(mut secret: Secret, ca: &ClusterCa) -> Secret {
    let data = secret.data.get_or_insert_with(BTreeMap::new);
    data.insert(
        TLS_CRT.to_string(),
        ByteString(ca.cert_pem().as_bytes().to_vec()),
    );
    data.insert(
        TLS_KEY.to_string(),
        ByteString(ca.key_pem().as_bytes().to_vec()),
    );
    secret
}

fn new_secret(at: &CaLocation, ca: &ClusterCa) -> Secret {
    with_ca(
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
            ..Secret::default()
        },
        ca,
    )
}

/// How often [`load_or_create_ca`] reads again after losing a race.
const CA_ROUNDS: usize = 5;

/// Whether `e` is the API server refusing an object that is not there
/// (`Forbidden` to create it, or `NotFound`).
fn refused(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 403 || s.code == 404)
}

/// Where [`load_or_make_ca`]'s CA came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaSource {
    /// The Secret held it when first read.
    Found,
    /// Made here and written into the Secret that held none.
    Written,
    /// Made here and stored in a Secret created here.
    Created,
    /// Another writer stored one between our read and our write (our
    /// write got `Conflict` or `AlreadyExists`): read back and used.
    OtherWriter,
}

/// The CA of the Secret at `at`, made and stored first if it holds none.
pub async fn load_or_create_ca(client: &Client, at: &CaLocation) -> Result<ClusterCa, StoreError> {
    load_or_make_ca(client, at).await.map(|(ca, _)| ca)
}

/// [`load_or_create_ca`], saying where the CA came from.
#[tracing::instrument(skip_all, fields(carina.ca.secret = %at.secret_name()))]
pub async fn load_or_make_ca(
    client: &Client,
    at: &CaLocation,
) -> Result<(ClusterCa, CaSource), StoreError> {
    let mut lost = false;
    let api: Api<Secret> = Api::namespaced(client.clone(), &at.namespace);
    let name = at.secret_name();
    let generate = || {
        ClusterCa::generate(GENERATED_CA_NAME).map_err(|source| StoreError::Ca {
            secret: name.clone(),
            source,
        })
    };
    for _ in 0..CA_ROUNDS {
        let found = api
            .get_opt(&at.secret)
            .await
            .map_err(api_err(format!("get Secret {name}")))?;
        match found {
            Some(secret) if !holds_no_ca(&secret) => {
                let ca = ca_from_secret(&secret, &name)?;
                tracing::info!("using the CA of the Secret");
                let source = if lost {
                    CaSource::OtherWriter
                } else {
                    CaSource::Found
                };
                return Ok((ca, source));
            }
            Some(secret) => {
                // The chart's empty Secret. Update (not patch) carries the
                // resourceVersion read: of replicas racing, one writes and
                // the others get Conflict and read its CA next round.
                let ca = generate()?;
                match api
                    .replace(&at.secret, &PostParams::default(), &with_ca(secret, &ca))
                    .await
                {
                    Ok(_) => {
                        tracing::info!("the CA Secret held no CA: made a new CA and stored it");
                        return Ok((ca, CaSource::Written));
                    }
                    Err(kube::Error::Api(s)) if s.code == 409 => {
                        tracing::info!("another replica wrote the CA Secret first: reading it");
                        lost = true;
                    }
                    Err(kube::Error::Api(s)) if s.code == 404 => {
                        tracing::info!("the CA Secret went away meanwhile: reading again");
                    }
                    Err(e) => return Err(api_err(format!("update Secret {name}"))(e)),
                }
            }
            None => {
                // No chart made it (or it was deleted): create it where
                // that is allowed.
                let ca = generate()?;
                match api
                    .create(&PostParams::default(), &new_secret(at, &ca))
                    .await
                {
                    Ok(_) => {
                        tracing::info!("no CA Secret: made a new CA and created the Secret");
                        return Ok((ca, CaSource::Created));
                    }
                    Err(kube::Error::Api(s)) if s.is_already_exists() => {
                        tracing::info!("another writer created the CA Secret first: reading it");
                        lost = true;
                    }
                    Err(e) if refused(&e) => {
                        return Err(StoreError::Missing {
                            kind: "Secret",
                            name,
                            source: e,
                        });
                    }
                    Err(e) => return Err(api_err(format!("create Secret {name}"))(e)),
                }
            }
        }
    }
    Err(StoreError::Contended {
        secret: name,
        rounds: CA_ROUNDS,
    })
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
            // The chart makes it; a deleted one is created where that is
            // allowed (a `helm upgrade` puts it back otherwise).
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
                Err(e) if refused(&e) => Err(StoreError::Missing {
                    kind: "ConfigMap",
                    name,
                    source: e,
                }),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(data: &[(&str, &str)]) -> Secret {
        Secret {
            metadata: ObjectMeta {
                name: Some("carina-ca".to_string()),
                resource_version: Some("42".to_string()),
                ..ObjectMeta::default()
            },
            data: Some(
                data.iter()
                    .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
                    .collect(),
            ),
            ..Secret::default()
        }
    }

    #[test]
    fn only_a_secret_without_both_keys_holds_no_ca() {
        assert!(holds_no_ca(&Secret::default()));
        assert!(holds_no_ca(&secret(&[])));
        assert!(holds_no_ca(&secret(&[(TLS_CRT, ""), (TLS_KEY, "")])));
        assert!(!holds_no_ca(&secret(&[(TLS_CRT, "x")])));
        assert!(!holds_no_ca(&secret(&[(TLS_KEY, "x")])));
    }

    #[test]
    fn the_ca_is_written_into_the_secret_read_with_its_version() {
        let ca = ClusterCa::generate(GENERATED_CA_NAME).expect("generate");
        let written = with_ca(secret(&[("other", "kept")]), &ca);
        assert_eq!(written.metadata.resource_version.as_deref(), Some("42"));
        assert!(!holds_no_ca(&written));
        let data = written.data.as_ref().expect("data");
        assert_eq!(data["other"].0, b"kept");
        let back = ca_from_secret(&written, "kube-system/carina-ca").expect("a CA");
        assert_eq!(back.cert_pem(), ca.cert_pem());
    }
}
