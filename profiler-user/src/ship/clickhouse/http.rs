//! ClickHouse's HTTP interface: statements in the POST body, inserts as gzipped `RowBinary`
//! with the statement in the URL. Blocking (ureq), called from the shipper's own thread only.

use std::{io::Write, time::Duration};

use base64::Engine as _;

use super::error::ShipError;

/// Longest time one request may take; a slow server is retried later rather than waited on.
pub const TIMEOUT: Duration = Duration::from_secs(30);
/// Bytes of a server's error kept in our error (its messages can quote the whole statement).
const ERROR_BYTES: usize = 512;

pub struct Client {
    agent: ureq::Agent,
    url: String,
    /// `Basic ...`, when a user is configured.
    auth: Option<String>,
}

impl Client {
    pub fn new(url: &str, user: Option<&str>, password: Option<&str>) -> Self {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(TIMEOUT))
            // Statuses are read here: ClickHouse explains a refusal in the body.
            .http_status_as_error(false)
            .build()
            .into();
        let auth = user.map(|u| {
            let pair = format!("{u}:{}", password.unwrap_or(""));
            format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(pair))
        });
        Self { agent, url: url.trim_end_matches('/').to_string() + "/", auth }
    }

    /// Runs one statement and returns what the server answered.
    pub fn query(&self, sql: &str) -> Result<String, ShipError> {
        let mut req = self.agent.post(&self.url);
        if let Some(a) = &self.auth {
            req = req.header("Authorization", a);
        }
        let resp = req.send(sql.as_bytes()).map_err(|e| ShipError::Http(e.to_string()))?;
        answer(resp)
    }

    /// Runs one query and returns the answer's bytes (a `RowBinary` result is not text).
    pub fn query_bytes(&self, sql: &str) -> Result<Vec<u8>, ShipError> {
        self.query_bytes_with(sql, &[])
    }

    /// [`Client::query_bytes`] with settings for this query (`name`, `value`), in the URL: a
    /// user with `readonly=1` is refused them (code 164).
    pub fn query_bytes_with(&self, sql: &str, settings: &[(&str, &str)]) -> Result<Vec<u8>, ShipError> {
        let mut req = self.agent.post(&self.url).query_pairs(settings.iter().copied());
        if let Some(a) = &self.auth {
            req = req.header("Authorization", a);
        }
        let mut resp = req.send(sql.as_bytes()).map_err(|e| ShipError::Http(e.to_string()))?;
        if resp.status().as_u16() != 200 {
            return answer(resp).map(String::into_bytes);
        }
        // No cap here: the caller bounds the rows a query may return with `LIMIT`.
        resp.body_mut().with_config().limit(u64::MAX).read_to_vec().map_err(|e| ShipError::Http(e.to_string()))
    }

    /// Inserts `rows` in `format` (`RowBinary`, `JSONEachRow`) into `table` (qualified,
    /// quoted); returns the bytes sent.
    pub fn insert(&self, table: &str, format: &str, rows: &[u8]) -> Result<usize, ShipError> {
        self.insert_with(table, format, rows, &[])
    }

    /// [`Client::insert`] with settings for this insert (`name`, `value`).
    pub fn insert_with(
        &self,
        table: &str,
        format: &str,
        rows: &[u8],
        settings: &[(&str, &str)],
    ) -> Result<usize, ShipError> {
        // Fast level: on the node CPU matters more than the last bytes (level 6 saved ~10 %).
        let mut gz = flate2::write::GzEncoder::new(Vec::with_capacity(rows.len() / 4), flate2::Compression::fast());
        gz.write_all(rows).and_then(|_| gz.flush()).map_err(|e| ShipError::Http(e.to_string()))?;
        let body = gz.finish().map_err(|e| ShipError::Http(e.to_string()))?;
        let mut req = self
            .agent
            .post(&self.url)
            .query("query", format!("INSERT INTO {table} FORMAT {format}"))
            .query_pairs(settings.iter().copied())
            .header("Content-Encoding", "gzip");
        if let Some(a) = &self.auth {
            req = req.header("Authorization", a);
        }
        let resp = req.send(&body[..]).map_err(|e| ShipError::Http(e.to_string()))?;
        answer(resp)?;
        Ok(body.len())
    }
}

fn answer(mut resp: ureq::http::Response<ureq::Body>) -> Result<String, ShipError> {
    let status = resp.status().as_u16();
    let body = resp.body_mut().read_to_string().map_err(|e| ShipError::Http(e.to_string()))?;
    if status == 200 {
        return Ok(body);
    }
    let mut message = body.trim().to_string();
    if message.len() > ERROR_BYTES {
        let cut = (0..=ERROR_BYTES).rev().find(|&i| message.is_char_boundary(i)).unwrap_or(0);
        message.truncate(cut);
        message.push_str("...");
    }
    Err(ShipError::Server { status, message })
}
