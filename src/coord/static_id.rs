//! The static coordinator: the worker id is a number in the configuration, assigned by hand;
//! only the local time fence protects it (distinct ids per node are the operator's job).

use std::sync::Arc;

use async_trait::async_trait;

use super::{CoordError, Coordinator, HeldWorker};
use crate::coord::IssueLimit;

pub struct StaticCoordinator {
    pub worker_id: u64,
}

struct StaticWorker(u64);

#[async_trait]
impl HeldWorker for StaticWorker {
    fn worker_id(&self) -> u64 {
        self.0
    }

    fn floor_ms(&self) -> u64 {
        0
    }

    fn floor_wait_ms(&self) -> u64 {
        0
    }

    async fn close(self: Box<Self>, _last_issued_ms: Option<u64>) {}
}

#[async_trait]
impl Coordinator for StaticCoordinator {
    fn kind(&self) -> &'static str {
        "static"
    }

    async fn acquire(&self, _limit: Arc<IssueLimit>) -> Result<Box<dyn HeldWorker>, CoordError> {
        Ok(Box::new(StaticWorker(self.worker_id)))
    }
}
