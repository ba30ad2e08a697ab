//! [`Check`]: a test's `check:` block, one of the core's kinds or one of
//! its subject's.

use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, Deserialize, Deserializer, MapAccess, Visitor};

use super::{CoreKind, CORE_KINDS};
use crate::check::doc::{example_yaml, kind_markdown};
use crate::check::{Backend, Here, KindInfo};
use crate::subject::{reference_markdown, KindSet};

/// The `check:` block of a falsification test of a subject whose kinds are
/// `K`: the `kind:` name picks one of the core's kinds or one of `K`.
#[derive(Debug, Clone)]
pub enum Check<K> {
    /// One of the core's kinds.
    Core(CoreKind),
    /// One of the subject's kinds.
    Subject(K),
}

impl<K: KindSet> Check<K> {
    /// The `kind:` name.
    pub fn kind_name(&self) -> &'static str {
        match self {
            Check::Core(k) => k.kind_name(),
            Check::Subject(k) => k.kind_name(),
        }
    }

    /// The registry entry of this check's kind.
    fn info(&self) -> Option<&'static KindInfo> {
        let kinds = match self {
            Check::Core(_) => CORE_KINDS,
            Check::Subject(_) => K::KINDS,
        };
        kinds.iter().find(|k| k.name == self.kind_name())
    }

    /// Whether this check can run on `backend`.
    pub fn supports(&self, backend: Backend) -> bool {
        self.info().is_some_and(|k| k.backends.contains(&backend))
    }

    /// The backends this check's kind runs on, for messages.
    pub fn backends_text(&self) -> String {
        let backends = self.info().map_or(&[][..], |k| k.backends);
        let names: Vec<&str> = backends.iter().map(|b| b.as_str()).collect();
        names.join(", ")
    }

    /// See [`crate::subject::Kind::unjudged_on`].
    pub fn unjudged_on(&self, backend: Backend, here: &Here) -> Option<String> {
        match self {
            Check::Core(k) => k.unjudged_on(backend, here),
            Check::Subject(k) => k.unjudged_on(backend, here),
        }
    }

    /// See [`crate::subject::Kind::check_budget`].
    pub fn check_budget(&self, backend: Backend, here: &Here) -> Result<(), String> {
        match self {
            Check::Core(k) => k.check_budget(backend, here),
            Check::Subject(k) => k.check_budget(backend, here),
        }
    }

    /// See [`crate::subject::Kind::default_timeout_s`].
    pub fn default_timeout_s(&self) -> f64 {
        match self {
            Check::Core(k) => k.default_timeout_s(),
            Check::Subject(k) => k.default_timeout_s(),
        }
    }

    /// See [`crate::subject::Kind::needs_the_gpu_alone`].
    pub fn needs_the_gpu_alone(&self) -> bool {
        match self {
            Check::Core(k) => k.needs_the_gpu_alone(),
            Check::Subject(k) => k.needs_the_gpu_alone(),
        }
    }

    /// See [`crate::subject::Kind::needs_the_whole_host`].
    pub fn needs_the_whole_host(&self) -> bool {
        match self {
            Check::Core(k) => k.needs_the_whole_host(),
            Check::Subject(k) => k.needs_the_whole_host(),
        }
    }

    /// See [`crate::subject::Kind::runs_on_one_stream`].
    pub fn runs_on_one_stream(&self) -> bool {
        match self {
            Check::Core(k) => k.runs_on_one_stream(),
            Check::Subject(k) => k.runs_on_one_stream(),
        }
    }

    /// Whether the subject can run this check (a core kind's `model:` is
    /// one its workload trains, ...): `Err((key, why))`, located at the
    /// check's `key` (`""`: the check itself). Called when a contract loads.
    pub fn validate_for_subject(&self) -> Result<(), (&'static str, String)> {
        match self {
            Check::Core(k) => k.validate_for::<K::Subject>(),
            Check::Subject(_) => Ok(()),
        }
    }
}

impl<'de, K: KindSet> Deserialize<'de> for Check<K> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(CheckVisitor(PhantomData))
    }
}

struct CheckVisitor<K>(PhantomData<fn() -> K>);

impl<'de, K: KindSet> Visitor<'de> for CheckVisitor<K> {
    type Value = Check<K>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a mapping whose first key is `kind`")
    }

    /// `kind` must be the first key; the rest of the mapping goes, still
    /// streaming, to that kind's strict `Params`, so serde_yaml keeps the
    /// exact line of an unknown key or a bad value.
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Check<K>, A::Error> {
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
        if K::KINDS.iter().any(|k| k.name == kind) {
            return K::parse_kind(&kind, map).map(Check::Subject);
        }
        match CoreKind::parse(&kind, map) {
            Some(parsed) => parsed.map(Check::Core),
            None => Err(unknown_kind(&kind, K::KINDS)),
        }
    }
}

/// The error for an unknown `kind:` name, listing the subject's kinds and
/// the core's.
fn unknown_kind<E: de::Error>(name: &str, subject: &[KindInfo]) -> E {
    let names = |kinds: &[KindInfo]| {
        let names: Vec<&str> = kinds.iter().map(|k| k.name).collect();
        names.join(", ")
    };
    E::custom(format!(
        "unknown check kind `{name}`; known kinds: {}; the core's kinds: {}",
        names(subject),
        names(CORE_KINDS)
    ))
}

/// The Markdown reference of every kind a contract of a subject with kinds
/// `K` may use: the subject's (see [`reference_markdown`]), then the
/// core's. `falsify kinds` prints it.
pub fn kinds_markdown<K: KindSet>() -> String {
    let mut out = reference_markdown::<K>();
    for kind in CORE_KINDS {
        out.push('\n');
        // The default timeout, read from the kind's parsed example.
        let timeout = serde_yaml::from_str::<Check<K>>(&example_yaml(kind, &[]))
            .ok()
            .map(|k| k.default_timeout_s());
        out.push_str(&kind_markdown(kind, timeout));
    }
    out
}
