//! The lease record read and written: one acquire-or-renew attempt guarded
//! by the `resourceVersion` just read, and the release on shutdown.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::{ObjectMeta, PostParams};
use tokio::time::Instant;

use super::{LeaderElector, LeaderError, Observed};

impl LeaderElector {
    /// One attempt: `true` if this replica holds the lease afterwards.
    pub(super) async fn try_acquire_or_renew(
        &self,
        observed: &mut Option<Observed>,
    ) -> Result<bool, LeaderError> {
        let me = &self.config.identity;
        let now = MicroTime(Timestamp::now());
        let Some(lease) = self
            .api
            .get_opt(&self.config.name)
            .await
            .map_err(|e| self.api_error("get", e))?
        else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.config.name.clone()),
                    namespace: Some(self.config.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(me.clone()),
                    lease_duration_seconds: Some(self.config.lease_seconds()),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now),
                    lease_transitions: Some(0),
                    ..LeaseSpec::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(created) => {
                    *observed = Some(self.observe(&created, None));
                    Ok(true)
                }
                Err(kube::Error::Api(s)) if s.is_already_exists() => Ok(false),
                Err(e) => Err(self.api_error("create", e)),
            };
        };
        let seen = self.observe(&lease, observed.take());
        *observed = Some(seen.clone());
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = seen.holder.as_deref();
        if let Some(other) = holder.filter(|h| *h != me.as_str())
            && seen.since.elapsed() < seen.lease_duration
        {
            tracing::trace!(carina.lease.holder = %other, "the lease is held and not expired");
            return Ok(false);
        }
        let taking_over = holder != Some(me.as_str());
        let mut next = lease.clone();
        next.spec = Some(LeaseSpec {
            holder_identity: Some(me.clone()),
            lease_duration_seconds: Some(self.config.lease_seconds()),
            acquire_time: if taking_over {
                Some(now.clone())
            } else {
                spec.acquire_time.clone()
            },
            renew_time: Some(now),
            lease_transitions: Some(spec.lease_transitions.unwrap_or(0) + i32::from(taking_over)),
            ..spec
        });
        // `next` keeps the resourceVersion just read: a concurrent change
        // makes this a conflict instead of a second leader.
        match self
            .api
            .replace(&self.config.name, &PostParams::default(), &next)
            .await
        {
            Ok(replaced) => {
                if taking_over {
                    tracing::info!(carina.lease.previous_holder = ?holder, "took the lease");
                }
                *observed = Some(self.observe(&replaced, None));
                Ok(true)
            }
            Err(kube::Error::Api(s)) if s.is_conflict() => Ok(false),
            Err(e) => Err(self.api_error("replace", e)),
        }
    }

    /// The record of `lease`, keeping the first-seen time of `before` if
    /// the record is unchanged.
    fn observe(&self, lease: &Lease, before: Option<Observed>) -> Observed {
        let resource_version = lease.resource_version();
        if let Some(b) = before.filter(|b| b.resource_version == resource_version) {
            return b;
        }
        let spec = lease.spec.as_ref();
        Observed {
            resource_version,
            holder: spec
                .and_then(|s| s.holder_identity.clone())
                .filter(|h| !h.is_empty()),
            lease_duration: spec
                .and_then(|s| s.lease_duration_seconds)
                .and_then(|s| u64::try_from(s).ok())
                .map_or(self.config.lease_duration, Duration::from_secs),
            since: Instant::now(),
        }
    }

    /// Clears the holder if it is this replica.
    pub(super) async fn release(&self) -> Result<(), LeaderError> {
        let Some(lease) = self
            .api
            .get_opt(&self.config.name)
            .await
            .map_err(|e| self.api_error("get", e))?
        else {
            return Ok(());
        };
        let spec = lease.spec.clone().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
            return Ok(());
        }
        let now = MicroTime(Timestamp::now());
        let mut next = lease;
        next.spec = Some(LeaseSpec {
            holder_identity: None,
            lease_duration_seconds: Some(1),
            acquire_time: Some(now.clone()),
            renew_time: Some(now),
            ..spec
        });
        match self
            .api
            .replace(&self.config.name, &PostParams::default(), &next)
            .await
        {
            Ok(_) => Ok(()),
            // Someone changed it meanwhile: it is not ours to clear.
            Err(kube::Error::Api(s)) if s.is_conflict() => Ok(()),
            Err(e) => Err(self.api_error("release", e)),
        }
    }
}
