//! What a subject's check kinds are to the core: [`Kind`] (one kind's
//! parameters, run for the subject), [`KindSet`] (the subject's `check:`
//! block, one of its kinds), [`TrialContext`] (what a trial hands a check),
//! and [`kinds!`](crate::kinds), which declares a subject's set from one
//! line per kind, parsed as strictly as any (unknown keys refused, each
//! error located) and documented by [`reference_markdown`].

use std::fmt::{self, Debug};
use std::marker::PhantomData;

use serde::de::{self as de, DeserializeOwned, Deserializer, MapAccess, Visitor};

use super::Subject;
use crate::check::doc::{example_yaml, kind_markdown};
use crate::check::{Backend, Here, KindInfo, Measurement, Validate, DEFAULT_TIMEOUT_S};

/// What a trial hands to a check.
pub struct TrialContext<'a, S: Subject> {
    /// Seed for every random input of this trial (recorded in the report).
    pub seed: u64,
    /// The fault to inject, for a mutant self-test trial (or a rehearsal).
    pub mutant: Option<S::Mutant>,
    /// The subject's device, for `cuda` trials.
    pub device: Option<&'a mut S::Device>,
}

/// A check kind's parameters: parsed strictly (serde, unknown keys refused),
/// checked across fields ([`Validate`]) and executed on a backend for the
/// subject `S`.
pub trait Kind<S: Subject>: Validate {
    /// Runs the measurement. Errors (a kernel that fails to launch, a shape
    /// the op refuses) become `error` rows; they never abort the run.
    fn execute(
        &self,
        backend: Backend,
        cx: &mut TrialContext<'_, S>,
    ) -> Result<Measurement, S::Error>;

    /// Why this check cannot be judged on `here` although it could run (no
    /// target stated for this GPU kind, a configuration that does not fit its
    /// memory), or `None`. Decided before the trial runs: such a trial is
    /// ignored with the reason and recorded `skipped`, never run and failed.
    fn unjudged_on(&self, _backend: Backend, _here: &Here) -> Option<String> {
        None
    }

    /// Whether running this check on `backend` stays within what `here` has
    /// and within the kind's documented bounds; the error says what it would
    /// need, e.g. "steps: 4000000000 needs ~128 GB on cpu; this machine has
    /// 24 GB". Checked when trials are planned, so a contract that validates
    /// can also run.
    fn check_budget(&self, _backend: Backend, _here: &Here) -> Result<(), String> {
        Ok(())
    }

    /// Seconds one trial of this kind may take before it is stopped and
    /// recorded as an `error` (a contract's `timeout_s` overrides it).
    fn default_timeout_s(&self) -> f64 {
        DEFAULT_TIMEOUT_S
    }

    /// Whether this check's verdict rests on what another process on the
    /// same GPU would change: a duration or rate it times, a peak of the
    /// device's free memory it measures, memory it fills. Such a trial has
    /// the GPU to itself (`.config/nextest.toml` runs it alone); any other
    /// cuda trial may share the GPU. tests/nextest_groups.rs holds that
    /// file's list to this method.
    fn needs_the_gpu_alone(&self) -> bool {
        false
    }

    /// Whether this check's trial spans the whole host: it starts work on
    /// every GPU (data-parallel ranks) or every core (it times work on a
    /// pool of CPU threads, or starts a peer that compiles on all of them).
    /// With [`Kind::needs_the_gpu_alone`] such a trial runs alone on the
    /// host, however many GPUs it has; one that needs only its GPU alone may
    /// run beside trials on other GPUs. Without it (a data-parallel claim
    /// that times nothing) the trial shares the GPUs with others like it,
    /// but never runs beside a trial that needs a GPU alone: its ranks would
    /// land on that GPU.
    fn needs_the_whole_host(&self) -> bool {
        false
    }

    /// Whether this check's GPU work runs on one CUDA stream, never two at
    /// once, so a context of one hardware work queue runs it as CUDA's
    /// default of eight does: where it needs the GPU alone, its process asks
    /// CUDA for one queue (`CUDA_DEVICE_MAX_CONNECTIONS=1`), which makes
    /// creating and destroying its context about half as costly. A check
    /// that runs streams side by side (collectives beside compute, a peer
    /// framework) keeps CUDA's default, what a user's process has. Shared
    /// trials always run with one queue: they time nothing.
    fn runs_on_one_stream(&self) -> bool {
        false
    }
}

