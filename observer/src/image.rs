//! What a module image handed to the driver is built for: PTX text (its
//! `.target`), a cubin (the SM in its ELF header) or a fat binary (the
//! architecture of each entry).
//!
//! Sources for the binary layouts:
//! - Cubin: LLVM `llvm/include/llvm/BinaryFormat/ELF.h` (`EM_CUDA = 190`;
//!   `ELFABIVERSION_CUDA_V1 = 7` keeps the SM in the low byte of `e_flags`,
//!   `EF_CUDA_SM = 0xff`; `ELFABIVERSION_CUDA_V2 = 8` keeps it in bits 8-15,
//!   `EF_CUDA_SM_MASK = 0xff00`, `EF_CUDA_SM_OFFSET = 8`) and LLVM's
//!   `ELFObjectFileBase::getNVPTXCPUName`, which picks the layout from
//!   `e_ident[EI_ABIVERSION]`. Example flags: `0x005a055a` (V1, sm_90) and
//!   `0x06005a04` (V2, sm_90, as cuobjdump reads recent toolkits' cubins).
//! - Fat binary: not documented by NVIDIA; the layout below is the one
//!   reverse-engineered from cuobjdump by several public tools and agreed on by
//!   them: a 16-byte header (`magic 0xBA55ED50`, `u16` version, `u16` header
//!   size, `u64` size of what follows), then entries of a header (`u16` kind:
//!   1 PTX, 2 ELF; `u32` header size at 4; `u64` payload size at 8; `u32`
//!   architecture number at 28) and the payload.

use std::ffi::CStr;
use std::path::Path;

use serde::Serialize;

use crate::sm::Sm;

const ELF_MAGIC: [u8; 4] = *b"\x7fELF";
const EM_CUDA: u16 = 190;
const ELF64_HEADER_BYTES: usize = 64;
const ELFABIVERSION_CUDA_V1: u8 = 7;
const ELFABIVERSION_CUDA_V2: u8 = 8;
const FATBIN_MAGIC: u32 = 0xBA55_ED50;
/// `__fatBinC_Wrapper_t` (nvcc's host-side registration record): magic,
/// version, then a pointer to the fat binary.
const FATBIN_WRAPPER_MAGIC: u32 = 0x4662_43B1;
const FATBIN_HEADER_BYTES: usize = 16;
/// The fat-binary entry fields read here end at byte 32 of the entry header.
const FATBIN_ENTRY_FIELDS_BYTES: usize = 32;

/// The container a module image came in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum ImageFormat {
    /// PTX text: the driver JIT-compiles it for the device.
    Ptx,
    /// A cubin (CUDA ELF): machine code for one SM.
    Cubin,
    /// A fat binary: cubins and/or PTX for several architectures.
    Fatbin,
    /// Not recognised; `ModuleImage::problem` says why.
    Unknown,
}

/// The kind of code in one image or fat-binary entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum CodeKind {
    Ptx,
    Cubin,
}

/// One piece of code in an image and the architecture it is built for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ImageEntry {
    pub code: CodeKind,
    /// The architecture as the image names it (`sm_90a`, `compute_75`).
    pub target: String,
    /// `target` as a compute capability; `None` when it could not be read.
    pub sm: Option<Sm>,
}

/// A module image as the driver was handed it, reduced to what it targets.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ModuleImage {
    pub format: ImageFormat,
    pub entries: Vec<ImageEntry>,
    /// The image's size in bytes where the format tells it.
    pub bytes: Option<u64>,
    /// Why the image (or part of it) could not be read.
    pub problem: Option<String>,
}

impl ModuleImage {
    pub(crate) fn unknown(problem: impl Into<String>) -> Self {
        Self {
            format: ImageFormat::Unknown,
            entries: Vec::new(),
            bytes: None,
            problem: Some(problem.into()),
        }
    }

    /// Every architecture the image holds code for, sorted, without repeats.
    pub fn targets(&self) -> Vec<Sm> {
        let mut sms: Vec<Sm> = self.entries.iter().filter_map(|e| e.sm).collect();
        sms.sort();
        sms.dedup();
        sms
    }

