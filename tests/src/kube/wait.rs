//! Waiting on objects by watch (a condition met, or gone) with a deadline,
//! and a client from a kubeconfig file.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use kube::Client;
use kube::api::Api;
use kube::runtime::wait::{await_condition, conditions};

/// Waits, by watch, until the object `name` satisfies `done`, at most
/// `deadline`; the last object seen goes into the error.
pub async fn wait_for<K>(
    api: &Api<K>,
    name: &str,
    what: &str,
    deadline: Duration,
    done: impl Fn(&K) -> bool,
) -> Result<K>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let cond = move |obj: Option<&K>| obj.is_some_and(&done);
    match tokio::time::timeout(deadline, await_condition(api.clone(), name, cond)).await {
        Ok(found) => found
            .with_context(|| format!("watch {name}"))?
            .with_context(|| format!("{name} gone while waiting for {what}")),
        Err(_) => {
            let last = api.get_opt(name).await?;
            bail!("{name}: no {what} within {deadline:?}; last seen: {last:#?}")
        }
    }
}

/// Waits, by watch, until the object `name` is gone, at most `deadline`.
pub async fn gone<K>(api: &Api<K>, name: &str, deadline: Duration) -> Result<()>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let Some(obj) = api.get_opt(name).await? else {
        return Ok(());
    };
    let uid = obj.meta().uid.clone().unwrap_or_default();
    tokio::time::timeout(
        deadline,
        await_condition(api.clone(), name, conditions::is_deleted(&uid)),
    )
    .await
    .with_context(|| {
        format!(
            "{name} still there after {deadline:?} (finalizers: {:?})",
            obj.meta().finalizers
        )
    })??;
    Ok(())
}

/// Builds a client from a kubeconfig file, as a component does.
pub async fn client_from(kubeconfig: &Path) -> Result<Client> {
    Ok(carina_api::client::connect(Some(kubeconfig)).await?)
}
