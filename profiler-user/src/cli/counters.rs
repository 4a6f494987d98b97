//! `profiler counters`: the kernel counters the daemon read each second (softnet, softirqs,
//! interrupts, PSI, cgroups, NICs) in a window, as a table or JSON (`/api/counters`'s shape).

use profiler::{
    query::Window,
    store::counters::{self, Select},
    timespec, untrusted,
};

use super::args::{DataDir, Source, StatusFormat};

// The command's help is the doc comment of its `Command` variant.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub dir: DataDir,
    /// Start: RFC 3339, unix seconds, `now`, or relative (-30s, -5m, -1h) [default: -1m].
    #[arg(long, allow_hyphen_values = true, conflicts_with_all = ["last", "around"])]
    pub from: Option<String>,
    /// End (exclusive), same forms as --from [default: now].
    #[arg(long, allow_hyphen_values = true, conflicts_with_all = ["last", "around"])]
    pub to: Option<String>,
    /// The last DURATION up to now (`--last 5m` is `--from -5m --to now`).
    #[arg(long, value_name = "DURATION", conflicts_with = "around")]
    pub last: Option<String>,
    /// The window around a finding or event (its id, from `profiler findings` or
    /// `profiler events`).
    #[arg(long)]
    pub around: Option<String>,
    /// With --around: how much before the finding's start or the event.
    #[arg(long, default_value = "5s", requires = "around")]
    pub before: String,
    /// With --around: how much after the event (or the finding's end).
    #[arg(long, default_value = "1s", requires = "around")]
    pub after: String,
    /// Only the counters of this CPU (per-CPU counters; machine-wide ones have no CPU).
    #[arg(long)]
    pub cpu: Option<u32>,
    /// Only counters whose name matches this glob (`softnet.*`, `*NET_RX`, `psi.*`).
    #[arg(long, value_name = "GLOB")]
    pub name: Option<String>,
    #[arg(long, value_enum, default_value_t = StatusFormat::Text)]
    pub format: StatusFormat,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    // Kernel counters stay on the node (they are not shipped to ClickHouse).
    let src = Source { dir: args.dir, clickhouse: None, database: String::new(), node: Vec::new() }.open()?;
    let data_dir = src.data_dir();
    profiler::store::check_dir(data_dir)?;
    let now = timespec::now_ns();
    let window = match (&args.around, &args.last) {
        (Some(id), _) => super::flamegraph::around_window(&src, id, &args.before, &args.after)?.0,
        (None, Some(last)) => {
            let d = timespec::parse_duration_ns(last)
                .filter(|&d| d > 0)
                .ok_or_else(|| anyhow::anyhow!("--last '{last}' is not a duration: use 30s, 5m, 1h"))?;
            Window::new(now.saturating_sub(d), now)?
        }
        (None, None) => Window::new(
            timespec::parse(args.from.as_deref().unwrap_or("-1m"), now)?,
            timespec::parse(args.to.as_deref().unwrap_or("now"), now)?,
        )?,
    };
    let select = Select { cpu: args.cpu, name: args.name.clone() };
    let tracks = counters::read(data_dir, window.from_ns, window.to_ns, &select)?;
    if tracks.skipped_lines > 0 {
        eprintln!("note: {} unreadable lines skipped (a daemon killed while writing leaves one)", tracks.skipped_lines);
    }
    for f in &tracks.skipped_files {
        eprintln!("note: {}", untrusted::visible(f));
    }
    if let StatusFormat::Json = args.format {
        outln!("{}", serde_json::to_string(&tracks)?)?;
        return Ok(());
    }
    if tracks.tracks.is_empty() {
        let which = match (&args.name, args.cpu) {
            (None, None) => String::new(),
            _ => " matching --name/--cpu".to_string(),
        };
        outln!(
            "no kernel counters{which} between {} and {} in {} (is the daemon running with kernel counters on?)",
            timespec::format(window.from_ns),
            timespec::format(window.to_ns),
            data_dir.display()
        )?;
        return Ok(());
    }
    out!("{}", table(&tracks.tracks))?;
    // What the process tracks are of (`cuda.PID.*`: the process's name and pod).
    for (name, about) in &tracks.about {
        outln!("{}: {}", untrusted::visible(name), untrusted::visible(about))?;
    }
    Ok(())
}

/// One row per point, in time order: time, counter, CPU (`-` for machine-wide), value and unit.
fn table(tracks: &[counters::Track]) -> String {
    let mut rows: Vec<(u64, &str, Option<u32>, f64, &str)> = tracks
        .iter()
        .flat_map(|t| t.points.iter().map(move |&(ms, v)| (ms, t.name.as_str(), t.cpu, v, t.unit.as_str())))
        .collect();
    rows.sort_by(|a, b| (a.0, a.1, a.2).cmp(&(b.0, b.1, b.2)));
    let width = rows.iter().map(|r| r.1.len()).max().unwrap_or(0).max("COUNTER".len());
    let mut out = format!("{:<24}  {:<width$}  {:>4}  {:>14}  UNIT\n", "TIME", "COUNTER", "CPU", "VALUE");
    for (ms, name, cpu, v, unit) in rows {
        let cpu = cpu.map_or("-".to_string(), |c| c.to_string());
        // Names come from the kernel (interfaces, interrupt names): shown as visible text.
        out.push_str(&format!(
            "{:<24}  {:<width$}  {cpu:>4}  {v:>14.2}  {unit}\n",
            timespec::format(ms * 1_000_000),
            untrusted::visible(name),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_in_time_order() {
        let t = |name: &str, cpu, points: Vec<(u64, f64)>| counters::Track {
            name: name.into(),
            cpu,
            unit: "/s".into(),
            points,
        };
        let s = table(&[
            t("softnet.processed", Some(1), vec![(1_795_000_000_000, 5.0), (1_795_000_001_000, 6.0)]),
            t("psi.cpu.some", None, vec![(1_795_000_001_000, 0.5)]),
        ]);
        let lines: Vec<&str> = s.lines().collect();
        assert_eq!(lines.len(), 4);
        assert!(lines[0].starts_with("TIME"));
        assert!(lines[1].contains("softnet.processed") && lines[1].contains("5.00"), "{s}");
        assert!(lines[2].contains("psi.cpu.some") && lines[2].contains("  - "), "{s}");
        assert!(lines[3].contains("6.00"));
    }
}
