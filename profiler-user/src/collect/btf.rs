//! Just enough of the kernel's BTF (`/sys/kernel/btf/vmlinux`) to find where a field of a
//! kernel struct lies and what an enum constant is worth, so that a BPF program can follow
//! pointers (`task->cgroups->subsys[memory_cgrp_id]->cgroup->kn->id`) on the running kernel's
//! layout, as tracepoint offsets are read from tracefs. aya parses BTF too, but keeps the members
//! and enum values to itself.
//!
//! Format: `include/uapi/linux/btf.h` (a header, then the types, numbered from 1, then the
//! strings). Every kind's trailing data is skipped by its size, so an unknown kind stops the walk
//! (its size is unknown) and the types read so far still answer.

use std::collections::HashMap;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BtfError {
    #[error("not BTF (bad magic or a truncated header)")]
    Header,
    #[error("no struct {0} in the kernel's BTF")]
    NoStruct(String),
    #[error("struct {0} has no member {1} (or it is a bit field)")]
    NoMember(String, String),
    #[error("no enum constant {0} in the kernel's BTF")]
    NoEnum(String),
}

const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_ENUM64: u32 = 19;

struct Type {
    kind: u32,
    kind_flag: bool,
    /// The type a typedef, qualifier or pointer refers to (a struct's size, unused here).
    refers: u32,
    /// Members `(name, type id, bit offset)` of a struct or union; `(name, value)` of an enum
    /// in `values`.
    members: Vec<(u32, u32, u32)>,
    values: Vec<(u32, i64)>,
}

pub struct Btf {
    /// Index 0 is type id 1.
    types: Vec<Type>,
    strings: Vec<u8>,
    structs: HashMap<String, u32>,
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

impl Btf {
    /// The running kernel's BTF.
    pub fn kernel() -> std::io::Result<Result<Self, BtfError>> {
        std::fs::read("/sys/kernel/btf/vmlinux").map(|b| Self::parse(&b))
    }

    pub fn parse(b: &[u8]) -> Result<Self, BtfError> {
        // Little-endian only: the kernel writes its own byte order, and the profiler's BPF
        // targets are little-endian (bpfel).
        if b.get(0..2) != Some(&[0x9f, 0xeb]) {
            return Err(BtfError::Header);
        }
        let h = |i: usize| u32_at(b, 4 + 4 * i).map(|v| v as usize).ok_or(BtfError::Header);
        let (hdr_len, type_off, type_len, str_off, str_len) = (h(0)?, h(1)?, h(2)?, h(3)?, h(4)?);
        let types = b.get(hdr_len + type_off..hdr_len + type_off + type_len).ok_or(BtfError::Header)?;
        let strings = b.get(hdr_len + str_off..hdr_len + str_off + str_len).ok_or(BtfError::Header)?.to_vec();
        let mut btf = Btf { types: Vec::new(), strings, structs: HashMap::new() };
        let mut at = 0;
        while let (Some(name), Some(info), Some(refers)) =
            (u32_at(types, at), u32_at(types, at + 4), u32_at(types, at + 8))
        {
            let (vlen, kind, kind_flag) = ((info & 0xffff) as usize, (info >> 24) & 0x1f, info >> 31 == 1);
            at += 12;
            let mut t = Type { kind, kind_flag, refers, members: Vec::new(), values: Vec::new() };
            let extra = match kind {
                1 | 14 | 17 => 4,          // int, var, decl tag
                3 => 12,                   // array
                2 | 7..=12 | 16 | 18 => 0, // ptr, fwd, typedef, qualifiers, func, float, type tag
                KIND_STRUCT | KIND_UNION => {
                    for i in 0..vlen {
                        let m = at + 12 * i;
                        if let (Some(n), Some(ty), Some(off)) =
                            (u32_at(types, m), u32_at(types, m + 4), u32_at(types, m + 8))
                        {
                            t.members.push((n, ty, off));
                        }
                    }
                    12 * vlen
                }
                KIND_ENUM => {
                    for i in 0..vlen {
                        if let (Some(n), Some(v)) = (u32_at(types, at + 8 * i), u32_at(types, at + 8 * i + 4)) {
                            t.values.push((n, i64::from(v as i32)));
                        }
                    }
                    8 * vlen
                }
                KIND_ENUM64 => {
                    for i in 0..vlen {
                        let e = at + 12 * i;
                        if let (Some(n), Some(lo), Some(hi)) =
                            (u32_at(types, e), u32_at(types, e + 4), u32_at(types, e + 8))
                        {
                            t.values.push((n, ((u64::from(hi) << 32) | u64::from(lo)) as i64));
                        }
                    }
                    12 * vlen
                }
                13 => 8 * vlen,  // func proto
                15 => 12 * vlen, // datasec
                _ => break,
            };
            at += extra;
            if kind == KIND_STRUCT && name != 0 {
                let id = btf.types.len() as u32 + 1;
                btf.structs.entry(btf.string(name).to_string()).or_insert(id);
            }
            btf.types.push(t);
        }
        Ok(btf)
    }

