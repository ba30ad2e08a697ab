//! The on-disk kernel cache: one file per compiled module, named by a hash
//! of everything that decides the compiled code (source and options, NVRTC
//! version, target architecture, code format).
//!
//! An entry file is a fixed header, then the payload (PTX text or a cubin):
//!
//! ```text
//! magic "QLKCACHE" | version u32 | format u8 | arch_len u8 | arch bytes
//! | nvrtc major i32 | nvrtc minor i32 | source hash u64
//! | payload length u64 | payload hash u64 | payload
//! ```
//!
//! (little-endian). A reader compares every header field with what it wants
//! and the payload with its length and hash: a file written for another
//! architecture or compiler, or torn, or corrupted, is refused with a
//! [`Refusal`] and never loaded. Writers write a temporary file in the same
//! directory and rename it over the entry, which is atomic on one file
//! system, so a concurrent reader sees the old entry, the new one, or none.

use std::fmt;
use std::fs::{self, OpenOptions};
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

const MAGIC: &[u8; 8] = b"QLKCACHE";
const VERSION: u32 = 1;
/// Longest architecture name a header holds (`sm_100a` is 7 bytes).
const MAX_ARCH_LEN: usize = 32;

/// What kind of code an entry holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// PTX text: the driver JIT-compiles it when it is loaded.
    Ptx,
    /// A cubin (SASS in an ELF file): loaded as it is, no JIT.
    Cubin,
}

impl Format {
    /// The format NVRTC emits for `arch`: a cubin for a real architecture
    /// (`sm_90`), PTX for a virtual one (`compute_90`).
    pub fn for_arch(arch: &str) -> Format {
        if arch.starts_with("sm_") {
            Format::Cubin
        } else {
            Format::Ptx
        }
    }

    fn code(self) -> u8 {
        match self {
            Format::Ptx => 0,
            Format::Cubin => 1,
        }
    }

    fn from_code(code: u8) -> Option<Format> {
        match code {
            0 => Some(Format::Ptx),
            1 => Some(Format::Cubin),
            _ => None,
        }
    }

    fn extension(self) -> &'static str {
        match self {
            Format::Ptx => "ptx",
            Format::Cubin => "cubin",
        }
    }
}

/// Everything that decides a module's compiled code: the key of an entry,
/// stored in its header and compared on every read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryHeader {
    pub format: Format,
    /// The architecture NVRTC compiled for, e.g. `sm_90` or `compute_75`.
    pub arch: String,
    /// NVRTC's (major, minor) version.
    pub nvrtc: (i32, i32),
    /// [`source_hash`] of the module's source and compile options.
    pub source_hash: u64,
}

impl EntryHeader {
    /// The file name of this key's entry for module `module`: a different
    /// source, option, compiler or architecture gives a different name.
    pub fn file_name(&self, module: &str) -> String {
        let mut key = Vec::new();
        self.write_key(&mut key);
        format!(
            "{module}-{:016x}.{}",
            fnv1a64(&key),
            self.format.extension()
        )
    }

    fn write_key(&self, out: &mut Vec<u8>) {
        out.push(self.format.code());
        // The length is checked before writing; a longer name cannot be stored.
        out.push(self.arch.len().min(MAX_ARCH_LEN) as u8);
        out.extend_from_slice(self.arch.as_bytes());
        out.extend_from_slice(&self.nvrtc.0.to_le_bytes());
        out.extend_from_slice(&self.nvrtc.1.to_le_bytes());
        out.extend_from_slice(&self.source_hash.to_le_bytes());
    }
}

