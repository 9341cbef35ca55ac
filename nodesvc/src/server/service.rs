//! The `NodeStorage` gRPC service over the storage [`Engine`].
//!
//! Each method validates its request (errors name the proto field), calls
//! the engine, converts the answer, and counts the outcome. Engine errors
//! become statuses through the one mapping in [`super::status`]. The
//! per-volume lock (`ABORTED`) and idempotency by name live in the engine.
//!
//! The requests with more to them than a call each have a file: `adopt`,
//! `capacity` (and its watch), `config`, `copy` and `list`.

use std::sync::Arc;

use carina_proto::nodestorage as pb;
use carina_proto::nodestorage::node_storage_server::NodeStorage;
use tokio::sync::watch;
use tonic::{Request, Response, Status};
use tracing::instrument;

use super::convert;
use super::metrics::Metrics;
use crate::engine::{Engine, health};

mod adopt;
mod capacity;
mod config;
mod copy;
mod list;

pub use self::capacity::CapacityStream;
use self::capacity::capacity_stream;
pub use self::copy::{CopyStream, PROGRESS_EVERY};
pub use self::list::{DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE};

/// The service. Cheap to clone.
#[derive(Debug, Clone)]
pub struct NodeStorageService {
    engine: Engine,
    node_name: Arc<str>,
    metrics: Arc<Metrics>,
    /// Turns true when the server shuts down; open watches end then.
    stopping: watch::Receiver<bool>,
}

impl NodeStorageService {
    pub fn new(
        engine: Engine,
        node_name: &str,
        metrics: Arc<Metrics>,
        stopping: watch::Receiver<bool>,
    ) -> Self {
        NodeStorageService {
            engine,
            node_name: node_name.into(),
            metrics,
            stopping,
        }
    }

    /// Counts the outcome and wraps the answer. The span records every
    /// error at INFO (a caller's mistake is not the node's); failures of
    /// the node itself are logged at ERROR here.
    fn done<T>(&self, method: &str, result: Result<T, Status>) -> Result<Response<T>, Status> {
        let code = match &result {
            Ok(_) => tonic::Code::Ok,
            Err(s) => s.code(),
        };
        if let Err(s) = &result
            && matches!(
                code,
                tonic::Code::Internal | tonic::Code::Unknown | tonic::Code::DataLoss
            )
        {
            tracing::error!(rpc.method = method, error = %s.message(), "call failed");
        }
        self.metrics.observe(method, code);
        result.map(Response::new)
    }

    /// The capacity report that reflects the change just made (the
    /// engine has published it before the change returned).
    fn capacity_version(&self) -> pb::CapacityVersion {
        let (incarnation, generation) = self.engine.capacity_version();
        pb::CapacityVersion {
            incarnation,
            generation,
        }
    }

    /// The wire form of `volume` with its condition checked now (every
    /// answer that carries a volume says how it is) and its copy origin.
    async fn wire(&self, volume: &crate::engine::Volume) -> pb::LogicVolume {
        let origin = self.engine.copy_record(&volume.name);
        convert::volume(volume, &health::condition(volume).await, origin.as_ref())
    }

    async fn create(&self, req: pb::CreateLvRequest) -> Result<pb::CreateLvResponse, Status> {
        let req = convert::create_request(req)?;
        let (volume, created) = self.engine.ensure_volume(req).await?;
        Ok(pb::CreateLvResponse {
            volume: Some(self.wire(&volume).await),
            created,
            capacity: Some(self.capacity_version()),
        })
    }
}

