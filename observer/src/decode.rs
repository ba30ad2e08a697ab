//! CUPTI's driver-API callbacks decoded into events: which driver calls the
//! observer subscribes to and what it reads of each one's parameters.
//!
//! Every read goes through the parameters struct CUPTI generates for the
//! call's callback id (`cuModuleLoadData_params` for
//! `CUPTI_DRIVER_TRACE_CBID_cuModuleLoadData`, ...); each `match` arm pairs an
//! id with its own struct. Fields are read one by one through the raw pointer,
//! never as a reference to the whole struct, and enum-typed fields are read as
//! their `u32`, so a value this build does not know is not undefined
//! behaviour.

use std::ffi::{c_char, c_void, CStr};
use std::path::Path;

use cudarc::cupti::sys::{self as cupti, CUpti_driver_api_trace_cbid as Cbid};
use cudarc::driver::sys as cu;

use crate::event::{Direction, EventKind, Memory, Outputs, SyncOn};
use crate::image::{cubin_sm, image_at, image_in_file, parse_image, ModuleImage};

macro_rules! cbids {
    ($($name:ident = $variant:ident,)*) => {
        $(pub(crate) const $name: u32 = Cbid::$variant as u32;)*
        /// Every driver call the observer subscribes to.
        pub(crate) const OBSERVED: &[u32] = &[$($name),*];
    };
}

cbids! {
    MODULE_LOAD = CUPTI_DRIVER_TRACE_CBID_cuModuleLoad,
    MODULE_LOAD_DATA = CUPTI_DRIVER_TRACE_CBID_cuModuleLoadData,
    MODULE_LOAD_DATA_EX = CUPTI_DRIVER_TRACE_CBID_cuModuleLoadDataEx,
    MODULE_LOAD_FAT_BINARY = CUPTI_DRIVER_TRACE_CBID_cuModuleLoadFatBinary,
    LIBRARY_LOAD_DATA = CUPTI_DRIVER_TRACE_CBID_cuLibraryLoadData,
    LIBRARY_LOAD_FROM_FILE = CUPTI_DRIVER_TRACE_CBID_cuLibraryLoadFromFile,
    LINK_ADD_DATA_V2 = CUPTI_DRIVER_TRACE_CBID_cuLinkAddData_v2,
    LINK_ADD_FILE_V2 = CUPTI_DRIVER_TRACE_CBID_cuLinkAddFile_v2,
    MEM_ALLOC_V2 = CUPTI_DRIVER_TRACE_CBID_cuMemAlloc_v2,
    MEM_ALLOC_ASYNC = CUPTI_DRIVER_TRACE_CBID_cuMemAllocAsync,
    MEM_ALLOC_ASYNC_PTSZ = CUPTI_DRIVER_TRACE_CBID_cuMemAllocAsync_ptsz,
    MEM_ALLOC_FROM_POOL_ASYNC = CUPTI_DRIVER_TRACE_CBID_cuMemAllocFromPoolAsync,
    MEM_ALLOC_FROM_POOL_ASYNC_PTSZ = CUPTI_DRIVER_TRACE_CBID_cuMemAllocFromPoolAsync_ptsz,
    MEM_ALLOC_MANAGED = CUPTI_DRIVER_TRACE_CBID_cuMemAllocManaged,
    MEM_ALLOC_PITCH_V2 = CUPTI_DRIVER_TRACE_CBID_cuMemAllocPitch_v2,
    MEM_CREATE = CUPTI_DRIVER_TRACE_CBID_cuMemCreate,
    MEM_HOST_ALLOC = CUPTI_DRIVER_TRACE_CBID_cuMemHostAlloc,
    MEM_ALLOC_HOST_V2 = CUPTI_DRIVER_TRACE_CBID_cuMemAllocHost_v2,
    MEMCPY_HTOD_V2 = CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoD_v2,
    MEMCPY_HTOD_V2_PTDS = CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoD_v2_ptds,
    MEMCPY_HTOD_ASYNC_V2 = CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoDAsync_v2,
    MEMCPY_HTOD_ASYNC_V2_PTSZ = CUPTI_DRIVER_TRACE_CBID_cuMemcpyHtoDAsync_v2_ptsz,
    MEMCPY_DTOH_V2 = CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoH_v2,
    MEMCPY_DTOH_V2_PTDS = CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoH_v2_ptds,
    MEMCPY_DTOH_ASYNC_V2 = CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoHAsync_v2,
    MEMCPY_DTOH_ASYNC_V2_PTSZ = CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoHAsync_v2_ptsz,
    MEMCPY = CUPTI_DRIVER_TRACE_CBID_cuMemcpy,
    MEMCPY_PTDS = CUPTI_DRIVER_TRACE_CBID_cuMemcpy_ptds,
    MEMCPY_ASYNC = CUPTI_DRIVER_TRACE_CBID_cuMemcpyAsync,
    MEMCPY_ASYNC_PTSZ = CUPTI_DRIVER_TRACE_CBID_cuMemcpyAsync_ptsz,
    MEMCPY_2D_V2 = CUPTI_DRIVER_TRACE_CBID_cuMemcpy2D_v2,
    MEMCPY_2D_V2_PTDS = CUPTI_DRIVER_TRACE_CBID_cuMemcpy2D_v2_ptds,
    MEMCPY_2D_UNALIGNED_V2 = CUPTI_DRIVER_TRACE_CBID_cuMemcpy2DUnaligned_v2,
    MEMCPY_2D_UNALIGNED_V2_PTDS = CUPTI_DRIVER_TRACE_CBID_cuMemcpy2DUnaligned_v2_ptds,
    MEMCPY_2D_ASYNC_V2 = CUPTI_DRIVER_TRACE_CBID_cuMemcpy2DAsync_v2,
    MEMCPY_2D_ASYNC_V2_PTSZ = CUPTI_DRIVER_TRACE_CBID_cuMemcpy2DAsync_v2_ptsz,
    MEMCPY_3D_V2 = CUPTI_DRIVER_TRACE_CBID_cuMemcpy3D_v2,
    MEMCPY_3D_V2_PTDS = CUPTI_DRIVER_TRACE_CBID_cuMemcpy3D_v2_ptds,
    MEMCPY_3D_ASYNC_V2 = CUPTI_DRIVER_TRACE_CBID_cuMemcpy3DAsync_v2,
    MEMCPY_3D_ASYNC_V2_PTSZ = CUPTI_DRIVER_TRACE_CBID_cuMemcpy3DAsync_v2_ptsz,
    CTX_SYNCHRONIZE = CUPTI_DRIVER_TRACE_CBID_cuCtxSynchronize,
    CTX_SYNCHRONIZE_V2 = CUPTI_DRIVER_TRACE_CBID_cuCtxSynchronize_v2,
    STREAM_SYNCHRONIZE = CUPTI_DRIVER_TRACE_CBID_cuStreamSynchronize,
    STREAM_SYNCHRONIZE_PTSZ = CUPTI_DRIVER_TRACE_CBID_cuStreamSynchronize_ptsz,
    EVENT_SYNCHRONIZE = CUPTI_DRIVER_TRACE_CBID_cuEventSynchronize,
    LAUNCH_KERNEL = CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel,
    LAUNCH_KERNEL_PTSZ = CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz,
    LAUNCH_KERNEL_EX = CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx,
    LAUNCH_KERNEL_EX_PTSZ = CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz,
    LAUNCH_COOPERATIVE_KERNEL = CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel,
    LAUNCH_COOPERATIVE_KERNEL_PTSZ = CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz,
    STREAM_BEGIN_CAPTURE = CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture,
    STREAM_BEGIN_CAPTURE_PTSZ = CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture_ptsz,
    STREAM_BEGIN_CAPTURE_V2 = CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture_v2,
    STREAM_BEGIN_CAPTURE_V2_PTSZ = CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture_v2_ptsz,
    STREAM_BEGIN_CAPTURE_TO_GRAPH = CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCaptureToGraph,
    STREAM_BEGIN_CAPTURE_TO_GRAPH_PTSZ = CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCaptureToGraph_ptsz,
    STREAM_END_CAPTURE = CUPTI_DRIVER_TRACE_CBID_cuStreamEndCapture,
    STREAM_END_CAPTURE_PTSZ = CUPTI_DRIVER_TRACE_CBID_cuStreamEndCapture_ptsz,
    GRAPH_INSTANTIATE = CUPTI_DRIVER_TRACE_CBID_cuGraphInstantiate,
    GRAPH_INSTANTIATE_V2 = CUPTI_DRIVER_TRACE_CBID_cuGraphInstantiate_v2,
    GRAPH_INSTANTIATE_WITH_FLAGS = CUPTI_DRIVER_TRACE_CBID_cuGraphInstantiateWithFlags,
    GRAPH_INSTANTIATE_WITH_PARAMS = CUPTI_DRIVER_TRACE_CBID_cuGraphInstantiateWithParams,
    GRAPH_INSTANTIATE_WITH_PARAMS_PTSZ = CUPTI_DRIVER_TRACE_CBID_cuGraphInstantiateWithParams_ptsz,
    GRAPH_LAUNCH = CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch,
    GRAPH_LAUNCH_PTSZ = CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch_ptsz,
}

