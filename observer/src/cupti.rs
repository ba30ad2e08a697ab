//! The CUPTI subscription: the callback CUPTI calls around every observed
//! driver call, on whatever thread makes the call, possibly several at once.
//!
//! The callback is cheap (decode the arguments, push under a mutex), never
//! unwinds into C (a panic is caught and counted), and never calls the driver
//! while it holds the lock (an injected call re-enters the callback).

use std::ffi::{c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use cudarc::cupti::result::{self as cupti, CuptiError};
use cudarc::cupti::sys::{
    CUptiResult, CUpti_ApiCallbackSite, CUpti_CallbackData, CUpti_CallbackDomain, CUpti_CallbackId,
    CUpti_ResourceData, CUpti_SubscriberHandle,
};

use crate::decode;
use crate::error::ObserverError;
use crate::event::{CuResult, Outputs};
use crate::inject;
use crate::recorder::{Recorder, Returned, NO_TOKEN};

/// What the callback shares with the observer.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    recorder: Mutex<Recorder>,
    /// Whether a region records: the callback skips the decoding of calls
    /// nobody records (captures are followed regardless).
    pub recording: AtomicBool,
    /// Callbacks that panicked (caught at the FFI boundary).
    pub faults: AtomicU32,
    /// Whether cudarc can reach the driver (to ask it about pointers).
    pub driver: bool,
}

impl Shared {
    pub fn lock(&self) -> MutexGuard<'_, Recorder> {
        // A panic caught in the callback may have poisoned the lock; the
        // recorder's state is still consistent between its calls.
        self.recorder.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn thread() -> std::thread::ThreadId {
    std::thread::current().id()
}

pub(crate) fn cupti_failure(call: &'static str, error: CuptiError) -> ObserverError {
    if error.0 == CUptiResult::CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED {
        return ObserverError::AlreadySubscribed;
    }
    // The Debug name of the result; cudarc's own Display would ask CUPTI.
    ObserverError::Cupti {
        call,
        result: format!("{:?}", error.0),
    }
}

fn panic_message(panic: Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "a panic".to_string())
}

/// The subscription; dropping it unsubscribes.
#[derive(Debug)]
pub(crate) struct Subscription {
    handle: CUpti_SubscriberHandle,
    shared: &'static Shared,
    /// Driver calls CUPTI would not enable callbacks for (an older CUPTI).
    pub unobserved: Vec<u32>,
}

// SAFETY: the handle is an opaque token CUPTI accepts from any thread; it is
// only passed to CUPTI (at construction and in Drop). `Shared` is Sync.
unsafe impl Send for Subscription {}
// SAFETY: as above; no method reads the handle through `&self`.
unsafe impl Sync for Subscription {}

impl Subscription {
    pub fn new(driver: bool) -> Result<Self, ObserverError> {
        let shared = Box::into_raw(Box::new(Shared {
            driver,
            ..Shared::default()
        }));
        let mut handle: CUpti_SubscriberHandle = std::ptr::null_mut();
        let subscribed = catch_unwind(AssertUnwindSafe(|| {
            // SAFETY: `handle` is a valid out-pointer; `on_callback` has
            // CUPTI's callback signature; `shared` outlives the subscription
            // (leaked below once CUPTI holds it).
            unsafe { cupti::subscribe(&mut handle, Some(on_callback), shared.cast()) }
        }));
        let failure = match subscribed {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(cupti_failure("cuptiSubscribe", e)),
            Err(panic) => Some(ObserverError::Loader(panic_message(panic))),
        };
        if let Some(failure) = failure {
            // SAFETY: the subscription failed, so CUPTI never took the pointer
            // and this is its only owner.
            drop(unsafe { Box::from_raw(shared) });
            return Err(failure);
        }
        // SAFETY: never freed. CUPTI does not promise that callbacks already
        // running on other threads have returned when cuptiUnsubscribe does,
        // so what they read must outlive the subscription for good: one small
        // allocation per attach (its events are released in Drop).
        let shared: &'static Shared = unsafe { &*shared };
        let mut subscription = Self {
            handle,
            shared,
            unobserved: Vec::new(),
        };
        subscription.enable()?;
        Ok(subscription)
    }

    pub fn shared(&self) -> &'static Shared {
        self.shared
    }

    fn enable(&mut self) -> Result<(), ObserverError> {
        let driver = CUpti_CallbackDomain::CUPTI_CB_DOMAIN_DRIVER_API;
        for &cbid in decode::OBSERVED {
            // SAFETY: the handle of a live subscription.
            if let Err(e) = unsafe { cupti::enable_callback(1, self.handle, driver, cbid) } {
                log::debug!("CUPTI callback {cbid} not enabled: {:?}", e.0);
                self.unobserved.push(cbid);
            }
        }
        if self.unobserved.len() == decode::OBSERVED.len() {
            return Err(ObserverError::Cupti {
                call: "cuptiEnableCallback",
                result: "no driver callback could be enabled".into(),
            });
        }
        let resource = CUpti_CallbackDomain::CUPTI_CB_DOMAIN_RESOURCE;
        // SAFETY: the handle of a live subscription.
        unsafe { cupti::enable_callback(1, self.handle, resource, decode::MODULE_LOADED) }
            .map_err(|e| cupti_failure("cuptiEnableCallback", e))
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        // SAFETY: the handle of this subscription, unsubscribed once, here.
        if let Err(e) = unsafe { cupti::enable_all_domains(0, self.handle) } {
            log::warn!("disabling CUPTI callbacks failed: {:?}", e.0);
        }
        // SAFETY: as above.
        if let Err(e) = unsafe { cupti::unsubscribe(self.handle) } {
            log::warn!("unsubscribing from CUPTI failed: {:?}", e.0);
        }
        self.shared.recording.store(false, Ordering::SeqCst);
        let _released = self.shared.lock().stop();
    }
}