    /// Whether the image holds code built for `device` itself: a PTX `.target`
    /// or cubin equal to it; for a fat binary, an entry equal to it (the one
    /// the driver then uses). An unrecognised image does not.
    pub fn targets_device(&self, device: Sm) -> bool {
        self.entries.iter().any(|e| e.sm == Some(device))
    }

    /// Whether loading the image on `device` makes the driver JIT-compile PTX:
    /// PTX always does, a cubin never does, a fat binary does when it holds no
    /// cubin the device runs (same major, minor not above the device's) but
    /// PTX it can compile (not newer than the device). `None` for an image
    /// that was not recognised.
    pub fn needs_jit(&self, device: Sm) -> Option<bool> {
        match self.format {
            ImageFormat::Ptx => Some(true),
            ImageFormat::Cubin => Some(false),
            ImageFormat::Unknown => None,
            ImageFormat::Fatbin => {
                let runs = |e: &ImageEntry| {
                    e.code == CodeKind::Cubin
                        && e.sm
                            .is_some_and(|s| s.major == device.major && s.minor <= device.minor)
                };
                let compiles =
                    |e: &ImageEntry| e.code == CodeKind::Ptx && e.sm.is_some_and(|s| s <= device);
                let native = self.entries.iter().any(runs);
                Some(!native && self.entries.iter().any(compiles))
            }
        }
    }

    /// A short description: `PTX sm_90`, `cubin sm_90`, `fatbin [sm_80 cubin,
    /// compute_90 PTX]`, `unrecognised image (why)`.
    pub fn describe(&self) -> String {
        let one = |e: &ImageEntry| e.target.clone();
        match self.format {
            ImageFormat::Ptx | ImageFormat::Cubin if self.entries.len() == 1 => {
                let kind = if self.format == ImageFormat::Ptx {
                    "PTX"
                } else {
                    "cubin"
                };
                format!("{kind} {}", one(&self.entries[0]))
            }
            ImageFormat::Unknown => format!(
                "unrecognised image ({})",
                self.problem.as_deref().unwrap_or("no reason given")
            ),
            _ => {
                let parts: Vec<String> = self
                    .entries
                    .iter()
                    .map(|e| match e.code {
                        CodeKind::Ptx => format!("{} PTX", e.target),
                        CodeKind::Cubin => format!("{} cubin", e.target),
                    })
                    .collect();
                let name = match self.format {
                    ImageFormat::Ptx => "PTX",
                    ImageFormat::Cubin => "cubin",
                    _ => "fatbin",
                };
                format!("{name} [{}]", parts.join(", "))
            }
        }
    }
}

fn read_u16(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(bytes.get(at..at + 2)?.try_into().ok()?))
}