/// Why an entry file was not loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Shorter than its header, or than the payload the header announces.
    Truncated { len: usize },
    /// Not an entry file of this cache (or of another version of it).
    NotAnEntry,
    /// Written for another key: `field` is `format`, `arch`, `nvrtc` or
    /// `source`; what the entry holds and what was wanted.
    Stale {
        field: &'static str,
        entry: String,
        wanted: String,
    },
    /// The payload's length differs from the header's.
    LengthMismatch { header: u64, actual: u64 },
    /// The payload's hash differs from the header's: corrupted.
    HashMismatch,
    /// The payload's own target (PTX `.target`, cubin ELF flags) is not the device's.
    WrongTarget { found: String, device: String },
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Truncated { len } => write!(f, "truncated entry ({len} bytes)"),
            Refusal::NotAnEntry => f.write_str("not a kernel cache entry"),
            Refusal::Stale {
                field,
                entry,
                wanted,
            } => write!(f, "stale entry: {field} is {entry}, wanted {wanted}"),
            Refusal::LengthMismatch { header, actual } => {
                write!(f, "payload is {actual} bytes, the header says {header}")
            }
            Refusal::HashMismatch => f.write_str("payload hash differs from the header's"),
            Refusal::WrongTarget { found, device } => {
                write!(f, "code targets {found}, the device is {device}")
            }
        }
    }
}

/// FNV-1a, 64 bits: a stable hash (unlike `std`'s, it never changes between
/// Rust releases) for keys and corruption checks. Not cryptographic; nothing
/// here defends against a deliberate forgery.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The hash of a module's source and the compile options (in order).
pub fn source_hash(source: &str, options: &[String]) -> u64 {
    let mut bytes = source.as_bytes().to_vec();
    for o in options {
        bytes.push(0);
        bytes.extend_from_slice(o.as_bytes());
    }
    fnv1a64(&bytes)
}

/// The bytes of an entry file holding `payload` under `header`.
pub fn encode(header: &EntryHeader, payload: &[u8]) -> Result<Vec<u8>> {
    if header.arch.len() > MAX_ARCH_LEN {
        return Err(Error::InvalidArgument {
            op: "kernel cache",
            message: format!("architecture name `{}` is too long", header.arch),
        });
    }
    let mut out = Vec::with_capacity(payload.len() + 80);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    header.write_key(&mut out);
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&fnv1a64(payload).to_le_bytes());
    out.extend_from_slice(payload);
    Ok(out)
}

/// Reads little-endian fields off the front of a byte slice.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> std::result::Result<&'a [u8], Refusal> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let end = end.ok_or(Refusal::Truncated {
            len: self.bytes.len(),
        })?;
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn array<const N: usize>(&mut self) -> std::result::Result<[u8; N], Refusal> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }
}

/// A parsed entry: its header, the payload length and hash it announces, and
/// the bytes after the header.
struct Parsed<'a> {
    header: EntryHeader,
    len: u64,
    hash: u64,
    rest: &'a [u8],
}

fn parse(bytes: &[u8]) -> std::result::Result<Parsed<'_>, Refusal> {
    let mut r = Reader { bytes, at: 0 };
    if r.take(MAGIC.len())? != MAGIC || u32::from_le_bytes(r.array()?) != VERSION {
        return Err(Refusal::NotAnEntry);
    }
    let [code] = r.array()?;
    let format = Format::from_code(code).ok_or(Refusal::NotAnEntry)?;
    let [arch_len] = r.array()?;
    let arch = String::from_utf8(r.take(usize::from(arch_len))?.to_vec())
        .map_err(|_| Refusal::NotAnEntry)?;
    let nvrtc = (
        i32::from_le_bytes(r.array()?),
        i32::from_le_bytes(r.array()?),
    );
    let source_hash = u64::from_le_bytes(r.array()?);
    let len = u64::from_le_bytes(r.array()?);
    let hash = u64::from_le_bytes(r.array()?);
    Ok(Parsed {
        header: EntryHeader {
            format,
            arch,
            nvrtc,
            source_hash,
        },
        len,
        hash,
        rest: &bytes[r.at..],
    })
}

/// The first header field of `got` that differs from `want`.
fn stale_field(got: &EntryHeader, want: &EntryHeader) -> Option<Refusal> {
    let stale = |field, entry: String, wanted: String| {
        Some(Refusal::Stale {
            field,
            entry,
            wanted,
        })
    };
    if got.format != want.format {
        return stale(
            "format",
            format!("{:?}", got.format),
            format!("{:?}", want.format),
        );
    }
    if got.arch != want.arch {
        return stale("arch", got.arch.clone(), want.arch.clone());
    }
    if got.nvrtc != want.nvrtc {
        let v = |(a, b): (i32, i32)| format!("NVRTC {a}.{b}");
        return stale("nvrtc", v(got.nvrtc), v(want.nvrtc));
    }
    if got.source_hash != want.source_hash {
        let h = |x: u64| format!("{x:016x}");
        return stale("source", h(got.source_hash), h(want.source_hash));
    }
    None
}