/// The resource callback that a module was loaded.
pub(crate) const MODULE_LOADED: u32 =
    cupti::CUpti_CallbackIdResource::CUPTI_CBID_RESOURCE_MODULE_LOADED as u32;

/// Reads one field of the parameters struct `$ty` of the call being decoded.
macro_rules! arg {
    ($params:expr, $ty:ident, $field:ident) => {
        // SAFETY: `$params` is the parameters struct CUPTI passes for this
        // callback id, which the calling `match` arm pairs with `$ty`; it is
        // valid for the duration of the callback.
        unsafe { (*$params.cast::<cupti::$ty>()).$field }
    };
}

/// Reads an enum-typed field as the `u32` it is in C.
macro_rules! arg_u32 {
    ($params:expr, $ty:ident, $field:ident) => {
        // SAFETY: as in `arg!`; a C enum field is an `unsigned int`.
        unsafe {
            std::ptr::addr_of!((*$params.cast::<cupti::$ty>()).$field)
                .cast::<u32>()
                .read()
        }
    };
}

fn handle<T>(pointer: *mut T) -> u64 {
    pointer as usize as u64
}

/// # Safety
/// `text` is null or a NUL-terminated string valid for the callback.
unsafe fn c_string(text: *const c_char) -> Option<String> {
    if text.is_null() {
        return None;
    }
    // SAFETY: per this function's contract.
    let text = unsafe { CStr::from_ptr(text) };
    Some(text.to_string_lossy().into_owned())
}

/// Whether the call begins or ends a stream capture: those are followed even
/// while no region records.
pub(crate) fn is_capture(cbid: u32) -> bool {
    matches!(
        cbid,
        STREAM_BEGIN_CAPTURE
            | STREAM_BEGIN_CAPTURE_PTSZ
            | STREAM_BEGIN_CAPTURE_V2
            | STREAM_BEGIN_CAPTURE_V2_PTSZ
            | STREAM_BEGIN_CAPTURE_TO_GRAPH
            | STREAM_BEGIN_CAPTURE_TO_GRAPH_PTSZ
            | STREAM_END_CAPTURE
            | STREAM_END_CAPTURE_PTSZ
    )
}

/// The event for a driver call at its entry. `symbol`: CUPTI's `symbolName`
/// (a launch's kernel). `driver`: whether the driver may be asked about
/// pointers (for unified-address copies).
///
/// # Safety
/// `params` is the `functionParams` of a driver-API callback for `cbid` and
/// `symbol` its `symbolName`, both valid for the callback; the call has not
/// returned yet (its image and arguments are as the driver reads them).
pub(crate) unsafe fn entry(
    cbid: u32,
    params: *const c_void,
    symbol: *const c_char,
    driver: bool,
) -> Option<EventKind> {
    if cbid == CTX_SYNCHRONIZE {
        return Some(EventKind::Sync {
            on: SyncOn::Context,
            handle: 0,
        });
    }
    if params.is_null() {
        return None;
    }
    // SAFETY: forwarded from this function's contract.
    unsafe {
        module_load(cbid, params)
            .or_else(|| alloc(cbid, params))
            .or_else(|| copy(cbid, params, driver))
            .or_else(|| sync_or_graph(cbid, params))
            .or_else(|| launch(cbid, params, symbol))
    }
}

fn load(image: ModuleImage, file: Option<String>) -> EventKind {
    EventKind::ModuleLoad {
        image,
        file,
        handle: None,
    }
}

