//! The crate's one error type.

use std::path::PathBuf;

/// Any error of a subject, boxed where the core keeps it.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Everything that can go wrong in the harness core, from a malformed
/// contract to a report that cannot be written; a subject's own errors are
/// boxed ([`Error::Subject`]). Contract errors carry the file and the
/// 1-based line and column so a user can jump straight to the offending key.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A contract file that does not parse or does not validate.
    #[error("{}: {message}", location(path, *line, *column))]
    Contract {
        path: PathBuf,
        /// 1-based line, 0 when unknown.
        line: usize,
        /// 1-based column, 0 when unknown.
        column: usize,
        message: String,
    },

    /// Reading or writing a file failed.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// Writing a CSV report failed.
    #[error("{}: {source}", path.display())]
    Csv {
        path: PathBuf,
        #[source]
        source: csv::Error,
    },

    /// Reports of several runs that cannot be merged into one (overlapping
    /// shards, different commits or GPU kinds, a missing report).
    #[error("{}: {message}", path.display())]
    Merge { path: PathBuf, message: String },

    /// Reports that cannot be judged: empty, the same trial twice, rows of
    /// several builds or contract texts, a baseline that did not finish.
    /// `line` is the 1-based line of the file, 0 when the whole file is meant.
    #[error("{}: {message}", location(path, *line, 0))]
    Evidence {
        path: PathBuf,
        line: usize,
        message: String,
    },

    /// A folder the reports cannot be written into (a file in the way, a
    /// folder that cannot be created or written).
    #[error("{}: {message}", path.display())]
    ReportDir { path: PathBuf, message: String },

    /// A run's reports could not be written where it was told to write
    /// them; `message` says why, and where the rows went instead
    /// (`fallback`, when that could be written).
    #[error("could not write the reports into {}: {message}", out.display())]
    NotWritten {
        out: PathBuf,
        message: String,
        fallback: Option<PathBuf>,
    },

    /// An injected mutant (`--inject`) that could not take effect in the
    /// run: its test's trial is not selected, or cannot be judged here.
    #[error("{0}")]
    Inject(String),

    /// A run selected no trial at all (an empty directory or a filter matching nothing).
    #[error("no trials selected: {0}")]
    NothingSelected(String),

    /// Something a front end or a helper process was handed that it
    /// cannot use (a request that does not parse, a trial that does not
    /// exist); `op` names the side that refused it.
    #[error("{op}: {message}")]
    InvalidArgument { op: &'static str, message: String },

    /// The CUDA driver is missing or no device could be opened.
    #[error("CUDA unavailable: {0}")]
    CudaUnavailable(String),

    /// A workload arm (a helper process that trains one arm of a two-arm
    /// comparison) could not run or answer.
    #[error("workload arm: {0}")]
    Arm(String),

    /// An error of the subject under test (its device, its helpers, its
    /// workload).
    #[error(transparent)]
    Subject(BoxError),

    /// The driver observer could not attach, record or inject.
    #[error("driver observer: {0}")]
    Observer(#[from] falsify_observer::ObserverError),

    /// A driver-observed check whose evidence cannot be judged (e.g. the
    /// upload point never reached: the workload's byte count is wrong).
    #[error("{0}")]
    Unjudgeable(String),
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

fn location(path: &std::path::Path, line: usize, column: usize) -> String {
    match (line, column) {
        (0, _) => path.display().to_string(),
        (l, 0) => format!("{}:{l}", path.display()),
        (l, c) => format!("{}:{l}:{c}", path.display()),
    }
}

impl Error {
    /// Shorthand for an I/O error on `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}
