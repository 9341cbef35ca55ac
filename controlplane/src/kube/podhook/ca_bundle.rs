//! Keeps the `caBundle` of every webhook in the pod webhook's
//! MutatingWebhookConfiguration equal to the CA that signs the issuer's
//! certificate: the chart cannot write it (the controller makes the CA on
//! its first start) and leaves the field out, so neither an install nor
//! an upgrade undoes it. Checked at start and every [`INTERVAL`]; a
//! configuration that does not exist (yet) is waited for, with one
//! warning.

use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use kube::api::PostParams;
use kube::{Api, Client};
use tokio::sync::watch;

/// How often the configuration is looked at.
pub const INTERVAL: Duration = Duration::from_secs(30);

/// Sets `ca_pem` as the `caBundle` of each webhook of `config`; whether
/// anything changed. `Ok(None)` when the configuration does not exist.
pub async fn ensure(
    api: &Api<MutatingWebhookConfiguration>,
    name: &str,
    ca_pem: &str,
) -> Result<Option<bool>, kube::Error> {
    let Some(mut config) = api.get_opt(name).await? else {
        return Ok(None);
    };
    let want = ByteString(ca_pem.as_bytes().to_vec());
    let mut changed = false;
    for hook in config.webhooks.iter_mut().flatten() {
        if hook.client_config.ca_bundle.as_ref() != Some(&want) {
            hook.client_config.ca_bundle = Some(want.clone());
            changed = true;
        }
    }
    if changed {
        // With the resourceVersion read: a concurrent change is a
        // conflict, tried again at the next round.
        api.replace(name, &PostParams::default(), &config).await?;
    }
    Ok(Some(changed))
}

/// Runs [`ensure`] for `name` until `stop`.
pub async fn keep(client: Client, name: String, ca_pem: String, mut stop: watch::Receiver<bool>) {
    let api: Api<MutatingWebhookConfiguration> = Api::all(client);
    let mut missing_said = false;
    loop {
        match ensure(&api, &name, &ca_pem).await {
            Ok(Some(true)) => {
                tracing::info!(webhook.configuration = %name, "set the pod webhook's caBundle");
                missing_said = false;
            }
            Ok(Some(false)) => missing_said = false,
            Ok(None) if !missing_said => {
                tracing::warn!(
                    webhook.configuration = %name,
                    "the pod webhook's MutatingWebhookConfiguration does not exist; waiting for it"
                );
                missing_said = true;
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(webhook.configuration = %name, error = %e, "could not set the pod webhook's caBundle");
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(INTERVAL) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}
