//! A compiled table in the kernel's form (`profiler_common::unwind::packed`): 4 bytes a row
//! instead of 8, the rules kept once for every table. libtorch_cpu.so's 2.6 M rows name 1,394
//! distinct rules, and a 4 KiB page of code changes rule a few hundred times at most
//! (BENCHMARKS.md, issue 28 part 2), so a row needs only the low 12 bits of its address and a
//! rule index; a page index after the rows gives back the high bits.
//!
//! [`lookup`] is the sampler's search written again in Rust, so that tests hold the packed form
//! to the rows it came from address by address.

use std::collections::HashMap;

use profiler_common::unwind::{MAX_RULES, ROW_SEARCH_STEPS, Row, Rule, packed};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PackError {
    #[error("the table needs more than {MAX_RULES} distinct unwind rules with the tables already in")]
    Rules,
    #[error("a 64 KiB page of the table holds more rows than its search covers")]
    Page,
}

/// A table packed for the kernel: its rows, then its page index (`pages + 1` words).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packed {
    pub words: Vec<u32>,
    pub rows: u32,
    pub pages: u32,
}

/// The shared rules array, as the registry fills it: each distinct rule once, never removed
/// (a node's tables name a few thousand at most).
#[derive(Debug, Default)]
pub struct Rules {
    ids: HashMap<Rule, u16>,
}

impl Rules {
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Packs `rows` (sorted by address, as `table::compile` gives them); the rules it added to
    /// the array come back with their indices, for the kernel. Nothing is added on failure.
    pub fn pack(&mut self, rows: &[Row]) -> Result<(Packed, Vec<(u16, Rule)>), PackError> {
        let mut added: Vec<(u16, Rule)> = Vec::new();
        let mut words =
            Vec::with_capacity(rows.len() + rows.last().map_or(1, |r| (r.pc >> packed::PAGE_SHIFT) as usize + 2));
        for r in rows {
            let rule = r.rule();
            let id = match self.ids.get(&rule) {
                Some(&id) => id,
                None => match added.iter().find(|(_, a)| *a == rule) {
                    Some(&(id, _)) => id,
                    None => {
                        let id = self.ids.len() + added.len();
                        if id >= MAX_RULES {
                            return Err(PackError::Rules);
                        }
                        added.push((id as u16, rule));
                        id as u16
                    }
                },
            };
            words.push(packed::row(r.pc, id));
        }
        let pages = rows.last().map_or(0, |r| (r.pc >> packed::PAGE_SHIFT) + 1);
        // index[p]: the first row at or past page p's start.
        let mut next = 0usize;
        for p in 0..=pages {
            while next < rows.len() && (rows[next].pc >> packed::PAGE_SHIFT) < p {
                next += 1;
            }
            words.push(next as u32);
        }
        let per_page = (0..pages as usize).map(|p| words[rows.len() + p + 1] - words[rows.len() + p]).max();
        if per_page.unwrap_or(0) as u64 >= 1 << ROW_SEARCH_STEPS {
            return Err(PackError::Page);
        }
        for &(id, rule) in &added {
            self.ids.insert(rule, id);
        }
        Ok((Packed { words, rows: rows.len() as u32, pages }, added))
    }
}