/// The payload of an entry file, if its header is exactly `want` and the
/// payload has the length and hash the header states.
pub fn decode<'a>(bytes: &'a [u8], want: &EntryHeader) -> std::result::Result<&'a [u8], Refusal> {
    let p = parse(bytes)?;
    if let Some(refusal) = stale_field(&p.header, want) {
        return Err(refusal);
    }
    let actual = p.rest.len() as u64;
    if actual < p.len {
        return Err(Refusal::Truncated { len: bytes.len() });
    }
    if actual != p.len {
        return Err(Refusal::LengthMismatch {
            header: p.len,
            actual,
        });
    }
    if fnv1a64(p.rest) != p.hash {
        return Err(Refusal::HashMismatch);
    }
    Ok(p.rest)
}

/// The header an entry file states and the bytes after it, checking nothing
/// but that a header is there: what a cache that trusts its files would load.
pub fn decode_unchecked(bytes: &[u8]) -> std::result::Result<(EntryHeader, &[u8]), Refusal> {
    parse(bytes).map(|p| (p.header, p.rest))
}

/// A directory of entry files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskCache {
    dir: PathBuf,
}

impl DiskCache {
    pub fn new(dir: PathBuf) -> Self {
        DiskCache { dir }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the entry of `module` under `header` lives.
    pub fn path(&self, module: &str, header: &EntryHeader) -> PathBuf {
        self.dir.join(header.file_name(module))
    }

    /// Whether there is an entry file for `module` under `header` (valid or
    /// not: [`DiskCache::read`] and its caller decide that).
    pub fn holds(&self, module: &str, header: &EntryHeader) -> bool {
        self.path(module, header).is_file()
    }

    /// The entry file's bytes, or `None` when there is none.
    pub fn read(&self, module: &str, header: &EntryHeader) -> Result<Option<Vec<u8>>> {
        let path = self.path(module, header);
        match fs::read(&path) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(source) => Err(Error::CacheIo { path, source }),
        }
    }

    /// Writes the entry of `module` under `header` atomically.
    pub fn write(&self, module: &str, header: &EntryHeader, payload: &[u8]) -> Result<()> {
        write_atomic(&self.path(module, header), &encode(header, payload)?)
    }
}

/// Writes `bytes` to `path` through a temporary file in the same directory
/// and a rename: readers never see a partly written file, and of two
/// concurrent writers the last rename wins whole. No fsync: an entry a
/// power loss truncates fails its length check and is compiled again.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let io = |source| Error::CacheIo {
        path: path.to_path_buf(),
        source,
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(dir).map_err(io)?;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("entry");
    // A name no other writer uses: this process, and a random number for
    // the threads (and repeated writes) within it. `create_new` refuses a
    // name that exists anyway.
    let tmp = dir.join(format!(
        ".{name}.{}.{:016x}.tmp",
        std::process::id(),
        rand::random::<u64>()
    ));
    let written = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&tmp)
        .and_then(|mut f| f.write_all(bytes));
    if let Err(e) = written.and_then(|()| fs::rename(&tmp, path)) {
        // Best effort: the temporary file is garbage either way.
        let _ = fs::remove_file(&tmp);
        return Err(io(e));
    }
    Ok(())
}