/// The same code as an input to the JIT linker.
fn linked(load: EventKind) -> EventKind {
    match load {
        EventKind::ModuleLoad { image, file, .. } => EventKind::LinkInput { image, file },
        other => other,
    }
}

/// # Safety
/// `path` is null or a C string.
unsafe fn load_file(path: *const c_char) -> EventKind {
    // SAFETY: per this function's contract.
    match unsafe { c_string(path) } {
        Some(path) => load(image_in_file(Path::new(&path)), Some(path)),
        None => load(ModuleImage::unknown("null file name"), None),
    }
}

/// # Safety
/// As [`entry`].
unsafe fn module_load(cbid: u32, p: *const c_void) -> Option<EventKind> {
    let image = |ptr: *const c_void| {
        // SAFETY: the image argument of a load call in progress (this
        // function's contract), as the driver is about to read it.
        load(unsafe { image_at(ptr.cast()) }, None)
    };
    let file = |path: *const c_char| {
        // SAFETY: the file-name argument of a load call: null or a C string.
        unsafe { load_file(path) }
    };
    Some(match cbid {
        MODULE_LOAD => file(arg!(p, cuModuleLoad_params, fname)),
        MODULE_LOAD_DATA => image(arg!(p, cuModuleLoadData_params, image)),
        MODULE_LOAD_DATA_EX => image(arg!(p, cuModuleLoadDataEx_params, image)),
        MODULE_LOAD_FAT_BINARY => image(arg!(p, cuModuleLoadFatBinary_params, fatCubin)),
        LIBRARY_LOAD_DATA => image(arg!(p, cuLibraryLoadData_params, code)),
        LIBRARY_LOAD_FROM_FILE => file(arg!(p, cuLibraryLoadFromFile_params, fileName)),
        LINK_ADD_FILE_V2 => linked(file(arg!(p, cuLinkAddFile_v2_params, path))),
        LINK_ADD_DATA_V2 => {
            let data = arg!(p, cuLinkAddData_v2_params, data);
            let size = arg!(p, cuLinkAddData_v2_params, size);
            let image = if data.is_null() || size == 0 || size > isize::MAX as usize {
                ModuleImage::unknown("empty link input")
            } else {
                // SAFETY: cuLinkAddData's input is `size` bytes at `data`.
                parse_image(unsafe { std::slice::from_raw_parts(data.cast::<u8>(), size) })
            };
            EventKind::LinkInput { image, file: None }
        }
        _ => return None,
    })
}

fn allocation(bytes: usize, memory: Memory, stream: Option<u64>) -> EventKind {
    EventKind::Alloc {
        bytes: bytes as u64,
        memory,
        stream,
        address: None,
    }
}

/// # Safety
/// As [`entry`].
unsafe fn alloc(cbid: u32, p: *const c_void) -> Option<EventKind> {
    let on = |stream: cu::CUstream| Some(handle(stream));
    Some(match cbid {
        MEM_ALLOC_V2 => allocation(
            arg!(p, cuMemAlloc_v2_params, bytesize),
            Memory::Device,
            None,
        ),
        MEM_ALLOC_ASYNC => allocation(
            arg!(p, cuMemAllocAsync_params, bytesize),
            Memory::Device,
            on(arg!(p, cuMemAllocAsync_params, hStream)),
        ),
        MEM_ALLOC_ASYNC_PTSZ => allocation(
            arg!(p, cuMemAllocAsync_ptsz_params, bytesize),
            Memory::Device,
            on(arg!(p, cuMemAllocAsync_ptsz_params, hStream)),
        ),
        MEM_ALLOC_FROM_POOL_ASYNC => allocation(
            arg!(p, cuMemAllocFromPoolAsync_params, bytesize),
            Memory::Device,
            on(arg!(p, cuMemAllocFromPoolAsync_params, hStream)),
        ),
        MEM_ALLOC_FROM_POOL_ASYNC_PTSZ => allocation(
            arg!(p, cuMemAllocFromPoolAsync_ptsz_params, bytesize),
            Memory::Device,
            on(arg!(p, cuMemAllocFromPoolAsync_ptsz_params, hStream)),
        ),
        MEM_ALLOC_MANAGED => allocation(
            arg!(p, cuMemAllocManaged_params, bytesize),
            Memory::Managed,
            None,
        ),
        MEM_ALLOC_PITCH_V2 => {
            let width = arg!(p, cuMemAllocPitch_v2_params, WidthInBytes);
            let height = arg!(p, cuMemAllocPitch_v2_params, Height);
            allocation(width.saturating_mul(height), Memory::Pitched, None)
        }
        MEM_CREATE => allocation(arg!(p, cuMemCreate_params, size), Memory::Physical, None),
        MEM_HOST_ALLOC => allocation(
            arg!(p, cuMemHostAlloc_params, bytesize),
            Memory::PinnedHost,
            None,
        ),
        MEM_ALLOC_HOST_V2 => allocation(
            arg!(p, cuMemAllocHost_v2_params, bytesize),
            Memory::PinnedHost,
            None,
        ),
        _ => return None,
    })
}

fn transfer(direction: Direction, bytes: usize, stream: Option<cu::CUstream>) -> EventKind {
    EventKind::Copy {
        direction,
        bytes: bytes as u64,
        asynchronous: stream.is_some(),
        stream: stream.map(handle),
    }
}

/// # Safety
/// As [`entry`].
unsafe fn copy(cbid: u32, p: *const c_void, driver: bool) -> Option<EventKind> {
    use Direction::{DeviceToHost as D2H, HostToDevice as H2D};
    Some(match cbid {
        MEMCPY_HTOD_V2 => transfer(H2D, arg!(p, cuMemcpyHtoD_v2_params, ByteCount), None),
        MEMCPY_HTOD_V2_PTDS => transfer(H2D, arg!(p, cuMemcpyHtoD_v2_ptds_params, ByteCount), None),
        MEMCPY_HTOD_ASYNC_V2 => transfer(
            H2D,
            arg!(p, cuMemcpyHtoDAsync_v2_params, ByteCount),
            Some(arg!(p, cuMemcpyHtoDAsync_v2_params, hStream)),
        ),
        MEMCPY_HTOD_ASYNC_V2_PTSZ => transfer(
            H2D,
            arg!(p, cuMemcpyHtoDAsync_v2_ptsz_params, ByteCount),
            Some(arg!(p, cuMemcpyHtoDAsync_v2_ptsz_params, hStream)),
        ),
        MEMCPY_DTOH_V2 => transfer(D2H, arg!(p, cuMemcpyDtoH_v2_params, ByteCount), None),
        MEMCPY_DTOH_V2_PTDS => transfer(D2H, arg!(p, cuMemcpyDtoH_v2_ptds_params, ByteCount), None),
        MEMCPY_DTOH_ASYNC_V2 => transfer(
            D2H,
            arg!(p, cuMemcpyDtoHAsync_v2_params, ByteCount),
            Some(arg!(p, cuMemcpyDtoHAsync_v2_params, hStream)),
        ),
        MEMCPY_DTOH_ASYNC_V2_PTSZ => transfer(
            D2H,
            arg!(p, cuMemcpyDtoHAsync_v2_ptsz_params, ByteCount),
            Some(arg!(p, cuMemcpyDtoHAsync_v2_ptsz_params, hStream)),
        ),
        // SAFETY: forwarded from this function's contract.
        _ => return unsafe { unified_copy(cbid, p, driver).or_else(|| pitched_copy(cbid, p)) },
    })
}

