//! DeleteVolume in `--mode kube`: the volume id read into its object
//! (`legacy`), the object deleted (that exact one, by uid) with this
//! delete's trace named on it, and a wait until the bridge deleted the
//! volume and released the object ([`KubeProvisioner::wait_gone`], which
//! a create that meets an object on its way out waits on too).

use carina_api::{LogicVolume, TRACEPARENT_ANNOTATION};
use carina_csi::CsiError;
use kube::ResourceExt;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};

use super::KubeProvisioner;
use super::error::api_error;
use super::object::traceparent;
use super::outcome::is_gone;
use super::watch::watch_until;

impl KubeProvisioner {
    /// DeleteVolume: done when no object of the id exists.
    pub(super) async fn delete(&self, volume_id: &str) -> Result<(), CsiError> {
        let Some(lv) = self.find(volume_id).await? else {
            tracing::info!("no such LogicVolume: nothing to delete");
            return Ok(());
        };
        self.delete_object(lv).await
    }

    /// Deletes the object `lv` (that exact one) and waits until the bridge
    /// deleted its volume and released it.
    pub(super) async fn delete_object(&self, lv: LogicVolume) -> Result<(), CsiError> {
        let name = lv.name_any();
        if lv.metadata.deletion_timestamp.is_none() {
            // The bridge's DeleteLV continues the trace the object names:
            // name this delete's, as an expand does. Bookkeeping: a failure
            // is logged and the delete goes on.
            if let Some(tp) = traceparent() {
                let patch = serde_json::json!({
                    "metadata": {"uid": lv.uid(), "annotations": { TRACEPARENT_ANNOTATION: tp }},
                });
                match self
                    .lvs
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.is_not_found() => return Ok(()),
                    // The uid precondition failed: a newer object took the name.
                    Err(kube::Error::Api(s)) if s.is_conflict() => return Ok(()),
                    Err(e) => {
                        tracing::info!(error = %e, "could not name the delete's trace on the LogicVolume")
                    }
                }
            }
            match self.lvs.delete(&name, &exactly(&lv)).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.is_not_found() => return Ok(()),
                // The uid precondition failed: a newer object took the name.
                Err(kube::Error::Api(s)) if s.is_conflict() => return Ok(()),
                Err(e) => return Err(api_error("delete LogicVolume", e)),
            }
        }
        self.wait_gone(&name, lv.uid()).await
    }

    /// Waits until the object `name` with `uid` is gone (a newer object of
    /// the same name counts as gone).
    pub(super) async fn wait_gone(&self, name: &str, uid: Option<String>) -> Result<(), CsiError> {
        watch_until(&self.lvs, name, self.config.wait_timeout, |obj| {
            is_gone(obj, uid.as_deref()).then_some(())
        })
        .await
        .map_err(|t| {
            let node = t.last.as_ref().map(|lv| lv.spec.node_name.as_str()).unwrap_or("?");
            CsiError::DeadlineExceeded(format!(
                "LogicVolume {name:?} on node {node}: not deleted within {:?} ({}); the node has not confirmed the deletion",
                self.config.wait_timeout,
                t.describe()
            ))
        })
    }
}

/// Deletes that very object: a newer one of the same name is left alone
/// (the API answers a conflict).
pub(super) fn exactly(lv: &LogicVolume) -> DeleteParams {
    DeleteParams {
        preconditions: Some(Preconditions {
            uid: lv.uid(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    }
}
