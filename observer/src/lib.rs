//! falsify-observer: what any CUDA program in this process goes through at
//! the driver level, observed through CUPTI's callback API rather than asked
//! of the program; and driver-level mutants that checks built on it must
//! catch.
//!
//! ```no_run
//! use falsify_observer::{DriverObserver, Injection, Sm};
//!
//! let observer = DriverObserver::attach()?; // Err: the reason to skip
//! let device = Sm::new(9, 0);
//! observer.start(vec![Injection::older_target(device)])?;
//! // ... the subject loads its kernels, uploads, trains ...
//! observer.mark("step 1")?;
//! let recording = observer.stop()?;
//! for mismatch in recording.target_mismatches(device) {
//!     println!("{mismatch}");
//! }
//! # Ok::<(), falsify_observer::ObserverError>(())
//! ```
//!
//! The layers: [`image`] reads module images (PTX, cubin, fat binary),
//! [`event`] is what is recorded, [`recording`] holds the analyses (pure, so
//! they are tested with hand-built recordings), [`inject`] the mutants; the
//! CUPTI subscription and the decoding of each call's parameters are private.
//!
//! # On a GPU
//!
//! `examples/observe_smoke.rs` goes through every kind of event and every
//! injection on a real device and checks each expectation. Build it with
//! `cargo build --release -p falsify-observer --example observe_smoke`, carry
//! `target/release/examples/observe_smoke` to the GPU machine and run it:
//! exit status 0 and a last JSON line with `"ok":true` mean the observer
//! works there; each `FAIL` line names what did not.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

mod cupti;
mod decode;
pub mod error;
pub mod event;
pub mod image;
pub mod inject;
mod library;
mod observer;
mod recorder;
pub mod recording;
pub mod sm;

pub use error::ObserverError;
pub use event::{CaptureState, CuResult, Direction, Event, EventKind, Memory, Origin, SyncOn};
pub use image::{ImageFormat, ModuleImage};
pub use inject::{Action, InjectedCall, Injection, InjectionReport, SyncScope};
pub use library::{driver_present, CuptiLibrary};
pub use observer::DriverObserver;
pub use recording::{Capture, Recording, RecordingBuilder, StepSpan, StepSyncs, TargetMismatch};
pub use sm::Sm;