/// Where an address lives, asked of the driver: `Some(true)` on the device.
/// An address the driver does not know is pageable host memory.
fn on_device(address: cu::CUdeviceptr) -> bool {
    let mut memory_type: u32 = 0;
    // SAFETY: the driver writes one `CUmemorytype` (an `unsigned int`) into
    // `memory_type`; any address may be asked about.
    let answer = unsafe {
        cu::cuPointerGetAttribute(
            std::ptr::addr_of_mut!(memory_type).cast(),
            cu::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            address,
        )
    };
    let device = cu::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32;
    let unified = cu::CUmemorytype::CU_MEMORYTYPE_UNIFIED as u32;
    answer == cu::CUresult::CUDA_SUCCESS && (memory_type == device || memory_type == unified)
}

fn direction(src_on_device: bool, dst_on_device: bool) -> Direction {
    match (src_on_device, dst_on_device) {
        (false, true) => Direction::HostToDevice,
        (true, false) => Direction::DeviceToHost,
        (true, true) => Direction::DeviceToDevice,
        (false, false) => Direction::HostToHost,
    }
}

/// `cuMemcpy` and `cuMemcpyAsync` take unified addresses: the direction is
/// asked of the driver (a call CUPTI is not subscribed to, so no callback
/// recurses), or unknown where the driver cannot be asked.
///
/// # Safety
/// As [`entry`].
unsafe fn unified_copy(cbid: u32, p: *const c_void, driver: bool) -> Option<EventKind> {
    let (dst, src, bytes, stream) = match cbid {
        MEMCPY => (
            arg!(p, cuMemcpy_params, dst),
            arg!(p, cuMemcpy_params, src),
            arg!(p, cuMemcpy_params, ByteCount),
            None,
        ),
        MEMCPY_PTDS => (
            arg!(p, cuMemcpy_ptds_params, dst),
            arg!(p, cuMemcpy_ptds_params, src),
            arg!(p, cuMemcpy_ptds_params, ByteCount),
            None,
        ),
        MEMCPY_ASYNC => (
            arg!(p, cuMemcpyAsync_params, dst),
            arg!(p, cuMemcpyAsync_params, src),
            arg!(p, cuMemcpyAsync_params, ByteCount),
            Some(arg!(p, cuMemcpyAsync_params, hStream)),
        ),
        MEMCPY_ASYNC_PTSZ => (
            arg!(p, cuMemcpyAsync_ptsz_params, dst),
            arg!(p, cuMemcpyAsync_ptsz_params, src),
            arg!(p, cuMemcpyAsync_ptsz_params, ByteCount),
            Some(arg!(p, cuMemcpyAsync_ptsz_params, hStream)),
        ),
        _ => return None,
    };
    let way = if driver {
        direction(on_device(src), on_device(dst))
    } else {
        Direction::Unknown
    };
    Some(transfer(way, bytes, stream))
}

fn memory_direction(src: u32, dst: u32) -> Direction {
    let host = cu::CUmemorytype::CU_MEMORYTYPE_HOST as u32;
    let device = cu::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32;
    match (src, dst) {
        (s, d) if s == host && d == device => Direction::HostToDevice,
        (s, d) if s == device && d == host => Direction::DeviceToHost,
        (s, d) if s == device && d == device => Direction::DeviceToDevice,
        (s, d) if s == host && d == host => Direction::HostToHost,
        _ => Direction::Unknown,
    }
}

/// # Safety
/// `copy` is null or points to a `$ty` descriptor valid for the callback.
macro_rules! described {
    ($copy:expr, $ty:ident, $depth:expr) => {{
        let copy = $copy;
        if copy.is_null() {
            return None;
        }
        // SAFETY: the copy descriptor the call was handed, valid during it;
        // the memory-type fields are C enums read as `u32`.
        let (src, dst, width, height) = unsafe {
            (
                std::ptr::addr_of!((*copy).srcMemoryType)
                    .cast::<u32>()
                    .read(),
                std::ptr::addr_of!((*copy).dstMemoryType)
                    .cast::<u32>()
                    .read(),
                (*copy).WidthInBytes,
                (*copy).Height,
            )
        };
        let depth: fn(*const cu::$ty) -> usize = $depth;
        (
            memory_direction(src, dst),
            width.saturating_mul(height).saturating_mul(depth(copy)),
        )
    }};
}

/// 2D and 3D copies describe their ends' memory types.
///
/// # Safety
/// As [`entry`].
unsafe fn pitched_copy(cbid: u32, p: *const c_void) -> Option<EventKind> {
    // SAFETY: forwarded from this function's contract.
    unsafe { copy_2d(cbid, p).or_else(|| copy_3d(cbid, p)) }
}

