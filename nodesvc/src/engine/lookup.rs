//! Finding volumes: by name through the name → group index, and the
//! listing of every volume we own.

use tracing::instrument;

use super::{Engine, Error, Result, Volume, names};

impl Engine {
    /// The volume of that name, in whichever group holds it.
    #[instrument(skip(self), err(level = "info"), fields(carina.volume.name = %name))]
    pub async fn get_volume(&self, name: &str) -> Result<Volume> {
        names::check_volume_name(name)?;
        self.existing(name).await
    }

    /// The volume of that name, or `VolumeNotFound`.
    pub(super) async fn existing(&self, name: &str) -> Result<Volume> {
        self.find(name).await?.ok_or_else(|| Error::VolumeNotFound {
            name: name.to_string(),
        })
    }

    /// Every volume we own, optionally of one group, sorted by name.
    #[instrument(skip(self), err)]
    pub async fn list_volumes(&self, group: Option<&str>) -> Result<Vec<Volume>> {
        let slots = self.slots(group).await?;
        let mut all = Vec::new();
        for slot in slots {
            all.extend(slot.backend.list().await?);
        }
        all.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(all)
    }

    /// Finds a volume by name: the index names the group, the backend says
    /// whether it is really there.
    pub(super) async fn find(&self, name: &str) -> Result<Option<Volume>> {
        let Some(group) = self.indexed_group(name) else {
            return Ok(None);
        };
        let Ok(slot) = self.slot(&group).await else {
            return Ok(None);
        };
        let found = slot.backend.get(name).await?;
        if found.is_none() {
            self.index_remove(name);
        }
        Ok(found)
    }

    /// The group the index names for a volume.
    pub(super) fn indexed_group(&self, name: &str) -> Option<String> {
        self.inner
            .index
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .cloned()
    }

    pub(super) fn index_insert(&self, name: &str, group: &str) {
        self.inner
            .index
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.to_string(), group.to_string());
    }

    pub(super) fn index_remove(&self, name: &str) {
        self.inner
            .index
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(name);
    }
}