fn read_u32(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

fn read_u64(bytes: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
}

/// Reads an image from its bytes: a cubin by its ELF magic, a fat binary by
/// its magic, anything else as PTX text (a terminating NUL is allowed).
pub fn parse_image(bytes: &[u8]) -> ModuleImage {
    if bytes.starts_with(&ELF_MAGIC) {
        cubin_image(bytes)
    } else if read_u32(bytes, 0) == Some(FATBIN_MAGIC) {
        fatbin_image(bytes)
    } else {
        ptx_image(bytes)
    }
}

/// The architecture on the `.target` line of a PTX text (`sm_90` for
/// `.target sm_90` and `.target sm_90, debug`), if there is one.
pub fn ptx_target(text: &str) -> Option<&str> {
    text.lines().find_map(|line| {
        let code = line.split("//").next().unwrap_or_default().trim();
        let rest = code.strip_prefix(".target")?;
        if !rest.starts_with(char::is_whitespace) {
            return None;
        }
        rest.split(|c: char| c == ',' || c.is_whitespace())
            .find(|token| !token.is_empty())
    })
}

fn ptx_image(bytes: &[u8]) -> ModuleImage {
    let text = bytes.strip_suffix(b"\0").unwrap_or(bytes);
    let Ok(text) = std::str::from_utf8(text) else {
        return ModuleImage::unknown("neither a cubin, a fat binary nor PTX text");
    };
    let mut image = ModuleImage {
        format: ImageFormat::Ptx,
        entries: Vec::new(),
        bytes: Some(text.len() as u64),
        problem: None,
    };
    match ptx_target(text) {
        Some(target) => image.entries.push(ImageEntry {
            code: CodeKind::Ptx,
            target: target.to_string(),
            sm: Sm::parse(target),
        }),
        None if text.contains(".version") => {
            image.problem = Some("PTX without a .target line".to_string());
        }
        None => return ModuleImage::unknown("neither a cubin, a fat binary nor PTX text"),
    }
    image
}

/// The SM a cubin was built for, from its ELF header (the first 64 bytes are
/// enough), or `None` when `header` is not a 64-bit little-endian CUDA ELF.
///
/// `e_ident[EI_ABIVERSION]` picks the `e_flags` layout: 7 keeps the SM in the
/// low byte, 8 in bits 8-15. Other versions fall back on the flags alone: the
/// V2 layout sets the top byte, the V1 layout leaves it zero.
pub fn cubin_sm(header: &[u8]) -> Option<Sm> {
    let header = header.get(..ELF64_HEADER_BYTES)?;
    let is_elf64_le = header[..4] == ELF_MAGIC && header[4] == 2 && header[5] == 1;
    if !is_elf64_le || read_u16(header, 18)? != EM_CUDA {
        return None;
    }
    let flags = read_u32(header, 48)?;
    let number = match header[8] {
        ELFABIVERSION_CUDA_V1 => flags & 0xff,
        ELFABIVERSION_CUDA_V2 => (flags >> 8) & 0xff,
        _ if flags >> 24 != 0 => (flags >> 8) & 0xff,
        _ => flags & 0xff,
    };
    (number >= 10).then(|| Sm::from_number(number))
}

/// The size of an ELF file from its header: the end of its section or program
/// header table, whichever is later (both sit at the end of a cubin).
fn elf_size(header: &[u8]) -> Option<u64> {
    let table_end = |offset: usize, entry: usize, count: usize| -> Option<u64> {
        let count = u64::from(read_u16(header, count)?);
        let entry = u64::from(read_u16(header, entry)?);
        read_u64(header, offset)?.checked_add(count.checked_mul(entry)?)
    };
    let programs = table_end(32, 54, 56)?;
    let sections = table_end(40, 58, 60)?;
    Some(programs.max(sections))
}

fn cubin_image(bytes: &[u8]) -> ModuleImage {
    let Some(sm) = cubin_sm(bytes) else {
        return ModuleImage::unknown("an ELF file that is not a 64-bit CUDA cubin");
    };
    ModuleImage {
        format: ImageFormat::Cubin,
        entries: vec![ImageEntry {
            code: CodeKind::Cubin,
            target: sm.to_string(),
            sm: Some(sm),
        }],
        bytes: elf_size(bytes).or(Some(bytes.len() as u64)),
        problem: None,
    }
}

/// The total size of a fat binary from its 16-byte header.
fn fatbin_size(header: &[u8]) -> Option<u64> {
    if read_u32(header, 0)? != FATBIN_MAGIC {
        return None;
    }
    u64::from(read_u16(header, 6)?).checked_add(read_u64(header, 8)?)
}

/// The entries of a fat binary: each one's kind and architecture.
pub fn fatbin_entries(bytes: &[u8]) -> Result<Vec<ImageEntry>, String> {
    let total = fatbin_size(bytes).ok_or("not a fat binary header")?;
    let end = usize::try_from(total)
        .ok()
        .filter(|&end| end <= bytes.len())
        .ok_or_else(|| format!("fat binary of {total} bytes, {} at hand", bytes.len()))?;
    let mut at = usize::from(read_u16(bytes, 6).unwrap_or_default());
    let mut entries = Vec::new();
    while at + FATBIN_ENTRY_FIELDS_BYTES <= end {
        let fields = (
            read_u16(bytes, at),
            read_u32(bytes, at + 4),
            read_u64(bytes, at + 8),
            read_u32(bytes, at + 28),
        );
        let (Some(kind), Some(header), Some(payload), Some(arch)) = fields else {
            break;
        };
        let code = match kind {
            1 => Some(CodeKind::Ptx),
            2 | 0x10 => Some(CodeKind::Cubin),
            _ => None,
        };
        if let Some(code) = code {
            let prefix = if code == CodeKind::Ptx {
                "compute"
            } else {
                "sm"
            };
            entries.push(ImageEntry {
                code,
                target: format!("{prefix}_{arch}"),
                sm: (arch >= 10).then(|| Sm::from_number(arch)),
            });
        }
        let step = u64::from(header).checked_add(payload).filter(|&s| s > 0);
        let next = step.and_then(|s| usize::try_from(s).ok()?.checked_add(at));
        at = next.ok_or_else(|| format!("fat binary entry at byte {at} has no size"))?;
    }
    Ok(entries)
}

fn fatbin_image(bytes: &[u8]) -> ModuleImage {
    match fatbin_entries(bytes) {
        Ok(entries) => ModuleImage {
            format: ImageFormat::Fatbin,
            entries,
            bytes: fatbin_size(bytes),
            problem: None,
        },
        Err(why) => ModuleImage {
            format: ImageFormat::Fatbin,
            entries: Vec::new(),
            bytes: fatbin_size(bytes),
            problem: Some(why),
        },
    }
}

/// Reads the image in the file at `path`, as `cuModuleLoad` and
/// `cuLibraryLoadFromFile` do.
pub(crate) fn image_in_file(path: &Path) -> ModuleImage {
    match std::fs::read(path) {
        Ok(bytes) => parse_image(&bytes),
        Err(e) => ModuleImage::unknown(format!("{}: {e}", path.display())),
    }
}

/// Reads the image at `ptr` the way the driver does, which is handed a
/// pointer only: the size comes from the format (the ELF header's tables, the
/// fat-binary header, PTX's terminating NUL). Of a cubin only the 64-byte
/// header is read: it alone names the SM.
///
/// # Safety
/// `ptr` is null or is the image pointer of a module-load call in progress
/// (`cuModuleLoadData`, `cuModuleLoadDataEx`, `cuModuleLoadFatBinary`,
/// `cuLibraryLoadData`): a well-formed image that the driver itself is about
/// to read, valid until the call returns.
pub(crate) unsafe fn image_at(ptr: *const u8) -> ModuleImage {
    if ptr.is_null() {
        return ModuleImage::unknown("null image pointer");
    }
    // Read the magic byte by byte, stopping at a NUL: a short PTX string may
    // end before four bytes; no magic below contains a zero byte.
    let mut magic = [0u8; 4];
    for (i, slot) in magic.iter_mut().enumerate() {
        // SAFETY: every byte before the first NUL of a C string is readable,
        // and the loop stops at that NUL; an ELF or fat-binary image is longer
        // than four bytes.
        *slot = unsafe { ptr.add(i).read() };
        if *slot == 0 {
            break;
        }
    }
    if magic == ELF_MAGIC {
        // SAFETY: an ELF image starts with its 64-byte ELF64 header.
        let header = unsafe { std::slice::from_raw_parts(ptr, ELF64_HEADER_BYTES) };
        let mut image = parse_image(header);
        image.bytes = elf_size(header);
        return image;
    }
    match u32::from_le_bytes(magic) {
        // SAFETY: forwarded from this function's contract.
        FATBIN_MAGIC => unsafe { fatbin_at(ptr) },
        // SAFETY: forwarded from this function's contract.
        FATBIN_WRAPPER_MAGIC => unsafe { wrapped_fatbin_at(ptr) },
        _ => {
            // SAFETY: anything else the driver accepts is PTX, a C string.
            let text = unsafe { CStr::from_ptr(ptr.cast()) };
            parse_image(text.to_bytes())
        }
    }
}

/// # Safety
/// `ptr` points to a fat binary the driver is about to read.
unsafe fn fatbin_at(ptr: *const u8) -> ModuleImage {
    // SAFETY: a fat binary starts with its 16-byte header.
    let header = unsafe { std::slice::from_raw_parts(ptr, FATBIN_HEADER_BYTES) };
    let total = fatbin_size(header).and_then(|t| usize::try_from(t).ok());
    match total.filter(|&t| t >= FATBIN_HEADER_BYTES && t <= isize::MAX as usize) {
        // SAFETY: the header gives the size of the whole fat binary, which the
        // driver reads to the same end.
        Some(total) => parse_image(unsafe { std::slice::from_raw_parts(ptr, total) }),
        None => ModuleImage::unknown("fat binary header with an impossible size"),
    }
}

/// # Safety
/// `ptr` points to a `__fatBinC_Wrapper_t` the driver is about to read.
unsafe fn wrapped_fatbin_at(ptr: *const u8) -> ModuleImage {
    // SAFETY: the wrapper is two `u32`s followed by the fat binary's pointer.
    let data = unsafe { ptr.add(8).cast::<*const u8>().read_unaligned() };
    if data.is_null() || data == ptr {
        return ModuleImage::unknown("fat binary wrapper without data");
    }
    // SAFETY: the wrapper's data is the fat binary the driver reads next; its
    // magic is checked before anything else is read.
    let inner = unsafe { data.cast::<[u8; 4]>().read_unaligned() };
    if u32::from_le_bytes(inner) != FATBIN_MAGIC {
        return ModuleImage::unknown("fat binary wrapper around something else");
    }
    // SAFETY: as above.
    unsafe { fatbin_at(data) }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A minimal ELF64 CUDA header: `abi_version` at `e_ident[8]`, `flags`
    /// as `e_flags`, a section table of 3 entries of 64 bytes at 0x200.
    pub(crate) fn elf(abi_version: u8, flags: u32) -> Vec<u8> {
        let mut b = vec![0u8; 64];
        b[..4].copy_from_slice(&ELF_MAGIC);
        b[4] = 2; // ELFCLASS64
        b[5] = 1; // ELFDATA2LSB
        b[6] = 1; // EV_CURRENT
        b[7] = if abi_version == ELFABIVERSION_CUDA_V2 {
            0x41
        } else {
            0x33
        };
        b[8] = abi_version;
        b[16..18].copy_from_slice(&2u16.to_le_bytes()); // ET_EXEC
        b[18..20].copy_from_slice(&EM_CUDA.to_le_bytes());
        b[40..48].copy_from_slice(&0x200u64.to_le_bytes()); // e_shoff
        b[48..52].copy_from_slice(&flags.to_le_bytes());
        b[52..54].copy_from_slice(&64u16.to_le_bytes()); // e_ehsize
        b[58..60].copy_from_slice(&64u16.to_le_bytes()); // e_shentsize
        b[60..62].copy_from_slice(&3u16.to_le_bytes()); // e_shnum
        b
    }

    /// A fat binary holding `(kind, arch, payload)` entries.
    pub(crate) fn fatbin(entries: &[(u16, u32, &[u8])]) -> Vec<u8> {
        let mut body = Vec::new();
        for &(kind, arch, payload) in entries {
            let padded = payload.len().div_ceil(8) * 8;
            let mut header = vec![0u8; 64];
            header[..2].copy_from_slice(&kind.to_le_bytes());
            header[2..4].copy_from_slice(&0x0101u16.to_le_bytes());
            header[4..8].copy_from_slice(&64u32.to_le_bytes());
            header[8..16].copy_from_slice(&(padded as u64).to_le_bytes());
            header[16..20].copy_from_slice(&(payload.len() as u32).to_le_bytes());
            header[28..32].copy_from_slice(&arch.to_le_bytes());
            body.extend_from_slice(&header);
            body.extend_from_slice(payload);
            body.resize(body.len() + padded - payload.len(), 0);
        }
        let mut out = Vec::new();
        out.extend_from_slice(&FATBIN_MAGIC.to_le_bytes());
        out.extend_from_slice(&1u16.to_le_bytes());
        out.extend_from_slice(&16u16.to_le_bytes());
        out.extend_from_slice(&(body.len() as u64).to_le_bytes());
        out.extend_from_slice(&body);
        out
    }

    const PTX_SM90: &str = "//\n// Generated by NVIDIA NVVM Compiler\n//\n.version 8.8\n.target sm_90\n.address_size 64\n\n.visible .entry k()\n{\n\tret;\n}\n";

    #[test]
    fn the_ptx_target_is_read_from_its_directive() {
        assert_eq!(ptx_target(PTX_SM90), Some("sm_90"));
        assert_eq!(
            ptx_target(".version 7.0\n.target sm_70, debug\n"),
            Some("sm_70")
        );
        assert_eq!(
            ptx_target("  .target\tsm_90a // arch-specific\n"),
            Some("sm_90a")
        );
        assert_eq!(
            ptx_target("// .target sm_50\n.target sm_75\n"),
            Some("sm_75")
        );
        assert_eq!(ptx_target(".targets sm_90\n"), None);
        assert_eq!(ptx_target(".version 8.0\n"), None);
    }

    #[test]
    fn ptx_images_name_their_target() {
        let image = parse_image(format!("{PTX_SM90}\0").as_bytes());
        assert_eq!(image.format, ImageFormat::Ptx);
        assert_eq!(image.targets(), vec![Sm::new(9, 0)]);
        assert_eq!(image.bytes, Some(PTX_SM90.len() as u64));
        assert_eq!(image.describe(), "PTX sm_90");
        let no_target = parse_image(b".version 8.0\n.address_size 64\n");
        assert_eq!(no_target.format, ImageFormat::Ptx);
        assert!(no_target.entries.is_empty() && no_target.problem.is_some());
        assert_eq!(
            parse_image(&[0xff, 0xfe, 0x00]).format,
            ImageFormat::Unknown
        );
        assert_eq!(parse_image(b"hello").format, ImageFormat::Unknown);
    }

    #[test]
    fn the_cubin_sm_follows_the_abi_version_of_the_elf_header() {
        // ELFABIVERSION_CUDA_V1: the SM in the low byte.
        for (sm, flags) in [(75, 0x004b_054b), (80, 0x0050_0550), (90, 0x005a_055a)] {
            assert_eq!(
                cubin_sm(&elf(7, flags)),
                Some(Sm::from_number(sm)),
                "{flags:#x}"
            );
        }
        // ELFABIVERSION_CUDA_V2: the SM in bits 8-15 (0x5a04 has 0x04 below
        // it, which the V1 reading would call sm_0.4).
        for (sm, flags) in [(90, 0x0600_5a04), (100, 0x0600_6402), (121, 0x0600_7902)] {
            assert_eq!(
                cubin_sm(&elf(8, flags)),
                Some(Sm::from_number(sm)),
                "{flags:#x}"
            );
        }
        // Another ABI version: the flags alone decide.
        assert_eq!(cubin_sm(&elf(0, 0x005a_055a)), Some(Sm::new(9, 0)));
        assert_eq!(cubin_sm(&elf(0, 0x0600_5a04)), Some(Sm::new(9, 0)));
    }

    #[test]
    fn headers_that_are_not_cuda_elf64_have_no_sm() {
        let mut x86 = elf(7, 0x005a_055a);
        x86[18..20].copy_from_slice(&62u16.to_le_bytes()); // EM_X86_64
        assert_eq!(cubin_sm(&x86), None);
        let mut elf32 = elf(7, 0x005a_055a);
        elf32[4] = 1;
        assert_eq!(cubin_sm(&elf32), None);
        assert_eq!(cubin_sm(&elf(7, 0x005a_055a)[..48]), None);
        assert_eq!(cubin_sm(PTX_SM90.as_bytes()), None);
        assert_eq!(parse_image(&x86).format, ImageFormat::Unknown);
    }

    #[test]
    fn a_cubin_image_has_its_size_from_the_section_table() {
        let image = parse_image(&elf(8, 0x0600_5a04));
        assert_eq!(image.format, ImageFormat::Cubin);
        assert_eq!(image.targets(), vec![Sm::new(9, 0)]);
        assert_eq!(image.bytes, Some(0x200 + 3 * 64));
        assert_eq!(image.describe(), "cubin sm_90");
    }

    #[test]
    fn fat_binary_entries_give_their_kind_and_architecture() {
        let cubin = elf(8, 0x0600_5a04);
        let bytes = fatbin(&[
            (2, 80, &cubin),
            (2, 90, &cubin),
            (1, 90, b".target sm_90\0"),
        ]);
        let image = parse_image(&bytes);
        assert_eq!(image.format, ImageFormat::Fatbin, "{:?}", image.problem);
        let targets: Vec<&str> = image.entries.iter().map(|e| e.target.as_str()).collect();
        assert_eq!(targets, ["sm_80", "sm_90", "compute_90"]);
        assert_eq!(image.entries[2].code, CodeKind::Ptx);
        assert_eq!(image.targets(), vec![Sm::new(8, 0), Sm::new(9, 0)]);
        assert_eq!(image.bytes, Some(bytes.len() as u64));
        assert_eq!(
            image.describe(),
            "fatbin [sm_80 cubin, sm_90 cubin, compute_90 PTX]"
        );
    }

    #[test]
    fn a_truncated_fat_binary_is_a_problem_not_a_panic() {
        let bytes = fatbin(&[(2, 90, &[1, 2, 3])]);
        let image = parse_image(&bytes[..bytes.len() - 4]);
        assert_eq!(image.format, ImageFormat::Fatbin);
        assert!(image.entries.is_empty() && image.problem.is_some());
        let mut zero_sized = fatbin(&[(2, 90, &[])]);
        zero_sized[16 + 4..16 + 8].copy_from_slice(&0u32.to_le_bytes());
        assert!(fatbin_entries(&zero_sized).is_err());
    }

    #[test]
    fn device_targets_and_jit_follow_the_image() {
        let device = Sm::new(9, 0);
        let ptx90 = parse_image(PTX_SM90.as_bytes());
        let ptx70 = parse_image(b".version 7.0\n.target sm_70\n");
        let cubin90 = parse_image(&elf(8, 0x0600_5a04));
        let cubin80 = parse_image(&elf(7, 0x0050_0550));
        assert!(ptx90.targets_device(device) && !ptx70.targets_device(device));
        assert!(cubin90.targets_device(device) && !cubin80.targets_device(device));
        assert_eq!(ptx70.needs_jit(device), Some(true));
        assert_eq!(cubin90.needs_jit(device), Some(false));
        let c = elf(8, 0x0600_5a04);
        let native = parse_image(&fatbin(&[(2, 90, &c), (1, 90, b"x")]));
        let jit = parse_image(&fatbin(&[(2, 80, &c), (1, 80, b"x")]));
        let neither = parse_image(&fatbin(&[(2, 100, &c), (1, 100, b"x")]));
        assert_eq!(native.needs_jit(device), Some(false));
        assert!(native.targets_device(device));
        assert_eq!(jit.needs_jit(device), Some(true));
        assert!(!jit.targets_device(device));
        assert_eq!(neither.needs_jit(device), Some(false));
        assert_eq!(ModuleImage::unknown("x").needs_jit(device), None);
        assert!(!ModuleImage::unknown("x").targets_device(device));
    }

    #[test]
    fn images_are_read_through_pointers_as_the_driver_is_handed_them() {
        let ptx = std::ffi::CString::new(PTX_SM90).unwrap();
        // SAFETY: a NUL-terminated PTX string, alive for the call.
        let image = unsafe { image_at(ptx.as_ptr().cast()) };
        assert_eq!(image.targets(), vec![Sm::new(9, 0)]);
        let cubin = elf(8, 0x0600_5a04);
        // SAFETY: a 64-byte ELF header, all that is read of a cubin.
        let image = unsafe { image_at(cubin.as_ptr()) };
        assert_eq!(
            (image.format, image.bytes),
            (ImageFormat::Cubin, Some(0x200 + 192))
        );
        let fat = fatbin(&[(2, 90, &cubin)]);
        // SAFETY: a whole fat binary.
        let image = unsafe { image_at(fat.as_ptr()) };
        assert_eq!(image.targets(), vec![Sm::new(9, 0)]);
        let mut wrapper = Vec::new();
        wrapper.extend_from_slice(&FATBIN_WRAPPER_MAGIC.to_le_bytes());
        wrapper.extend_from_slice(&1u32.to_le_bytes());
        wrapper.extend_from_slice(&(fat.as_ptr() as usize).to_le_bytes());
        wrapper.extend_from_slice(&0usize.to_le_bytes());
        // SAFETY: a wrapper whose data pointer is the fat binary above.
        let image = unsafe { image_at(wrapper.as_ptr()) };
        assert_eq!(image.targets(), vec![Sm::new(9, 0)]);
        for short in [c"\x7f", c""] {
            // SAFETY: one-byte and empty C strings: reading stops at the NUL.
            let image = unsafe { image_at(short.as_ptr().cast()) };
            assert_eq!(image.format, ImageFormat::Unknown);
        }
        // SAFETY: a null pointer is allowed.
        assert!(unsafe { image_at(std::ptr::null()) }.problem.is_some());
    }
}
