//! CreateVolume in `--mode kube`, its steps top to bottom in the order
//! they run: find an object already holding the name ([`KubeProvisioner::lookup`]);
//! take it if it fits ([`KubeProvisioner::take_existing`]) or wait until
//! one being deleted is gone; place the volume and reserve its room
//! ([`KubeProvisioner::place`]); create the object, or take the one a
//! concurrent create made first ([`KubeProvisioner::create_or_existing`],
//! the one create-or-take-existing, which clones and volumes from a
//! snapshot use too); wait for the bridge's outcome
//! ([`KubeProvisioner::await_made`]); check the size made against the
//! range ([`KubeProvisioner::outcome`]). A create that failed for good
//! removes its object ([`KubeProvisioner::discard`]).

use carina_api::LogicVolume;
use carina_csi::{CsiError, ProvisionedVolume, VolumeRequest, sizes};
use kube::ResourceExt;
use kube::api::PostParams;
use tracing::Instrument;

use super::KubeProvisioner;
use super::cache::{Records, Reservation};
use super::delete::exactly;
use super::error::api_error;
use super::legacy;
use super::object::new_object;
use super::outcome::CreateOutcome::{Failed, Gone, Made};
use super::outcome::{create_outcome, incompatible, provisioned};
use super::placement::{Target, place, settled};
use super::watch::Timeout;
use crate::nodes::volume::fs_type;

/// What a create of an object came to.
pub(super) enum Created<'a> {
    /// This call made the object; the room reserved for it, if any, is
    /// held until the create ends (dropped).
    New(LogicVolume, Option<Reservation<'a>>),
    /// A concurrent create (another replica, a retry) was first: its
    /// object as read now.
    Existing(LogicVolume),
}

impl Created<'_> {
    /// The object, made now or by the concurrent create.
    pub(super) fn object(self) -> LogicVolume {
        match self {
            Created::New(lv, _) | Created::Existing(lv) => lv,
        }
    }
}

impl KubeProvisioner {
    /// CreateVolume: the steps in the order they run.
    pub(super) async fn create(&self, req: &VolumeRequest) -> Result<ProvisionedVolume, CsiError> {
        self.notices.parameters_ignored(req).await;
        if let Some(source) = &req.source {
            return self.create_from(req, source).await;
        }
        let name = req.local_name.clone();
        if let Some(lv) = self.lookup(&name).await? {
            if lv.metadata.deletion_timestamp.is_none() {
                return self.take_existing(lv, req).await;
            }
            tracing::info!(carina.volume.name = %name, "an earlier LogicVolume is being deleted; waiting until it is gone");
            self.wait_gone(&name, lv.uid()).await?;
        }
        let (target, reservation) = self
            .place(&name, req)
            .instrument(tracing::info_span!("kube.place"))
            .await?;
        tracing::info!(
            carina.volume.name = %name,
            k8s.node.name = %target.node,
            carina.group = %target.group,
            carina.volume.size_bytes = target.size_bytes,
            strategy = %self.config.strategy,
            "creating LogicVolume"
        );
        let object = new_object(&name, req, &target);
        let created = self
            .create_or_existing(&object, Some(reservation))
            .instrument(tracing::info_span!("kube.create_object"))
            .await?;
        match created {
            Created::New(created, _held) => self.outcome(created, req, target.policy).await,
            Created::Existing(lv) => {
                if lv.metadata.deletion_timestamp.is_some() {
                    return Err(CsiError::Aborted(format!(
                        "an earlier LogicVolume {name:?} is being deleted; retry once it is gone"
                    )));
                }
                self.take_existing(lv, req).await
            }
        }
    }

    /// The object already holding `name`, if any. The cache misses only
    /// objects made a moment ago, which the create runs into; an object it
    /// holds may be gone or changed, so that one is read afresh.
    async fn lookup(&self, name: &str) -> Result<Option<LogicVolume>, CsiError> {
        if self.cache.is_ready() && self.cache.lv(name).is_none() {
            return Ok(None);
        }
        self.reads
            .lv(name)
            .instrument(tracing::info_span!("kube.lookup"))
            .await
    }

    /// An object that already holds the name: returned (or waited for) if
    /// it fits `req`, `ALREADY_EXISTS` if it does not.
    async fn take_existing(
        &self,
        lv: LogicVolume,
        req: &VolumeRequest,
    ) -> Result<ProvisionedVolume, CsiError> {
        legacy::refuse_go_object(&lv)?;
        let policy = self
            .reads
            .policy(&lv.spec.node_name, &lv.spec.device_group)
            .await?;
        if let Some(why) = incompatible(req, &lv, policy.as_deref()) {
            return Err(CsiError::AlreadyExists(format!(
                "volume {:?} exists as LogicVolume {:?} on node {} ({} in group {:?}) but {why}",
                req.name,
                lv.name_any(),
                lv.spec.node_name,
                lv.spec.size.0,
                lv.spec.device_group
            )));
        }
        tracing::info!(carina.volume.name = %lv.name_any(), k8s.node.name = %lv.spec.node_name, "LogicVolume exists already");
        self.outcome(lv, req, policy).await
    }