    fn string(&self, off: u32) -> &str {
        let s = self.strings.get(off as usize..).unwrap_or_default();
        let end = s.iter().position(|&c| c == 0).unwrap_or(s.len());
        std::str::from_utf8(&s[..end]).unwrap_or_default()
    }

    fn get(&self, id: u32) -> Option<&Type> {
        self.types.get((id as usize).checked_sub(1)?)
    }

    /// Byte offset of `member` in `struct name`, looking into anonymous structs and unions
    /// (randomized layouts put `task_struct`'s fields in one).
    pub fn member_offset(&self, name: &str, member: &str) -> Result<u64, BtfError> {
        let id = *self.structs.get(name).ok_or_else(|| BtfError::NoStruct(name.to_string()))?;
        self.find_member(id, member, 0).ok_or_else(|| BtfError::NoMember(name.to_string(), member.to_string()))
    }

    fn find_member(&self, id: u32, member: &str, depth: u32) -> Option<u64> {
        let t = self.get(id)?;
        for &(n, ty, off) in &t.members {
            // With kind_flag the offset's top byte is a bit field's size: not a pointer or a u64.
            let (bits, bitfield) = if t.kind_flag { (off & 0xff_ffff, off >> 24 != 0) } else { (off, false) };
            if n != 0 && self.string(n) == member {
                return (!bitfield && bits % 8 == 0).then_some(u64::from(bits / 8));
            }
            if n == 0 && depth < 8 {
                let inner = self.resolve(ty)?;
                if matches!(self.get(inner).map(|t| t.kind), Some(KIND_STRUCT | KIND_UNION))
                    && let Some(o) = self.find_member(inner, member, depth + 1)
                {
                    return Some(u64::from(bits / 8) + o);
                }
            }
        }
        None
    }

    /// Through typedefs and qualifiers to the type itself.
    fn resolve(&self, mut id: u32) -> Option<u32> {
        for _ in 0..16 {
            match self.get(id)?.kind {
                8..=11 | 18 => id = self.get(id)?.refers,
                _ => return Some(id),
            }
        }
        None
    }

