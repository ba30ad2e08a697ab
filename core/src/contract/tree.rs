//! A contract's YAML as a tree of located nodes, to say where a problem is.
//!
//! serde_yaml locates an error at the node it was reading; reached through
//! an alias (`*shapes`), that is the anchored node, wherever the anchor is,
//! and the message's path (`falsification_tests[2].check.shapes[0]`) is the
//! only trace of the use. serde_yaml also reads a tagged value (`!foo x`,
//! `!!binary x`) as the plain value, dropping the tag unread.
//!
//! This tree is read with libyaml, the parser serde_yaml is built on, so its
//! nodes are the ones serde_yaml reads. It keeps each node's position and
//! tag, and each alias as a reference to its anchored node (not expanded:
//! the tree is no larger than the file). [`Tree::find`] follows a path as
//! serde_yaml writes it and reports the first alias on the way, which is
//! where the value is used.

use std::ffi::CStr;
use std::marker::PhantomData;
use std::mem::MaybeUninit;

/// A 1-based line and column, as serde_yaml's locations give them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Mark {
    pub line: usize,
    pub column: usize,
}

impl Mark {
    fn of(m: unsafe_libyaml::yaml_mark_t) -> Mark {
        Mark {
            line: m.line as usize + 1,
            column: m.column as usize + 1,
        }
    }
}

/// The first document of a YAML text as nodes; node 0 is the root.
#[derive(Default)]
pub(super) struct Tree {
    nodes: Vec<Node>,
    /// Every node's tag, with its position, in document order.
    tags: Vec<(Mark, String)>,
}

struct Node {
    mark: Mark,
    kind: NodeKind,
}

enum NodeKind {
    Scalar,
    Seq(Vec<usize>),
    /// Each entry's key (its text when it is a scalar) and value.
    Map(Vec<(Option<String>, usize)>),
    /// `*name`, and the node `&name` anchors (`None`: no such anchor).
    Alias {
        name: String,
        target: Option<usize>,
    },
}

/// Where [`Tree::find`] led.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Found {
    /// The node, or the first alias on the way to it.
    pub mark: Mark,
    /// When the way passed an alias: its anchor's name and position.
    pub anchor: Option<(String, Mark)>,
}

/// A problem libyaml reported, and where.
#[derive(Debug)]
pub(super) struct SyntaxError {
    pub mark: Mark,
    pub problem: String,
}

impl Tree {
    /// Reads the first document of `text`.
    pub fn read(text: &str) -> Result<Tree, SyntaxError> {
        let mut parser = Parser::new(text)?;
        let mut builder = Builder::default();
        loop {
            let (event, mark) = parser.next()?;
            match event {
                Event::End => builder.end(),
                Event::Node { anchor, tag, node } => builder.node(mark, anchor, tag, node),
                Event::DocumentEnd | Event::StreamEnd => break,
                Event::Other => {}
            }
        }
        Ok(builder.tree)
    }

    /// The first tag in the document, as written (`!foo`, `!!binary`).
    pub fn first_tag(&self) -> Option<(Mark, String)> {
        self.tags.first().map(|(mark, tag)| (*mark, shorthand(tag)))
    }

    /// The node at `path`, written as serde_yaml writes paths in its
    /// messages: `.` for the root, else keys and `[index]`es joined by `.`
    /// (`falsification_tests[2].check.shapes[0]`). `None` when the path
    /// leads nowhere.
    pub fn find(&self, path: &str) -> Option<Found> {
        if self.nodes.is_empty() {
            return None;
        }
        let rest = if path == "." { "" } else { path };
        self.walk(0, rest, None)
    }

    fn walk(&self, at: usize, rest: &str, alias: Option<(Mark, String, Mark)>) -> Option<Found> {
        let node = self.nodes.get(at)?;
        if let NodeKind::Alias { name, target } = &node.kind {
            let target = (*target)?;
            let anchor = self.nodes.get(target)?.mark;
            // The first alias on the way is where the value is used.
            let alias = alias.or_else(|| Some((node.mark, name.clone(), anchor)));
            return self.walk(target, rest, alias);
        }
        if rest.is_empty() {
            return Some(match alias {
                Some((mark, name, anchor)) => Found {
                    mark,
                    anchor: Some((name, anchor)),
                },
                None => Found {
                    mark: node.mark,
                    anchor: None,
                },
            });
        }
        match &node.kind {
            NodeKind::Seq(items) => {
                let (index, rest) = rest.strip_prefix('[')?.split_once(']')?;
                let item = *items.get(index.parse::<usize>().ok()?)?;
                self.walk(item, rest.strip_prefix('.').unwrap_or(rest), alias)
            }
            // Keys may hold `.` or `[`: try every key the path starts with.
            NodeKind::Map(entries) => entries.iter().find_map(|(key, value)| {
                let after = rest.strip_prefix(key.as_deref()?)?;
                let next = match after.as_bytes().first() {
                    None | Some(b'[') => after,
                    Some(b'.') => &after[1..],
                    Some(_) => return None,
                };
                self.walk(*value, next, alias.clone())
            }),
            NodeKind::Scalar | NodeKind::Alias { .. } => None,
        }
    }
}

