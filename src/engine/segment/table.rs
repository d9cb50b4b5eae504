//! The tag map, read on every request without a lock: shards of immutable maps, each replaced
//! whole when one of its tags is added, rebuilt or removed, so a change copies a shard, not every tag.

use std::collections::BTreeSet;
use std::hash::BuildHasher;
use std::ops::Bound;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use arc_swap::{ArcSwap, Guard};

use super::{TagBuffer, TagEntry};

/// Tags are created only by admins and configuration, so the hash needs no defence against
/// chosen collisions beyond foldhash's per-process seed; SipHash cost more than the rest of
/// an INCR's lookup.
type Shard = std::collections::HashMap<Arc<[u8]>, Arc<TagEntry>, foldhash::fast::RandomState>;

/// Shards of the map: with 1,000,000 tags a new tag copies about 16,000 entries, not all.
const SHARDS: usize = 64;

pub(super) struct TagTable {
    shards: Box<[ArcSwap<Shard>]>,
    /// Picks a tag's shard (the shards' own maps hash with their own seed).
    hasher: foldhash::fast::RandomState,
    /// Every tag's name in byte order (sharing the shards' copy), so a page of `LEAF.TAGS`
    /// starts at its cursor without walking the tags before it. Changed with its shard, under
    /// this lock: a tag added, rebuilt or forgotten (also by a request that met a changed or
    /// missing row), and refreshes; a page holds the lock while it copies its names.
    names: Mutex<BTreeSet<Arc<[u8]>>>,
    /// The sweep of the tag list under way (see [`TagTable::begin_sweep`]): every entry
    /// added is stamped with it.
    sweep: AtomicU32,
    /// The entries whose buffers a request built (or a rebuild made), so the metrics and INFO
    /// read the tags in use without walking every tag. An entry no longer in the map (removed,
    /// or replaced by a rebuild) is dropped from it when it is next read.
    used: Mutex<Vec<Arc<TagEntry>>>,
    /// One reader of `used` at a time; a reader holds `used` itself only to take the list and
    /// to put it back, so a request noting a tag never waits for a walk of the list.
    used_reader: Mutex<()>,
}

impl Default for TagTable {
    fn default() -> TagTable {
        TagTable {
            shards: (0..SHARDS).map(|_| ArcSwap::default()).collect(),
            hasher: foldhash::fast::RandomState::default(),
            names: Mutex::default(),
            sweep: AtomicU32::new(0),
            used: Mutex::default(),
            used_reader: Mutex::default(),
        }
    }
}

impl TagTable {
    fn shard_of(&self, tag: &[u8]) -> &ArcSwap<Shard> {
        &self.shards[self.hasher.hash_one(tag) as usize % SHARDS]
    }

    fn names(&self) -> MutexGuard<'_, BTreeSet<Arc<[u8]>>> {
        self.names.lock().unwrap_or_else(|p| p.into_inner())
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

    /// Notes that `entry`'s buffers were built: it is in use.
    pub fn note_used(&self, entry: &Arc<TagEntry>) {
        self.used().push(entry.clone());
    }

    fn used(&self) -> MutexGuard<'_, Vec<Arc<TagEntry>>> {
        self.used.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The buffers of the tags in use, unsorted: O(tags in use), not O(tags).
    pub fn used_buffers(&self) -> Vec<Arc<TagBuffer>> {
        self.prune_used(|used| {
            used.iter()
                .filter_map(|entry| entry.loaded().cloned())
                .collect()
        })
    }

    /// Drops from the in-use list the entries no longer in the map, then calls `read` with the
    /// list. The list is taken out meanwhile and put back with whatever was noted since.
    fn prune_used<R>(&self, read: impl FnOnce(&[Arc<TagEntry>]) -> R) -> R {
        let _one_reader = self.used_reader.lock().unwrap_or_else(|p| p.into_inner());
        let mut used = std::mem::take(&mut *self.used());
        used.retain(|entry| match entry.loaded() {
            Some(buffer) => self
                .read(buffer.name.as_bytes(), |current| {
                    Arc::ptr_eq(current, entry)
                })
                .unwrap_or(false),
            // Noted while its buffers are being built.
            None => true,
        });
        let result = read(&used);
        let mut list = self.used();
        // Tags noted while the list was out.
        used.append(&mut list);
        *list = used;
        result
    }

    /// Stamps an entry being added with the sweep under way. Called under the `names` lock,
    /// which a sweep's start takes too: an entry is either there when a sweep begins (which
    /// then reads its row) or stamped with that sweep.
    fn stamped(&self, entry: Arc<TagEntry>) -> Arc<TagEntry> {
        self.mark(&entry, self.sweep.load(Ordering::Acquire));
        entry
    }

