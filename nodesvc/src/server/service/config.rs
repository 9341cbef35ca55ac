//! `ApplyConfig`: reads the node's configuration from its JSON (errors
//! name the field inside it) and applies it.

use carina_proto::nodestorage as pb;
use tonic::Status;

use super::NodeStorageService;
use crate::engine::{Config, Error};

impl NodeStorageService {
    pub(super) async fn apply(
        &self,
        req: pb::ApplyConfigRequest,
    ) -> Result<pb::ApplyConfigResponse, Status> {
        let config = Config::from_json(&req.config_json).map_err(|e| match e {
            // The field path inside the JSON, under the proto field.
            Error::InvalidConfig { field, reason } => {
                Status::invalid_argument(format!("config_json: {field}: {reason}"))
            }
            other => Status::from(other),
        })?;
        let device_groups = config.groups.iter().map(|g| g.name.clone()).collect();
        self.engine.apply_config(config).await?;
        Ok(pb::ApplyConfigResponse { device_groups })
    }
}
