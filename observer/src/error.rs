//! The observer's one error type.

/// Everything that can go wrong attaching the observer or recording with it.
/// The messages are written to be the reason a trial is skipped.
#[derive(Debug, thiserror::Error)]
pub enum ObserverError {
    /// No CUPTI library could be loaded.
    #[error("CUPTI not found (tried {})", tried.join(", "))]
    CuptiNotFound { tried: Vec<String> },

    /// CUPTI was loaded from a folder, but cudarc (which opens it by name)
    /// cannot reach it by any of its names.
    #[error("CUPTI was found at {path} but cudarc opens it only by name, and none of its names ({names}) reaches it")]
    CuptiNotByName { path: String, names: String },

    /// CUPTI allows one callback subscriber per process.
    #[error("CUPTI has another subscriber in this process (a profiler such as Nsight Systems, or another DriverObserver); it allows one")]
    AlreadySubscribed,

    /// A CUPTI call failed; `result` is CUPTI's name for the failure.
    #[error("CUPTI {call} failed: {result}")]
    Cupti { call: &'static str, result: String },

    /// cudarc's CUPTI loader panicked (a symbol missing from the library).
    #[error("loading CUPTI's functions failed: {0}")]
    Loader(String),

    #[error("a recording is already running")]
    AlreadyRecording,

    #[error("no recording is running")]
    NotRecording,

    #[error("an injection is already running")]
    InjectionRunning,

    /// An injection needs the driver, which cudarc could not load.
    #[error("the CUDA driver library could not be loaded")]
    DriverMissing,
}