    /// Records that the sweep `sweep` found `entry`'s row.
    pub fn mark(&self, entry: &TagEntry, sweep: u32) {
        entry.swept.store(sweep, Ordering::Release);
    }

    /// Adds `tag` with the entry `make` builds, unless it is known.
    pub fn insert_if_absent(&self, tag: &str, make: impl Fn() -> Arc<TagEntry>) {
        let mut names = self.names();
        let name = Self::name(&names, tag);
        self.shard_of(tag.as_bytes()).rcu(|shard| {
            let mut shard = Shard::clone(shard);
            shard
                .entry(name.clone())
                .or_insert_with(|| self.stamped(make()));
            shard
        });
        names.insert(name);
    }

    /// Sets `tag`'s entry, replacing any.
    pub fn insert(&self, tag: &str, entry: Arc<TagEntry>) {
        let mut names = self.names();
        let entry = self.stamped(entry);
        let name = Self::name(&names, tag);
        self.shard_of(tag.as_bytes()).rcu(|shard| {
            let mut shard = Shard::clone(shard);
            shard.insert(name.clone(), entry.clone());
            shard
        });
        names.insert(name);
    }

    pub fn remove(&self, tag: &str) {
        let mut names = self.names();
        self.shard_of(tag.as_bytes()).rcu(|shard| {
            let mut shard = Shard::clone(shard);
            shard.remove(tag.as_bytes());
            shard
        });
        names.remove(tag.as_bytes());
    }

    /// `tag`'s name as the index holds it, or a new copy: one allocation per tag, shared.
    fn name(names: &BTreeSet<Arc<[u8]>>, tag: &str) -> Arc<[u8]> {
        names
            .get(tag.as_bytes())
            .cloned()
            .unwrap_or_else(|| Arc::from(tag.as_bytes()))
    }

