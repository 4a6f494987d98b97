//! Reads ClickHouse's `RowBinary` output (the layout `ship::clickhouse::rows` writes): integers
//! little-endian at their width, strings and arrays as a LEB128 length then the items.

use super::error::FleetError;

pub struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Self { data, pos: 0 }
    }

    pub fn at_end(&self) -> bool {
        self.pos >= self.data.len()
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], FleetError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.data.len());
        let end = end.ok_or_else(|| FleetError::Decode(format!("a row ends early at byte {}", self.pos)))?;
        let b = &self.data[self.pos..end];
        self.pos = end;
        Ok(b)
    }

    pub fn u8(&mut self) -> Result<u8, FleetError> {
        Ok(self.take(1)?[0])
    }

    pub fn u16(&mut self) -> Result<u16, FleetError> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().expect("2 bytes")))
    }

    pub fn u32(&mut self) -> Result<u32, FleetError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }

    pub fn i32(&mut self) -> Result<i32, FleetError> {
        Ok(i32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }

    pub fn u64(&mut self) -> Result<u64, FleetError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }

    pub fn f64(&mut self) -> Result<f64, FleetError> {
        Ok(f64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }

    /// A length: at most what is left of the data, so a corrupt one cannot ask for memory.
    pub fn len(&mut self) -> Result<usize, FleetError> {
        let mut n = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.u8()?;
            n |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return usize::try_from(n)
                    .ok()
                    .filter(|&n| n <= self.data.len() - self.pos)
                    .ok_or_else(|| FleetError::Decode(format!("a length of {n} at byte {}", self.pos)));
            }
        }
        Err(FleetError::Decode("a length longer than 64 bits".into()))
    }

    pub fn string(&mut self) -> Result<&'a str, FleetError> {
        let n = self.len()?;
        std::str::from_utf8(self.take(n)?).map_err(|_| FleetError::Decode("a string that is not UTF-8".into()))
    }

    pub fn strings(&mut self) -> Result<Vec<&'a str>, FleetError> {
        let n = self.len()?;
        (0..n).map(|_| self.string()).collect()
    }

    /// `Array(UInt64)`.
    pub fn u64s(&mut self) -> Result<Vec<u64>, FleetError> {
        let n = self.len()?;
        (0..n).map(|_| self.u64()).collect()
    }

    pub fn bytes(&mut self) -> Result<&'a [u8], FleetError> {
        let n = self.len()?;
        self.take(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_what_the_shipper_writes_and_refuses_short_rows() {
        let mut row = vec![2, b'n', b'1'];
        row.extend_from_slice(&5u64.to_le_bytes());
        row.extend_from_slice(&3u16.to_le_bytes());
        row.extend_from_slice(&[2, 1, b'a', 2, b'b', b'c', 2, 0, 1]);
        let mut r = Reader::new(&row);
        assert_eq!(r.string().unwrap(), "n1");
        assert_eq!((r.u64().unwrap(), r.u16().unwrap()), (5, 3));
        assert_eq!(r.strings().unwrap(), ["a", "bc"]);
        assert_eq!(r.bytes().unwrap(), [0, 1]);
        assert!(r.at_end());
        let e = Reader::new(&[9, b'x']).string().unwrap_err().to_string();
        assert!(e.contains("length of 9"), "{e}");
        assert!(Reader::new(&[1, 2, 3]).u64().is_err());
        assert!(Reader::new(&[0xff; 11]).len().is_err());
    }
}