/// `tag:yaml.org,2002:binary` as it is written, `!!binary`.
fn shorthand(tag: &str) -> String {
    match tag.strip_prefix("tag:yaml.org,2002:") {
        Some(name) => format!("!!{name}"),
        None => tag.to_string(),
    }
}

/// Builds the tree from events: each open collection on a stack, each
/// anchor's latest node by name.
#[derive(Default)]
struct Builder {
    tree: Tree,
    open: Vec<Open>,
    anchors: std::collections::HashMap<String, usize>,
}

/// An open collection, and for a mapping the key read before its value.
struct Open {
    node: usize,
    key: Option<Option<String>>,
}

/// A node's content as its event gives it.
enum NewNode {
    Scalar(String),
    Seq,
    Map,
    Alias(String),
}

impl Builder {
    fn node(&mut self, mark: Mark, anchor: Option<String>, tag: Option<String>, new: NewNode) {
        let id = self.tree.nodes.len();
        if let Some(tag) = tag {
            self.tree.tags.push((mark, tag));
        }
        let (kind, key_text, opens) = match new {
            NewNode::Scalar(text) => (NodeKind::Scalar, Some(text), false),
            NewNode::Seq => (NodeKind::Seq(Vec::new()), None, true),
            NewNode::Map => (NodeKind::Map(Vec::new()), None, true),
            NewNode::Alias(name) => {
                let target = self.anchors.get(&name).copied();
                (NodeKind::Alias { name, target }, None, false)
            }
        };
        self.tree.nodes.push(Node { mark, kind });
        if let Some(name) = anchor {
            self.anchors.insert(name, id);
        }
        self.attach(id, key_text);
        if opens {
            self.open.push(Open {
                node: id,
                key: None,
            });
        }
    }

    /// Adds node `id` to the innermost open collection: an item of a
    /// sequence, or a mapping's key (kept by its text) or value.
    fn attach(&mut self, id: usize, key_text: Option<String>) {
        let Some(parent) = self.open.last_mut() else {
            return;
        };
        match &mut self.tree.nodes[parent.node].kind {
            NodeKind::Seq(items) => items.push(id),
            NodeKind::Map(entries) => match parent.key.take() {
                None => parent.key = Some(key_text),
                Some(key) => entries.push((key, id)),
            },
            NodeKind::Scalar | NodeKind::Alias { .. } => {}
        }
    }

    fn end(&mut self) {
        self.open.pop();
    }
}

/// What the tree needs of one libyaml event.
enum Event {
    Node {
        anchor: Option<String>,
        tag: Option<String>,
        node: NewNode,
    },
    /// The end of a sequence or mapping.
    End,
    DocumentEnd,
    StreamEnd,
    /// Stream and document starts.
    Other,
}

/// libyaml's event parser over a borrowed text.
struct Parser<'a> {
    /// Boxed: libyaml keeps pointers into the parser, so it must not move.
    sys: Box<MaybeUninit<unsafe_libyaml::yaml_parser_t>>,
    /// libyaml reads the text through a raw pointer while the parser lives.
    text: PhantomData<&'a str>,
}

impl<'a> Parser<'a> {
    fn new(text: &'a str) -> Result<Parser<'a>, SyntaxError> {
        let mut sys = Box::new(MaybeUninit::<unsafe_libyaml::yaml_parser_t>::uninit());
        // SAFETY: `yaml_parser_initialize` zeroes the whole struct before it
        // sets it up, and on failure frees what it allocated, so a parser is
        // only kept (and later deleted in `drop`) once it is initialised.
        // The input pointer and length are those of `text`, which outlives
        // the parser (`'a`), and libyaml only reads through it.
        unsafe {
            if unsafe_libyaml::yaml_parser_initialize(sys.as_mut_ptr()).fail {
                return Err(SyntaxError {
                    mark: Mark { line: 1, column: 0 },
                    problem: "libyaml could not allocate its parser".into(),
                });
            }
            unsafe_libyaml::yaml_parser_set_encoding(
                sys.as_mut_ptr(),
                unsafe_libyaml::YAML_UTF8_ENCODING,
            );
            unsafe_libyaml::yaml_parser_set_input_string(
                sys.as_mut_ptr(),
                text.as_ptr(),
                text.len() as u64,
            );
        }
        Ok(Parser {
            sys,
            text: PhantomData,
        })
    }

    fn next(&mut self) -> Result<(Event, Mark), SyntaxError> {
        let mut event = MaybeUninit::<unsafe_libyaml::yaml_event_t>::uninit();
        let parser = self.sys.as_mut_ptr();
        // SAFETY: the parser was initialised in `new` and is used by this
        // thread only. `yaml_parser_parse` fills the event when it succeeds,
        // and only then is the event read; `convert` copies out everything
        // kept before `yaml_event_delete` frees the event's strings. On
        // failure libyaml sets `problem` (a static C string, or null) and
        // `problem_mark`.
        unsafe {
            if unsafe_libyaml::yaml_parser_parse(parser, event.as_mut_ptr()).fail {
                let state = &*parser;
                let problem = state.problem;
                return Err(SyntaxError {
                    mark: Mark::of(state.problem_mark),
                    problem: if problem.is_null() {
                        "a YAML syntax error".into()
                    } else {
                        CStr::from_ptr(problem).to_string_lossy().into_owned()
                    },
                });
            }
            let event = event.assume_init_mut();
            let converted = convert(event);
            let mark = Mark::of(event.start_mark);
            unsafe_libyaml::yaml_event_delete(event);
            Ok((converted, mark))
        }
    }
}

impl Drop for Parser<'_> {
    fn drop(&mut self) {
        // SAFETY: a `Parser` exists only once `yaml_parser_initialize`
        // succeeded (see `new`), and is deleted once, here.
        unsafe { unsafe_libyaml::yaml_parser_delete(self.sys.as_mut_ptr()) }
    }
}

