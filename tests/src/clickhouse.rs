//! A private ClickHouse server for one test: Debian's `clickhouse-server` (18.16) as a child
//! process, on loopback ports, with its config and data in a directory of the test's. No
//! systemd, nothing shared with a system server.

use crate::free_port;
use std::{
    io::{Read, Write},
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use crate::{Kill, skip, wait_for};

pub const SERVER: &str = "/usr/sbin/clickhouse-server";

pub struct ClickHouse {
    pub dir: PathBuf,
    pub http_port: u16,
    tcp_port: u16,
    /// `<remote_servers>` of the config: the cluster this server is a shard of.
    cluster: String,
    child: Option<Kill>,
}

impl ClickHouse {
    /// Starts a server in `dir`, or says why it cannot (and under CI=true panics).
    pub fn start(dir: &Path) -> Option<Self> {
        if !Path::new(SERVER).exists() {
            skip(&format!("{SERVER} is not installed: `apt-get install clickhouse-server` (or `cargo xtask setup`)"));
            return None;
        }
        let mut ch = Self::new(dir);
        ch.write_config();
        ch.restart();
        Some(ch)
    }

    fn new(dir: &Path) -> Self {
        Self {
            dir: dir.to_path_buf(),
            http_port: free_port(),
            tcp_port: free_port(),
            cluster: String::new(),
            child: None,
        }
    }

    /// One server per directory, each a shard of the cluster `name` (one replica each, no
    /// ZooKeeper: tables are created on each server, as the shipper does).
    pub fn start_cluster(name: &str, dirs: &[PathBuf]) -> Option<Vec<Self>> {
        if !Path::new(SERVER).exists() {
            skip(&format!("{SERVER} is not installed: `apt-get install clickhouse-server` (or `cargo xtask setup`)"));
            return None;
        }
        let mut servers: Vec<Self> = dirs.iter().map(|d| Self::new(d)).collect();
        let shards: String = servers
            .iter()
            .map(|s| format!("<shard><replica><host>127.0.0.1</host><port>{}</port></replica></shard>", s.tcp_port))
            .collect();
        for s in &mut servers {
            s.cluster = format!("<remote_servers><{name}>{shards}</{name}></remote_servers>");
            s.write_config();
            s.restart();
        }
        Some(servers)
    }

    /// Queries are logged (`system.query_log`, flushed every 7.5 s or on `SYSTEM FLUSH LOGS`):
    /// what a read cost the server (rows, bytes, memory) is there to see.
    fn write_config(&self) {
        let d = self.dir.display();
        std::fs::create_dir_all(self.dir.join("data")).unwrap();
        std::fs::write(
            self.dir.join("config.xml"),
            format!(
                "<yandex>\n<logger><level>warning</level><log>{d}/server.log</log><errorlog>{d}/server.err</errorlog></logger>\n\
                 <http_port>{}</http_port><tcp_port>{}</tcp_port><listen_host>127.0.0.1</listen_host>\n\
                 <path>{d}/data/</path><tmp_path>{d}/tmp/</tmp_path><users_config>users.xml</users_config>\n\
                 <default_profile>default</default_profile><default_database>default</default_database>\n\
                 <mark_cache_size>5368709</mark_cache_size><uncompressed_cache_size>0</uncompressed_cache_size>\n\
                 <query_log><database>system</database><table>query_log</table><flush_interval_milliseconds>7500</flush_interval_milliseconds></query_log>\n{}\n</yandex>\n",
                self.http_port, self.tcp_port, self.cluster
            ),
        )
        .unwrap();
        std::fs::write(
            self.dir.join("users.xml"),
            format!(
                "<yandex><profiles><default><log_queries>1</log_queries></default>{READ_ONLY_PROFILES}</profiles>\
                 <quotas><default></default></quotas>\n\
                 <users><default><password></password><networks><ip>127.0.0.1</ip></networks>\
                 <profile>default</profile><quota>default</quota></default>{READERS}</users></yandex>\n"
            ),
        )
        .unwrap();
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.http_port)
    }

    /// The URL with a user's credentials ([`READER`], [`HASTY`]).
    pub fn url_as(&self, (user, password): (&str, &str)) -> String {
        format!("http://{user}:{password}@127.0.0.1:{}", self.http_port)
    }

    /// Its native protocol's address, as other shards reach it (and errors name it).
    pub fn tcp_addr(&self) -> String {
        format!("127.0.0.1:{}", self.tcp_port)
    }

    /// SIGSTOP (`true`) or SIGCONT: a server that stops answering without closing a connection.
    pub fn freeze(&self, stopped: bool) {
        let pid = self.child.as_ref().expect("the server is running").0.id();
        let signal = if stopped { "-STOP" } else { "-CONT" };
        assert!(Command::new("kill").args([signal, &pid.to_string()]).status().unwrap().success());
    }

    /// Starts the server on the same directory and ports, and waits until it answers.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "the server is running");
        let child = Command::new(SERVER)
            .arg(format!("--config-file={}", self.dir.join("config.xml").display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start clickhouse-server");
        self.child = Some(Kill(child));
        wait_for("ClickHouse to answer", Duration::from_secs(60), || {
            if let Some(Ok(Some(st))) = self.child.as_mut().map(|c| c.0.try_wait()) {
                let log = std::fs::read_to_string(self.dir.join("server.err")).unwrap_or_default();
                panic!("clickhouse-server exited ({st}):\n{log}");
            }
            self.query("SELECT 1").ok().filter(|a| a.trim() == "1")
        });
    }

    /// SIGKILL: whatever it was writing stays as it was.
    pub fn kill9(&mut self) {
        drop(self.child.take().expect("the server is running"));
    }

    /// Runs `sql`; the answer, or the server's error.
    pub fn query(&self, sql: &str) -> Result<String, String> {
        let mut s = TcpStream::connect(("127.0.0.1", self.http_port)).map_err(|e| e.to_string())?;
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let req = format!(
            "POST / HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{sql}",
            sql.len()
        );
        s.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
        let mut resp = Vec::new();
        s.read_to_end(&mut resp).map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&resp);
        let (head, body) = text.split_once("\r\n\r\n").ok_or_else(|| format!("no HTTP answer: {text}"))?;
        if head.starts_with("HTTP/1.1 200") || head.starts_with("HTTP/1.0 200") {
            Ok(body.to_string())
        } else {
            Err(body.to_string())
        }
    }

    /// A query whose answer is one number.
    pub fn number(&self, sql: &str) -> u64 {
        let a = self.query(sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
        a.trim().parse().unwrap_or_else(|_| panic!("{sql}: answered {a:?}"))
    }
}

/// A user who may only read (`readonly=1`: no writes, no settings in a request), as a fleet's
/// readers are given; its profile sets the time limit reads get (20 s).
pub const READER: (&str, &str) = ("reader", "reads");
/// A read-only user whose reads stop after 1 s: a time limit that a test can reach.
pub const HASTY: (&str, &str) = ("hasty", "hurries");

const READ_ONLY_PROFILES: &str = "<reader><readonly>1</readonly><max_execution_time>20</max_execution_time></reader>\
    <hasty><readonly>1</readonly><max_execution_time>1</max_execution_time></hasty>";

const READERS: &str = "<reader><password>reads</password><networks><ip>127.0.0.1</ip></networks>\
    <profile>reader</profile><quota>default</quota></reader>\
    <hasty><password>hurries</password><networks><ip>127.0.0.1</ip></networks>\
    <profile>hasty</profile><quota>default</quota></hasty>";

/// The shipper's cursor in a data directory: samples before it are in ClickHouse (ns).
pub fn cursor_ns(data: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(data.join("ship/clickhouse.cursor")).ok()?;
    serde_json::from_str::<serde_json::Value>(&text).ok()?["next_ns"].as_u64()
}

/// Waits until the shipper's cursor passes `to_ns`.
pub fn wait_shipped(data: &Path, to_ns: u64) {
    wait_for(&format!("the shipper's cursor to pass {}", to_ns / 1_000_000_000), Duration::from_secs(120), || {
        cursor_ns(data).is_some_and(|c| c >= to_ns).then_some(())
    });
}

/// Runs `statements` in order on today's ClickHouse, embedded (PyPI's chdb), in a fresh
/// directory; each one's answer, trimmed. Says why and returns `None` when chdb is missing.
pub fn chdb(statements: &[String]) -> Option<Vec<String>> {
    let probe = Command::new("python3").args(["-c", "import chdb"]).output();
    if !probe.is_ok_and(|o| o.status.success()) {
        skip("the PyPI package chdb (embedded current ClickHouse) is not installed: `pip install chdb`");
        return None;
    }
    let tmp = tempfile::tempdir().unwrap();
    let script = "import sys, json\nfrom chdb.session import Session\ns = Session(sys.argv[1])\n\
                  out = []\nfor q in json.load(sys.stdin):\n    out.append(str(s.query(q)).strip())\n\
                  print(json.dumps(out))\n";
    let mut child = Command::new("python3")
        .args(["-c", script, tmp.path().join("chdb").to_str().unwrap()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(serde_json::to_string(statements).unwrap().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "chdb refused a statement: {}", String::from_utf8_lossy(&out.stderr));
    Some(serde_json::from_slice(&out.stdout).unwrap())
}

/// Starts a daemon per data directory (`start(i)`, shipping to ClickHouse), lets them ship
/// `secs` whole seconds and stops them: the seconds `[a, b)` every one of them shipped.
pub fn ship_for(data: &[PathBuf], secs: u64, start: impl FnMut(usize) -> crate::Daemon) -> (u64, u64) {
    let mut daemons: Vec<crate::Daemon> = (0..data.len()).map(start).collect();
    let a = crate::now_secs().ceil() as u64 + 1;
    let b = a + secs;
    for d in data {
        wait_shipped(d, b * 1_000_000_000);
    }
    for d in &mut daemons {
        d.stop();
    }
    (a, b)
}

/// A JSON integer as ClickHouse writes a 64-bit one (18.16 and chdb quote them by default).
pub fn json_u64(v: &serde_json::Value) -> u64 {
    v.as_str().map_or_else(|| v.as_u64().expect("an integer"), |s| s.parse().expect("an integer"))
}

/// Every stack of database `db` as text, assembled from the frames dictionary (`stack_frames`
/// and `frames`, one row per id whatever merges have done yet): frame names root first and
/// kernel flags, by stack id. A frame a stack names that `frames` lacks is a panic.
pub fn stacks_as_text(ch: &ClickHouse, db: &str) -> std::collections::BTreeMap<u64, (Vec<String>, Vec<u8>)> {
    stacks_as_text_in(ch, &format!("{db}.frames"), &format!("{db}.stack_frames"))
}

/// [`stacks_as_text`] of the tables named (a shard's `_local` ones).
pub fn stacks_as_text_in(
    ch: &ClickHouse,
    frames: &str,
    stack_frames: &str,
) -> std::collections::BTreeMap<u64, (Vec<String>, Vec<u8>)> {
    let rows = |sql: String| -> Vec<serde_json::Value> {
        let answer = ch.query(&format!("{sql} FORMAT JSONEachRow")).unwrap_or_else(|e| panic!("{sql}: {e}"));
        answer.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    };
    let names: std::collections::HashMap<u64, String> =
        rows(format!("SELECT frame_id, any(name) AS name FROM {frames} GROUP BY frame_id"))
            .iter()
            .map(|v| (json_u64(&v["frame_id"]), v["name"].as_str().unwrap().to_string()))
            .collect();
    let sql =
        format!("SELECT stack_id, any(frame_ids) AS ids, any(kernel) AS kernel FROM {stack_frames} GROUP BY stack_id");
    rows(sql)
        .iter()
        .map(|v| {
            let id = json_u64(&v["stack_id"]);
            let frames = v["ids"].as_array().unwrap().iter().map(|f| {
                names.get(&json_u64(f)).cloned().unwrap_or_else(|| panic!("frame {f} of stack {id} is not in frames"))
            });
            let kernel = v["kernel"].as_array().unwrap().iter().map(|k| k.as_u64().unwrap() as u8);
            (id, (frames.collect(), kernel.collect()))
        })
        .collect()
}
