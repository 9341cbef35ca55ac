//! `ListLVs`: one page of the node's volumes, sorted by name, continuing
//! after the page token's name.

use carina_proto::nodestorage as pb;
use futures::future::join_all;
use tonic::Status;

use super::NodeStorageService;
use crate::server::convert;

/// Default and largest `ListLVs` page.
pub const DEFAULT_PAGE_SIZE: usize = 500;
pub const MAX_PAGE_SIZE: usize = 5000;

impl NodeStorageService {
    pub(super) async fn list(
        &self,
        req: pb::ListLVsRequest,
    ) -> Result<pb::ListLVsResponse, Status> {
        let after = if req.page_token.is_empty() {
            None
        } else {
            Some(convert::parse_page_token(&req.page_token)?)
        };
        let page_size = match req.page_size as usize {
            0 => DEFAULT_PAGE_SIZE,
            n => n.min(MAX_PAGE_SIZE),
        };
        let group = (!req.device_group.is_empty()).then_some(req.device_group.as_str());
        let all = self.engine.list_volumes(group).await?;
        // Sorted by name; continue strictly after the last name sent.
        let rest: Vec<_> = all
            .iter()
            .filter(|v| after.as_deref().is_none_or(|a| v.name.as_str() > a))
            .collect();
        let page = &rest[..rest.len().min(page_size)];
        let next_page_token = match (rest.len() > page.len(), page.last()) {
            (true, Some(last)) => convert::page_token(&last.name),
            _ => String::new(),
        };
        Ok(pb::ListLVsResponse {
            volumes: join_all(page.iter().map(|v| self.wire(v))).await,
            next_page_token,
        })
    }
}