/// Copies what the tree keeps out of a parsed event.
///
/// # Safety
/// `event` must be an event `yaml_parser_parse` filled and that has not
/// been deleted: its `type_` says which member of `data` is set, and that
/// member's strings are null or NUL-terminated, its scalar value `length`
/// bytes long.
unsafe fn convert(event: &unsafe_libyaml::yaml_event_t) -> Event {
    // SAFETY (for every block below): the member read is the one `type_`
    // names, and its pointers are valid per this function's contract.
    match event.type_ {
        unsafe_libyaml::YAML_SCALAR_EVENT => unsafe {
            let s = event.data.scalar;
            let value = std::slice::from_raw_parts(s.value, s.length as usize);
            Event::Node {
                anchor: c_text(s.anchor),
                tag: c_text(s.tag),
                node: NewNode::Scalar(String::from_utf8_lossy(value).into_owned()),
            }
        },
        unsafe_libyaml::YAML_SEQUENCE_START_EVENT => unsafe {
            let s = event.data.sequence_start;
            Event::Node {
                anchor: c_text(s.anchor),
                tag: c_text(s.tag),
                node: NewNode::Seq,
            }
        },
        unsafe_libyaml::YAML_MAPPING_START_EVENT => unsafe {
            let m = event.data.mapping_start;
            Event::Node {
                anchor: c_text(m.anchor),
                tag: c_text(m.tag),
                node: NewNode::Map,
            }
        },
        unsafe_libyaml::YAML_ALIAS_EVENT => unsafe {
            Event::Node {
                anchor: None,
                tag: None,
                node: NewNode::Alias(c_text(event.data.alias.anchor).unwrap_or_default()),
            }
        },
        unsafe_libyaml::YAML_SEQUENCE_END_EVENT | unsafe_libyaml::YAML_MAPPING_END_EVENT => {
            Event::End
        }
        unsafe_libyaml::YAML_DOCUMENT_END_EVENT => Event::DocumentEnd,
        unsafe_libyaml::YAML_STREAM_END_EVENT | unsafe_libyaml::YAML_NO_EVENT => Event::StreamEnd,
        _ => Event::Other,
    }
}

/// A C string of libyaml's as text; `None` for a null pointer.
///
/// # Safety
/// `ptr` must be null or point to a NUL-terminated string.
unsafe fn c_text(ptr: *const u8) -> Option<String> {
    if ptr.is_null() {
        return None;
    }
    // SAFETY: non-null and NUL-terminated per this function's contract.
    let text = unsafe { CStr::from_ptr(ptr.cast()) };
    Some(text.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "a:\n  b: &x [1, {c: 2}]\n  d: *x\ne.f: [3]\n";

    fn at(line: usize, column: usize) -> Mark {
        Mark { line, column }
    }

    #[test]
    fn paths_lead_to_nodes_and_aliases_to_their_use() {
        let tree = Tree::read(TEXT).unwrap();
        let found = |p: &str| tree.find(p).map(|f| f.mark);
        assert_eq!(found("."), Some(at(1, 1)));
        assert_eq!(found("a.b"), Some(at(2, 6)));
        assert_eq!(found("a.b[1].c"), Some(at(2, 17)));
        // Through the alias: located at `*x`, naming the anchor.
        let through = tree.find("a.d[1].c").unwrap();
        assert_eq!(through.mark, at(3, 6));
        assert_eq!(through.anchor, Some(("x".to_string(), at(2, 6))));
        // A key holding a dot.
        assert_eq!(found("e.f[0]"), Some(at(4, 7)));
        assert_eq!(found("a.z"), None);
        assert_eq!(found("a.b[7]"), None);
    }

    #[test]
    fn tags_are_kept_as_written() {
        let tree = Tree::read("a: !!binary aGk=\nb: !x {c: 1}\n").unwrap();
        assert_eq!(tree.first_tag(), Some((at(1, 4), "!!binary".to_string())));
        assert_eq!(Tree::read(TEXT).unwrap().first_tag(), None);
    }

    #[test]
    fn a_syntax_error_is_located() {
        let e = Tree::read("a: [1, 2\n").err().unwrap();
        assert_eq!(e.mark.line, 2);
        assert!(!e.problem.is_empty());
    }
}
