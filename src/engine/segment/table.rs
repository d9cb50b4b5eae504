//! The tag map, read on every request without a lock: shards of immutable maps, each replaced
//! whole when one of its tags is added, rebuilt or removed, so a change copies a shard, not every tag.

use std::hash::BuildHasher;
use std::sync::Arc;

use arc_swap::{ArcSwap, Guard};

use super::TagEntry;

/// Tags are created only by admins and configuration, so the hash needs no defence against
/// chosen collisions beyond foldhash's per-process seed; SipHash cost more than the rest of
/// an INCR's lookup.
type Shard = std::collections::HashMap<Box<[u8]>, Arc<TagEntry>, foldhash::fast::RandomState>;

/// Shards of the map: with 1,000,000 tags a new tag copies about 16,000 entries, not all.
const SHARDS: usize = 64;

pub(super) struct TagTable {
    shards: Box<[ArcSwap<Shard>]>,
    /// Picks a tag's shard (the shards' own maps hash with their own seed).
    hasher: foldhash::fast::RandomState,
}

impl Default for TagTable {
    fn default() -> TagTable {
        TagTable {
            shards: (0..SHARDS).map(|_| ArcSwap::default()).collect(),
            hasher: foldhash::fast::RandomState::default(),
        }
    }
}

impl TagTable {
    fn shard_of(&self, tag: &[u8]) -> &ArcSwap<Shard> {
        &self.shards[self.hasher.hash_one(tag) as usize % SHARDS]
    }

    /// Calls `read` with `tag`'s entry, if the tag is known, without cloning anything.
    pub fn read<R>(&self, tag: &[u8], read: impl FnOnce(&Arc<TagEntry>) -> R) -> Option<R> {
        let shard = self.shard_of(tag).load();
        shard.get(tag).map(read)
    }

    /// `tag`'s entry.
    pub fn get(&self, tag: &[u8]) -> Option<Arc<TagEntry>> {
        self.read(tag, Arc::clone)
    }

    /// Adds `tag` with the entry `make` builds, unless it is known.
    pub fn insert_if_absent(&self, tag: &str, make: impl Fn() -> Arc<TagEntry>) {
        self.shard_of(tag.as_bytes()).rcu(|shard| {
            let mut shard = Shard::clone(shard);
            shard.entry(Box::from(tag.as_bytes())).or_insert_with(&make);
            shard
        });
    }

    /// Sets `tag`'s entry, replacing any.
    pub fn insert(&self, tag: &str, entry: Arc<TagEntry>) {
        self.shard_of(tag.as_bytes()).rcu(|shard| {
            let mut shard = Shard::clone(shard);
            shard.insert(Box::from(tag.as_bytes()), entry.clone());
            shard
        });
    }

    pub fn remove(&self, tag: &str) {
        self.shard_of(tag.as_bytes()).rcu(|shard| {
            let mut shard = Shard::clone(shard);
            shard.remove(tag.as_bytes());
            shard
        });
    }

    /// Replaces every shard with the tags `entries` gives (read lazily: it may look up the
    /// entries it keeps, which stay in place until every shard is built). The shards are
    /// stored one after another, so a request may find one tag already changed and another
    /// not yet; never a tag half changed.
    pub fn replace_all<'a>(&self, entries: impl IntoIterator<Item = (&'a str, Arc<TagEntry>)>) {
        let mut shards: Vec<Shard> = (0..SHARDS).map(|_| Shard::default()).collect();
        for (tag, entry) in entries {
            let index = self.hasher.hash_one(tag.as_bytes()) as usize % SHARDS;
            shards[index].insert(Box::from(tag.as_bytes()), entry);
        }
        for (slot, shard) in self.shards.iter().zip(shards) {
            slot.store(Arc::new(shard));
        }
    }

    pub fn len(&self) -> usize {
        self.shards.iter().map(|shard| shard.load().len()).sum()
    }

    /// The shards as they are now, for a walk over every tag.
    pub fn shards(&self) -> Vec<Guard<Arc<Shard>>> {
        self.shards.iter().map(ArcSwap::load).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_are_added_replaced_and_removed_one_shard_at_a_time() {
        let table = TagTable::default();
        let entry = || TagEntry::new(None);
        for i in 0..1000 {
            table.insert_if_absent(&format!("t{i}"), entry);
        }
        assert_eq!(table.len(), 1000);
        let first = table.get(b"t7").unwrap();
        table.insert_if_absent("t7", entry);
        assert!(Arc::ptr_eq(&first, &table.get(b"t7").unwrap()), "kept");
        table.insert("t7", entry());
        assert!(!Arc::ptr_eq(&first, &table.get(b"t7").unwrap()), "replaced");
        table.remove("t7");
        assert!(table.get(b"t7").is_none());
        assert_eq!(table.len(), 999);
        let walked: usize = table.shards().iter().map(|shard| shard.len()).sum();
        assert_eq!(walked, 999);
        assert!(
            table.shards().iter().all(|shard| shard.len() < 100),
            "spread over the shards"
        );
        table.replace_all([("a", entry()), ("b", entry())]);
        assert_eq!(table.len(), 2);
        assert!(table.get(b"t1").is_none() && table.get(b"a").is_some());
        assert_eq!(table.read(b"b", |_| 1), Some(1));
    }
}
