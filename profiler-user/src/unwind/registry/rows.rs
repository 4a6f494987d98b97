//! The rows array: where a table goes, and what gives way when it is full.
//!
//! In order: tables no process uses (least recently used first); then the tables of processes
//! not sampled for [`STALE`] (a user's thousand sleeping processes); then, when one owner's
//! files hold more than [`OWNER_SHARE`] of the rows and the table that needs room is
//! another owner's, that owner's tables, least recently used first, until it is back to its
//! share. One user's busy processes mapping ever larger libraries can take the rows nobody
//! else needs, but cannot keep root's new program (or another user's) without tables. An
//! owner alone on the node keeps every row it fills: the share applies only when contended.
//! The processes whose tables gave way are forgotten: walked with frame pointers until they
//! are sampled and described again.

use std::collections::{HashMap, HashSet};

use super::{Entry, FileKey, Registry, STALE};
use crate::collect::unwind_maps::Tables;

/// The part of the rows one file owner keeps when another owner needs room.
pub const OWNER_SHARE: f64 = 0.5;

impl<T: Tables> Registry<T> {
    /// First fit, making room as the module comment says; `None` when nothing can give way.
    pub(super) fn allocate(&mut self, len: usize, owner: u32) -> Option<usize> {
        if len == 0 {
            return None;
        }
        loop {
            if let Some(i) = self.free.iter().position(|&(_, l)| l >= len) {
                let (start, l) = self.free[i];
                if l == len {
                    self.free.remove(i);
                } else {
                    self.free[i] = (start + len, l - len);
                }
                return Some(start);
            }
            let victim = self
                .files
                .iter()
                .filter_map(|(k, e)| match e {
                    Entry::Loaded { users: 0, last_used, .. } => Some((*last_used, *k)),
                    _ => None,
                })
                .min();
            if let Some((_, key)) = victim {
                if let Some(Entry::Loaded { start, len, .. }) = self.files.remove(&key) {
                    self.free_range(start, len);
                }
                continue;
            }
            // Every table is in use: its users give way, and the table is freed by the next
            // pass.
            let (key, stale) = match self.stale_table() {
                Some(key) => (key, true),
                None => (self.table_over_share(owner, len)?, false),
            };
            let forgotten = self.forget_users(key);
            if stale {
                self.stale_evicted += forgotten;
                if self.stale_evicted == forgotten {
                    tracing::warn!(
                        processes = forgotten,
                        "the unwind rows are full of tables of processes not sampled for {} s: their tables give way to a running program's (profiler_unwind_processes_evicted_total)",
                        STALE.as_secs()
                    );
                }
            } else {
                self.share_evicted += forgotten;
                if self.share_evicted == forgotten {
                    tracing::warn!(
                        owner = key.owner,
                        processes = forgotten,
                        "one owner's files hold more than {:.0} % of the unwind rows while another owner's table needs room: \
                         its least recently used tables give way (profiler_unwind_processes_evicted_total)",
                        OWNER_SHARE * 100.0
                    );
                }
            }
            if let Some(Entry::Loaded { users, .. }) = self.files.get(&key)
                && *users > 0
            {
                return None;
            }
        }
    }

    /// The least recently used table no recently sampled process uses.
    fn stale_table(&self) -> Option<FileKey> {
        let fresh: HashSet<FileKey> = self
            .processes
            .values()
            .filter(|p| p.seen_at.elapsed() < STALE)
            .flat_map(|p| p.keys.iter().copied())
            .collect();
        self.files
            .iter()
            .filter_map(|(k, e)| match e {
                Entry::Loaded { last_used, .. } if !fresh.contains(k) => Some((*last_used, *k)),
                _ => None,
            })
            .min()
            .map(|(_, k)| k)
    }

    /// The least recently used table of the owner holding the most rows, when that is not
    /// `requester`, it holds more than its share, and its tables that would go before it is
    /// back to its share make room for `len`.
    fn table_over_share(&self, requester: u32, len: usize) -> Option<FileKey> {
        let mut held: HashMap<u32, usize> = HashMap::new();
        for (k, e) in &self.files {
            if let Entry::Loaded { len, .. } = e {
                *held.entry(k.owner).or_default() += len;
            }
        }
        let (&owner, &rows) = held.iter().max_by_key(|(o, r)| (**r, std::cmp::Reverse(**o)))?;
        let share = (self.tables.capacity() as f64 * OWNER_SHARE) as usize;
        if owner == requester || rows <= share {
            return None;
        }
        let mut tables: Vec<(u64, FileKey, usize)> = self
            .files
            .iter()
            .filter_map(|(k, e)| match e {
                Entry::Loaded { last_used, len, .. } if k.owner == owner => Some((*last_used, *k, *len)),
                _ => None,
            })
            .collect();
        tables.sort_unstable();
        // Nothing goes when what would go before the owner is back to its share cannot make
        // room.
        let (mut freed, mut left) = (self.free.iter().map(|&(_, l)| l).sum::<usize>(), rows);
        for &(_, _, l) in &tables {
            if left <= share || freed >= len {
                break;
            }
            (freed, left) = (freed + l, left - l);
        }
        (freed >= len).then(|| tables[0].1)
    }

    /// Forgets the processes that use `key`'s table; how many.
    fn forget_users(&mut self, key: FileKey) -> u64 {
        let users: Vec<u32> =
            self.processes.iter().filter(|(_, p)| p.keys.contains(&key)).map(|(pid, _)| *pid).collect();
        for &pid in &users {
            self.remove_process(pid);
        }
        users.len() as u64
    }

    pub(super) fn free_range(&mut self, start: usize, len: usize) {
        let i = self.free.partition_point(|&(s, _)| s < start);
        self.free.insert(i, (start, len));
        // Merge with the next, then with the previous.
        if i + 1 < self.free.len() && self.free[i].0 + self.free[i].1 == self.free[i + 1].0 {
            self.free[i].1 += self.free[i + 1].1;
            self.free.remove(i + 1);
        }
        if i > 0 && self.free[i - 1].0 + self.free[i - 1].1 == self.free[i].0 {
            self.free[i - 1].1 += self.free[i].1;
            self.free.remove(i);
        }
    }
}