#[tonic::async_trait]
impl NodeStorage for NodeStorageService {
    #[instrument(
        name = "NodeStorage/CreateLV",
        skip(self, request),
        err(level = "info"),
        fields(
            carina.volume.name = %request.get_ref().name,
            carina.group = %request.get_ref().device_group,
            carina.volume.size_bytes = request.get_ref().size_bytes,
        )
    )]
    async fn create_lv(
        &self,
        request: Request<pb::CreateLvRequest>,
    ) -> Result<Response<pb::CreateLvResponse>, Status> {
        let result = self.create(request.into_inner()).await;
        self.done("CreateLV", result)
    }

    #[instrument(
        name = "NodeStorage/DeleteLV",
        skip(self, request),
        err(level = "info"),
        fields(carina.volume.name = %request.get_ref().name)
    )]
    async fn delete_lv(
        &self,
        request: Request<pb::DeleteLvRequest>,
    ) -> Result<Response<pb::DeleteLvResponse>, Status> {
        let name = request.into_inner().name;
        let result = async {
            convert::volume_name(&name)?;
            self.engine.delete_volume(&name).await?;
            Ok(pb::DeleteLvResponse {})
        }
        .await;
        self.done("DeleteLV", result)
    }

    #[instrument(
        name = "NodeStorage/ResizeLV",
        skip(self, request),
        err(level = "info"),
        fields(carina.volume.name = %request.get_ref().name, carina.volume.size_bytes = request.get_ref().size_bytes)
    )]
    async fn resize_lv(
        &self,
        request: Request<pb::ResizeLvRequest>,
    ) -> Result<Response<pb::ResizeLvResponse>, Status> {
        let req = request.into_inner();
        let result = async {
            convert::volume_name(&req.name)?;
            convert::size("size_bytes", req.size_bytes)?;
            let volume = self.engine.resize_volume(&req.name, req.size_bytes).await?;
            Ok(pb::ResizeLvResponse {
                volume: Some(self.wire(&volume).await),
                capacity: Some(self.capacity_version()),
            })
        }
        .await;
        self.done("ResizeLV", result)
    }

    #[instrument(
        name = "NodeStorage/AdoptLV",
        skip(self, request),
        err(level = "info"),
        fields(carina.volume.name = %request.get_ref().name, carina.group = %request.get_ref().device_group)
    )]
    async fn adopt_lv(
        &self,
        request: Request<pb::AdoptLvRequest>,
    ) -> Result<Response<pb::AdoptLvResponse>, Status> {
        let result = self.adopt(request.into_inner()).await;
        self.done("AdoptLV", result)
    }

    type CopyLVStream = CopyStream;

    #[instrument(
        name = "NodeStorage/CopyLV",
        skip(self, request),
        err(level = "info"),
        fields(
            carina.copy.source = %request.get_ref().source,
            carina.volume.name = %request.get_ref().target,
            carina.copy.snapshot = request.get_ref().snapshot,
        )
    )]
    async fn copy_lv(
        &self,
        request: Request<pb::CopyLvRequest>,
    ) -> Result<Response<Self::CopyLVStream>, Status> {
        match self.copy(request.into_inner()) {
            Ok(stream) => Ok(Response::new(stream)),
            Err(status) => self.done("CopyLV", Err(status)),
        }
    }

    #[instrument(
        name = "NodeStorage/GetLV",
        skip(self, request),
        err(level = "info"),
        fields(carina.volume.name = %request.get_ref().name)
    )]
    async fn get_lv(
        &self,
        request: Request<pb::GetLvRequest>,
    ) -> Result<Response<pb::GetLvResponse>, Status> {
        let name = request.into_inner().name;
        let result = async {
            convert::volume_name(&name)?;
            let volume = self.engine.get_volume(&name).await?;
            Ok(pb::GetLvResponse {
                volume: Some(self.wire(&volume).await),
            })
        }
        .await;
        self.done("GetLV", result)
    }

    #[instrument(
        name = "NodeStorage/ListLVs",
        skip(self, request),
        err(level = "info"),
        fields(carina.group = %request.get_ref().device_group)
    )]
    async fn list_l_vs(
        &self,
        request: Request<pb::ListLVsRequest>,
    ) -> Result<Response<pb::ListLVsResponse>, Status> {
        let result = self.list(request.into_inner()).await;
        self.done("ListLVs", result)
    }

    #[instrument(
        name = "NodeStorage/Capacity",
        skip(self, request),
        err(level = "info"),
        fields(carina.group = %request.get_ref().device_group)
    )]
    async fn capacity(
        &self,
        request: Request<pb::CapacityRequest>,
    ) -> Result<Response<pb::CapacityResponse>, Status> {
        let result = self.capacity_now(&request.get_ref().device_group).await;
        self.done("Capacity", result)
    }

    type WatchCapacityStream = CapacityStream;

    #[instrument(
        name = "NodeStorage/WatchCapacity",
        skip(self, _request),
        err(level = "info")
    )]
    async fn watch_capacity(
        &self,
        _request: Request<pb::WatchCapacityRequest>,
    ) -> Result<Response<Self::WatchCapacityStream>, Status> {
        let stream = capacity_stream(
            self.node_name.clone(),
            self.engine.subscribe(),
            self.stopping.clone(),
        );
        self.done("WatchCapacity", Ok(stream))
    }

    #[instrument(
        name = "NodeStorage/ListDisks",
        skip(self, _request),
        err(level = "info")
    )]
    async fn list_disks(
        &self,
        _request: Request<pb::ListDisksRequest>,
    ) -> Result<Response<pb::ListDisksResponse>, Status> {
        let disks = self.engine.disks().iter().map(convert::disk).collect();
        self.done("ListDisks", Ok(pb::ListDisksResponse { disks }))
    }

    #[instrument(
        name = "NodeStorage/ApplyConfig",
        skip(self, request),
        err(level = "info")
    )]
    async fn apply_config(
        &self,
        request: Request<pb::ApplyConfigRequest>,
    ) -> Result<Response<pb::ApplyConfigResponse>, Status> {
        let result = self.apply(request.into_inner()).await;
        if let Ok(r) = &result {
            tracing::info!(device_groups = ?r.device_groups, "configuration applied");
        }
        self.done("ApplyConfig", result)
    }

    #[instrument(
        name = "NodeStorage/CreateBcache",
        skip(self, request),
        err(level = "info"),
        fields(
            carina.bcache.name = %request.get_ref().name,
            carina.bcache.backing = %request.get_ref().backing_volume,
            carina.bcache.cache = %request.get_ref().cache_volume,
        )
    )]
    async fn create_bcache(
        &self,
        request: Request<pb::CreateBcacheRequest>,
    ) -> Result<Response<pb::CreateBcacheResponse>, Status> {
        let result = async {
            let req = convert::bcache_request(request.into_inner())?;
            let (device, created) = self.engine.ensure_bcache(req).await?;
            Ok(pb::CreateBcacheResponse {
                device: Some(convert::bcache(&device)),
                created,
                capacity: Some(self.capacity_version()),
            })
        }
        .await;
        self.done("CreateBcache", result)
    }

    #[instrument(
        name = "NodeStorage/DeleteBcache",
        skip(self, request),
        err(level = "info"),
        fields(carina.bcache.name = %request.get_ref().name)
    )]
    async fn delete_bcache(
        &self,
        request: Request<pb::DeleteBcacheRequest>,
    ) -> Result<Response<pb::DeleteBcacheResponse>, Status> {
        let name = request.into_inner().name;
        let result = async {
            self.engine.delete_bcache(&name).await?;
            Ok(pb::DeleteBcacheResponse {})
        }
        .await;
        self.done("DeleteBcache", result)
    }

    #[instrument(
        name = "NodeStorage/GetBcache",
        skip(self, request),
        err(level = "info"),
        fields(carina.bcache.name = %request.get_ref().name)
    )]
    async fn get_bcache(
        &self,
        request: Request<pb::GetBcacheRequest>,
    ) -> Result<Response<pb::GetBcacheResponse>, Status> {
        let name = request.into_inner().name;
        let result = async {
            let device = self.engine.get_bcache(&name).await?;
            Ok(pb::GetBcacheResponse {
                device: Some(convert::bcache(&device)),
            })
        }
        .await;
        self.done("GetBcache", result)
    }

    #[instrument(
        name = "NodeStorage/SetCacheMode",
        skip(self, request),
        err(level = "info"),
        fields(carina.bcache.name = %request.get_ref().name)
    )]
    async fn set_cache_mode(
        &self,
        request: Request<pb::SetCacheModeRequest>,
    ) -> Result<Response<pb::SetCacheModeResponse>, Status> {
        let req = request.into_inner();
        let result = async {
            let mode = convert::cache_mode("cache_mode", req.cache_mode, None)?;
            let device = self.engine.set_cache_mode(&req.name, mode).await?;
            Ok(pb::SetCacheModeResponse {
                device: Some(convert::bcache(&device)),
            })
        }
        .await;
        self.done("SetCacheMode", result)
    }

    #[instrument(
        name = "NodeStorage/SetPodIOLimits",
        skip(self, request),
        err(level = "info"),
        fields(k8s.pod.uid = %request.get_ref().pod_uid, carina.volume.name = %request.get_ref().volume)
    )]
    async fn set_pod_io_limits(
        &self,
        request: Request<pb::SetPodIoLimitsRequest>,
    ) -> Result<Response<pb::SetPodIoLimitsResponse>, Status> {
        let req = request.into_inner();
        let result = async {
            convert::volume_name(&req.volume).map_err(|e| convert::rename(e, "volume"))?;
            let limits = convert::io_limits(req.limits)?;
            let limit = self
                .engine
                .set_pod_io_limits(&req.pod_uid, &req.volume, limits)
                .await?;
            Ok(pb::SetPodIoLimitsResponse {
                limit: limit.as_ref().map(convert::pod_limit),
            })
        }
        .await;
        self.done("SetPodIOLimits", result)
    }

    #[instrument(
        name = "NodeStorage/ClearPodIOLimits",
        skip(self, request),
        err(level = "info"),
        fields(k8s.pod.uid = %request.get_ref().pod_uid, carina.volume.name = %request.get_ref().volume)
    )]
    async fn clear_pod_io_limits(
        &self,
        request: Request<pb::ClearPodIoLimitsRequest>,
    ) -> Result<Response<pb::ClearPodIoLimitsResponse>, Status> {
        let req = request.into_inner();
        let result = async {
            let volume = (!req.volume.is_empty()).then_some(req.volume.as_str());
            if let Some(v) = volume {
                convert::volume_name(v).map_err(|e| convert::rename(e, "volume"))?;
            }
            let cleared = self
                .engine
                .clear_pod_io_limits(&req.pod_uid, volume)
                .await?;
            Ok(pb::ClearPodIoLimitsResponse { cleared })
        }
        .await;
        self.done("ClearPodIOLimits", result)
    }

    #[instrument(
        name = "NodeStorage/ListPodIOLimits",
        skip(self, request),
        err(level = "info"),
        fields(k8s.pod.uid = %request.get_ref().pod_uid)
    )]
    async fn list_pod_io_limits(
        &self,
        request: Request<pb::ListPodIoLimitsRequest>,
    ) -> Result<Response<pb::ListPodIoLimitsResponse>, Status> {
        let uid = request.into_inner().pod_uid;
        let result = async {
            let only = (!uid.is_empty()).then_some(uid.as_str());
            let limits = self.engine.pod_io_limits(only).await?;
            Ok(pb::ListPodIoLimitsResponse {
                limits: limits.iter().map(convert::pod_limit).collect(),
            })
        }
        .await;
        self.done("ListPodIOLimits", result)
    }
}
