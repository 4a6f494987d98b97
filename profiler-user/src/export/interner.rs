//! The string table pprof and OTLP profiles share a design of: every distinct string stored
//! once, referred to by its index. The table itself stays in the message that carries it
//! (`Profile::string_table`, `ProfilesDictionary::string_table`); this remembers where each
//! string went, so that a name seen a million times costs one entry.

use std::collections::HashMap;

#[derive(Debug, Default)]
pub struct Interner {
    index: HashMap<String, usize>,
}

impl Interner {
    /// The index of `s` in `table`, pushing it there the first time.
    pub fn index(&mut self, table: &mut Vec<String>, s: &str) -> usize {
        if let Some(&i) = self.index.get(s) {
            return i;
        }
        let i = table.len();
        table.push(s.to_string());
        self.index.insert(s.to_string(), i);
        i
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_string_once_in_order_of_first_sight() {
        let (mut table, mut i) = (Vec::new(), Interner::default());
        assert_eq!([i.index(&mut table, ""), i.index(&mut table, "a"), i.index(&mut table, "")], [0, 1, 0]);
        assert_eq!(i.index(&mut table, "b"), 2);
        assert_eq!(table, ["", "a", "b"]);
    }
}