    /// Where the new volume `name` goes, and the room reserved for it
    /// until the create ends. The cache answers when it can ([`settled`]);
    /// otherwise the API server's records decide.
    async fn place(
        &self,
        name: &str,
        req: &VolumeRequest,
    ) -> Result<(Target, Reservation<'_>), CsiError> {
        let strategy = self.config.strategy;
        let choice = |records: &Records| {
            let target = place(records, strategy, req)?;
            let pending = new_object(name, req, &target);
            Ok::<_, CsiError>((target, pending))
        };
        if self.cache.is_ready() {
            let cached = self.cache.reserve(
                || self.cache.records(),
                |records| {
                    let placed = choice(records).ok();
                    placed
                        .filter(|(target, _)| settled(target, records))
                        .ok_or(())
                },
            );
            if let Ok(placed) = cached {
                return Ok(placed);
            }
        }
        let records = self.reads.listed().await?;
        self.cache.reserve(|| records, choice)
    }

    /// Creates `object`, or reads the object a concurrent create made
    /// first under its name (`ABORTED` when that one is gone again). The
    /// `reservation` of a new object is told the object; on a conflict it
    /// is released before the read.
    pub(super) async fn create_or_existing<'a>(
        &'a self,
        object: &LogicVolume,
        reservation: Option<Reservation<'a>>,
    ) -> Result<Created<'a>, CsiError> {
        match self.lvs.create(&PostParams::default(), object).await {
            Ok(created) => {
                if let Some(r) = &reservation {
                    r.created(&created);
                }
                Ok(Created::New(created, reservation))
            }
            Err(kube::Error::Api(s)) if s.is_already_exists() => {
                drop(reservation);
                let name = object.name_any();
                let lv = self.reads.lv(&name).await?.ok_or_else(|| {
                    CsiError::Aborted(format!(
                        "LogicVolume {name:?} was created and deleted concurrently; retry"
                    ))
                })?;
                Ok(Created::Existing(lv))
            }
            Err(e) => Err(api_error("create LogicVolume", e)),
        }
    }

    /// Waits for the outcome of the create of `lv` (already checked
    /// against `req`), and removes the object when it failed for good or
    /// came out larger than `limit_bytes`.
    pub(super) async fn outcome(
        &self,
        lv: LogicVolume,
        req: &VolumeRequest,
        policy: Option<String>,
    ) -> Result<ProvisionedVolume, CsiError> {
        let name = lv.name_any();
        let made = self.await_made(lv).await?;
        let volume = provisioned(&made, fs_type(req), policy.as_deref());
        if !sizes::satisfies(&req.capacity, volume.capacity_bytes) {
            // A whole disk larger than limit_bytes.
            self.discard(&made).await;
            return Err(CsiError::OutOfRange(format!(
                "volume {:?} on node {} is {} bytes, above limit_bytes {}",
                name, volume.node, volume.capacity_bytes, req.capacity.limit_bytes
            )));
        }
        Ok(volume)
    }

    /// Waits until the bridge made `lv` (returned as made), or its create
    /// failed (the object removed when it failed for good).
    pub(super) async fn await_made(&self, lv: LogicVolume) -> Result<LogicVolume, CsiError> {
        let name = lv.name_any();
        let uid = lv.uid();
        let judged = match create_outcome(Some(&lv), uid.as_deref()) {
            Some(o) => o,
            None => {
                tracing::debug!(carina.volume.name = %name, "waiting for the bridge");
                self.cache
                    .wait_for(&name, uid.as_deref(), self.config.wait_timeout, |obj| {
                        create_outcome(obj, uid.as_deref())
                    })
                    .instrument(tracing::info_span!("kube.await_outcome"))
                    .await
                    .map_err(|last| {
                        let t = Timeout {
                            last: last.map(|lv| (*lv).clone()),
                            watch_error: self.cache.watch_error(),
                        };
                        CsiError::DeadlineExceeded(format!(
                            "LogicVolume {name:?} on node {}: not made within {:?} ({}); it stays, and a retry finds it",
                            lv.spec.node_name,
                            self.config.wait_timeout,
                            t.describe()
                        ))
                    })?
            }
        };
        match judged {
            Made(made) => Ok(made),
            Failed {
                lv: failed,
                error,
                given_up,
            } => {
                if given_up {
                    self.discard(&failed).await;
                }
                Err(error)
            }
            Gone => Err(CsiError::Aborted(format!(
                "LogicVolume {name:?} was deleted while CreateVolume waited for it"
            ))),
        }
    }

    /// Deletes `lv` (that exact object) after its create failed, so a
    /// retry can start over; a failure is only logged (the retry finds the
    /// object and says why).
    async fn discard(&self, lv: &LogicVolume) {
        let name = lv.name_any();
        match self.lvs.delete(&name, &exactly(lv)).await {
            Ok(_) => {
                tracing::info!(carina.volume.name = %name, "removed the LogicVolume of a failed create")
            }
            Err(e) => {
                tracing::warn!(carina.volume.name = %name, error = %e, "removing the LogicVolume of a failed create failed")
            }
        }
    }
}