    /// The value of an enum constant (`memory_cgrp_id`).
    pub fn enum_value(&self, constant: &str) -> Result<i64, BtfError> {
        self.types
            .iter()
            .filter(|t| matches!(t.kind, KIND_ENUM | KIND_ENUM64))
            .flat_map(|t| t.values.iter())
            .find(|(n, _)| self.string(*n) == constant)
            .map(|(_, v)| *v)
            .ok_or_else(|| BtfError::NoEnum(constant.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A BTF blob of these types: `(name, info, size or type, trailing words)`.
    fn blob(strings: &[&str], types: &[(u32, u32, u32, Vec<u32>)]) -> Vec<u8> {
        let mut t = Vec::new();
        for (name, info, refers, extra) in types {
            for w in [*name, *info, *refers].iter().chain(extra) {
                t.extend_from_slice(&w.to_le_bytes());
            }
        }
        let s: Vec<u8> = strings.iter().flat_map(|s| s.bytes().chain([0])).collect();
        let mut b = vec![0x9f, 0xeb, 1, 0];
        for w in [24u32, 0, t.len() as u32, t.len() as u32, s.len() as u32] {
            b.extend_from_slice(&w.to_le_bytes());
        }
        b.extend(t);
        b.extend(s);
        b
    }

    fn info(kind: u32, vlen: u32, kind_flag: bool) -> u32 {
        (u32::from(kind_flag) << 31) | (kind << 24) | vlen
    }

    #[test]
    fn members_are_found_through_anonymous_unions_and_typedefs() {
        // Offsets of names in the string section.
        let names = [
            "",
            "long",
            "inner",
            "id",
            "outer",
            "a",
            "cgroups",
            "flags",
            "cgroup_subsys_id",
            "cpu_cgrp_id",
            "memory_cgrp_id",
            "wrapped",
        ];
        let at = |n: &str| names.iter().take_while(|s| **s != n).map(|s| s.len() as u32 + 1).sum::<u32>();
        let b = blob(
            &names,
            &[
                (at("long"), info(1, 0, false), 8, vec![64]),
                (at("inner"), info(KIND_STRUCT, 1, false), 8, vec![at("id"), 1, 0]),
                // a at 0, an anonymous union at byte 8 (through a typedef), a 3-bit field at bit 192.
                (
                    at("outer"),
                    info(KIND_STRUCT, 3, true),
                    32,
                    vec![at("a"), 1, 0, 0, 7, 64, at("flags"), 1, (3 << 24) | 192],
                ),
                (0, info(KIND_UNION, 1, false), 8, vec![at("cgroups"), 5, 0]),
                (0, info(2, 0, false), 2, vec![]),
                (
                    at("cgroup_subsys_id"),
                    info(KIND_ENUM, 2, false),
                    4,
                    vec![at("cpu_cgrp_id"), 0, at("memory_cgrp_id"), 4],
                ),
                (at("wrapped"), info(8, 0, false), 4, vec![]),
            ],
        );
        let btf = Btf::parse(&b).unwrap();
        assert_eq!(btf.member_offset("outer", "a"), Ok(0));
        assert_eq!(btf.member_offset("outer", "cgroups"), Ok(8));
        assert_eq!(btf.member_offset("inner", "id"), Ok(0));
        assert_eq!(btf.member_offset("outer", "flags"), Err(BtfError::NoMember("outer".into(), "flags".into())));
        assert_eq!(btf.member_offset("nope", "id"), Err(BtfError::NoStruct("nope".into())));
        assert_eq!(btf.enum_value("memory_cgrp_id"), Ok(4));
        assert!(btf.enum_value("io_cgrp_id").is_err());
        assert!(matches!(Btf::parse(b"not btf at all, really"), Err(BtfError::Header)));
        assert!(matches!(Btf::parse(&b[..20]), Err(BtfError::Header)));
    }

    /// The running kernel's layout (BTF is readable by anyone); without it, the suite's skip
    /// rule (a failure under CI).
    #[test]
    fn the_memory_cgroup_path_of_a_task_is_in_this_kernels_btf() {
        let btf = match Btf::kernel() {
            Ok(btf) => btf,
            Err(e) => {
                profiler_common::test_skip::skip(&format!(
                    "the_memory_cgroup_path_of_a_task_is_in_this_kernels_btf: no kernel BTF at /sys/kernel/btf/vmlinux ({e})"
                ));
                return;
            }
        };
        let btf = btf.unwrap();
        // `task_struct.cgroups` lies deep in the struct; the others may be first (offset 0).
        assert!(btf.member_offset("task_struct", "cgroups").is_ok_and(|o| o > 64));
        for (s, m) in
            [("css_set", "subsys"), ("cgroup_subsys_state", "cgroup"), ("cgroup", "kn"), ("kernfs_node", "id")]
        {
            assert!(btf.member_offset(s, m).is_ok(), "{s}.{m}");
        }
        assert!(btf.enum_value("memory_cgrp_id").is_ok_and(|v| (0..32).contains(&v)));
    }
}
