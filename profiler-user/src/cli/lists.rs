//! `profiler findings` and `profiler events`: what the detectors and the kernel log said in a
//! window, as text or JSON.

use profiler::{
    collect::kmsg::Event, detect::Finding, fleet::notes, model::SampleKind, query::Window, timespec, untrusted,
};

use super::args::{Source, StatusFormat, window_of};

// The commands' help is the doc comment of their `Command` variants.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub source: Source,
    #[arg(long, allow_hyphen_values = true, default_value = "-1h")]
    pub from: String,
    #[arg(long, allow_hyphen_values = true, default_value = "now")]
    pub to: String,
    #[arg(long, value_enum, default_value_t = StatusFormat::Text)]
    pub format: StatusFormat,
}

/// A finding as a text line (and its summary on the next).
fn finding_line(f: &Finding) -> String {
    let end = match f.end_ns {
        Some(e) => format!("{} ({})", timespec::format(e), timespec::format_duration(e.saturating_sub(f.start_ns))),
        None => "open".to_string(),
    };
    // Summaries name processes (comm) and functions: untrusted text.
    format!(
        "{}  {:?}  {} .. {}\n    {}",
        untrusted::visible(&f.id),
        f.severity,
        timespec::format(f.start_ns),
        end,
        untrusted::visible(&f.summary)
    )
}

fn event_line(e: &Event) -> String {
    format!("{}  {}  {}", untrusted::visible(&e.id), timespec::format(e.ts_ns), untrusted::visible(&e.message))
}

/// Node names are untrusted text too (a node's --node).
fn on_node(node: &str, line: String) -> String {
    format!("{}  {line}", untrusted::visible(node))
}

pub fn findings(args: Args) -> anyhow::Result<()> {
    let src = args.source.open_nodes()?;
    // Several nodes (or the whole fleet): the server reads them, each line names its node.
    if let (Some(_), Some((fleet, selection))) = (src.several_nodes(), src.fleet()) {
        let w = window_of(&args.from, &args.to)?;
        let list = notes::findings(fleet, selection, Some(w))?;
        return print_list(&list, "findings", w, args.format, |f| on_node(&f.node, finding_line(&f.finding)));
    }
    // One node: its store, or its rows read by the server, printed as the node prints them.
    let w = window_of(&args.from, &args.to)?;
    let list = src.reader(SampleKind::Cpu)?.findings(w)?;
    print_list(&list, "findings", w, args.format, finding_line)
}

pub fn events(args: Args) -> anyhow::Result<()> {
    let src = args.source.open_nodes()?;
    if let (Some(_), Some((fleet, selection))) = (src.several_nodes(), src.fleet()) {
        let w = window_of(&args.from, &args.to)?;
        let list = notes::events(fleet, selection, Some(w))?;
        return print_list(&list, "events", w, args.format, |e| on_node(&e.node, event_line(&e.event)));
    }
    let w = window_of(&args.from, &args.to)?;
    let list = src.reader(SampleKind::Cpu)?.events(w)?;
    print_list(&list, "events", w, args.format, event_line)
}

/// A list as JSON, or one text line per item (a sentence when there is none).
fn print_list<T: serde::Serialize>(
    list: &[T],
    what: &str,
    w: Window,
    format: StatusFormat,
    line: impl Fn(&T) -> String,
) -> anyhow::Result<()> {
    if let StatusFormat::Json = format {
        outln!("{}", serde_json::to_string_pretty(list)?)?;
    } else if list.is_empty() {
        outln!("no {what} between {} and {}", timespec::format(w.from_ns), timespec::format(w.to_ns))?;
    } else {
        for item in list {
            outln!("{}", line(item))?;
        }
    }
    Ok(())
}
