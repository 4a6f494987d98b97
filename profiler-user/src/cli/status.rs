//! `profiler status`: what the store holds.

use std::path::Path;

use profiler::{
    store::{Meta, Store},
    timespec, untrusted,
};

use super::args::{DataDir, StatusFormat};

// The command's help is the doc comment of its `Command` variant.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub dir: DataDir,
    #[arg(long, value_enum, default_value_t = StatusFormat::Text)]
    pub format: StatusFormat,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    status(&args.dir.data_dir, args.format)
}

#[derive(clap::Args)]
pub struct HealthArgs {
    #[command(flatten)]
    pub dir: DataDir,
    /// Unhealthy when the newest samples in the store are older than this.
    #[arg(long, default_value = "30s")]
    pub max_age: String,
}

/// Whether a daemon holds the data directory's lock.
fn daemon_running(data_dir: &Path) -> bool {
    std::fs::OpenOptions::new().write(true).open(data_dir.join("LOCK")).ok().is_some_and(|f| f.try_lock().is_err())
}

/// A liveness check cheap enough to run every few seconds: a daemon holds the data directory
/// and its newest samples are recent (the headers of the last segment file are read, nothing
/// else). A hung daemon, or one whose sampling or writing stopped, fails it.
pub fn health(args: HealthArgs) -> anyhow::Result<()> {
    let data_dir = &args.dir.data_dir;
    let max_age = timespec::parse_duration_ns(&args.max_age)
        .ok_or_else(|| anyhow::anyhow!("--max-age '{}' is not a duration: use 30s, 2m", args.max_age))?;
    profiler::store::check_dir(data_dir)?;
    if !daemon_running(data_dir) {
        anyhow::bail!("unhealthy: no daemon holds {}: it is not running", data_dir.display());
    }
    let now = timespec::now_ns();
    let started = Meta::read(data_dir).map_or(0, |m| m.started_ns);
    match Store::open(data_dir)?.last_end()? {
        Some(end) if now.saturating_sub(end) <= max_age => {
            outln!("healthy: samples written {} ago", timespec::format_duration(now.saturating_sub(end)))?;
            Ok(())
        }
        // Just started: the first block comes within a flush interval.
        _ if now.saturating_sub(started) <= max_age => {
            outln!("healthy: started {} ago", timespec::format_duration(now.saturating_sub(started)))?;
            Ok(())
        }
        Some(end) => anyhow::bail!(
            "unhealthy: the daemon wrote its newest samples {} ago (limit {}): sampling or writing has stopped; \
             its log says why",
            timespec::format_duration(now.saturating_sub(end)),
            timespec::format_duration(max_age)
        ),
        None => anyhow::bail!("unhealthy: the daemon has written no samples since it started"),
    }
}

fn status(data_dir: &Path, format: StatusFormat) -> anyhow::Result<()> {
    let mut store = Store::open(data_dir)?;
    let summary = store.summary()?;
    for w in store.take_warnings() {
        tracing::warn!("{w}");
    }
    let meta = Meta::read(data_dir);
    let daemon_running = daemon_running(data_dir);
    // Running once this run's first samples are written: before, it loads its programs.
    let started = meta.as_ref().map_or(0, |m| m.started_ns);
    let state = match (daemon_running, store.last_end()?) {
        (false, _) => "not running",
        (true, Some(end)) if end > started => "running",
        (true, _) => "starting",
    };
    if let StatusFormat::Json = format {
        let json = serde_json::json!({
            "data_dir": data_dir,
            "daemon_running": daemon_running,
            "daemon": state,
            "meta": meta,
            "summary": summary,
            "clickhouse": profiler::ship::clickhouse::read_cursor(data_dir),
            "interrupts": profiler::collect::irqs::Placement::read(),
            "gpus": profiler::gpu::Inventory::read(data_dir),
            "cuda": profiler::gpu::cuda::status::Status::read(data_dir),
            "off_cpu": profiler::offcpu::Status::read(data_dir),
        });
        outln!("{}", serde_json::to_string_pretty(&json)?)?;
        return Ok(());
    }
    outln!("data dir     {}", untrusted::visible(&data_dir.display().to_string()))?;
    outln!(
        "daemon       {}",
        match state {
            "starting" => "starting (no samples of this run written yet: loading its BPF programs)",
            other => other,
        }
    )?;
    if let Some(m) = &meta {
        outln!("machine      {} ({} CPUs), sampled at {} Hz", untrusted::visible(&m.hostname), m.cpus, m.frequency_hz)?;
        if !m.node.is_empty() && m.node != m.hostname {
            outln!("node         {}", untrusted::visible(&m.node))?;
        }
    }
    // Where this machine's NIC and GPU interrupts go now: a busy CPU that takes a NIC queue's
    // interrupts starves the queue (the ENA resets).
    for line in profiler::collect::irqs::Placement::read().to_string().lines() {
        outln!("interrupts   {line}")?;
    }
    // What the daemon found of NVIDIA's GPUs, or why none (no library, no GPU, off).
    if let Some(inv) = profiler::gpu::Inventory::read(data_dir) {
        for line in inv.describe() {
            outln!("gpu          {}", untrusted::visible(&line))?;
        }
    }
    // The CUDA probes: which driver libraries, how many processes, the rate guard.
    if let Some(cuda) = profiler::gpu::cuda::status::Status::read(data_dir) {
        for line in cuda.describe() {
            outln!("cuda         {}", untrusted::visible(&line))?;
        }
    }
    // Off-CPU time: its threshold, rate limit and weight, and what was recorded or left out.
    if let Some(o) = profiler::offcpu::Status::read(data_dir) {
        for line in o.describe() {
            outln!("off-cpu      {line}")?;
        }
    }
    outln!(
        "store        {:.2} MiB in {} segments, {} blocks",
        summary.bytes as f64 / 1048576.0,
        summary.segments,
        summary.blocks
    )?;
    let Some((first, last)) = summary.span else {
        outln!("time range   empty: no samples yet")?;
        return Ok(());
    };
    outln!(
        "time range   {} to {} ({})",
        timespec::format(first),
        timespec::format(last),
        timespec::format_duration(last - first)
    )?;
    let (mut busy, mut idle, mut lost) = (0, 0, 0);
    for (cpu, c) in &summary.cpus {
        let total = c.samples + c.idle;
        outln!("cpu {cpu:<8} {total} samples ({} busy, {} idle), {} lost", c.samples, c.idle, c.lost)?;
        busy += c.samples;
        idle += c.idle;
        lost += c.lost;
    }
    outln!("total        {} samples ({busy} busy, {idle} idle), {lost} lost", busy + idle)?;
    if let Some(c) = profiler::ship::clickhouse::read_cursor(data_dir) {
        outln!(
            "clickhouse   {}: shipped up to {} ({} before the store's end)",
            untrusted::visible(&c.target),
            timespec::format(c.next_ns),
            timespec::format_duration(last.saturating_sub(c.next_ns))
        )?;
    }
    Ok(())
}
