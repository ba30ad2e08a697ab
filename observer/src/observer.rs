//! The observer as a trial uses it: attach once per process, then record
//! regions.

use std::sync::atomic::Ordering;
use std::time::Instant;

use crate::cupti::Subscription;
use crate::error::ObserverError;
use crate::inject::{self, Action, Injection};
use crate::library::{self, CuptiLibrary};
use crate::recording::Recording;

/// Records what every CUDA program in this process goes through at the driver
/// level, through CUPTI's callback API: no cooperation from the program.
///
/// CUPTI allows one callback subscriber per process, so there is at most one
/// attached observer (and none under a profiler). Dropping it unsubscribes.
#[derive(Debug)]
pub struct DriverObserver {
    subscription: Subscription,
    library: CuptiLibrary,
}

impl DriverObserver {
    /// Loads CUPTI at run time and subscribes to the driver calls the
    /// observer reads. Where CUPTI is absent, the error's message is the
    /// reason to skip the trial (`CUPTI not found (tried ...)`).
    pub fn attach() -> Result<Self, ObserverError> {
        let library = library::load()?;
        let driver = crate::library::driver_present();
        let subscription = Subscription::new(driver)?;
        log::debug!("CUPTI attached from {}", library.path.display());
        Ok(Self {
            subscription,
            library,
        })
    }

    /// The CUPTI library in use.
    pub fn library(&self) -> &CuptiLibrary {
        &self.library
    }

    /// Driver calls CUPTI would not observe (callback ids an older CUPTI does
    /// not know); empty with a CUPTI as new as the bindings.
    pub fn unobserved_calls(&self) -> &[u32] {
        &self.subscription.unobserved
    }

    /// Starts recording a region, with `injections` armed in it (each fires
    /// at most once).
    pub fn start(&self, injections: Vec<Injection>) -> Result<(), ObserverError> {
        let shared = self.subscription.shared();
        let mut recorder = shared.lock();
        recorder.start(injections, Instant::now())?;
        shared.recording.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// Places a marker (`step 3`) in the region; its sequence number.
    pub fn mark(&self, label: impl Into<String>) -> Result<u64, ObserverError> {
        self.subscription
            .shared()
            .lock()
            .mark(label.into(), Instant::now())
    }

    /// Ends the region. Calls still running have no result in it.
    pub fn stop(&self) -> Result<Recording, ObserverError> {
        let shared = self.subscription.shared();
        let mut recording = {
            let mut recorder = shared.lock();
            shared.recording.store(false, Ordering::SeqCst);
            recorder.stop()?
        };
        recording.callback_faults = shared.faults.swap(0, Ordering::SeqCst);
        Ok(recording)
    }

    /// Records `region` with `injections` armed: [`start`](Self::start), the
    /// closure, [`stop`](Self::stop).
    pub fn record<T>(
        &self,
        injections: Vec<Injection>,
        region: impl FnOnce(&Self) -> T,
    ) -> Result<(T, Recording), ObserverError> {
        self.start(injections)?;
        let value = region(self);
        Ok((value, self.stop()?))
    }

    /// Makes an injection's driver call now, on this thread (whose current
    /// context it uses), outside any callback: for a check that injects at a
    /// point of its own choosing, such as right after the subject's upload.
    pub fn inject_now(&self, action: Action) -> Result<(), ObserverError> {
        let shared = self.subscription.shared();
        if !shared.driver {
            return Err(ObserverError::DriverMissing);
        }
        let thread = std::thread::current().id();
        shared.lock().begin_direct(action, Instant::now(), thread)?;
        let performed = inject::perform(&action);
        shared.lock().finish_injection(performed, Instant::now());
        Ok(())
    }
}