/// The `check:` block of a falsification test: one of a subject's kinds
/// with its parameters. Declared with [`kinds!`](crate::kinds), which
/// writes every item here from one line per kind; the methods dispatch to
/// the kind's [`Kind`] impl.
pub trait KindSet: DeserializeOwned + Clone + Debug + Send + Sync + 'static {
    /// The subject whose kinds these are.
    type Subject: Subject;

    /// Every kind, in the order `falsify kinds` lists them.
    const KINDS: &'static [KindInfo];

    /// The `kind:` name.
    fn kind_name(&self) -> &'static str;

    /// See [`Kind::unjudged_on`].
    fn unjudged_on(&self, backend: Backend, here: &Here) -> Option<String>;

    /// See [`Kind::check_budget`].
    fn check_budget(&self, backend: Backend, here: &Here) -> Result<(), String>;

    /// See [`Kind::default_timeout_s`].
    fn default_timeout_s(&self) -> f64;

    /// See [`Kind::needs_the_gpu_alone`].
    fn needs_the_gpu_alone(&self) -> bool;

    /// See [`Kind::needs_the_whole_host`].
    fn needs_the_whole_host(&self) -> bool;

    /// See [`Kind::runs_on_one_stream`].
    fn runs_on_one_stream(&self) -> bool;

    /// Runs the measurement (see [`Kind::execute`]).
    fn execute(
        &self,
        backend: Backend,
        cx: &mut TrialContext<'_, Self::Subject>,
    ) -> Result<Measurement, <Self::Subject as Subject>::Error>;

    /// Parses the rest of a `check:` mapping as the parameters of kind
    /// `kind`; an unknown name is refused with the list of known ones.
    fn parse_kind<'de, A: MapAccess<'de>>(kind: &str, map: A) -> Result<Self, A::Error>;

    /// Whether this kind can run on `backend`.
    fn supports(&self, backend: Backend) -> bool {
        info(Self::KINDS, self.kind_name()).is_some_and(|k| k.backends.contains(&backend))
    }

    /// The backends this kind runs on, for messages.
    fn backends_text(&self) -> String {
        let backends = info(Self::KINDS, self.kind_name()).map_or(&[][..], |k| k.backends);
        let names: Vec<&str> = backends.iter().map(|b| b.as_str()).collect();
        names.join(", ")
    }
}

/// The entry of `kinds` named `name`.
fn info<'a>(kinds: &'a [KindInfo], name: &str) -> Option<&'a KindInfo> {
    kinds.iter().find(|k| k.name == name)
}

/// Parses `check:` (for [`kinds!`](crate::kinds)). `kind` must be the
/// first key; the rest of the mapping is handed, still streaming, to that
/// kind's strict `Params`, so serde_yaml keeps the exact line of an unknown
/// key or a bad value.
pub fn deserialize_check<'de, K: KindSet, D: Deserializer<'de>>(d: D) -> Result<K, D::Error> {
    d.deserialize_map(CheckVisitor(PhantomData))
}

struct CheckVisitor<K>(PhantomData<fn() -> K>);

impl<'de, K: KindSet> Visitor<'de> for CheckVisitor<K> {
    type Value = K;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a mapping whose first key is `kind`")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<K, A::Error> {
        match map.next_key::<String>()?.as_deref() {
            Some("kind") => {}
            Some(other) => {
                return Err(de::Error::custom(format!(
                    "`kind` must be the first key of `check`, found `{other}`"
                )))
            }
            None => return Err(de::Error::missing_field("kind")),
        }
        let kind: String = map.next_value()?;
        K::parse_kind(&kind, map)
    }
}

/// The Markdown reference of every kind of the set `K`: what it measures,
/// where it runs, its default timeout, a minimal check block, and a table
/// of its parameters (default or "required", bound, meaning). `falsify
/// kinds` prints it; the README holds a copy that a test keeps current.
pub fn reference_markdown<K: KindSet>() -> String {
    let mut out = String::new();
    for (i, kind) in K::KINDS.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        // The default timeout, read from the kind's parsed example.
        let timeout = serde_yaml::from_str::<K>(&example_yaml(kind, &[]))
            .ok()
            .map(|k| k.default_timeout_s());
        out.push_str(&kind_markdown(kind, timeout));
    }
    out
}

