//! The accept loop. `axum::serve` keeps every connection for as long as the client likes; an
//! unprivileged user opening a thousand idle connections took all of the daemon's file
//! descriptors, and then it could not write samples. Here: a connection cap computed from
//! RLIMIT_NOFILE (beyond it a connection is closed at once), a deadline on reading request
//! headers (which hyper also applies to an idle keep-alive connection waiting for its next
//! request), a lifetime per connection (a client that never reads its answer), a rate of
//! accepted connections (a connect flood waits in the kernel's backlog), all on one
//! thread at nice 10 with its own runtime, so no request competes with the sampling stages.
//!
//! The cap must not let anyone who can connect keep the owners out: when every slot is taken, a
//! new connection takes the place of one that never showed the API token, an idle one first,
//! the oldest first ([`ConnMark`]). So a user holding every slot with keep-alive requests every
//! few seconds still leaves room for the UI, the API and Prometheus's scrape.

use std::{
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

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

/// What the accept loop knows of a connection, shared with its requests (an extension of each):
/// whether it showed the API token, and whether a request is being answered.
#[derive(Debug, Default)]
pub struct ConnMark {
    trusted: AtomicBool,
    in_flight: AtomicUsize,
    close: tokio::sync::Notify,
}

impl ConnMark {
    /// The connection carried a request with the right token: it is never closed for another.
    pub fn trust(&self) {
        self.trusted.store(true, Ordering::Relaxed);
    }

    pub fn is_trusted(&self) -> bool {
        self.trusted.load(Ordering::Relaxed)
    }

    /// A request is being answered until the guard is dropped.
    pub fn busy(self: &Arc<Self>) -> Busy {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        Busy(self.clone())
    }
}

pub struct Busy(Arc<ConnMark>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Open connections, oldest first.
type Open = Arc<Mutex<Vec<(u64, Instant, Arc<ConnMark>)>>>;

/// The connection to close for a new one when every slot is taken: one that never showed the
/// token, idle before busy, the oldest first; `None` when all showed it.
fn victim(open: &[(u64, Instant, Arc<ConnMark>)]) -> Option<Arc<ConnMark>> {
    open.iter()
        .filter(|(_, _, m)| !m.is_trusted())
        .min_by_key(|(_, at, m)| (m.in_flight.load(Ordering::Relaxed) > 0, *at))
        .map(|(_, _, m)| m.clone())
}

pub fn spawn(addr: SocketAddr, router: Router) -> std::io::Result<SocketAddr> {
    let listener = std::net::TcpListener::bind(addr)?;
    listener.set_nonblocking(true)?;
    let bound = listener.local_addr()?;
    let nofile = limits::raise_nofile();
    let cap = limits::connection_cap(nofile);
    tracing::debug!(nofile, connections = cap, "HTTP server limits");
    std::thread::Builder::new().name("http".into()).spawn(move || {
        // Before the runtime starts: its worker and blocking threads inherit the nice value.
        crate::threads::lower_this_thread();
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
    let open: Open = Arc::default();
    let mut next_id: u64 = 0;
    let (mut refused, mut replaced): (u64, u64) = (0, 0);
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
        let slot = match slots.clone().try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) => {
                // Full: the new connection takes the place of one that never showed the token.
                let victim = victim(&open.lock().expect("connections"));
                let freed = match victim {
                    Some(v) => {
                        v.close.notify_one();
                        tokio::time::timeout(Duration::from_secs(1), slots.clone().acquire_owned()).await.ok()
                    }
                    None => None,
                };
                match freed.and_then(Result::ok) {
                    Some(slot) => {
                        replaced += 1;
                        if replaced.is_power_of_two() {
                            tracing::warn!(
                                replaced,
                                cap,
                                "HTTP connections over the cap: connections without the API token were closed for new ones"
                            );
                        }
                        slot
                    }
                    None => {
                        refused += 1;
                        if refused.is_power_of_two() {
                            tracing::warn!(refused, cap, "HTTP connections over the cap were closed");
                        }
                        drop(stream);
                        continue;
                    }
                }
            }
        };
        let mark = Arc::new(ConnMark::default());
        next_id += 1;
        let id = next_id;
        open.lock().expect("connections").push((id, Instant::now(), mark.clone()));
        let service = TowerToHyperService::new(router.clone().layer(axum::Extension(mark.clone())));
        let open = open.clone();
        tokio::spawn(async move {
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                _ = tokio::time::timeout(CONNECTION_LIFETIME, conn) => {}
                _ = mark.close.notified() => {}
            }
            open.lock().expect("connections").retain(|(i, _, _)| *i != id);
            drop(slot);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_connection_replaces_an_idle_one_without_the_token_the_oldest_first() {
        let t0 = Instant::now();
        let at = |s| t0 + Duration::from_secs(s);
        let (owner, busy, idle_old, idle_new) = (
            Arc::new(ConnMark::default()),
            Arc::new(ConnMark::default()),
            Arc::new(ConnMark::default()),
            Arc::new(ConnMark::default()),
        );
        owner.trust();
        let _working = busy.busy();
        let open = vec![
            (1, at(0), owner.clone()),
            (2, at(1), busy.clone()),
            (3, at(2), idle_old.clone()),
            (4, at(3), idle_new),
        ];
        assert!(Arc::ptr_eq(&victim(&open).unwrap(), &idle_old));
        // Only the owner's and a busy one: the busy one goes, never the owner's.
        let open = vec![(1, at(0), owner.clone()), (2, at(1), busy.clone())];
        assert!(Arc::ptr_eq(&victim(&open).unwrap(), &busy));
        assert!(victim(&[(1, at(0), owner)]).is_none());
    }
}
