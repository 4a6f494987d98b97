//! What ClickHouse's binary input formats (`RowBinary`, `Native`) are made of: a length as
//! unsigned LEB128, a string as its length and bytes.

/// `n` as unsigned LEB128: seven bits a byte, low first, the high bit set on all but the last.
pub(super) fn put_len(out: &mut Vec<u8>, mut n: usize) {
    loop {
        let byte = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// A string: its length, then its bytes.
pub(super) fn put_str(out: &mut Vec<u8>, s: &str) {
    put_len(out, s.len());
    out.extend_from_slice(s.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_are_leb128_and_strings_follow_theirs() {
        let mut out = Vec::new();
        for n in [0, 127, 128, 300, 16_384] {
            put_len(&mut out, n);
        }
        assert_eq!(out, [0x00, 0x7f, 0x80, 0x01, 0xac, 0x02, 0x80, 0x80, 0x01]);
        out.clear();
        put_str(&mut out, "gpu-7");
        assert_eq!(out, b"\x05gpu-7");
    }
}