    /// Replaces every shard with the tags `entries` gives (read lazily: it may look up the
    /// entries it keeps, which stay in place until every shard is built). The shards are
    /// stored one after another, so a request may find one tag already changed and another
    /// not yet; never a tag half changed.
    pub fn replace_all<'a>(&self, entries: impl IntoIterator<Item = (&'a str, Arc<TagEntry>)>) {
        let mut sorted = self.names();
        let mut shards: Vec<Shard> = (0..SHARDS).map(|_| Shard::default()).collect();
        let mut names = Vec::new();
        for (tag, entry) in entries {
            let entry = self.stamped(entry);
            let index = self.hasher.hash_one(tag.as_bytes()) as usize % SHARDS;
            let name: Arc<[u8]> = Arc::from(tag.as_bytes());
            shards[index].insert(name.clone(), entry);
            names.push(name);
        }
        // Built from a sorted list, the tree's nodes are full: about 17 bytes a tag.
        let names: BTreeSet<Arc<[u8]>> = names.into_iter().collect();
        for (slot, shard) in self.shards.iter().zip(shards) {
            slot.store(Arc::new(shard));
        }
        *sorted = names;
    }

    /// Sets the entries of many tags, replacing any: one copy of each shard they touch.
    pub fn insert_many(&self, entries: Vec<(&str, Arc<TagEntry>)>) {
        if entries.is_empty() {
            return;
        }
        let mut names = self.names();
        let mut by_shard: Vec<Shard> = vec![Shard::default(); SHARDS];
        for (tag, entry) in entries {
            let name = Self::name(&names, tag);
            let index = self.hasher.hash_one(tag.as_bytes()) as usize % SHARDS;
            by_shard[index].insert(name, self.stamped(entry));
        }
        for (slot, added) in self.shards.iter().zip(by_shard) {
            if added.is_empty() {
                continue;
            }
            slot.rcu(|shard| {
                let mut shard = Shard::clone(shard);
                shard.extend(
                    added
                        .iter()
                        .map(|(name, entry)| (name.clone(), entry.clone())),
                );
                shard
            });
            names.extend(added.into_keys());
        }
    }

    /// Starts a sweep of the tag list: its number, with which entries found (or added) from
    /// now on are marked.
    pub fn begin_sweep(&self) -> u32 {
        let _names = self.names();
        self.sweep.fetch_add(1, Ordering::AcqRel).wrapping_add(1)
    }

    /// Ends the sweep `sweep`, which read every row: the entries it did not mark (their rows
    /// were gone, and no request or admin command added them since it began) are removed.
    /// Returns how many.
    pub fn remove_unswept(&self, sweep: u32) -> usize {
        let mut names = self.names();
        let mut removed = 0;
        for slot in self.shards.iter() {
            let gone = |entry: &Arc<TagEntry>| entry.swept.load(Ordering::Acquire) != sweep;
            if !slot.load().values().any(gone) {
                continue;
            }
            let mut dropped = Vec::new();
            slot.rcu(|shard| {
                dropped.clear();
                let mut shard = Shard::clone(shard);
                shard.retain(|name, entry| {
                    let keep = !gone(entry);
                    if !keep {
                        dropped.push(name.clone());
                    }
                    keep
                });
                shard
            });
            removed += dropped.len();
            for name in dropped {
                names.remove(&name);
            }
        }
        if removed > 0 {
            drop(names);
            // Lets the removed tags' buffers go now, also when nothing reads the list.
            self.prune_used(|_| ());
        }
        removed
    }

    /// Up to `count` names after `after` in byte order, and whether more follow.
    pub fn names_after(&self, after: &[u8], count: usize) -> (Vec<Arc<[u8]>>, bool) {
        let names = self.names();
        let mut range = names.range::<[u8], _>((Bound::Excluded(after), Bound::Unbounded));
        let page: Vec<Arc<[u8]>> = range.by_ref().take(count).cloned().collect();
        (page, range.next().is_some())
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

    /// Tags noted in use while another thread walks the list (a scrape) are all kept.
    #[test]
    fn tags_noted_while_the_list_is_read_are_kept() {
        let table = Arc::new(TagTable::default());
        let settings = crate::engine::segment::SegmentSettings::default();
        for i in 0..2000 {
            table.insert_if_absent(&format!("t{i}"), || TagEntry::new(None));
        }
        let reader = {
            let table = table.clone();
            std::thread::spawn(move || {
                for _ in 0..300 {
                    table.used_buffers();
                }
            })
        };
        for i in 0..2000 {
            let name = format!("t{i}");
            table.read(name.as_bytes(), |entry| {
                entry.buffer(&name, &settings, &table);
            });
        }
        reader.join().unwrap();
        assert_eq!(table.used_buffers().len(), 2000);
        table.remove("t5");
        assert_eq!(table.used_buffers().len(), 1999, "a removed tag leaves");
    }

    /// A sweep removes exactly the entries it neither marked nor saw added while it ran; the
    /// name index follows; entries added in bulk replace and add one shard copy at a time.
    #[test]
    fn a_sweep_removes_only_what_it_did_not_find() {
        let table = TagTable::default();
        for i in 0..300 {
            table.insert_if_absent(&format!("t{i}"), || TagEntry::new(None));
        }
        let sweep = table.begin_sweep();
        for i in 0..300 {
            if i % 3 != 0 {
                table.mark(&table.get(format!("t{i}").as_bytes()).unwrap(), sweep);
            }
        }
        // Added while the sweep ran (a request's miss, an admin command): kept.
        table.insert_if_absent("new", || TagEntry::new(None));
        table.insert("t0", TagEntry::new(Some("2:1")));
        table.insert_many(vec![
            ("t3", TagEntry::new(None)),
            ("bulk", TagEntry::new(None)),
        ]);
        assert_eq!(table.remove_unswept(sweep), 98, "t6, t9, …, t297");
        assert_eq!(table.len(), 204);
        for kept in ["new", "t0", "t1", "t3", "bulk", "t299"] {
            assert!(table.get(kept.as_bytes()).is_some(), "{kept}");
        }
        assert!(table.get(b"t6").is_none() && table.get(b"t297").is_none());
        let (names, more) = table.names_after(b"", 1000);
        assert_eq!((names.len(), more), (204, false), "the index follows");
        assert_eq!(
            table.get(b"t0").unwrap().recorded.as_deref(),
            Some("2:1"),
            "replaced"
        );
        // The next sweep marks nothing: it removes everything.
        let next = table.begin_sweep();
        assert_eq!(table.remove_unswept(next), 204);
        assert_eq!((table.len(), table.names_after(b"", 10).0.len()), (0, 0));
    }

    #[test]
    fn names_are_paged_in_byte_order_from_the_index() {
        let table = TagTable::default();
        for tag in ["b", "a", "B", "ab", "c"] {
            table.insert_if_absent(tag, || TagEntry::new(None));
        }
        let names = |after: &[u8], count| {
            let (page, more) = table.names_after(after, count);
            let page: Vec<String> = page
                .iter()
                .map(|n| String::from_utf8_lossy(n).into_owned())
                .collect();
            (page, more)
        };
        assert_eq!(names(b"", 2), (vec!["B".into(), "a".into()], true));
        assert_eq!(names(b"a", 2), (vec!["ab".into(), "b".into()], true));
        assert_eq!(names(b"b", 2), (vec!["c".into()], false));
        assert_eq!(names(b"c", 2), (vec![], false));
        table.remove("ab");
        table.insert("d", TagEntry::new(None));
        assert_eq!(
            names(b"a", 9),
            (vec!["b".into(), "c".into(), "d".into()], false)
        );
        table.replace_all([("x", TagEntry::new(None))]);
        assert_eq!(names(b"", 9), (vec!["x".into()], false));
    }
}
