//! Driver-level mutants: calls the observer itself makes inside a recorded
//! region, so that a check built on the recording can be shown to fail on any
//! program, without the program's cooperation.
//!
//! An injection is data: the check hands a list of them to
//! [`DriverObserver::start`](crate::DriverObserver::start); each fires once,
//! from the CUPTI callback of the program call that triggers it, on the
//! program's own thread (where its context is current).

use std::ffi::CString;

use serde::{Deserialize, Serialize};

use crate::event::{CuResult, EventKind, SyncOn};
use crate::image::parse_image;
use crate::sm::Sm;

/// What an injected synchronisation waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SyncScope {
    /// The stream of the triggering call (for a capture: the capturing one).
    Stream,
    /// The whole context.
    Context,
}

/// A driver-level mutant, armed for one recorded region.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Injection {
    /// When the program's first module load of the region returns
    /// successfully, load a module whose PTX `.target` is `target` (older than
    /// the device: the driver JIT-compiles it without complaint). A
    /// target-parity check must report it.
    OlderTargetModule { target: Sm },
    /// When the host-to-device copy with which the region's host-to-device
    /// bytes reach `h2d_bytes` (the model's bytes: the upload) returns, load a
    /// module (PTX for `target`). A no-load-after-upload check must report it.
    ModuleAfterUpload { h2d_bytes: u64, target: Sm },
    /// When the region's first successful stream-capture begin returns,
    /// synchronise inside the capture. The driver refuses the call and
    /// invalidates the capture, whose end then fails; a no-sync-in-capture
    /// check must report the sync.
    SyncInsideCapture { scope: SyncScope },
    /// When the region's first kernel launch whose name starts with
    /// `kernel_prefix` returns, copy `bytes` device to host (synchronously,
    /// from a device allocation the injection makes and frees). A check of
    /// host traffic in a span of kernels must report it.
    CopyToHostAfterKernel { kernel_prefix: String, bytes: u64 },
}

/// When an armed injection fires.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Trigger<'a> {
    FirstModuleLoad,
    HostToDeviceBytes(u64),
    CaptureBegin,
    /// A kernel launch whose name starts with the prefix.
    KernelLaunch(&'a str),
}

/// A driver call an injection makes; also what
/// [`DriverObserver::inject_now`](crate::DriverObserver::inject_now) takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Action {
    /// Load (then unload) a minimal PTX module whose `.target` is `target`.
    LoadModule { target: Sm },
    /// Synchronise `stream` (a `CUstream`'s address; 0 is the legacy default
    /// stream) or, with [`SyncScope::Context`], the current context.
    Synchronize { scope: SyncScope, stream: u64 },
    /// Copy `bytes` device to host with `cuMemcpyDtoH_v2`, from a device
    /// allocation made (and freed) for the purpose.
    CopyToHost { bytes: u64 },
}

impl Injection {
    /// The older-target mutant for a device: PTX for [`Sm::older`].
    pub fn older_target(device: Sm) -> Self {
        Self::OlderTargetModule {
            target: device.older(),
        }
    }

    /// The load-after-upload mutant: a module for the device itself, loaded
    /// once `model_bytes` have gone host to device.
    pub fn module_after_upload(model_bytes: u64, device: Sm) -> Self {
        Self::ModuleAfterUpload {
            h2d_bytes: model_bytes,
            target: device,
        }
    }

    /// The sync-inside-capture mutant: the capturing stream is synchronised.
    pub fn sync_inside_capture() -> Self {
        Self::SyncInsideCapture {
            scope: SyncScope::Stream,
        }
    }

    /// The copy-in-span mutant: 4 bytes copied device to host right after
    /// the first launch of a kernel whose name starts with `kernel_prefix`.
    pub fn copy_to_host_after_kernel(kernel_prefix: impl Into<String>) -> Self {
        Self::CopyToHostAfterKernel {
            kernel_prefix: kernel_prefix.into(),
            bytes: 4,
        }
    }

