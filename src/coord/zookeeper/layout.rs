//! The snowflake layout a ZooKeeper cluster's worker ids issue in, in `{root}/{cluster}/layout`:
//! taken over by another layout only when no node is alive and its IDs start above all the old
//! layout could have issued.

use zookeeper_client::{Acls, Client, CreateMode, Error as ZkError};

use super::registry::Registry;
use crate::coord::{CoordError, LayoutRecord};

/// Records this node's layout for the cluster, or refuses the start when another layout is
/// recorded and taking it over could repeat or lower IDs.
pub(super) async fn adopt(
    registry: &Registry,
    client: &Client,
    layout: &dyn LayoutRecord,
) -> Result<(), CoordError> {
    let mine = layout.descriptor();
    let path = registry.layout_path();
    let persistent = CreateMode::Persistent.with_acls(Acls::anyone_all());
    // Versioned writes: of nodes racing with different layouts one wins, the others re-read.
    for _ in 0..3 {
        let (recorded, version) = match client.get_data(&path).await {
            Ok((bytes, stat)) => (String::from_utf8_lossy(&bytes).into_owned(), stat.version),
            Err(ZkError::NoNode) => {
                client.mkdir(&registry.alive, &persistent).await?;
                match client.create(&path, mine.as_bytes(), &persistent).await {
                    Ok(_) => return Ok(()),
                    Err(ZkError::NodeExists) => continue,
                    Err(e) => return Err(e.into()),
                }
            }
            Err(e) => return Err(e.into()),
        };
        if recorded == mine {
            return Ok(());
        }
        let alive = client.list_children(&registry.alive).await?;
        if !alive.is_empty() {
            return Err(CoordError::LayoutChange(format!(
                "worker ids {alive:?} are alive in ZooKeeper issuing IDs of {recorded}; stop all of them before starting a node with {mine}"
            )));
        }
        let mut fence = 0;
        for child in client.list_children(&registry.forever).await? {
            if let Some((data, _)) = registry
                .read(client, &registry.forever_path(&child))
                .await?
            {
                fence = fence.max(data.map_err(CoordError::LayoutChange)?.floor());
            }
        }
        // As with the database: a node of the old layout that has just checked but not yet
        // registered may issue until its first report finds the record changed.
        let now = registry.clock.now_millis();
        layout
            .may_follow(&recorded, fence.max(now + registry.lease_ms()), now)
            .map_err(|why| CoordError::LayoutChange(format!("{why} (recorded in {path})")))?;
        match client.set_data(&path, mine.as_bytes(), Some(version)).await {
            Ok(_) => return Ok(()),
            Err(ZkError::BadVersion) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(CoordError::LayoutChange(format!(
        "the layout recorded in {path} kept changing (nodes with different layouts starting at once)"
    )))
}

/// The layout the cluster records now (`None`: no record).
pub(super) async fn recorded(
    registry: &Registry,
    client: &Client,
) -> Result<Option<String>, ZkError> {
    match client.get_data(&registry.layout_path()).await {
        Ok((bytes, _)) => Ok(Some(String::from_utf8_lossy(&bytes).into_owned())),
        Err(ZkError::NoNode) => Ok(None),
        Err(e) => Err(e),
    }
}
