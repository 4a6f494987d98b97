//! `profiler ui`: the address of the daemon's page with its token, or, with `--clickhouse`,
//! the page served here in the foreground for any node that ships to ClickHouse.

use std::sync::Arc;

use anyhow::Context as _;
use profiler::{
    fleet::Fleet,
    serve::{self, AppState, source::Source},
    untrusted,
};

use super::args;

// The command's help is the doc comment of its `Command` variant.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub source: args::Source,
    /// With --clickhouse: where this command serves the page (loopback unless told otherwise).
    #[arg(long, default_value = "127.0.0.1:7071", requires = "clickhouse")]
    pub listen: String,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let Some(url) = &args.source.clickhouse else { return daemon_address(&args.source.dir) };
    let fleet = Fleet::new(url, &args.source.database)?;
    // The mistakes a user can fix now rather than on the page: no server, no such node.
    let asked = match args.source.node.as_slice() {
        [] => None,
        [one] if !one.contains(['*', '?']) => Some(one.clone()),
        _ => anyhow::bail!("the page reads one node (--node NAME) or, without --node, offers every node"),
    };
    let nodes = match &asked {
        Some(n) => vec![fleet.node(Some(n))?.name],
        None => fleet.nodes()?.into_iter().map(|n| n.name).collect(),
    };
    if nodes.is_empty() {
        return Err(profiler::fleet::FleetError::NoNodes(args.source.database.clone()).into());
    }
    let addr: std::net::SocketAddr = args
        .listen
        .parse()
        .map_err(|_| anyhow::anyhow!("listen address '{}' is not IP:PORT (e.g. 127.0.0.1:7071)", args.listen))?;
    let token = serve::new_token().context("cannot read /dev/urandom for the page's token")?;
    let state = AppState {
        source: Arc::new(Source::fleet(fleet, asked.clone())),
        live: Default::default(),
        token: token.clone(),
        hosts: serve::hosts(addr),
        metrics_from_any_host: false,
    };
    let bound =
        serve::spawn(addr, state).with_context(|| format!("cannot listen on {addr} (pick another with --listen)"))?;
    // Without --node, `/` is the fleet page (every node; a node's row opens its page).
    let which = match (&asked, nodes.len()) {
        (Some(one), _) => format!("node {one}"),
        (None, n) => format!("the fleet page ({n} node{})", if n == 1 { "" } else { "s" }),
    };
    eprintln!("profiler: serving {which} from ClickHouse until interrupted (Ctrl-C); open:");
    // A reader gone (`| head -1` after the address) stops no server.
    let _ = outln!("http://{bound}/#token={token}");
    // Until SIGINT or SIGTERM (nothing to clean up: the page copies nothing, it reads the server).
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async {
        use tokio::signal::unix::{SignalKind, signal};
        let (mut int, mut term) = (signal(SignalKind::interrupt())?, signal(SignalKind::terminate())?);
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
        anyhow::Ok(())
    })?;
    Ok(())
}

/// The running daemon's page: the address it wrote, with its token (root-only).
fn daemon_address(dir: &args::DataDir) -> anyhow::Result<()> {
    profiler::store::check_dir(&dir.data_dir)?;
    let path = dir.data_dir.join(serve::URL_FILE);
    let url = std::fs::read_to_string(&path)
        .with_context(|| format!("no UI address in {} (is the daemon running with its UI on?)", path.display()))?;
    outln!("{}", untrusted::visible(url.trim()))?;
    Ok(())
}
