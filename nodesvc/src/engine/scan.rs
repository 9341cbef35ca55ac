//! How the engine learns its disks and groups: discovery and assignment,
//! a rescan of every group, a new configuration, and the periodic rescan.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tracing::instrument;

use super::{
    Backend, ChangeReason, Config, Disk, DiskStatus, Engine, GroupSlot, Policy, Result,
    backend_call, disks, host, log_config_warnings, lvm, raw,
};

impl Engine {
    /// Rediscovers disks and brings every group up to date.
    #[instrument(skip(self), err)]
    pub async fn rescan(&self) -> Result<()> {
        self.rescan_with(ChangeReason::Rescan).await
    }

    /// Replaces the configuration: validated first (an invalid one changes
    /// nothing), then every group is rebuilt and rescanned.
    #[instrument(skip_all, err)]
    pub async fn apply_config(&self, config: Config) -> Result<()> {
        log_config_warnings(&config);
        let groups = build_groups(&config, self.inner.device_mapper, &self.inner.lvm)?;
        {
            let mut state = self.inner.state.write().await;
            // Wait for in-flight mutations of the old groups to finish.
            let old: Vec<GroupSlot> = state.groups.values().cloned().collect();
            for slot in &old {
                let locked = slot.mutate.lock().await;
                slot.retire(&locked);
            }
            state.config = config;
            state.groups = groups;
        }
        self.rescan_with(ChangeReason::Config).await
    }

