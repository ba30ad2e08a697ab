//! What the driver went through, one event per driver call (or CUPTI
//! resource notification, or user marker).

use std::fmt;

use serde::{Serialize, Serializer};

use crate::image::ModuleImage;

/// A `CUresult` as the driver returned it. Kept as its number: a newer driver
/// may return codes this build does not know.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CuResult(pub u32);

impl CuResult {
    pub const SUCCESS: Self = Self(0);
    pub const INVALID_VALUE: Self = Self(1);
    pub const INVALID_PTX: Self = Self(218);
    pub const STREAM_CAPTURE_UNSUPPORTED: Self = Self(900);
    pub const STREAM_CAPTURE_INVALIDATED: Self = Self(901);
    pub const STREAM_CAPTURE_WRONG_THREAD: Self = Self(908);

    pub fn is_success(self) -> bool {
        self == Self::SUCCESS
    }

    /// The driver's name for the codes a recording is read for.
    pub fn name(self) -> Option<&'static str> {
        Some(match self.0 {
            0 => "CUDA_SUCCESS",
            1 => "CUDA_ERROR_INVALID_VALUE",
            2 => "CUDA_ERROR_OUT_OF_MEMORY",
            3 => "CUDA_ERROR_NOT_INITIALIZED",
            200 => "CUDA_ERROR_INVALID_IMAGE",
            201 => "CUDA_ERROR_INVALID_CONTEXT",
            209 => "CUDA_ERROR_NO_BINARY_FOR_GPU",
            218 => "CUDA_ERROR_INVALID_PTX",
            221 => "CUDA_ERROR_JIT_COMPILER_NOT_FOUND",
            222 => "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
            223 => "CUDA_ERROR_JIT_COMPILATION_DISABLED",
            400 => "CUDA_ERROR_INVALID_HANDLE",
            401 => "CUDA_ERROR_ILLEGAL_STATE",
            600 => "CUDA_ERROR_NOT_READY",
            700 => "CUDA_ERROR_ILLEGAL_ADDRESS",
            800 => "CUDA_ERROR_NOT_PERMITTED",
            801 => "CUDA_ERROR_NOT_SUPPORTED",
            900 => "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
            901 => "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
            902 => "CUDA_ERROR_STREAM_CAPTURE_MERGE",
            903 => "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED",
            904 => "CUDA_ERROR_STREAM_CAPTURE_UNJOINED",
            905 => "CUDA_ERROR_STREAM_CAPTURE_ISOLATION",
            906 => "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT",
            907 => "CUDA_ERROR_CAPTURED_EVENT",
            908 => "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD",
            910 => "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE",
            _ => return None,
        })
    }
}

impl fmt::Display for CuResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => f.write_str(name),
            None => write!(f, "CUresult({})", self.0),
        }
    }
}

impl Serialize for CuResult {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.to_string())
    }
}

/// The stream-capture state when a call began.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CaptureState {
    /// Stream captures in progress in the process (begun successfully, not yet
    /// ended) as far as the observer saw them since it attached.
    pub open: u32,
    /// Whether the call's own stream was one of them.
    pub on_capturing_stream: bool,
}

impl CaptureState {
    pub fn inside(self) -> bool {
        self.open > 0
    }
}

/// Who made a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Origin {
    /// The program under observation.
    Program,
    /// An injected driver-level mutant. `inside_callback`: made from within a
    /// CUPTI callback, nested in one of the program's calls.
    /// `reported_by_cupti`: CUPTI issued callbacks for it; `false` when the
    /// injector recorded the call itself because CUPTI did not report it.
    Injected {
        inside_callback: bool,
        reported_by_cupti: bool,
    },
}

/// Which memory an allocation is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Memory {
    Device,
    Managed,
    Pitched,
    /// A physical allocation of the virtual memory API (`cuMemCreate`).
    Physical,
    PinnedHost,
}

/// The direction of a copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Direction {
    HostToDevice,
    DeviceToHost,
    DeviceToDevice,
    HostToHost,
    /// A copy whose ends could not be told apart (arrays, unknown pointers).
    Unknown,
}

/// What a synchronisation waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum SyncOn {
    Context,
    Stream,
    Event,
}

/// What a driver call did, with the arguments that matter to the checks.
/// Handles (streams, graphs, executables, modules) are their addresses.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "type")]
pub enum EventKind {
    /// `cuModuleLoad*`, `cuLibraryLoad*`: code handed to the driver to load. `file`: the path, for the calls that take one. `handle`: the
    /// module or library made (on success).
    ModuleLoad {
        image: ModuleImage,
        file: Option<String>,
        handle: Option<u64>,
    },
    /// `cuLinkAddData`, `cuLinkAddFile`: an input to the driver's JIT linker,
    /// whose output cubin is then loaded (a `ModuleLoad` of its own).
    LinkInput {
        image: ModuleImage,
        file: Option<String>,
    },
    /// CUPTI's resource callback that a module was loaded, with the cubin the
    /// driver loaded (after JIT, for PTX) and the SM in its header.
    ModuleLoaded {
        module_id: u32,
        cubin_bytes: u64,
        cubin: Option<crate::sm::Sm>,
    },
    Alloc {
        bytes: u64,
        memory: Memory,
        stream: Option<u64>,
        address: Option<u64>,
    },
    Copy {
        direction: Direction,
        bytes: u64,
        asynchronous: bool,
        stream: Option<u64>,
    },
    Sync {
        on: SyncOn,
        handle: u64,
    },
    CaptureBegin {
        stream: u64,
        mode: Option<u32>,
    },
    CaptureEnd {
        stream: u64,
        graph: Option<u64>,
    },
    GraphInstantiate {
        graph: u64,
        exec: Option<u64>,
    },
    GraphLaunch {
        exec: u64,
        stream: u64,
    },
    KernelLaunch {
        name: Option<String>,
        stream: u64,
        grid: [u32; 3],
        block: [u32; 3],
    },
    /// A label the caller placed to delimit steps or regions.
    Marker {
        label: String,
    },
}