/// CUPTI's callback.
///
/// # Safety
/// Called by CUPTI only: `userdata` is the `Shared` given to cuptiSubscribe,
/// `cbdata` the data CUPTI documents for `domain`, valid during the call.
unsafe extern "C" fn on_callback(
    userdata: *mut c_void,
    domain: CUpti_CallbackDomain,
    cbid: CUpti_CallbackId,
    cbdata: *const c_void,
) {
    // SAFETY: `userdata` is the leaked `Shared` of this subscription.
    let Some(shared) = (unsafe { userdata.cast::<Shared>().as_ref() }) else {
        return;
    };
    let outcome = catch_unwind(AssertUnwindSafe(|| match domain {
        // SAFETY: the driver-API domain passes a CUpti_CallbackData.
        CUpti_CallbackDomain::CUPTI_CB_DOMAIN_DRIVER_API => unsafe {
            driver_call(shared, cbid, cbdata.cast())
        },
        CUpti_CallbackDomain::CUPTI_CB_DOMAIN_RESOURCE
            if cbid == decode::MODULE_LOADED && shared.recording.load(Ordering::SeqCst) =>
        {
            // SAFETY: the resource domain passes a CUpti_ResourceData.
            let loaded = unsafe { decode::module_loaded(cbdata.cast::<CUpti_ResourceData>()) };
            if let Some(kind) = loaded {
                shared
                    .lock()
                    .notify("module loaded", kind, Instant::now(), thread);
            }
        }
        _ => {}
    }));
    if outcome.is_err() {
        shared.faults.fetch_add(1, Ordering::SeqCst);
    }
}

/// One driver-API callback's data, read out of CUPTI's struct.
struct Call {
    cbid: u32,
    params: *const c_void,
    returned: *mut c_void,
    slot: *mut u64,
    symbol: *const std::ffi::c_char,
    api: String,
}

/// # Safety
/// `data` is null or the CUpti_CallbackData of a driver-API callback.
unsafe fn driver_call(shared: &Shared, cbid: u32, data: *const CUpti_CallbackData) {
    if data.is_null() {
        return;
    }
    let followed = shared.recording.load(Ordering::SeqCst) || decode::is_capture(cbid);
    // SAFETY: CUPTI's callback data, valid during the callback; fields are
    // read one by one (the site is 0 or 1, both variants).
    let (site, slot) = unsafe { ((*data).callbackSite, (*data).correlationData) };
    if !followed {
        // Always written at entry: the slot is not promised to start at zero,
        // and the exit reads it.
        if site == CUpti_ApiCallbackSite::CUPTI_API_ENTER && !slot.is_null() {
            // SAFETY: CUPTI's per-call slot, shared by entry and exit.
            unsafe { slot.write(NO_TOKEN) };
        }
        return;
    }
    // SAFETY: as above; the function name is a global C string.
    let call = unsafe {
        let name = (*data).functionName;
        Call {
            cbid,
            params: (*data).functionParams,
            returned: (*data).functionReturnValue,
            slot,
            symbol: (*data).symbolName,
            api: if name.is_null() {
                String::new()
            } else {
                CStr::from_ptr(name).to_string_lossy().into_owned()
            },
        }
    };
    if site == CUpti_ApiCallbackSite::CUPTI_API_ENTER {
        // SAFETY: the data of an entry callback.
        unsafe { on_entry(shared, &call) }
    } else {
        // SAFETY: the data of an exit callback.
        unsafe { on_exit(shared, &call) }
    }
}

/// # Safety
/// `call` holds the data of a driver-API entry callback.
unsafe fn on_entry(shared: &Shared, call: &Call) {
    // SAFETY: the parameters and symbol of this callback, at entry.
    let kind = unsafe { decode::entry(call.cbid, call.params, call.symbol, shared.driver) };
    let token = kind.map_or(NO_TOKEN, |kind| {
        shared.lock().enter(&call.api, kind, Instant::now(), thread)
    });
    if !call.slot.is_null() {
        // SAFETY: CUPTI's per-call slot, shared by entry and exit.
        unsafe { call.slot.write(token) };
    }
}

/// # Safety
/// `call` holds the data of a driver-API exit callback.
unsafe fn on_exit(shared: &Shared, call: &Call) {
    let result = if call.returned.is_null() {
        CuResult(u32::MAX)
    } else {
        // SAFETY: at exit a driver call's return value is its CUresult (a C
        // enum, an `int`).
        CuResult(unsafe { call.returned.cast::<u32>().read() })
    };
    let token = if call.slot.is_null() {
        NO_TOKEN
    } else {
        // SAFETY: CUPTI's per-call slot, written by this call's entry.
        unsafe { call.slot.read() }
    };
    let outputs = if result.is_success() {
        // SAFETY: the parameters of a call that returned CUDA_SUCCESS.
        unsafe { decode::outputs(call.cbid, call.params) }
    } else {
        Outputs::default()
    };
    // SAFETY: the parameters of this call, still valid at exit.
    let capture = decode::is_capture(call.cbid)
        .then(|| unsafe { decode::entry(call.cbid, call.params, std::ptr::null(), false) })
        .flatten();
    let returned = Returned {
        token,
        api: &call.api,
        result,
        outputs,
        capture: capture.as_ref(),
    };
    let fired = shared.lock().exit(returned, Instant::now(), thread);
    if let Some(action) = fired {
        // Made outside the lock: the driver may call back into this callback.
        let performed = inject::perform(&action);
        shared.lock().finish_injection(performed, Instant::now());
    }
}
