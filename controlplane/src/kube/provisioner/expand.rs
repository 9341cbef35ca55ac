//! ControllerExpandVolume in `--mode kube`: `spec.size` patched to the
//! request rounded to the group's allocation unit, a wait until
//! `status.currentSize` covers it, and, when the bridge refused for good,
//! the size set back ([`KubeProvisioner::take_back_size`]) so the refusal
//! leaves the object as it was. A tiered volume cannot grow.

use carina_api::TRACEPARENT_ANNOTATION;
use carina_csi::{CapacityRange, CsiError, sizes};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::ResourceExt;
use kube::api::{Patch, PatchParams};

use super::KubeProvisioner;
use super::error::api_error;
use super::object::traceparent;
use super::outcome::{ExpandOutcome, current_bytes, expand_outcome};
use super::watch::watch_until;

impl KubeProvisioner {
    /// ControllerExpandVolume: the size the volume has once grown.
    pub(super) async fn expand(
        &self,
        volume_id: &str,
        range: &CapacityRange,
    ) -> Result<u64, CsiError> {
        let not_found = || CsiError::NotFound(format!("volume {volume_id:?} does not exist"));
        let lv = self.find(volume_id).await?.ok_or_else(not_found)?;
        let name = lv.name_any();
        let made = lv
            .status
            .as_ref()
            .and_then(|s| s.volume_id.as_ref())
            .is_some();
        if !made || lv.metadata.deletion_timestamp.is_some() {
            return Err(not_found());
        }
        let current = current_bytes(&lv).unwrap_or(0);
        if let Some(cache) = &lv.spec.cache
            && current < range.required_bytes
        {
            return Err(crate::nodes::bcache::cannot_grow(
                volume_id,
                &cache.device_group,
                current,
            ));
        }
        if current >= range.required_bytes {
            return Ok(current);
        }
        let unit = self
            .reads
            .unit(&lv.spec.node_name, &lv.spec.device_group)
            .await?;
        let size = sizes::allocation(range, unit)?;
        let mut patch = serde_json::json!({
            "metadata": {"resourceVersion": lv.resource_version()},
            "spec": {"size": size.to_string()},
        });
        if let Some(tp) = traceparent() {
            patch["metadata"]["annotations"] = serde_json::json!({ TRACEPARENT_ANNOTATION: tp });
        }
        let patched = self
            .lvs
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| api_error("patch LogicVolume size", e))?;
        let generation = patched.metadata.generation.unwrap_or(0);
        let before = patched.status.clone().unwrap_or_default();
        let uid = lv.uid();
        let judge = |obj: Option<&carina_api::LogicVolume>| {
            expand_outcome(
                obj,
                uid.as_deref(),
                range.required_bytes,
                generation,
                &before,
            )
        };
        let outcome = match judge(Some(&patched)) {
            Some(outcome) => outcome,
            None => watch_until(&self.lvs, &name, self.config.wait_timeout, judge)
                .await
                .map_err(|t| {
                    CsiError::DeadlineExceeded(format!(
                        "LogicVolume {name:?} not grown to {size} bytes within {:?} ({})",
                        self.config.wait_timeout,
                        t.describe()
                    ))
                })?,
        };
        match outcome {
            ExpandOutcome::Grown(size) => Ok(size),
            ExpandOutcome::Failed { error, given_up } => {
                if given_up {
                    self.take_back_size(&name, uid.as_deref(), size, &lv.spec.size)
                        .await;
                }
                Err(error)
            }
            ExpandOutcome::Gone => Err(not_found()),
        }
    }

    /// Sets `spec.size` of the object `name` (that very one, `uid`) back
    /// to `previous` after an expand to `asked` bytes failed for good, so
    /// the refused expand leaves the object as it was (the bridge then
    /// records the volume ready again). Left alone when the object moved
    /// on meanwhile (another expand); a failure is only logged.
    async fn take_back_size(&self, name: &str, uid: Option<&str>, asked: u64, previous: &Quantity) {
        let current = match self.reads.lv(name).await {
            Ok(Some(lv)) if lv.uid().as_deref() == uid => lv,
            Ok(_) => return,
            Err(e) => {
                tracing::warn!(carina.volume.name = %name, error = %e, "reading the LogicVolume of a failed expand failed");
                return;
            }
        };
        if current.spec.size.0 != asked.to_string() {
            return;
        }
        let patch = serde_json::json!({
            "metadata": {"resourceVersion": current.resource_version()},
            "spec": {"size": previous},
        });
        match self
            .lvs
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                tracing::info!(carina.volume.name = %name, size = %previous.0, "set the size of a failed expand back")
            }
            Err(e) => {
                tracing::warn!(carina.volume.name = %name, error = %e, "setting the size of a failed expand back failed")
            }
        }
    }
}
