//! Installing Carina's CRDs into the cluster and waiting until each is
//! `Established`.

use anyhow::{Context, Result};
use carina_api::crds_yaml;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::wait::{await_condition, conditions};
use serde::Deserialize;

use super::{CRD_TIMEOUT, FIELD_MANAGER, KubeCluster};

impl KubeCluster {
    /// Applies Carina's CRDs (the documents of [`crds_yaml`]) by
    /// server-side apply and waits, by watch, until each is `Established`
    /// (at most [`CRD_TIMEOUT`] each).
    pub async fn install_crds(&self) -> Result<()> {
        let api: Api<CustomResourceDefinition> = Api::all(self.client());
        let yaml = crds_yaml();
        let mut names = Vec::new();
        for doc in serde_yaml::Deserializer::from_str(&yaml) {
            let crd = CustomResourceDefinition::deserialize(doc).context("parse crds_yaml()")?;
            let name = crd.metadata.name.clone().context("a CRD without a name")?;
            api.patch(
                &name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&crd),
            )
            .await
            .with_context(|| format!("apply CRD {name}"))?;
            names.push(name);
        }
        for name in names {
            let established = await_condition(api.clone(), &name, conditions::is_crd_established());
            tokio::time::timeout(CRD_TIMEOUT, established)
                .await
                .with_context(|| format!("CRD {name} not Established within {CRD_TIMEOUT:?}"))?
                .with_context(|| format!("watch CRD {name}"))?;
        }
        Ok(())
    }
}