/// The SM number a CUDA cubin (an ELF file) was built for, from its ELF
/// header's `e_flags`, or `None` when `bytes` is not a 64-bit little-endian
/// CUDA ELF file.
///
/// Up to Hopper the SM is the low byte of `e_flags` (sm_90: `0x5a055a`);
/// from Blackwell on it is the second byte and the top byte is non-zero
/// (sm_100: `0x6006402`). The top byte tells the layouts apart.
pub fn cubin_sm(bytes: &[u8]) -> Option<u32> {
    const EM_CUDA: u16 = 190;
    let header = bytes.get(..52)?;
    let is_elf64_le = header[..4] == *b"\x7fELF" && header[4] == 2 && header[5] == 1;
    let machine = u16::from_le_bytes([header[18], header[19]]);
    if !is_elf64_le || machine != EM_CUDA {
        return None;
    }
    let flags = u32::from_le_bytes([header[48], header[49], header[50], header[51]]);
    if flags >> 24 == 0 {
        Some(flags & 0xff)
    } else {
        Some((flags >> 8) & 0xff)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> EntryHeader {
        EntryHeader {
            format: Format::Cubin,
            arch: "sm_90".into(),
            nvrtc: (13, 0),
            source_hash: source_hash("__global__ void k() {}", &["--std=c++17".into()]),
        }
    }

    /// A minimal ELF64 header as NVRTC writes it, with `flags` as `e_flags`.
    fn elf(flags: u32) -> Vec<u8> {
        let mut b = vec![0u8; 64];
        b[..4].copy_from_slice(b"\x7fELF");
        b[4] = 2;
        b[5] = 1;
        b[18..20].copy_from_slice(&190u16.to_le_bytes());
        b[48..52].copy_from_slice(&flags.to_le_bytes());
        b
    }

    #[test]
    fn fnv_matches_its_published_vectors() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn every_key_field_changes_the_file_name() {
        let h = header();
        let name = h.file_name("rmsnorm");
        assert!(
            name.starts_with("rmsnorm-") && name.ends_with(".cubin"),
            "{name}"
        );
        let others = [
            EntryHeader {
                arch: "sm_80".into(),
                ..header()
            },
            EntryHeader {
                nvrtc: (12, 8),
                ..header()
            },
            EntryHeader {
                source_hash: h.source_hash ^ 1,
                ..header()
            },
            EntryHeader {
                format: Format::Ptx,
                ..header()
            },
        ];
        for other in others {
            assert_ne!(other.file_name("rmsnorm"), name, "{other:?}");
        }
        assert_ne!(
            source_hash("x", &["--std=c++17".into()]),
            source_hash("x", &["--std=c++14".into()])
        );
        assert_eq!(Format::for_arch("sm_90"), Format::Cubin);
        assert_eq!(Format::for_arch("compute_75"), Format::Ptx);
    }

    #[test]
    fn an_entry_round_trips_and_every_stale_field_is_refused() {
        let payload = b"some cubin bytes".to_vec();
        let bytes = encode(&header(), &payload).unwrap();
        assert_eq!(decode(&bytes, &header()), Ok(payload.as_slice()));
        let want_other_arch = EntryHeader {
            arch: "sm_100".into(),
            ..header()
        };
        assert_eq!(
            decode(&bytes, &want_other_arch),
            Err(Refusal::Stale {
                field: "arch",
                entry: "sm_90".into(),
                wanted: "sm_100".into()
            })
        );
        let want_newer_nvrtc = EntryHeader {
            nvrtc: (13, 1),
            ..header()
        };
        let refused = decode(&bytes, &want_newer_nvrtc).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "stale entry: nvrtc is NVRTC 13.0, wanted NVRTC 13.1"
        );
        let want_ptx = EntryHeader {
            format: Format::Ptx,
            ..header()
        };
        assert!(matches!(
            decode(&bytes, &want_ptx),
            Err(Refusal::Stale {
                field: "format",
                ..
            })
        ));
        let want_source = EntryHeader {
            source_hash: 7,
            ..header()
        };
        assert!(matches!(
            decode(&bytes, &want_source),
            Err(Refusal::Stale {
                field: "source",
                ..
            })
        ));
        // What a trusting cache would load: the payload, whatever the header says.
        assert_eq!(decode_unchecked(&bytes), Ok((header(), payload.as_slice())));
    }

    #[test]
    fn torn_and_corrupted_entries_are_refused() {
        let payload = vec![7u8; 100];
        let bytes = encode(&header(), &payload).unwrap();
        for cut in [0, 5, 12, 30, bytes.len() - 100, bytes.len() - 1] {
            assert!(
                matches!(
                    decode(&bytes[..cut], &header()),
                    Err(Refusal::Truncated { .. } | Refusal::NotAnEntry)
                ),
                "cut at {cut}"
            );
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(
            decode(&longer, &header()),
            Err(Refusal::LengthMismatch {
                header: 100,
                actual: 101
            })
        );
        let mut flipped = bytes.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        assert_eq!(decode(&flipped, &header()), Err(Refusal::HashMismatch));
        let mut magic = bytes;
        magic[0] = b'X';
        assert_eq!(decode(&magic, &header()), Err(Refusal::NotAnEntry));
        let long_arch = EntryHeader {
            arch: "s".repeat(MAX_ARCH_LEN + 1),
            ..header()
        };
        assert!(encode(&long_arch, b"x").is_err());
    }

    #[test]
    fn the_disk_cache_reads_what_it_wrote_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let cache = DiskCache::new(dir.path().join("nested").join("cache"));
        assert_eq!(cache.read("rope", &header()).unwrap(), None);
        assert!(!cache.holds("rope", &header()));
        cache.write("rope", &header(), b"payload").unwrap();
        assert!(cache.holds("rope", &header()));
        let bytes = cache.read("rope", &header()).unwrap().unwrap();
        assert_eq!(decode(&bytes, &header()), Ok(&b"payload"[..]));
        // Another key has another file: nothing to read.
        let other = EntryHeader {
            arch: "sm_80".into(),
            ..header()
        };
        assert_eq!(cache.read("rope", &other).unwrap(), None);
        assert!(!cache.holds("rope", &other));
        // Rewriting replaces the entry whole and leaves no temporary file.
        cache.write("rope", &header(), b"second").unwrap();
        let bytes = cache.read("rope", &header()).unwrap().unwrap();
        assert_eq!(decode(&bytes, &header()), Ok(&b"second"[..]));
        let files: Vec<_> = fs::read_dir(cache.dir()).unwrap().collect();
        assert_eq!(files.len(), 1);
    }

    #[test]
    fn concurrent_writers_never_leave_a_torn_entry() {
        let dir = tempfile::tempdir().unwrap();
        let cache = DiskCache::new(dir.path().to_path_buf());
        let payloads: Vec<Vec<u8>> = (0..8u8).map(|i| vec![i; 64 * 1024]).collect();
        std::thread::scope(|s| {
            for p in &payloads {
                let cache = &cache;
                s.spawn(move || {
                    for _ in 0..10 {
                        cache.write("nf4", &header(), p).unwrap();
                    }
                });
            }
            // A reader racing the writers sees no entry or a whole one.
            let cache = &cache;
            s.spawn(move || {
                for _ in 0..200 {
                    if let Some(bytes) = cache.read("nf4", &header()).unwrap() {
                        let payload = decode(&bytes, &header()).unwrap();
                        assert!(payload.iter().all(|&b| b == payload[0]));
                    }
                }
            });
        });
        let bytes = cache.read("nf4", &header()).unwrap().unwrap();
        let payload = decode(&bytes, &header()).unwrap();
        assert!(payloads.iter().any(|p| p.as_slice() == payload));
        assert_eq!(
            fs::read_dir(dir.path()).unwrap().count(),
            1,
            "temporary files left"
        );
    }

    #[test]
    fn the_sm_is_read_from_cubin_elf_flags() {
        // e_flags of cubins as cuobjdump prints them.
        for (sm, flags) in [
            (75, 0x004b_054b),
            (80, 0x0050_0550),
            (86, 0x0056_0556),
            (90, 0x005a_055a),
            (100, 0x0600_6402),
            (120, 0x0600_7802),
        ] {
            assert_eq!(cubin_sm(&elf(flags)), Some(sm), "{flags:#x}");
        }
        let mut not_cuda = elf(0x005a_055a);
        not_cuda[18] = 62; // EM_X86_64
        assert_eq!(cubin_sm(&not_cuda), None);
        assert_eq!(cubin_sm(b".version 9.0\n.target sm_90\n"), None);
        assert_eq!(cubin_sm(&elf(0x005a_055a)[..40]), None);
    }
}
