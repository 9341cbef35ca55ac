//! The `NodeStorage` gRPC service over the storage [`Engine`].
//!
//! Each method validates its request (errors name the proto field), calls
//! the engine, converts the answer, and counts the outcome. Engine errors
//! become statuses through the one mapping in [`super::status`]. The
//! per-volume lock (`ABORTED`) and idempotency by name live in the engine.

use std::pin::Pin;
use std::sync::Arc;

use carina_proto::nodestorage as pb;
use carina_proto::nodestorage::node_storage_server::NodeStorage;
use futures::Stream;
use futures::future::join_all;
use tokio::sync::{mpsc, watch};
use tonic::{Request, Response, Status};
use tracing::{Instrument, instrument};

use super::convert;
use super::metrics::Metrics;
use crate::engine::copy::{Progress, Stop};
use crate::engine::{Config, Engine, Error, health};

mod adopt;

/// Default and largest `ListLVs` page.
pub const DEFAULT_PAGE_SIZE: usize = 500;
pub const MAX_PAGE_SIZE: usize = 5000;

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

    /// Starts the copy `req` asks for and streams its progress: a message
    /// every [`PROGRESS_EVERY`] while it runs, then the last one (done,
    /// with the target) or the error. The copy stops when the client goes
    /// away (the stream is dropped) or the server stops (the call then
    /// ends UNAVAILABLE: the caller did not cancel it, a retry works).
    fn copy(&self, req: pb::CopyLvRequest) -> Result<CopyStream, Status> {
        let req = convert::copy_request(req)?;
        let (tx, rx) = mpsc::channel::<Result<pb::CopyLvProgress, Status>>(8);
        let (progress_tx, progress) = watch::channel(Progress::default());
        let stop = Stop::default();
        let service = self.clone();
        let mut stopping = self.stopping.clone();
        let task = async move {
            let copy = service
                .engine
                .copy_volume(req, Arc::new(progress_tx), stop.clone());
            tokio::pin!(copy);
            let mut ticker = tokio::time::interval(PROGRESS_EVERY);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut stopped = false;
            let mut shutting_down = false;
            let outcome = loop {
                tokio::select! {
                    result = &mut copy => break result,
                    _ = ticker.tick() => {
                        // Never waits on the client: a slow reader misses
                        // a progress message, it does not hold the copy
                        // (and a frozen filesystem) up.
                        let _ = tx.try_send(Ok(convert::copy_progress(&progress.borrow())));
                    }
                    _ = tx.closed(), if !stopped => {
                        tracing::info!("the client went away; stopping the copy");
                        stopped = true;
                        stop.set();
                    }
                    _ = stopping.wait_for(|s| *s), if !stopped => {
                        tracing::info!("the server is stopping; stopping the copy");
                        stopped = true;
                        shutting_down = true;
                        stop.set();
                    }
                }
            };
            let last = match outcome {
                Ok(copied) => {
                    let total = progress.borrow().total_bytes;
                    Ok(pb::CopyLvProgress {
                        copied_bytes: total,
                        total_bytes: total,
                        done: true,
                        target: Some(service.wire(&copied.volume).await),
                        frozen: false,
                    })
                }
                // Stopped by the node going down, not by the caller: a
                // retry (once the node is back) works.
                Err(e @ Error::Cancelled { .. }) if shutting_down => Err(Status::unavailable(
                    format!("{e}: the node is shutting down"),
                )),
                Err(e) => Err(Status::from(e)),
            };
            // Counted (and a node failure logged) like every call's end.
            let _ = service.done("CopyLV", last.as_ref().map(|_| ()).map_err(Clone::clone));
            let _ = tx.send(last).await;
        };
        tokio::spawn(task.instrument(tracing::Span::current()));
        Ok(Box::pin(futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        })))
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

    async fn list(&self, req: pb::ListLVsRequest) -> Result<pb::ListLVsResponse, Status> {
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

    async fn capacity_now(&self, group: &str) -> Result<pb::CapacityResponse, Status> {
        let group = (!group.is_empty()).then_some(group);
        // Read first: the figures below then reflect at least every change
        // this generation stands for.
        let (incarnation, generation) = self.engine.capacity_version();
        let groups = self.engine.capacity(group).await?;
        Ok(pb::CapacityResponse {
            node_name: self.node_name.to_string(),
            groups: groups.iter().map(convert::group_capacity).collect(),
            generation,
            reason: pb::ChangeReason::Current.into(),
            incarnation,
        })
    }

    async fn apply(&self, req: pb::ApplyConfigRequest) -> Result<pb::ApplyConfigResponse, Status> {
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

/// The stream of `WatchCapacity`.
/// How often a running copy reports its progress.
pub const PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_millis(500);

/// The progress messages of one copy.
pub type CopyStream = Pin<Box<dyn Stream<Item = Result<pb::CopyLvProgress, Status>> + Send>>;

pub type CapacityStream = Pin<Box<dyn Stream<Item = Result<pb::CapacityResponse, Status>> + Send>>;

/// The current snapshot at once (reason CURRENT), then one message per
/// update the engine publishes. Updates that arrive faster than the client
/// reads are coalesced to the newest (the generation shows the gap). Ends
/// when the server stops; dropping it (the client went away) unsubscribes.
fn capacity_stream(
    node_name: Arc<str>,
    mut updates: watch::Receiver<crate::engine::CapacitySnapshot>,
    stopping: watch::Receiver<bool>,
) -> CapacityStream {
    let first = convert::capacity(
        &node_name,
        &updates.borrow_and_update(),
        Some(pb::ChangeReason::Current),
    );
    let state = (Some(first), updates, stopping, node_name);
    Box::pin(futures::stream::unfold(
        state,
        |(first, mut updates, mut stopping, node_name)| async move {
            if let Some(first) = first {
                return Some((Ok(first), (None, updates, stopping, node_name)));
            }
            let changed = tokio::select! {
                changed = updates.changed() => changed.is_ok(),
                _ = stopping.wait_for(|s| *s) => false,
            };
            if !changed {
                return None;
            }
            let msg = convert::capacity(&node_name, &updates.borrow_and_update(), None);
            Some((Ok(msg), (None, updates, stopping, node_name)))
        },
    ))
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
