//! PLACEHOLDER: being written.
#![allow(dead_code, unused_variables)]

use async_trait::async_trait;

use super::backend::Backend;
use super::config::GroupConfig;
use super::disks::Disk;
use super::error::{Error, Result};
use super::volume::{CreateRequest, GroupCapacity, Volume};

#[derive(Debug)]
pub struct RawGroup {
    config: GroupConfig,
}

impl RawGroup {
    pub fn new(config: GroupConfig) -> Self {
        RawGroup { config }
    }
    fn unsupported(&self, operation: &'static str) -> Error {
        Error::Unsupported {
            group: self.config.name.clone(),
            policy: self.config.policy.as_str(),
            operation,
        }
    }
}

pub async fn disks_with_our_partitions(_disks: &[Disk]) -> Result<Vec<String>> {
    Ok(Vec::new())
}

#[async_trait]
impl Backend for RawGroup {
    fn config(&self) -> &GroupConfig {
        &self.config
    }
    async fn rescan(&self, _disks: &[Disk]) -> Result<()> {
        Ok(())
    }
    async fn create(&self, _req: &CreateRequest) -> Result<Volume> {
        Err(self.unsupported("create"))
    }
    async fn get(&self, _name: &str) -> Result<Option<Volume>> {
        Ok(None)
    }
    async fn list(&self) -> Result<Vec<Volume>> {
        Ok(Vec::new())
    }
    async fn resize(&self, _name: &str, _size: u64) -> Result<Volume> {
        Err(self.unsupported("resize"))
    }
    async fn delete(&self, _name: &str) -> Result<()> {
        Err(self.unsupported("delete"))
    }
    async fn capacity(&self) -> Result<GroupCapacity> {
        Err(self.unsupported("capacity"))
    }
    fn round_size(&self, size: u64) -> Option<u64> {
        Some(size)
    }
}