/// # Safety
/// As [`entry`].
unsafe fn copy_2d(cbid: u32, p: *const c_void) -> Option<EventKind> {
    let flat = |_: *const cu::CUDA_MEMCPY2D| 1usize;
    let (copy, stream) = match cbid {
        MEMCPY_2D_V2 => (
            described!(arg!(p, cuMemcpy2D_v2_params, pCopy), CUDA_MEMCPY2D, flat),
            None,
        ),
        MEMCPY_2D_V2_PTDS => (
            described!(
                arg!(p, cuMemcpy2D_v2_ptds_params, pCopy),
                CUDA_MEMCPY2D,
                flat
            ),
            None,
        ),
        MEMCPY_2D_UNALIGNED_V2 => (
            described!(
                arg!(p, cuMemcpy2DUnaligned_v2_params, pCopy),
                CUDA_MEMCPY2D,
                flat
            ),
            None,
        ),
        MEMCPY_2D_UNALIGNED_V2_PTDS => (
            described!(
                arg!(p, cuMemcpy2DUnaligned_v2_ptds_params, pCopy),
                CUDA_MEMCPY2D,
                flat
            ),
            None,
        ),
        MEMCPY_2D_ASYNC_V2 => (
            described!(
                arg!(p, cuMemcpy2DAsync_v2_params, pCopy),
                CUDA_MEMCPY2D,
                flat
            ),
            Some(arg!(p, cuMemcpy2DAsync_v2_params, hStream)),
        ),
        MEMCPY_2D_ASYNC_V2_PTSZ => (
            described!(
                arg!(p, cuMemcpy2DAsync_v2_ptsz_params, pCopy),
                CUDA_MEMCPY2D,
                flat
            ),
            Some(arg!(p, cuMemcpy2DAsync_v2_ptsz_params, hStream)),
        ),
        _ => return None,
    };
    Some(transfer(copy.0, copy.1, stream))
}

/// # Safety
/// As [`entry`].
unsafe fn copy_3d(cbid: u32, p: *const c_void) -> Option<EventKind> {
    // SAFETY: a 3D descriptor passed the null check in `described!`.
    let deep = |c: *const cu::CUDA_MEMCPY3D| unsafe { (*c).Depth };
    let (copy, stream) = match cbid {
        MEMCPY_3D_V2 => (
            described!(arg!(p, cuMemcpy3D_v2_params, pCopy), CUDA_MEMCPY3D, deep),
            None,
        ),
        MEMCPY_3D_V2_PTDS => (
            described!(
                arg!(p, cuMemcpy3D_v2_ptds_params, pCopy),
                CUDA_MEMCPY3D,
                deep
            ),
            None,
        ),
        MEMCPY_3D_ASYNC_V2 => (
            described!(
                arg!(p, cuMemcpy3DAsync_v2_params, pCopy),
                CUDA_MEMCPY3D,
                deep
            ),
            Some(arg!(p, cuMemcpy3DAsync_v2_params, hStream)),
        ),
        MEMCPY_3D_ASYNC_V2_PTSZ => (
            described!(
                arg!(p, cuMemcpy3DAsync_v2_ptsz_params, pCopy),
                CUDA_MEMCPY3D,
                deep
            ),
            Some(arg!(p, cuMemcpy3DAsync_v2_ptsz_params, hStream)),
        ),
        _ => return None,
    };
    Some(transfer(copy.0, copy.1, stream))
}

fn capture_begin(stream: cu::CUstream, mode: Option<u32>) -> EventKind {
    EventKind::CaptureBegin {
        stream: handle(stream),
        mode,
    }
}

fn instantiate(graph: cu::CUgraph) -> EventKind {
    EventKind::GraphInstantiate {
        graph: handle(graph),
        exec: None,
    }
}

/// # Safety
/// As [`entry`].
unsafe fn sync_or_graph(cbid: u32, p: *const c_void) -> Option<EventKind> {
    // SAFETY: forwarded from this function's contract.
    unsafe {
        sync(cbid, p)
            .or_else(|| capture(cbid, p))
            .or_else(|| graph(cbid, p))
    }
}

/// # Safety
/// As [`entry`].
unsafe fn sync(cbid: u32, p: *const c_void) -> Option<EventKind> {
    let sync = |on, handle| EventKind::Sync { on, handle };
    Some(match cbid {
        CTX_SYNCHRONIZE_V2 => sync(
            SyncOn::Context,
            handle(arg!(p, cuCtxSynchronize_v2_params, ctx)),
        ),
        STREAM_SYNCHRONIZE => sync(
            SyncOn::Stream,
            handle(arg!(p, cuStreamSynchronize_params, hStream)),
        ),
        STREAM_SYNCHRONIZE_PTSZ => sync(
            SyncOn::Stream,
            handle(arg!(p, cuStreamSynchronize_ptsz_params, hStream)),
        ),
        EVENT_SYNCHRONIZE => sync(
            SyncOn::Event,
            handle(arg!(p, cuEventSynchronize_params, hEvent)),
        ),
        _ => return None,
    })
}

/// # Safety
/// As [`entry`].
unsafe fn capture(cbid: u32, p: *const c_void) -> Option<EventKind> {
    Some(match cbid {
        STREAM_BEGIN_CAPTURE => capture_begin(arg!(p, cuStreamBeginCapture_params, hStream), None),
        STREAM_BEGIN_CAPTURE_PTSZ => {
            capture_begin(arg!(p, cuStreamBeginCapture_ptsz_params, hStream), None)
        }
        STREAM_BEGIN_CAPTURE_V2 => capture_begin(
            arg!(p, cuStreamBeginCapture_v2_params, hStream),
            Some(arg_u32!(p, cuStreamBeginCapture_v2_params, mode)),
        ),
        STREAM_BEGIN_CAPTURE_V2_PTSZ => capture_begin(
            arg!(p, cuStreamBeginCapture_v2_ptsz_params, hStream),
            Some(arg_u32!(p, cuStreamBeginCapture_v2_ptsz_params, mode)),
        ),
        STREAM_BEGIN_CAPTURE_TO_GRAPH => capture_begin(
            arg!(p, cuStreamBeginCaptureToGraph_params, hStream),
            Some(arg_u32!(p, cuStreamBeginCaptureToGraph_params, mode)),
        ),
        STREAM_BEGIN_CAPTURE_TO_GRAPH_PTSZ => capture_begin(
            arg!(p, cuStreamBeginCaptureToGraph_ptsz_params, hStream),
            Some(arg_u32!(p, cuStreamBeginCaptureToGraph_ptsz_params, mode)),
        ),
        STREAM_END_CAPTURE => EventKind::CaptureEnd {
            stream: handle(arg!(p, cuStreamEndCapture_params, hStream)),
            graph: None,
        },
        STREAM_END_CAPTURE_PTSZ => EventKind::CaptureEnd {
            stream: handle(arg!(p, cuStreamEndCapture_ptsz_params, hStream)),
            graph: None,
        },
        _ => return None,
    })
}

