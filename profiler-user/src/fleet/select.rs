//! Which nodes a read asks: `--node` names, repeated or as globs (`--node 'gpu-*'`), or none
//! for the whole fleet. Resolved against the nodes that shipped, so a pattern that matches
//! nothing is said at once, and the SQL gets plain names (never a pattern a user typed).

use super::{Fleet, FleetError, Node};
use crate::{
    ship::clickhouse::schema::{col::NODE, quote_str},
    store::counters::glob,
};

/// The nodes a read covers.
#[derive(Debug, Clone)]
pub struct Selection {
    /// The nodes chosen, by name.
    pub nodes: Vec<Node>,
    /// No `--node`: every node that shipped, so no `node IN (...)` is needed.
    pub whole_fleet: bool,
}

impl Selection {
    /// `node IN (...)` for a `WHERE`, or `1` for the whole fleet.
    pub fn predicate(&self) -> String {
        if self.whole_fleet {
            return "1".into();
        }
        let names: Vec<String> = self.nodes.iter().map(|n| quote_str(&n.name)).collect();
        format!("{NODE} IN ({})", names.join(", "))
    }

    /// The one node chosen, if only one is.
    pub fn single(&self) -> Option<&Node> {
        match self.nodes.as_slice() {
            [n] => Some(n),
            _ => None,
        }
    }

    /// The most CPUs any chosen node has (a `--cpu` beyond it exists nowhere).
    pub fn cpus(&self) -> u32 {
        self.nodes.iter().map(|n| n.cpus).max().unwrap_or(0)
    }

    /// For sentences: `node a`, `3 nodes (a, b, c)`, `the fleet's 1002 nodes`.
    pub fn describe(&self) -> String {
        match (self.whole_fleet, self.nodes.as_slice()) {
            (_, [n]) => format!("node {}", n.name),
            (true, n) => format!("the fleet's {} nodes", n.len()),
            (false, n) => format!("{} nodes ({})", n.len(), list(n)),
        }
    }
}

/// Up to ten names, then how many more.
pub(super) fn list(nodes: &[Node]) -> String {
    let mut s = nodes.iter().take(10).map(|n| n.name.as_str()).collect::<Vec<_>>().join(", ");
    if nodes.len() > 10 {
        s.push_str(&format!(" and {} more", nodes.len() - 10));
    }
    s
}

/// `s` with its control characters escaped (`\n`, `\u{0}`): a sentence stays one line.
fn printable(s: &str) -> String {
    s.chars().map(|c| if c.is_control() { c.escape_default().to_string() } else { c.to_string() }).collect()
}

/// Whether `pattern` is a glob rather than a name.
fn is_glob(pattern: &str) -> bool {
    pattern.contains(['*', '?'])
}

impl Fleet {
    /// The nodes `patterns` name (each a name or a glob: `*` any run, `?` one character); no
    /// pattern: every node that shipped.
    pub fn select(&self, patterns: &[String]) -> Result<Selection, FleetError> {
        let all = self.nodes()?;
        if all.is_empty() {
            return Err(FleetError::NoNodes(self.database.clone()));
        }
        choose(all, patterns)
    }
}

/// The nodes of `all` that `patterns` name, matched here, never in SQL: a pattern's quotes,
/// backslashes or SQL are characters to match, and one that matches nothing is a sentence.
fn choose(all: Vec<Node>, patterns: &[String]) -> Result<Selection, FleetError> {
    if patterns.is_empty() {
        return Ok(Selection { nodes: all, whole_fleet: true });
    }
    let mut chosen: Vec<Node> = Vec::new();
    for p in patterns {
        let matched: Vec<&Node> =
            all.iter().filter(|n| if is_glob(p) { glob(p, &n.name) } else { n.name == *p }).collect();
        if matched.is_empty() {
            return Err(FleetError::UnknownNode { node: printable(p), known: list(&all) });
        }
        for n in matched {
            if !chosen.iter().any(|c| c.name == n.name) {
                chosen.push(n.clone());
            }
        }
    }
    chosen.sort_by(|a, b| a.name.cmp(&b.name));
    let whole_fleet = chosen.len() == all.len();
    Ok(Selection { nodes: chosen, whole_fleet })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, cpus: u32) -> Node {
        Node { name: name.into(), cpus, hz: 99, online: String::new(), host: String::new() }
    }

    #[test]
    fn a_selection_names_its_nodes_in_sql_quoted_and_the_fleet_needs_none() {
        let s = Selection { nodes: vec![node("a'b", 16), node("c", 192)], whole_fleet: false };
        assert_eq!(s.predicate(), "node IN ('a\\'b', 'c')");
        assert_eq!(s.cpus(), 192);
        assert_eq!(s.describe(), "2 nodes (a'b, c)");
        assert!(s.single().is_none());
        let all = Selection { whole_fleet: true, ..s };
        assert_eq!(all.predicate(), "1");
        assert_eq!(all.describe(), "the fleet's 2 nodes");
        assert!(is_glob("gpu-*") && is_glob("n?") && !is_glob("gpu-1"));
    }

    #[test]
    fn quotes_backslashes_and_sql_in_a_pattern_are_characters_to_match() {
        let all = || vec![node("gpu-1", 2), node("gpu-2", 2), node("o'brien\\x", 2)];
        let names = |patterns: &[&str]| {
            let patterns: Vec<String> = patterns.iter().map(|p| p.to_string()).collect();
            choose(all(), &patterns).map(|s| s.nodes.into_iter().map(|n| n.name).collect::<Vec<_>>())
        };
        for hostile in ["gpu-*'", "*' OR 1 = 1 --", "gpu-\\*", "gpu-1\\", "'", "\\", "*`*"] {
            let e = names(&[hostile]).unwrap_err().to_string();
            assert_eq!(
                e,
                format!("node '{hostile}' has shipped nothing to this ClickHouse; it holds gpu-1, gpu-2, o'brien\\x"),
                "{hostile}"
            );
        }
        let e = names(&["*\n*\u{0}"]).unwrap_err().to_string();
        assert!(e.starts_with("node '*\\n*\\u{0}' has shipped nothing") && e.lines().count() == 1, "{e}");
        // A name with a quote and a backslash is matched as written, and quoted in SQL.
        assert_eq!(names(&["o'brien\\x"]).unwrap(), ["o'brien\\x"]);
        assert_eq!(names(&["*'*"]).unwrap(), ["o'brien\\x"]);
        assert_eq!(names(&["*\\*"]).unwrap(), ["o'brien\\x"]);
        let s = choose(all(), &["o'*".to_string(), "gpu-2".to_string()]).unwrap();
        assert_eq!(s.predicate(), "node IN ('gpu-2', 'o\\'brien\\\\x')");
        let s = choose(all(), &["o'*".to_string(), "gpu-?".to_string()]).unwrap();
        assert!(s.whole_fleet && s.predicate() == "1", "every node named: no IN list needed");
        assert_eq!(names(&["gpu-1", "gpu-*"]).unwrap(), ["gpu-1", "gpu-2"], "each node once");
    }
}