/// The rule in effect at `key` (an address relative to the table's base), found as the sampler
/// finds it (`profiler-ebpf/src/unwind.rs: find_row`), in a table of `rows` rows and `pages`
/// pages whose words are `words`, with the rules array `rules`.
pub fn lookup(words: &[u32], rows: u32, pages: u32, rules: &[Rule], key: u32) -> Option<Rule> {
    let page = key >> packed::PAGE_SHIFT;
    if page >= pages {
        return None;
    }
    let index = (rows + page) as usize;
    let (mut lo, mut hi) = (*words.get(index)?, *words.get(index + 1)?);
    let low = packed::low(key);
    for _ in 0..ROW_SEARCH_STEPS {
        if lo >= hi {
            break;
        }
        let mid = lo + (hi - lo) / 2;
        if packed::low(*words.get(mid as usize)?) <= low {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    if lo == 0 || lo > rows {
        return None;
    }
    rules.get(packed::rule(words[lo as usize - 1]) as usize).copied()
}

#[cfg(test)]
mod tests {
    use profiler_common::unwind::kind;

    use super::*;

    fn row(pc: u32, cfa_offset: u16) -> Row {
        Row { pc, cfa_offset, kind: kind::CFA_SP, fp_offset: 0 }
    }

    /// The rule a search of the unpacked rows gives: the last row at or below `key`.
    fn naive(rows: &[Row], key: u32) -> Option<Rule> {
        rows.iter().rev().find(|r| r.pc <= key).map(Row::rule)
    }

    fn all_rules(rules: &Rules) -> Vec<Rule> {
        let mut v = vec![Rule::default(); rules.len()];
        for (rule, &id) in &rules.ids {
            v[id as usize] = *rule;
        }
        v
    }

    #[test]
    fn every_address_finds_the_rule_the_rows_give_across_pages_and_empty_pages() {
        // Rows in the first pages, none for a while, one at the start of a page, several later.
        let rows = vec![
            row(0, 8),
            row(0x10, 16),
            row(0xfff0, 24),
            row(0x3_0000, 8),
            row(0x3_0004, 40),
            row(0x3_ffff, 16),
            row(0x4_1000, 8),
        ];
        let mut rules = Rules::default();
        let (p, added) = rules.pack(&rows).unwrap();
        assert_eq!(added.len(), 4, "four distinct rules");
        let pages = (0x4_1000 >> packed::PAGE_SHIFT) + 1;
        assert_eq!((p.rows, p.pages, p.words.len()), (7, pages, 7 + pages as usize + 1));
        assert_eq!((p.words[7], p.words[7 + 1], *p.words.last().unwrap()), (0, 2, 7), "the page index");
        let table = all_rules(&rules);
        for key in (0..0x4_2000).step_by(3).chain([0xffff, 0x1_0000, 0x2_ffff, 0x3_0000, 0x4_1000]) {
            assert_eq!(lookup(&p.words, p.rows, p.pages, &table, key), naive(&rows, key), "at {key:#x}");
        }
        assert_eq!(lookup(&p.words, p.rows, p.pages, &table, 0x5_0000), None, "past the last page");
    }

    #[test]
    fn a_second_table_reuses_the_rules_already_in_and_a_failed_pack_adds_none() {
        let mut rules = Rules::default();
        rules.pack(&[row(0, 8), row(4, 16)]).unwrap();
        let (_, added) = rules.pack(&[row(0, 16), row(8, 24)]).unwrap();
        assert_eq!(added, vec![(2, row(0, 24).rule())], "only the new rule");
        assert_eq!(rules.len(), 3);
        // A page of more rows than its search covers.
        let crowded: Vec<Row> = (0..(1u32 << 17)).map(|i| row(i / 2, 99 + (i % 3) as u16)).collect();
        assert_eq!(rules.pack(&crowded).unwrap_err(), PackError::Page);
        assert_eq!(rules.len(), 3, "nothing added by the failed pack");
    }

    #[test]
    fn random_tables_match_the_naive_search() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut rules = Rules::default();
        for _ in 0..20 {
            let mut pc = 0u32;
            let rows: Vec<Row> = (0..300)
                .map(|_| {
                    let r = row(pc, (next() % 40) as u16 * 8);
                    // Mostly small steps, sometimes pages at once.
                    pc += if next() % 10 == 0 { (next() % 0x3_0000) as u32 } else { (next() % 200) as u32 + 1 };
                    r
                })
                .collect();
            let (p, _) = rules.pack(&rows).unwrap();
            let table = all_rules(&rules);
            for _ in 0..3000 {
                let key = (next() % (u64::from(pc) + 0x100)) as u32;
                assert_eq!(
                    lookup(&p.words, p.rows, p.pages, &table, key),
                    naive(&rows, key).filter(|_| { key >> packed::PAGE_SHIFT < p.pages }),
                    "at {key:#x}"
                );
            }
        }
    }
}

// Tables are built for x86_64 only (docs/arm64.md).
#[cfg(all(test, target_arch = "x86_64"))]
mod libc_tests {
    use super::*;

    /// This machine's libc, packed: every address its rows cover finds the same rule.
    #[test]
    fn libc_packs_without_changing_a_rule() {
        let data = crate::unwind::table::tests::libc();
        let table = crate::unwind::table::compile(&*data).unwrap();
        let mut rules = Rules::default();
        let (p, _) = rules.pack(&table.rows).unwrap();
        let mut all = vec![Rule::default(); rules.len()];
        for (rule, &id) in &rules.ids {
            all[id as usize] = *rule;
        }
        let end = table.rows.last().unwrap().pc;
        let mut i = 0;
        for key in (0..end).step_by(7) {
            while i + 1 < table.rows.len() && table.rows[i + 1].pc <= key {
                i += 1;
            }
            assert_eq!(lookup(&p.words, p.rows, p.pages, &all, key), Some(table.rows[i].rule()), "at {key:#x}");
        }
        assert!(p.words.len() < table.rows.len() + table.rows.len() / 8);
    }
}