    pub(crate) fn trigger(&self) -> Trigger<'_> {
        match self {
            Self::OlderTargetModule { .. } => Trigger::FirstModuleLoad,
            Self::ModuleAfterUpload { h2d_bytes, .. } => Trigger::HostToDeviceBytes(*h2d_bytes),
            Self::SyncInsideCapture { .. } => Trigger::CaptureBegin,
            Self::CopyToHostAfterKernel { kernel_prefix, .. } => {
                Trigger::KernelLaunch(kernel_prefix)
            }
        }
    }

    /// The call to make when the trigger fired on a call on `stream`.
    pub(crate) fn action(&self, stream: u64) -> Action {
        match self {
            Self::OlderTargetModule { target } | Self::ModuleAfterUpload { target, .. } => {
                Action::LoadModule { target: *target }
            }
            Self::SyncInsideCapture { scope } => Action::Synchronize {
                scope: *scope,
                stream,
            },
            Self::CopyToHostAfterKernel { bytes, .. } => Action::CopyToHost { bytes: *bytes },
        }
    }
}

/// What became of one armed injection (or one `inject_now`) in a recording.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct InjectionReport {
    /// The armed injection; `None` for a call made with `inject_now`.
    pub injection: Option<Injection>,
    /// The program call whose return fired it; `None` if it never fired (or
    /// for `inject_now`).
    pub trigger_seq: Option<u64>,
    /// The call it made; `None` if it never fired.
    pub call: Option<InjectedCall>,
}

impl InjectionReport {
    pub fn fired(&self) -> bool {
        self.call.is_some()
    }
}

/// The driver call an injection made.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct InjectedCall {
    pub action: Action,
    pub api: String,
    pub result: CuResult,
    /// Made from within a CUPTI callback (nested in a program call).
    pub inside_callback: bool,
    /// CUPTI issued callbacks for it; `false` when the injector recorded the
    /// call itself.
    pub reported_by_cupti: bool,
    /// The events of the recording that the injected call produced.
    pub events: Vec<u64>,
}

/// The call an action made, as the injector saw it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Performed {
    pub api: &'static str,
    pub result: CuResult,
    pub kind: EventKind,
}

/// The PTX ISA version that introduced a target (PTX ISA release notes), so
/// the injected module is valid PTX for it.
fn ptx_isa_for(target: Sm) -> &'static str {
    match target.number() {
        0..=80 => "7.0",
        81..=87 => "7.4",
        88..=90 => "7.8",
        91..=101 => "8.6",
        102..=120 => "8.7",
        _ => "8.8",
    }
}

/// A minimal module with one empty kernel whose `.target` is `target`.
pub fn injected_ptx(target: Sm) -> String {
    format!(
        "// falsify-observer: an injected module (a driver-level mutant)\n\
         .version {}\n.target {target}\n.address_size 64\n\n\
         .visible .entry falsify_observer_injected()\n{{\n\tret;\n}}\n",
        ptx_isa_for(target)
    )
}

fn result_of(outcome: Result<(), cudarc::driver::DriverError>) -> CuResult {
    match outcome {
        Ok(()) => CuResult::SUCCESS,
        Err(e) => CuResult(e.0 as u32),
    }
}

/// Makes the action's driver call on this thread, with whatever context is
/// current (inside a callback: the program's).
pub(crate) fn perform(action: &Action) -> Performed {
    match *action {
        Action::LoadModule { target } => load_module(target),
        Action::Synchronize { scope, stream } => {
            let (api, on, handle) = match scope {
                SyncScope::Stream => ("cuStreamSynchronize", SyncOn::Stream, stream),
                SyncScope::Context => ("cuCtxSynchronize", SyncOn::Context, 0),
            };
            let result = match scope {
                // SAFETY: `stream` is the handle of the triggering call's
                // stream (or 0, the legacy default stream), alive during it.
                SyncScope::Stream => result_of(unsafe {
                    cudarc::driver::result::stream::synchronize(stream as usize as _)
                }),
                SyncScope::Context => result_of(cudarc::driver::result::ctx::synchronize()),
            };
            Performed {
                api,
                result,
                kind: EventKind::Sync { on, handle },
            }
        }
        Action::CopyToHost { bytes } => copy_to_host(bytes),
    }
}

