//! ClickHouse's HTTP interface over chdb (today's ClickHouse, embedded; from PyPI), for tests
//! that check every query of a read path on a current engine as well as on Debian's 18.16.

use std::{
    io::{BufRead, Read, Write},
    net::TcpStream,
    path::Path,
    process::{Command, Stdio},
};

use crate::{Kill, clickhouse::ClickHouse};

/// ClickHouse's HTTP interface over chdb (today's ClickHouse, embedded; from PyPI): a statement
/// in each POST body, the answer (or the engine's error, status 500) back. The real binary
/// reads it as it reads a server, so every query a read sends runs on a current engine too.
pub struct ChdbServer {
    _child: Kill,
    port: u16,
}

const CHDB_HTTP: &str = r#"
import sys, http.server
from chdb.session import Session
s = Session(sys.argv[1])
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        q = self.rfile.read(int(self.headers.get('Content-Length', 0))).decode()
        try:
            body, code = s.query(q).bytes(), 200
        except Exception as e:
            body, code = str(e).encode(), 500
        self.send_response(code)
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
srv = http.server.HTTPServer(('127.0.0.1', 0), H)
print(srv.server_port, flush=True)
srv.serve_forever()
"#;

impl ChdbServer {
    /// `None` where chdb is not installed (a failure under CI).
    pub fn start(dir: &Path) -> Option<Self> {
        crate::clickhouse::chdb(&["SELECT 1".to_string()])?;
        let mut child = Kill(
            Command::new("python3")
                .args(["-c", CHDB_HTTP, dir.to_str().unwrap()])
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .unwrap(),
        );
        let mut line = String::new();
        std::io::BufReader::new(child.0.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let port = line.trim().parse().unwrap_or_else(|_| panic!("chdb's HTTP port: {line:?}"));
        Some(Self { _child: child, port })
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn query(&self, sql: &str) -> Result<String, String> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).map_err(|e| e.to_string())?;
        let head = format!("POST / HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Length: {}\r\n\r\n", sql.len());
        s.write_all(head.as_bytes()).and_then(|_| s.write_all(sql.as_bytes())).map_err(|e| e.to_string())?;
        let mut resp = String::new();
        s.read_to_string(&mut resp).map_err(|e| e.to_string())?;
        let (head, body) = resp.split_once("\r\n\r\n").ok_or("no HTTP answer")?;
        if head.contains(" 200 ") { Ok(body.to_string()) } else { Err(body.to_string()) }
    }

    /// The schema (`schema`: its statements), and every row `from` holds in `tables` (the
    /// rollups are made again by chdb's own views, from the samples).
    pub fn copy_of(&self, from: &ClickHouse, schema: &[String], tables: &[&str]) {
        for sql in schema {
            self.query(sql).unwrap_or_else(|e| panic!("chdb: {sql}: {e}"));
        }
        for table in tables {
            let rows = from.query(&format!("SELECT * FROM profiler.{table} FORMAT Values")).unwrap();
            if !rows.trim().is_empty() {
                self.query(&format!("INSERT INTO profiler.{table} VALUES {rows}"))
                    .unwrap_or_else(|e| panic!("chdb: rows of {table}: {e}"));
            }
        }
    }
}
