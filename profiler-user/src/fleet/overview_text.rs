//! `profiler fleet` as text: one aligned table per question, read at a glance. The grid is
//! left to `--format json` (a heatmap is for a UI, not a terminal). Names come from nodes and
//! processes: shown through `untrusted::visible`, never raw.

use std::fmt::Write as _;

use super::overview::{EVENT_LOOKBACK_NS, Overview, TopStack};
use crate::{timespec, untrusted::visible};

/// Longest folded line the text shows; JSON has them whole.
const STACK_WIDTH: usize = 110;

/// Columns aligned on the widest cell: text to the left, numbers to the right.
struct Table {
    right: Vec<bool>,
    rows: Vec<Vec<String>>,
}

impl Table {
    fn new(header: &[(&str, bool)]) -> Self {
        Self {
            right: header.iter().map(|h| h.1).collect(),
            rows: vec![header.iter().map(|h| h.0.to_string()).collect()],
        }
    }

    fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    fn write(&self, out: &mut String, indent: &str) {
        let cols = self.right.len();
        let width: Vec<usize> =
            (0..cols).map(|c| self.rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0)).collect();
        for r in &self.rows {
            let mut line = indent.to_string();
            for (c, cell) in r.iter().enumerate() {
                let pad = " ".repeat(width[c] - cell.chars().count());
                let last = c + 1 == cols;
                match (self.right[c], last) {
                    (true, _) => line.push_str(&format!("{pad}{cell}")),
                    (false, true) => line.push_str(cell),
                    (false, false) => line.push_str(&format!("{cell}{pad}")),
                }
                if !last {
                    line.push_str("  ");
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
    }
}

fn percent(share: Option<f64>) -> String {
    share.map_or_else(|| "-".to_string(), |s| format!("{:.1}%", s * 100.0))
}

fn seconds(s: f64) -> String {
    if s < 60.0 { format!("{s:.0}s") } else { timespec::format_duration((s * 1e9) as u64) }
}

/// A folded line cut to `width` characters: the comm, `…`, and the frames nearest the leaf
/// (where the time is spent), whole.
pub fn abbreviate(line: &str, width: usize) -> String {
    if line.chars().count() <= width {
        return line.to_string();
    }
    let (comm, rest) = line.split_once(';').unwrap_or((line, ""));
    let mut kept: Vec<&str> = Vec::new();
    let mut len = comm.chars().count() + 2;
    for frame in rest.rsplit(';') {
        let n = frame.chars().count() + 1;
        if len + n > width && !kept.is_empty() {
            break;
        }
        len += n;
        kept.push(frame);
    }
    kept.reverse();
    format!("{comm};…;{}", kept.join(";"))
}

fn stacks_table(stacks: &[TopStack], total: u64, with_nodes: bool) -> Table {
    let mut header = vec![("samples", true), ("share", true)];
    if with_nodes {
        header.push(("nodes", true));
    }
    header.push(("stack", false));
    let mut t = Table::new(&header);
    for s in stacks {
        let mut row = vec![s.samples.to_string(), percent((total > 0).then(|| s.samples as f64 / total as f64))];
        if with_nodes {
            row.push(s.nodes.to_string());
        }
        row.push(visible(&abbreviate(&s.stack, STACK_WIDTH)).into_owned());
        t.row(row);
    }
    t
}

/// The whole answer as text.
pub fn render_text(o: &Overview) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} nodes, {} to {} ({}), {} busy samples",
        o.nodes.len(),
        o.from,
        o.to,
        timespec::format_duration(o.to_ns - o.from_ns),
        o.samples
    );
    out.push('\n');
    let mut t = Table::new(&[
        ("node", false),
        ("cpus", true),
        ("busy", true),
        ("peak cpu", true),
        ("saturated", true),
        ("samples", true),
        ("events", true),
        ("findings", false),
    ]);
    for n in &o.nodes {
        let kinds: Vec<String> = n.finding_kinds.iter().map(|(k, c)| format!("{c} {}", visible(k))).collect();
        t.row(vec![
            visible(&n.node).into_owned(),
            n.cpus.to_string(),
            percent(n.busy_share),
            percent(n.peak_cpu_busy_share),
            seconds(n.saturated_seconds),
            n.samples.to_string(),
            n.events.to_string(),
            if kinds.is_empty() { "0".to_string() } else { kinds.join(", ") },
        ]);
    }
    t.write(&mut out, "");
    if o.nodes_without_data > 0 {
        let _ = writeln!(out, "({} more nodes shipped nothing in this window)", o.nodes_without_data);
    }
    out.push('\n');
    if o.top_stacks.is_empty() {
        out.push_str("no samples in this window\n");
    } else {
        let _ = writeln!(out, "top stacks (of {} busy samples)", o.samples);
        stacks_table(&o.top_stacks, o.samples, true).write(&mut out, "  ");
    }
    if let Some(ev) = &o.events {
        out.push('\n');
        let shown = if ev.matched > ev.events.len() as u64 {
            format!(", the first {} explained", ev.events.len())
        } else {
            String::new()
        };
        let _ = writeln!(out, "events matching '{}': {}{shown}", visible(&ev.pattern), ev.matched);
        let secs = EVENT_LOOKBACK_NS / 1_000_000_000;
        for e in &ev.events {
            let _ = writeln!(out, "  {}  {}  {}", visible(&e.node), e.time, visible(&e.message));
            match e.cpu {
                Some(cpu) => {
                    let _ = writeln!(
                        out,
                        "    CPU {cpu}: most kernel-mode samples in the {secs} s before ({} of its {})",
                        e.cpu_kernel_samples, e.cpu_samples
                    );
                    stacks_table(&e.stacks, e.cpu_samples, false).write(&mut out, "      ");
                }
                None => {
                    let _ = writeln!(out, "    no samples in the {secs} s before");
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{super::overview::*, *};

    fn overview() -> Overview {
        let node = |name: &str, busy: Option<f64>| NodeSummary {
            node: name.into(),
            cpus: 2,
            hz: 99,
            busy_share: busy,
            peak_cpu_busy_share: busy.map(|b| b * 1.5),
            saturated_seconds: 60.0,
            samples: 1234,
            finding_kinds: [("saturated_core".to_string(), 2)].into(),
            findings: 2,
            ..Default::default()
        };
        Overview {
            from_ns: 0,
            to_ns: 60_000_000_000,
            from: "A".into(),
            to: "B".into(),
            nodes: vec![node("node-1", Some(0.5)), node("a-much-longer-node\u{1b}", None)],
            nodes_without_data: 3,
            samples: 2468,
            top_stacks: vec![TopStack { stack: "app;main;do_syscall_64_[k]".into(), samples: 1000, nodes: 2 }],
            grid: Grid { bucket_seconds: 1, columns: 0, start_ns: 0, nodes: vec![], values: vec![] },
            read_from: String::new(),
            events: Some(EventAnswer {
                pattern: "ena".into(),
                matched: 1,
                events: vec![EventCause {
                    node: "node-1".into(),
                    ts_ns: 1,
                    time: "T".into(),
                    id: "e".into(),
                    message: "ena reset".into(),
                    cpu: Some(1),
                    cpu_kernel_samples: 400,
                    cpu_samples: 450,
                    stacks: vec![TopStack { stack: "x;y_[k]".into(), samples: 400, nodes: 1 }],
                }],
            }),
        }
    }

    #[test]
    fn tables_align_and_names_are_escaped() {
        let text = render_text(&overview());
        let want = "\
2 nodes, A to B (1m 0s), 2468 busy samples

node                    cpus   busy  peak cpu  saturated  samples  events  findings
node-1                     2  50.0%     75.0%      1m 0s     1234       0  2 saturated_core
a-much-longer-node\\x1b     2      -         -      1m 0s     1234       0  2 saturated_core
(3 more nodes shipped nothing in this window)

top stacks (of 2468 busy samples)
  samples  share  nodes  stack
     1000  40.5%      2  app;main;do_syscall_64_[k]

events matching 'ena': 1
  node-1  T  ena reset
    CPU 1: most kernel-mode samples in the 5 s before (400 of its 450)
      samples  share  stack
          400  88.9%  x;y_[k]
";
        assert_eq!(text, want, "\n{text}");
    }

    #[test]
    fn long_stacks_keep_the_comm_and_the_leaf() {
        let frames: Vec<String> = (0..50).map(|i| format!("frame_{i}")).collect();
        let line = format!("app;{}", frames.join(";"));
        let short = abbreviate(&line, 60);
        assert!(short.starts_with("app;…;") && short.ends_with(";frame_49"), "{short}");
        assert!(short.chars().count() <= 60, "{short}");
        assert_eq!(abbreviate("app;main", 60), "app;main");
        // A single leaf longer than the width is still shown.
        assert!(abbreviate(&format!("a;{}", "x".repeat(80)), 20).ends_with(&"x".repeat(80)));
    }
}