/// Copies `bytes` device to host from an allocation of its own. Where the
/// allocation is refused (inside a stream capture, say), the copy is
/// recorded with the allocation's error: it was asked for all the same.
fn copy_to_host(bytes: u64) -> Performed {
    let mut performed = Performed {
        api: "cuMemcpyDtoH_v2",
        result: CuResult::INVALID_VALUE,
        kind: EventKind::Copy {
            direction: crate::event::Direction::DeviceToHost,
            bytes,
            asynchronous: false,
            stream: None,
        },
    };
    let Ok(len) = usize::try_from(bytes) else {
        return performed;
    };
    let mut host = vec![0u8; len];
    // SAFETY: allocates `len` bytes of device memory in the current context;
    // nothing else holds the allocation, freed below.
    match unsafe { cudarc::driver::result::malloc_sync(len) } {
        Ok(device) => {
            // SAFETY: `device` holds `len` bytes (allocated above) and
            // `host` is `len` bytes long.
            performed.result =
                result_of(unsafe { cudarc::driver::result::memcpy_dtoh_sync(&mut host, device) });
            // SAFETY: allocated above, not used after this.
            if let Err(e) = unsafe { cudarc::driver::result::free_sync(device) } {
                log::warn!("freeing the injected copy's device memory failed: {e:?}");
            }
        }
        Err(e) => performed.result = CuResult(e.0 as u32),
    }
    performed
}

fn load_module(target: Sm) -> Performed {
    let text = injected_ptx(target);
    let image = parse_image(text.as_bytes());
    let mut performed = Performed {
        api: "cuModuleLoadData",
        result: CuResult::INVALID_VALUE,
        kind: EventKind::ModuleLoad {
            image,
            file: None,
            handle: None,
        },
    };
    let Ok(source) = CString::new(text) else {
        return performed;
    };
    // SAFETY: a NUL-terminated PTX text that outlives the call.
    let loaded = unsafe { cudarc::driver::result::module::load_data(source.as_ptr().cast()) };
    match loaded {
        Ok(module) => {
            performed.result = CuResult::SUCCESS;
            performed.kind.apply(crate::event::Outputs {
                handle: Some(module as usize as u64),
                bytes: None,
            });
            // SAFETY: the module was just loaded and nothing else holds it.
            if let Err(e) = unsafe { cudarc::driver::result::module::unload(module) } {
                log::warn!("unloading the injected module failed: {e:?}");
            }
        }
        Err(e) => performed.result = CuResult(e.0 as u32),
    }
    performed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::ImageFormat;

    #[test]
    fn the_injected_module_targets_what_it_is_asked_to() {
        for target in [Sm::new(7, 0), Sm::new(9, 0), Sm::new(12, 0)] {
            let image = parse_image(injected_ptx(target).as_bytes());
            assert_eq!(image.format, ImageFormat::Ptx);
            assert_eq!(image.targets(), vec![target]);
        }
        assert!(injected_ptx(Sm::new(9, 0)).contains(".version 7.8\n"));
        assert!(injected_ptx(Sm::new(7, 0)).contains(".version 7.0\n"));
    }

    #[test]
    fn mutants_name_their_trigger_and_action() {
        let device = Sm::new(9, 0);
        let older = Injection::older_target(device);
        assert_eq!(older.trigger(), Trigger::FirstModuleLoad);
        assert_eq!(
            older.action(5),
            Action::LoadModule {
                target: Sm::new(7, 0)
            }
        );
        let after = Injection::module_after_upload(1 << 20, device);
        assert_eq!(after.trigger(), Trigger::HostToDeviceBytes(1 << 20));
        assert_eq!(after.action(5), Action::LoadModule { target: device });
        let sync = Injection::sync_inside_capture();
        assert_eq!(sync.trigger(), Trigger::CaptureBegin);
        assert_eq!(
            sync.action(5),
            Action::Synchronize {
                scope: SyncScope::Stream,
                stream: 5
            }
        );
        let copy = Injection::copy_to_host_after_kernel("clip_");
        assert_eq!(copy.trigger(), Trigger::KernelLaunch("clip_"));
        assert_eq!(copy.action(5), Action::CopyToHost { bytes: 4 });
    }
}
