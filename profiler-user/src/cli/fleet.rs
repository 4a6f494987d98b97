//! `profiler fleet`: what the nodes that ship to one ClickHouse did in a window (library:
//! `fleet::overview`).

use profiler::fleet::{
    Fleet,
    overview::{self, Request},
};

use super::args::{StatusFormat, window_of};

// The command's help is the doc comment of its `Command` variant.
#[derive(clap::Args)]
pub struct Args {
    /// The ClickHouse the daemons ship to (http://[USER[:PASSWORD]@]HOST:PORT).
    #[arg(long, value_name = "URL")]
    pub clickhouse: String,
    /// The database the daemons ship to.
    #[arg(long, default_value = "profiler")]
    pub database: String,
    /// Start: RFC 3339, unix seconds, `now`, or relative (-30s, -5m, -1h).
    #[arg(long, allow_hyphen_values = true, default_value = "-1h")]
    pub from: String,
    /// End (exclusive), same forms as --from.
    #[arg(long, allow_hyphen_values = true, default_value = "now")]
    pub to: String,
    /// Only this node (repeat for several); default: every node that shipped.
    #[arg(long)]
    pub node: Vec<String>,
    /// Stacks in the top list.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u16).range(1..=1000))]
    pub top: u16,
    /// Kernel log events whose message matches this regular expression (RE2, ClickHouse's
    /// `match()`): for each, the CPU with the most kernel-mode samples (stacks with kernel
    /// frames) in the 5 s before it, and that CPU's top 3 stacks in those 5 s.
    #[arg(long, value_name = "REGEX")]
    pub event: Option<String>,
    /// Text (tables) or JSON (everything, with the nodes x time grid of busy shares).
    #[arg(long, value_enum, default_value_t = StatusFormat::Text)]
    pub format: StatusFormat,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let window = window_of(&args.from, &args.to)?;
    let fleet = Fleet::new(&args.clickhouse, &args.database)?;
    let req = Request { window, nodes: args.node, top: usize::from(args.top), event: args.event };
    let answer = overview::overview(&fleet, &req)?;
    match args.format {
        StatusFormat::Json => outln!("{}", serde_json::to_string(&answer)?)?,
        StatusFormat::Text => out!("{}", profiler::fleet::overview_text::render_text(&answer))?,
    }
    Ok(())
}