/// # Safety
/// As [`entry`].
unsafe fn graph(cbid: u32, p: *const c_void) -> Option<EventKind> {
    Some(match cbid {
        GRAPH_INSTANTIATE => instantiate(arg!(p, cuGraphInstantiate_params, hGraph)),
        GRAPH_INSTANTIATE_V2 => instantiate(arg!(p, cuGraphInstantiate_v2_params, hGraph)),
        GRAPH_INSTANTIATE_WITH_FLAGS => {
            instantiate(arg!(p, cuGraphInstantiateWithFlags_params, hGraph))
        }
        GRAPH_INSTANTIATE_WITH_PARAMS => {
            instantiate(arg!(p, cuGraphInstantiateWithParams_params, hGraph))
        }
        GRAPH_INSTANTIATE_WITH_PARAMS_PTSZ => {
            instantiate(arg!(p, cuGraphInstantiateWithParams_ptsz_params, hGraph))
        }
        // cuGraphLaunch's parameter struct names the executable graph `hGraph`.
        GRAPH_LAUNCH => EventKind::GraphLaunch {
            exec: handle(arg!(p, cuGraphLaunch_params, hGraph)),
            stream: handle(arg!(p, cuGraphLaunch_params, hStream)),
        },
        GRAPH_LAUNCH_PTSZ => EventKind::GraphLaunch {
            exec: handle(arg!(p, cuGraphLaunch_ptsz_params, hGraphExec)),
            stream: handle(arg!(p, cuGraphLaunch_ptsz_params, hStream)),
        },
        _ => return None,
    })
}

macro_rules! dims {
    ($p:expr, $ty:ident) => {
        (
            [
                arg!($p, $ty, gridDimX),
                arg!($p, $ty, gridDimY),
                arg!($p, $ty, gridDimZ),
            ],
            [
                arg!($p, $ty, blockDimX),
                arg!($p, $ty, blockDimY),
                arg!($p, $ty, blockDimZ),
            ],
            handle(arg!($p, $ty, hStream)),
        )
    };
}

/// # Safety
/// As [`entry`].
unsafe fn launch(cbid: u32, p: *const c_void, symbol: *const c_char) -> Option<EventKind> {
    let configured = |config: *const cu::CUlaunchConfig| {
        // SAFETY: cuLaunchKernelEx's configuration, valid during the call
        // (checked non-null below).
        let c = unsafe { &*config };
        (
            [c.gridDimX, c.gridDimY, c.gridDimZ],
            [c.blockDimX, c.blockDimY, c.blockDimZ],
            handle(c.hStream),
        )
    };
    let (grid, block, stream) = match cbid {
        LAUNCH_KERNEL => dims!(p, cuLaunchKernel_params),
        LAUNCH_KERNEL_PTSZ => dims!(p, cuLaunchKernel_ptsz_params),
        LAUNCH_COOPERATIVE_KERNEL => dims!(p, cuLaunchCooperativeKernel_params),
        LAUNCH_COOPERATIVE_KERNEL_PTSZ => dims!(p, cuLaunchCooperativeKernel_ptsz_params),
        LAUNCH_KERNEL_EX | LAUNCH_KERNEL_EX_PTSZ => {
            let config = if cbid == LAUNCH_KERNEL_EX {
                arg!(p, cuLaunchKernelEx_params, config)
            } else {
                arg!(p, cuLaunchKernelEx_ptsz_params, config)
            };
            if config.is_null() {
                return None;
            }
            configured(config)
        }
        _ => return None,
    };
    Some(EventKind::KernelLaunch {
        // SAFETY: CUPTI's `symbolName`: null or a C string for the callback.
        name: unsafe { c_string(symbol) },
        stream,
        grid,
        block,
    })
}

/// Reads an output argument the driver wrote on success.
///
/// # Safety
/// `out` is null or an output argument of a call that returned successfully.
unsafe fn written<T: Copy>(out: *const T) -> Option<T> {
    // SAFETY: per this function's contract.
    (!out.is_null()).then(|| unsafe { out.read() })
}

/// Reads an output argument of the call being decoded.
macro_rules! out {
    ($params:expr, $ty:ident, $field:ident) => {{
        let out = arg!($params, $ty, $field);
        // SAFETY: an output argument of a call that returned CUDA_SUCCESS
        // (the contract of `outputs`): null or written by the driver.
        unsafe { written(out) }
    }};
}

/// What a call that returned `CUDA_SUCCESS` wrote back.
///
/// # Safety
/// `params` is the `functionParams` of the exit callback of a driver call for
/// `cbid` that returned `CUDA_SUCCESS`.
pub(crate) unsafe fn outputs(cbid: u32, p: *const c_void) -> Outputs {
    if p.is_null() {
        return Outputs::default();
    }
    let handle_out = match cbid {
        MODULE_LOAD => out!(p, cuModuleLoad_params, module).map(handle),
        MODULE_LOAD_DATA => out!(p, cuModuleLoadData_params, module).map(handle),
        MODULE_LOAD_DATA_EX => out!(p, cuModuleLoadDataEx_params, module).map(handle),
        MODULE_LOAD_FAT_BINARY => out!(p, cuModuleLoadFatBinary_params, module).map(handle),
        LIBRARY_LOAD_DATA => out!(p, cuLibraryLoadData_params, library).map(handle),
        LIBRARY_LOAD_FROM_FILE => out!(p, cuLibraryLoadFromFile_params, library).map(handle),
        MEM_ALLOC_V2 => out!(p, cuMemAlloc_v2_params, dptr),
        MEM_ALLOC_ASYNC => out!(p, cuMemAllocAsync_params, dptr),
        MEM_ALLOC_ASYNC_PTSZ => out!(p, cuMemAllocAsync_ptsz_params, dptr),
        MEM_ALLOC_FROM_POOL_ASYNC => out!(p, cuMemAllocFromPoolAsync_params, dptr),
        MEM_ALLOC_FROM_POOL_ASYNC_PTSZ => out!(p, cuMemAllocFromPoolAsync_ptsz_params, dptr),
        MEM_ALLOC_MANAGED => out!(p, cuMemAllocManaged_params, dptr),
        MEM_ALLOC_PITCH_V2 => out!(p, cuMemAllocPitch_v2_params, dptr),
        MEM_CREATE => out!(p, cuMemCreate_params, handle),
        MEM_HOST_ALLOC => out!(p, cuMemHostAlloc_params, pp).map(handle),
        MEM_ALLOC_HOST_V2 => out!(p, cuMemAllocHost_v2_params, pp).map(handle),
        STREAM_END_CAPTURE => out!(p, cuStreamEndCapture_params, phGraph).map(handle),
        STREAM_END_CAPTURE_PTSZ => out!(p, cuStreamEndCapture_ptsz_params, phGraph).map(handle),
        GRAPH_INSTANTIATE => out!(p, cuGraphInstantiate_params, phGraphExec).map(handle),
        GRAPH_INSTANTIATE_V2 => out!(p, cuGraphInstantiate_v2_params, phGraphExec).map(handle),
        GRAPH_INSTANTIATE_WITH_FLAGS => {
            out!(p, cuGraphInstantiateWithFlags_params, phGraphExec).map(handle)
        }
        GRAPH_INSTANTIATE_WITH_PARAMS => {
            out!(p, cuGraphInstantiateWithParams_params, phGraphExec).map(handle)
        }
        GRAPH_INSTANTIATE_WITH_PARAMS_PTSZ => {
            out!(p, cuGraphInstantiateWithParams_ptsz_params, phGraphExec).map(handle)
        }
        _ => None,
    };
    let bytes = if cbid == MEM_ALLOC_PITCH_V2 {
        let height = arg!(p, cuMemAllocPitch_v2_params, Height);
        out!(p, cuMemAllocPitch_v2_params, pPitch).map(|pitch| pitch.saturating_mul(height) as u64)
    } else {
        None
    };
    Outputs {
        handle: handle_out,
        bytes,
    }
}

