//! d3-flame-graph's tree (`{name, value, children}`) of a fold, written straight to bytes.
//! A tree of `serde_json::Value`s costs hundreds of bytes a node and deep stacks have many
//! nodes; here nodes are 24 bytes in one vector, and nodes too thin to draw (under
//! [`MIN_SHARE`] of all samples, a fraction of a pixel) are left to their parent's self time.
//! A process (a node under the root) also carries the pods it ran in, most samples first:
//! `"pods":[["namespace/name",samples],...]`, for the page's "only pod X".

use std::io::Write;

use crate::query::Folded;

/// Children under this share of the total are not written (d3-flame-graph cannot draw them):
/// at most 1/MIN_SHARE nodes per depth, whatever the fold holds.
pub const MIN_SHARE: f64 = 1.0 / 5000.0;

struct Node {
    /// Index into the interned names.
    name: u32,
    value: u64,
    first_child: u32,
    next_sibling: u32,
}

const NONE: u32 = u32::MAX;

pub fn write(folded: &Folded, mut out: impl Write) -> std::io::Result<()> {
    let mut names: Vec<&str> = vec!["all"];
    let mut ids: rustc_hash::FxHashMap<&str, u32> = Default::default();
    let mut nodes = vec![Node { name: 0, value: 0, first_child: NONE, next_sibling: NONE }];
    for (line, &count) in &folded.stacks {
        nodes[0].value += count;
        let mut at = 0usize;
        for frame in line.split(';') {
            let name = *ids.entry(frame).or_insert_with(|| {
                names.push(frame);
                (names.len() - 1) as u32
            });
            let mut child = nodes[at].first_child;
            while child != NONE && nodes[child as usize].name != name {
                child = nodes[child as usize].next_sibling;
            }
            if child == NONE {
                child = nodes.len() as u32;
                let next = nodes[at].first_child;
                nodes.push(Node { name, value: 0, first_child: NONE, next_sibling: next });
                nodes[at].first_child = child;
            }
            nodes[child as usize].value += count;
            at = child as usize;
        }
    }
    let min = (nodes[0].value as f64 * MIN_SHARE) as u64;
    // Which nodes are processes (children of the root).
    let mut process = vec![false; nodes.len()];
    let mut c = nodes[0].first_child;
    while c != NONE {
        process[c as usize] = true;
        c = nodes[c as usize].next_sibling;
    }
    enum Step {
        Open(u32),
        Close,
        Comma,
    }
    // Depth-first without recursion (stacks can be deep).
    let mut todo = vec![Step::Open(0)];
    let mut kids = Vec::new();
    while let Some(step) = todo.pop() {
        let n = match step {
            Step::Close => {
                out.write_all(b"]}")?;
                continue;
            }
            Step::Comma => {
                out.write_all(b",")?;
                continue;
            }
            Step::Open(n) => (n, &nodes[n as usize]),
        };
        let (index, n) = n;
        out.write_all(b"{\"name\":")?;
        serde_json::to_writer(&mut out, names[n.name as usize])?;
        if let Some(pods) = process[index as usize].then(|| folded.pods.get(names[n.name as usize])).flatten() {
            let mut pods: Vec<_> = pods.iter().collect();
            pods.sort_unstable_by(|a, b| b.1.cmp(a.1).then_with(|| a.0.cmp(b.0)));
            out.write_all(b",\"pods\":")?;
            serde_json::to_writer(&mut out, &pods)?;
        }
        write!(out, ",\"value\":{},\"children\":[", n.value)?;
        todo.push(Step::Close);
        kids.clear();
        let mut c = n.first_child;
        while c != NONE {
            if nodes[c as usize].value >= min.max(1) {
                kids.push(c);
            }
            c = nodes[c as usize].next_sibling;
        }
        // Children by name (as before), pushed in reverse so the first is written first.
        kids.sort_unstable_by_key(|&k| names[nodes[k as usize].name as usize]);
        for (i, &k) in kids.iter().enumerate().rev() {
            todo.push(Step::Open(k));
            if i > 0 {
                todo.push(Step::Comma);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tree_sums_children_and_drops_only_invisible_ones() {
        let mut f = Folded::default();
        f.stacks.insert("app;main;spin".into(), 7);
        f.stacks.insert("app;main;read".into(), 3);
        f.stacks.insert("db;\"q\"".into(), 2);
        let mut out = Vec::new();
        write(&f, &mut out).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["name"], "all");
        assert_eq!(v["value"], 12);
        assert_eq!(v["children"][0]["name"], "app");
        assert_eq!(v["children"][0]["children"][0]["value"], 10);
        assert_eq!(v["children"][0]["children"][0]["children"][1]["name"], "spin");
        assert_eq!(v["children"][1]["children"][0]["name"], "\"q\"");
        assert!(v["children"][0].get("pods").is_none(), "no pod known: no field");
        f.pods.insert("app".into(), [("ml/a".to_string(), 3), ("ml/b".to_string(), 7)].into());
        // A function named like a process is not one.
        f.pods.insert("main".into(), [("ml/c".to_string(), 1)].into());
        let mut out = Vec::new();
        write(&f, &mut out).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["children"][0]["pods"], serde_json::json!([["ml/b", 7], ["ml/a", 3]]));
        assert!(v["children"][0]["children"][0].get("pods").is_none());
        assert!(v.get("pods").is_none());
        f.pods.clear();
        f.stacks.insert("rare;x".into(), 1);
        f.stacks.insert("app;main;spin".into(), 100_000);
        let mut out = Vec::new();
        write(&f, &mut out).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["value"], 100_006);
        assert!(v["children"].as_array().unwrap().iter().all(|c| c["name"] != "rare"));
    }
}
