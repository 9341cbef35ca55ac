//! The issuer's CA as the tests read it: published in its ConfigMap
//! ([`published_ca`], [`published_files`]), kept in its Secret
//! ([`issuer_ca`]), and client credentials signed by it
//! ([`controller_tls`]).

use anyhow::{Context, Result};

/// The `ca.crt` and `ca-endorsements.crt` (empty when absent) of the
/// issuer's ConfigMap `name` in `namespace` now.
pub async fn published_files(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<(String, String)> {
    let cm =
        kube::Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), namespace)
            .get(name)
            .await?;
    let data = cm.data.unwrap_or_default();
    Ok((
        data.get("ca.crt").cloned().unwrap_or_default(),
        data.get(carina_proto::anchors::ENDORSEMENTS_KEY)
            .cloned()
            .unwrap_or_default(),
    ))
}

/// Waits (at most `within`) until the issuer's CA certificate is
/// published as `ca.crt` of ConfigMap `name` in `namespace`, and returns it.
pub async fn published_ca(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    within: std::time::Duration,
) -> Result<String> {
    let api: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
        kube::Api::namespaced(client.clone(), namespace);
    crate::cluster::await_object(&api, name, "published", within, |cm| {
        cm.and_then(|c| c.data.as_ref())
            .is_some_and(|d| d.contains_key("ca.crt"))
    })
    .await?
    .and_then(|cm| cm.data)
    .and_then(|mut d| d.remove("ca.crt"))
    .with_context(|| format!("ConfigMap {namespace}/{name} deleted"))
}

/// The text under `key` of a Secret.
pub fn secret_text(secret: &k8s_openapi::api::core::v1::Secret, key: &str) -> Result<String> {
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .with_context(|| format!("Secret without {key}"))?;
    Ok(String::from_utf8(bytes.0.clone())?)
}

/// The issuer's CA, from its `kubernetes.io/tls` Secret `name` in
/// `namespace`.
pub async fn issuer_ca(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<carina_proto::devcerts::DevCa> {
    let secret =
        kube::Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), namespace)
            .get(name)
            .await?;
    let (crt, key) = (
        secret_text(&secret, "tls.crt")?,
        secret_text(&secret, "tls.key")?,
    );
    Ok(carina_proto::devcerts::DevCa::from_pem(&crt, &key)?)
}

/// Client credentials of role `controller` signed by `ca`, for node `node`.
pub fn controller_tls(
    ca: &carina_proto::devcerts::DevCa,
    node: &str,
) -> Result<carina_proto::tls::ClientTls> {
    let cert = ca.issue_client(
        carina_proto::tls::DEFAULT_TRUST_DOMAIN,
        "controller",
        carina_proto::devcerts::Validity::days(1),
    )?;
    Ok(carina_proto::tls::ClientTls {
        ca_pem: ca.cert_pem().as_bytes().to_vec(),
        cert_pem: cert.cert_pem.into_bytes(),
        key_pem: cert.key_pem.into_bytes(),
        server_name: node.to_string(),
    })
}