/// CUPTI's notification that a module was loaded, with the cubin the driver
/// loaded (for PTX: the JIT's output).
///
/// # Safety
/// `data` is the `cbdata` of a `CUPTI_CBID_RESOURCE_MODULE_LOADED` callback.
pub(crate) unsafe fn module_loaded(data: *const cupti::CUpti_ResourceData) -> Option<EventKind> {
    if data.is_null() {
        return None;
    }
    // SAFETY: for module callbacks the descriptor is a CUpti_ModuleResourceData.
    let module = unsafe {
        (*data)
            .resourceDescriptor
            .cast::<cupti::CUpti_ModuleResourceData>()
    };
    if module.is_null() {
        return None;
    }
    // SAFETY: as above; the cubin is `cubinSize` bytes at `pCubin` during the
    // callback, of which at most the 64-byte ELF header is read.
    let (module_id, size, cubin) =
        unsafe { ((*module).moduleId, (*module).cubinSize, (*module).pCubin) };
    let header = (!cubin.is_null() && size >= 64)
        // SAFETY: as above.
        .then(|| unsafe { std::slice::from_raw_parts(cubin.cast::<u8>(), 64) });
    Some(EventKind::ModuleLoaded {
        module_id,
        cubin_bytes: size as u64,
        cubin: header.and_then(cubin_sm),
    })
}

#[cfg(test)]
mod tests {
    use std::ffi::CString;

    use super::*;
    use crate::image::tests::elf;
    use crate::sm::Sm;

    fn params<T>(p: &T) -> *const c_void {
        (p as *const T).cast()
    }

    fn stream(address: usize) -> cu::CUstream {
        address as cu::CUstream
    }

    /// Decodes an entry as the callback does, without a driver to ask.
    fn decoded<T>(cbid: u32, p: &T) -> Option<EventKind> {
        // SAFETY: `p` is the parameters struct of `cbid`, built by the test.
        unsafe { entry(cbid, params(p), std::ptr::null(), false) }
    }

    #[test]
    fn a_module_load_reads_the_image_it_is_handed() {
        let ptx = CString::new(".version 8.8\n.target sm_90\n.address_size 64\n").unwrap();
        let mut module: cu::CUmodule = std::ptr::null_mut();
        let p = cupti::cuModuleLoadData_params {
            module: &mut module,
            image: ptx.as_ptr().cast(),
        };
        let Some(EventKind::ModuleLoad { image, .. }) = decoded(MODULE_LOAD_DATA, &p) else {
            panic!("not a module load");
        };
        assert_eq!(image.targets(), vec![Sm::new(9, 0)]);
        let mut cubin = elf(8, 0x0600_5a04);
        cubin.resize(0x200 + 3 * 64, 0);
        let link = cupti::cuLinkAddData_v2_params {
            state: std::ptr::null_mut(),
            type_: cu::CUjitInputType::CU_JIT_INPUT_CUBIN,
            data: cubin.as_mut_ptr().cast(),
            size: cubin.len(),
            name: std::ptr::null(),
            numOptions: 0,
            options: std::ptr::null_mut(),
            optionValues: std::ptr::null_mut(),
        };
        let Some(EventKind::LinkInput { image, .. }) = decoded(LINK_ADD_DATA_V2, &link) else {
            panic!("not a link input");
        };
        assert_eq!(image.describe(), "cubin sm_90");
        // On success the driver writes the module, which is read back.
        // SAFETY: `p.module` points to `module`, alive and not borrowed.
        unsafe { p.module.write(0xabc0 as cu::CUmodule) };
        // SAFETY: the parameters of a load that "returned" success.
        let written = unsafe { outputs(MODULE_LOAD_DATA, params(&p)) };
        assert_eq!(written.handle, Some(0xabc0));
    }

    #[test]
    fn copies_read_their_direction_size_and_stream() {
        let host = [0u8; 64];
        let p = cupti::cuMemcpyHtoDAsync_v2_params {
            dstDevice: 0x1000,
            srcHost: host.as_ptr().cast(),
            ByteCount: 64,
            hStream: stream(0x77),
        };
        let expected = EventKind::Copy {
            direction: Direction::HostToDevice,
            bytes: 64,
            asynchronous: true,
            stream: Some(0x77),
        };
        assert_eq!(decoded(MEMCPY_HTOD_ASYNC_V2, &p), Some(expected));
        let sync = cupti::cuMemcpyDtoH_v2_params {
            dstHost: std::ptr::null_mut(),
            srcDevice: 0x1000,
            ByteCount: 8,
        };
        let Some(EventKind::Copy {
            direction,
            asynchronous,
            ..
        }) = decoded(MEMCPY_DTOH_V2, &sync)
        else {
            panic!("not a copy");
        };
        assert_eq!((direction, asynchronous), (Direction::DeviceToHost, false));
        // Without a driver to ask, a unified-address copy has no direction.
        let unified = cupti::cuMemcpy_params {
            dst: 1,
            src: 2,
            ByteCount: 8,
        };
        let Some(EventKind::Copy { direction, .. }) = decoded(MEMCPY, &unified) else {
            panic!("not a copy");
        };
        assert_eq!(direction, Direction::Unknown);
    }