/// Declares a subject's kinds from one line each:
///
/// ```ignore
/// falsify_core::kinds! {
///     /// The `check:` block of a falsification test.
///     pub enum CheckSpec for Qlora {
///         OpParity(op_parity) "op_parity", CUDA, "rel-L2 error of an op vs the CPU reference";
///     }
/// }
/// ```
///
/// `Variant(module) "name", backends, "what it measures";`: the module
/// holds the kind's `Params` (which implement [`Kind`] for the subject),
/// `PARAMS` and `EXAMPLE`; the line makes it a variant of the enum, an
/// entry of `KINDS` (a constant beside the enum), a name the parser accepts
/// and an arm of every [`KindSet`] method.
#[macro_export]
macro_rules! kinds {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident for $subject:ty {
            $($variant:ident($module:ident) $kind:literal, $backends:expr, $measures:literal;)*
        }
    ) => {
        /// The registry of check kinds, in the order `falsify kinds` lists them.
        $vis const KINDS: &[$crate::check::KindInfo] = &[
            $($crate::check::KindInfo {
                name: $kind,
                measures: $measures,
                backends: $backends,
                params: $module::PARAMS,
                example: $module::EXAMPLE,
            },)*
        ];

        $(#[$meta])*
        #[derive(Debug, Clone)]
        $vis enum $name {
            $($variant($module::Params),)*
        }

        impl $crate::subject::KindSet for $name {
            type Subject = $subject;
            const KINDS: &'static [$crate::check::KindInfo] = KINDS;

            fn kind_name(&self) -> &'static str {
                match self {
                    $(Self::$variant(_) => $kind,)*
                }
            }

            fn unjudged_on(
                &self,
                backend: $crate::check::Backend,
                here: &$crate::check::Here,
            ) -> ::std::option::Option<::std::string::String> {
                match self {
                    $(Self::$variant(p) =>
                        <$module::Params as $crate::subject::Kind<$subject>>::unjudged_on(p, backend, here),)*
                }
            }

            fn check_budget(
                &self,
                backend: $crate::check::Backend,
                here: &$crate::check::Here,
            ) -> ::std::result::Result<(), ::std::string::String> {
                match self {
                    $(Self::$variant(p) =>
                        <$module::Params as $crate::subject::Kind<$subject>>::check_budget(p, backend, here),)*
                }
            }

            fn default_timeout_s(&self) -> f64 {
                match self {
                    $(Self::$variant(p) =>
                        <$module::Params as $crate::subject::Kind<$subject>>::default_timeout_s(p),)*
                }
            }

            fn needs_the_gpu_alone(&self) -> bool {
                match self {
                    $(Self::$variant(p) =>
                        <$module::Params as $crate::subject::Kind<$subject>>::needs_the_gpu_alone(p),)*
                }
            }

            fn needs_the_whole_host(&self) -> bool {
                match self {
                    $(Self::$variant(p) =>
                        <$module::Params as $crate::subject::Kind<$subject>>::needs_the_whole_host(p),)*
                }
            }

            fn runs_on_one_stream(&self) -> bool {
                match self {
                    $(Self::$variant(p) =>
                        <$module::Params as $crate::subject::Kind<$subject>>::runs_on_one_stream(p),)*
                }
            }

            fn execute(
                &self,
                backend: $crate::check::Backend,
                cx: &mut $crate::subject::TrialContext<'_, $subject>,
            ) -> ::std::result::Result<
                $crate::check::Measurement,
                <$subject as $crate::subject::Subject>::Error,
            > {
                match self {
                    $(Self::$variant(p) =>
                        <$module::Params as $crate::subject::Kind<$subject>>::execute(p, backend, cx),)*
                }
            }

            fn parse_kind<'de, A: $crate::__private::serde::de::MapAccess<'de>>(
                kind: &str,
                map: A,
            ) -> ::std::result::Result<Self, A::Error> {
                match kind {
                    $($kind => ::std::result::Result::Ok(Self::$variant($crate::check::parse_params(map)?)),)*
                    other => ::std::result::Result::Err($crate::check::unknown_kind(other, KINDS)),
                }
            }
        }

        impl<'de> $crate::__private::serde::Deserialize<'de> for $name {
            fn deserialize<D: $crate::__private::serde::Deserializer<'de>>(
                d: D,
            ) -> ::std::result::Result<Self, D::Error> {
                $crate::subject::deserialize_check(d)
            }
        }
    };
}
