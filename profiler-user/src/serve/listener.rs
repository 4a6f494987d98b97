//! The accept loop. `axum::serve` keeps every connection for as long as the client likes; an
//! unprivileged user opening a thousand idle connections took all of the daemon's file
//! descriptors, and then it could not write samples. Here: a connection cap computed from
//! RLIMIT_NOFILE (beyond it a connection is closed at once), a deadline on reading request
//! headers (which hyper also applies to an idle keep-alive connection waiting for its next
//! request), a lifetime per connection (a client that never reads its answer), a rate of
//! accepted connections (a connect flood waits in the kernel's backlog), all on one
//! thread at nice 10 with its own runtime, so no request competes with the sampling stages.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use axum::Router;
use hyper_util::{
    rt::{TokioIo, TokioTimer},
    service::TowerToHyperService,
};
use tokio::sync::Semaphore;

use super::limits;

/// Time to send a request's headers, and how long an idle keep-alive connection stays open.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest life of one connection (the largest answer takes well under a second on loopback).
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(120);
/// New connections accepted per second, at most (a UI opens a handful, a scraper one).
pub const ACCEPTS_PER_SEC: u32 = 200;
/// Blocking threads of the server's runtime: heavy requests are at most
/// [`limits::HEAVY_AT_ONCE`] at a time anyway.
const BLOCKING_THREADS: usize = 4;

pub fn spawn(addr: SocketAddr, router: Router) -> std::io::Result<SocketAddr> {
    let listener = std::net::TcpListener::bind(addr)?;
    listener.set_nonblocking(true)?;
    let bound = listener.local_addr()?;
    let nofile = limits::raise_nofile();
    let cap = limits::connection_cap(nofile);
    tracing::debug!(nofile, connections = cap, "HTTP server limits");
    std::thread::Builder::new().name("http".into()).spawn(move || {
        // Before the runtime starts: its worker and blocking threads inherit the nice value.
        limits::lower_this_thread();
        let rt = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .max_blocking_threads(BLOCKING_THREADS)
            .thread_name("http-query")
            .build()
        {
            Ok(rt) => rt,
            Err(e) => return tracing::error!(error = %e, "the HTTP server could not start"),
        };
        rt.block_on(async move {
            match tokio::net::TcpListener::from_std(listener) {
                Ok(l) => accept_loop(l, router, cap).await,
                Err(e) => tracing::error!(error = %e, "the HTTP server could not start"),
            }
        });
    })?;
    Ok(bound)
}

async fn accept_loop(listener: tokio::net::TcpListener, router: Router, cap: usize) {
    let slots = Arc::new(Semaphore::new(cap));
    let mut refused: u64 = 0;
    let accepts = limits::Rate::new(ACCEPTS_PER_SEC);
    loop {
        // Beyond the rate, connections wait in the kernel's backlog (and past it, the kernel
        // refuses them) instead of costing the daemon CPU.
        while !accepts.allow() {
            tokio::time::sleep(Duration::from_secs(1) / ACCEPTS_PER_SEC).await;
        }
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                // EMFILE and friends: wait rather than spin; connections ending free slots.
                tracing::warn!(error = %e, "the HTTP server could not accept a connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            refused += 1;
            if refused.is_power_of_two() {
                tracing::warn!(refused, cap, "HTTP connections over the cap were closed");
            }
            drop(stream);
            continue;
        };
        let service = TowerToHyperService::new(router.clone());
        tokio::spawn(async move {
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service);
            let _ = tokio::time::timeout(CONNECTION_LIFETIME, conn).await;
            drop(slot);
        });
    }
}