    /// Runs [`Engine::rescan`] every `diskScanInterval` until the engine is
    /// dropped by everyone else. Errors are logged, not fatal.
    pub fn spawn_periodic_rescan(&self) -> tokio::task::JoinHandle<()> {
        let weak = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            loop {
                let interval = match weak.upgrade() {
                    Some(inner) => inner.state.read().await.config.scan_interval,
                    None => return,
                };
                let interval = if interval.is_zero() {
                    Duration::from_secs(60)
                } else {
                    interval
                };
                tokio::time::sleep(interval).await;
                let Some(inner) = weak.upgrade() else { return };
                let engine = Engine { inner };
                if engine
                    .inner
                    .state
                    .read()
                    .await
                    .config
                    .scan_interval
                    .is_zero()
                {
                    continue;
                }
                if let Err(e) = engine.rescan().await {
                    tracing::warn!(error = %e, "periodic rescan failed");
                }
            }
        })
    }

    pub(super) async fn rescan_with(&self, reason: ChangeReason) -> Result<()> {
        let (config, slots) = {
            let state = self.inner.state.read().await;
            (state.config.clone(), state.groups.clone())
        };
        let statuses = discover_and_assign(&config, &self.inner.lvm).await?;
        let assigned = disks::by_group(&statuses);
        self.note_empty_groups(disks::empty_groups(&config, &statuses));
        *self.inner.disks.lock().unwrap_or_else(|p| p.into_inner()) = statuses;
        let mut first_error = None;
        for (name, slot) in &slots {
            let _m = slot.mutate.lock().await;
            if slot.is_retired() {
                // A configuration was applied meanwhile; its own rescan
                // (of the new groups) stands for this one.
                tracing::debug!("rescan superseded by a configuration apply");
                return Ok(());
            }
            let group_disks = assigned.get(name).map(Vec::as_slice).unwrap_or(&[]);
            let rescan = slot.backend.rescan(group_disks);
            if let Err(e) = backend_call(slot.backend.as_ref(), "rescan", rescan).await {
                tracing::error!(carina.group = %name, error = %e, "group rescan failed");
                first_error.get_or_insert(e);
                continue;
            }
            match slot.backend.list().await {
                // Under the group's lock, so a create or delete in this
                // group is either in the listing or after it: the index is
                // rewritten one group at a time, never from a listing that
                // an already-finished mutation of another group postdates.
                Ok(vols) => self.reindex_group(name, vols.into_iter().map(|v| v.name)),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        self.unindex_gone_groups().await;
        self.notify(reason).await;
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Makes the index's entries for `group` exactly `names`. Called with
    /// the group's lock held.
    fn reindex_group(&self, group: &str, names: impl Iterator<Item = String>) {
        let mut index = self.inner.index.lock().unwrap_or_else(|p| p.into_inner());
        index.retain(|_, g| g != group);
        index.extend(names.map(|n| (n, group.to_string())));
    }

    /// Drops the index entries of groups the configuration no longer has.
    /// The current configuration, not the one this rescan started from: an
    /// apply that landed meanwhile has indexed its own new groups.
    async fn unindex_gone_groups(&self) {
        let state = self.inner.state.read().await;
        let mut index = self.inner.index.lock().unwrap_or_else(|p| p.into_inner());
        index.retain(|_, g| state.groups.contains_key(g));
    }

    /// Keeps the groups that took no disk, and warns once per change of
    /// what the group's patterns match ([`disks::EmptyGroup::same_cause`]):
    /// a selector that matches nothing otherwise shows only as a group with
    /// no capacity. Disks its patterns do not match coming and going (other
    /// loop devices, our own LV exposures) are no change.
    fn note_empty_groups(&self, now: Vec<disks::EmptyGroup>) {
        let now: BTreeMap<String, disks::EmptyGroup> =
            now.into_iter().map(|e| (e.group.clone(), e)).collect();
        let mut kept = self.inner.empty.lock().unwrap_or_else(|p| p.into_inner());
        for (name, empty) in &now {
            if !kept.get(name).is_some_and(|k| k.same_cause(empty)) {
                tracing::warn!(
                    carina.group = %name,
                    carina.selector.patterns = ?empty.patterns,
                    "{empty}"
                );
            }
        }
        for name in kept.keys().filter(|n| !now.contains_key(*n)) {
            tracing::info!(carina.group = %name, "group took disks again");
        }
        *kept = now;
    }
}

pub(super) fn build_groups(
    config: &Config,
    device_mapper: bool,
    lvm: &Arc<lvm::LvmRunner>,
) -> Result<BTreeMap<String, GroupSlot>> {
    let mut groups = BTreeMap::new();
    for group in &config.groups {
        let backend: Arc<dyn Backend> = match group.policy {
            Policy::Lvm => Arc::new(lvm::LvmGroup::new(
                group.clone(),
                device_mapper,
                lvm.clone(),
            )?),
            Policy::Raw => Arc::new(raw::RawGroup::new(group.clone())),
            Policy::Host => Arc::new(host::HostGroup::new(group.clone())?),
        };
        groups.insert(group.name.clone(), GroupSlot::new(backend));
    }
    Ok(groups)
}

/// Discovery, probing of the disks some selector matches, and assignment.
async fn discover_and_assign(config: &Config, runner: &lvm::LvmRunner) -> Result<Vec<DiskStatus>> {
    let mut all = disks::discover().await?;
    let matched = |d: &Disk| disks::selected(config, d);
    for disk in all.iter_mut().filter(|d| matched(d)) {
        disks::probe(disk).await?;
    }
    let lvm_paths: Vec<PathBuf> = all
        .iter()
        .filter(|d| matched(d) && d.fstype.as_deref() == Some("LVM2_member"))
        .map(|d| d.path.clone())
        .collect();
    if !lvm_paths.is_empty() {
        let vgs = lvm::pv_vg_names(runner, &lvm_paths).await?;
        for disk in &mut all {
            if let Some(vg) = vgs.get(&disk.path) {
                disk.lvm_vg = Some(vg.clone());
            }
        }
    }
    let gpt: Vec<Disk> = all
        .iter()
        .filter(|d| matched(d) && d.pttype.as_deref() == Some("gpt"))
        .cloned()
        .collect();
    let ours = raw::disks_with_our_partitions(&gpt).await?;
    Ok(disks::assign(config, &all, &ours))
}