impl EventKind {
    /// The stream the call works on, where it names one.
    pub fn stream(&self) -> Option<u64> {
        match self {
            Self::Alloc { stream, .. } | Self::Copy { stream, .. } => *stream,
            Self::Sync {
                on: SyncOn::Stream,
                handle,
            } => Some(*handle),
            Self::CaptureBegin { stream, .. }
            | Self::CaptureEnd { stream, .. }
            | Self::GraphLaunch { stream, .. }
            | Self::KernelLaunch { stream, .. } => Some(*stream),
            _ => None,
        }
    }

    /// Stores what the driver wrote back on success (a module, an address,
    /// a graph, an executable graph, a pitched allocation's real size).
    pub(crate) fn apply(&mut self, outputs: Outputs) {
        if let Self::Alloc { bytes, .. } = self {
            if let Some(real) = outputs.bytes {
                *bytes = real;
            }
        }
        let Some(written) = outputs.handle else {
            return;
        };
        match self {
            Self::ModuleLoad { handle, .. } => *handle = Some(written),
            Self::Alloc { address, .. } => *address = Some(written),
            Self::CaptureEnd { graph, .. } => *graph = Some(written),
            Self::GraphInstantiate { exec, .. } => *exec = Some(written),
            _ => {}
        }
    }

    /// The same kind of event, whatever its arguments.
    pub(crate) fn same_kind(&self, other: &Self) -> bool {
        std::mem::discriminant(self) == std::mem::discriminant(other)
    }
}

/// What a call wrote back through its output arguments.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Outputs {
    pub handle: Option<u64>,
    pub bytes: Option<u64>,
}

/// One thing the driver went through.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Event {
    /// Order of the calls' beginnings in the recording, from 0.
    pub seq: u64,
    /// The driver function (`cuModuleLoadData`), the CUPTI resource callback,
    /// or `marker`.
    pub api: String,
    /// Nanoseconds from the start of the recording to the call's beginning.
    pub start_ns: u64,
    /// ... and to its end; `None` for notifications and calls still running.
    pub end_ns: Option<u64>,
    /// The call's result on exit; `None` for notifications and calls that had
    /// not returned when the recording stopped.
    pub result: Option<CuResult>,
    pub capture: CaptureState,
    pub origin: Origin,
    pub kind: EventKind,
}

impl Event {
    /// Whether the call returned an error (a call without a result has not).
    pub fn failed(&self) -> bool {
        self.result.is_some_and(|r| !r.is_success())
    }

    /// Whether the host waits for the device here: a context, stream or event
    /// synchronisation, or a synchronous device-to-host copy.
    pub fn is_host_sync(&self) -> bool {
        matches!(
            self.kind,
            EventKind::Sync { .. }
                | EventKind::Copy {
                    direction: Direction::DeviceToHost,
                    asynchronous: false,
                    ..
                }
        )
    }

    pub fn is_injected(&self) -> bool {
        matches!(self.origin, Origin::Injected { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_print_their_driver_names() {
        assert_eq!(CuResult::SUCCESS.to_string(), "CUDA_SUCCESS");
        assert_eq!(
            CuResult::STREAM_CAPTURE_UNSUPPORTED.to_string(),
            "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"
        );
        assert_eq!(CuResult(12345).to_string(), "CUresult(12345)");
        assert!(CuResult::SUCCESS.is_success() && !CuResult::INVALID_PTX.is_success());
    }

    #[test]
    fn outputs_land_in_the_arguments_they_answer() {
        let mut alloc = EventKind::Alloc {
            bytes: 100,
            memory: Memory::Pitched,
            stream: None,
            address: None,
        };
        alloc.apply(Outputs {
            handle: Some(0x7000),
            bytes: Some(128),
        });
        assert_eq!(
            alloc,
            EventKind::Alloc {
                bytes: 128,
                memory: Memory::Pitched,
                stream: None,
                address: Some(0x7000)
            }
        );
        let mut end = EventKind::CaptureEnd {
            stream: 1,
            graph: None,
        };
        end.apply(Outputs {
            handle: Some(9),
            bytes: None,
        });
        assert_eq!(
            end,
            EventKind::CaptureEnd {
                stream: 1,
                graph: Some(9)
            }
        );
    }
}