    #[test]
    fn a_2d_copy_reads_its_descriptor() {
        let copy = cu::CUDA_MEMCPY2D {
            srcXInBytes: 0,
            srcY: 0,
            srcMemoryType: cu::CUmemorytype::CU_MEMORYTYPE_HOST,
            srcHost: std::ptr::null(),
            srcDevice: 0,
            srcArray: std::ptr::null_mut(),
            srcPitch: 16,
            dstXInBytes: 0,
            dstY: 0,
            dstMemoryType: cu::CUmemorytype::CU_MEMORYTYPE_DEVICE,
            dstHost: std::ptr::null_mut(),
            dstDevice: 0x1000,
            dstArray: std::ptr::null_mut(),
            dstPitch: 16,
            WidthInBytes: 16,
            Height: 4,
        };
        let p = cupti::cuMemcpy2DAsync_v2_params {
            pCopy: &copy,
            hStream: stream(0x77),
        };
        let Some(EventKind::Copy {
            direction,
            bytes,
            stream,
            ..
        }) = decoded(MEMCPY_2D_ASYNC_V2, &p)
        else {
            panic!("not a copy");
        };
        assert_eq!(
            (direction, bytes, stream),
            (Direction::HostToDevice, 64, Some(0x77))
        );
    }

    #[test]
    fn captures_graphs_syncs_and_launches_read_their_handles() {
        let begin = cupti::cuStreamBeginCapture_v2_params {
            hStream: stream(0x50),
            mode: cu::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
        };
        let expected = EventKind::CaptureBegin {
            stream: 0x50,
            mode: Some(2),
        };
        assert_eq!(decoded(STREAM_BEGIN_CAPTURE_V2, &begin), Some(expected));
        assert!(is_capture(STREAM_BEGIN_CAPTURE_V2) && is_capture(STREAM_END_CAPTURE_PTSZ));
        assert!(!is_capture(GRAPH_LAUNCH));
        let mut graph = 0x9000 as cu::CUgraph;
        let end = cupti::cuStreamEndCapture_params {
            hStream: stream(0x50),
            phGraph: &mut graph,
        };
        // SAFETY: the parameters of an end that "returned" success.
        let written = unsafe { outputs(STREAM_END_CAPTURE, params(&end)) };
        assert_eq!(written.handle, Some(0x9000));
        let replay = cupti::cuGraphLaunch_params {
            hGraph: 0xE000 as cu::CUgraphExec,
            hStream: stream(0x50),
        };
        let expected = EventKind::GraphLaunch {
            exec: 0xE000,
            stream: 0x50,
        };
        assert_eq!(decoded(GRAPH_LAUNCH, &replay), Some(expected));
        // cuCtxSynchronize has no parameters.
        // SAFETY: no parameters are read for it.
        let ctx = unsafe { entry(CTX_SYNCHRONIZE, std::ptr::null(), std::ptr::null(), false) };
        assert_eq!(
            ctx,
            Some(EventKind::Sync {
                on: SyncOn::Context,
                handle: 0
            })
        );
        let name = CString::new("scale").unwrap();
        let launch = cupti::cuLaunchKernel_params {
            f: std::ptr::null_mut(),
            gridDimX: 4,
            gridDimY: 1,
            gridDimZ: 1,
            blockDimX: 256,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: 0,
            hStream: stream(0x50),
            kernelParams: std::ptr::null_mut(),
            extra: std::ptr::null_mut(),
        };
        // SAFETY: the parameters of a launch and a C string as its symbol.
        let decoded = unsafe { entry(LAUNCH_KERNEL, params(&launch), name.as_ptr(), false) };
        let expected = EventKind::KernelLaunch {
            name: Some("scale".into()),
            stream: 0x50,
            grid: [4, 1, 1],
            block: [256, 1, 1],
        };
        assert_eq!(decoded, Some(expected));
    }

    #[test]
    fn a_pitched_allocation_is_sized_by_its_pitch() {
        let (mut address, mut pitch) = (0u64, 0usize);
        let p = cupti::cuMemAllocPitch_v2_params {
            dptr: &mut address,
            pPitch: &mut pitch,
            WidthInBytes: 100,
            Height: 4,
            ElementSizeBytes: 4,
        };
        let Some(EventKind::Alloc { bytes, memory, .. }) = decoded(MEM_ALLOC_PITCH_V2, &p) else {
            panic!("not an allocation");
        };
        assert_eq!((bytes, memory), (400, Memory::Pitched));
        // SAFETY: the out-pointers point to `address` and `pitch`, alive.
        unsafe { (p.dptr.write(0x7000), p.pPitch.write(128)) };
        // SAFETY: the parameters of an allocation that "returned" success.
        let written = unsafe { outputs(MEM_ALLOC_PITCH_V2, params(&p)) };
        assert_eq!((written.handle, written.bytes), (Some(0x7000), Some(512)));
    }

    #[test]
    fn unobserved_calls_decode_to_nothing() {
        assert!(!OBSERVED.contains(&0));
        let p = cupti::cuStreamSynchronize_params { hStream: stream(1) };
        assert_eq!(decoded(0, &p), None);
        assert!(OBSERVED.contains(&STREAM_SYNCHRONIZE));
    }

    #[test]
    fn a_loaded_module_notification_reads_the_cubin_header() {
        let cubin = elf(8, 0x0600_5a04);
        let mut module = cupti::CUpti_ModuleResourceData {
            moduleId: 3,
            cubinSize: cubin.len(),
            pCubin: cubin.as_ptr().cast(),
        };
        let data = cupti::CUpti_ResourceData {
            context: std::ptr::null_mut(),
            resourceHandle: cupti::CUpti_ResourceData__bindgen_ty_1 {
                stream: cupti::__BindgenUnionField::new(),
                bindgen_union_field: 0,
            },
            resourceDescriptor: (&mut module as *mut cupti::CUpti_ModuleResourceData).cast(),
        };
        // SAFETY: resource data whose descriptor is a module's.
        let loaded = unsafe { module_loaded(&data) };
        let expected = EventKind::ModuleLoaded {
            module_id: 3,
            cubin_bytes: 64,
            cubin: Some(Sm::new(9, 0)),
        };
        assert_eq!(loaded, Some(expected));
    }
}
