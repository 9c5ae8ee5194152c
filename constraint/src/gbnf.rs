//! A regex as a GBNF expression (llama.cpp's grammar format), so a regex
//! constraint can be asked of an engine that takes grammars and not regexes
//! (llama.cpp's server, ENGINE-2's native dialect).
//!
//! The translation walks the pattern's syntax tree (regex-syntax's HIR, the
//! one regex-automata compiles [`Constraint`](crate::Constraint) from, with
//! the same flags), so both sides read the same language: literals become
//! quoted strings, classes character ranges, repetitions GBNF's `*`, `+`,
//! `?` and `{m,n}`, groups parentheses. GBNF is over characters, so a byte
//! class reaching past ASCII (only written with `(?-u)`) is refused, as is
//! an assertion (`^`, `$`, `\b`: GBNF has none; a constraint is anchored at
//! both ends already). Every refusal is a typed [`ConstraintError::Regex`]
//! naming what GBNF cannot say.
//!
//! The other way, [`to_regex`] reads a GBNF grammar whose rules do not
//! recurse as one regex (vLLM's `structured_outputs.grammar`, `generate
//! --grammar`): a plain recursive-descent parser of llama.cpp's syntax,
//! every rule inlined where it is used, a recursive rule refused by name.

use regex_syntax::hir::{Class, Hir, HirKind};

use crate::ConstraintError;

/// The GBNF expression matching exactly the texts `pattern` matches whole.
pub fn from_regex(pattern: &str) -> Result<String, ConstraintError> {
    let bad = |reason: String| ConstraintError::Regex { pattern: pattern.to_string(), reason };
    let hir = regex_syntax::parse(pattern).map_err(|e| bad(e.to_string()))?;
    let mut out = String::new();
    write(&hir, &mut out).map_err(|why| bad(format!("GBNF cannot say this: {why}")))?;
    Ok(out)
}

/// Appends `hir` as GBNF: a sequence bare, an alternation in parentheses.
fn write(hir: &Hir, out: &mut String) -> Result<(), String> {
    match hir.kind() {
        HirKind::Empty => out.push_str("\"\""),
        HirKind::Literal(lit) => {
            let text = std::str::from_utf8(&lit.0).map_err(|_| "a literal that is not UTF-8 text".to_string())?;
            write_text(text, out);
        }
        HirKind::Class(Class::Unicode(class)) => {
            let ranges: Vec<(char, char)> = class.ranges().iter().map(|r| (r.start(), r.end())).collect();
            write_class(&ranges, out)?;
        }
        HirKind::Class(Class::Bytes(class)) => {
            let ranges =
                class.ranges().iter().map(|r| if r.end() < 0x80 { Ok((char::from(r.start()), char::from(r.end()))) } else { Err(format!("a byte class reaching {:#04x}, past ASCII", r.end())) });
            write_class(&ranges.collect::<Result<Vec<_>, _>>()?, out)?;
        }
        HirKind::Look(look) => return Err(format!("an assertion ({look:?})")),
        HirKind::Repetition(rep) => {
            write_group(&rep.sub, out)?;
            match (rep.min, rep.max) {
                (0, None) => out.push('*'),
                (1, None) => out.push('+'),
                (0, Some(1)) => out.push('?'),
                (m, None) => out.push_str(&format!("{{{m},}}")),
                (m, Some(n)) if m == n => out.push_str(&format!("{{{m}}}")),
                (m, Some(n)) => out.push_str(&format!("{{{m},{n}}}")),
            }
        }
        HirKind::Capture(cap) => write_group(&cap.sub, out)?,
        // A sequence binds tighter than `|`, so it needs parentheses only
        // under a repetition ([`write_group`]).
        HirKind::Concat(items) => {
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(' ');
                }
                write(item, out)?;
            }
        }
        HirKind::Alternation(items) => {
            out.push('(');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(" | ");
                }
                write(item, out)?;
            }
            out.push(')');
        }
    }
    Ok(())
}

/// `hir` as an item a repetition may follow: parenthesised unless it is one
/// literal character, a class or already a group (a capture writes one).
fn write_group(hir: &Hir, out: &mut String) -> Result<(), String> {
    let atomic = match hir.kind() {
        HirKind::Class(_) | HirKind::Capture(_) | HirKind::Alternation(_) => true,
        HirKind::Literal(lit) => std::str::from_utf8(&lit.0).is_ok_and(|s| s.chars().count() == 1),
        _ => false,
    };
    if !atomic {
        out.push('(');
    }
    write(hir, out)?;
    if !atomic {
        out.push(')');
    }
    Ok(())
}

/// A character class as `[...]` of its ranges; an empty class matches
/// nothing, which GBNF cannot write.
fn write_class(ranges: &[(char, char)], out: &mut String) -> Result<(), String> {
    if ranges.is_empty() {
        return Err("an empty class (it matches nothing)".into());
    }
    write_ranges(ranges, false, out);
    Ok(())
}

/// `[...]` (`[^...]` negated) of `ranges`, each end escaped.
fn write_ranges(ranges: &[(char, char)], negated: bool, out: &mut String) {
    out.push('[');
    if negated {
        out.push('^');
    }
    for &(lo, hi) in ranges {
        escape(lo, &[']', '\\', '-', '^', '['], out);
        if hi != lo {
            out.push('-');
            escape(hi, &[']', '\\', '-', '^', '['], out);
        }
    }
    out.push(']');
}

/// A GBNF string of `text`.
fn write_text(text: &str, out: &mut String) {
    out.push('"');
    text.chars().for_each(|c| escape(c, &['"', '\\'], out));
    out.push('"');
}

/// One character of a GBNF string or class: printable ASCII as itself
/// unless special there, everything else as a code point escape (llama.cpp's
/// parser knows `\x`, `\u`, `\U` but no `\-` or `\^`).
fn escape(c: char, special: &[char], out: &mut String) {
    let code = u32::from(c);
    if (0x20..0x7f).contains(&code) && !special.contains(&c) {
        out.push(c);
    } else if code <= 0xff {
        out.push_str(&format!("\\x{code:02X}"));
    } else if code <= 0xffff {
        out.push_str(&format!("\\u{code:04X}"));
    } else {
        out.push_str(&format!("\\U{code:08X}"));
    }
}

/// `grammar` (GBNF, rule `root` the whole output, recursive or not) with
/// `end` after the whole output: its rules written again, `root` renamed to
/// a name no rule has, and a new `root` of the old one then `end` (a GBNF
/// expression: an engine's end-of-sequence token, `<[2]>`, so the output
/// can end exactly where it matches). Strings and classes are written with
/// [`escape`], so the text read back is the same language.
pub fn with_end(grammar: &str, end: &str) -> Result<String, ConstraintError> {
    let rules = parse_rules(grammar).map_err(|reason| ConstraintError::Grammar { reason })?;
    if !rules.iter().any(|(n, _)| n == "root") {
        return Err(ConstraintError::Grammar { reason: "no rule `root`".into() });
    }
    all_defined(&rules).map_err(|reason| ConstraintError::Grammar { reason })?;
    let body = (0..).map(|i| format!("root-body{i}")).find(|n| !rules.iter().any(|(r, _)| r == n)).expect("a free name");
    let rename = |n: &str| if n == "root" { body.clone() } else { n.to_string() };
    let mut out = format!("root ::= {body} ({end})\n");
    for (name, alts) in &rules {
        out.push_str(&format!("{} ::= ", rename(name)));
        write_alternatives(alts, &rename, &mut out);
        out.push('\n');
    }
    Ok(out)
}

/// Every rule used is defined: the first that is not, by name.
pub(crate) fn all_defined(rules: &[(String, Alternatives)]) -> Result<(), String> {
    fn used<'a>(alts: &'a Alternatives, out: &mut Vec<&'a str>) {
        for item in alts.iter().flatten() {
            match &item.atom {
                Atom::Rule(r) => out.push(r),
                Atom::Group(g) => used(g, out),
                _ => {}
            }
        }
    }
    let mut names = Vec::new();
    rules.iter().for_each(|(_, alts)| used(alts, &mut names));
    match names.into_iter().filter(|n| !rules.iter().any(|(d, _)| d == n)).min() {
        Some(name) => Err(format!("rule `{name}` is used but not defined")),
        None => Ok(()),
    }
}

fn write_alternatives(alts: &Alternatives, rename: &dyn Fn(&str) -> String, out: &mut String) {
    for (i, seq) in alts.iter().enumerate() {
        if i > 0 {
            out.push_str(" | ");
        }
        if seq.is_empty() {
            out.push_str("\"\"");
        }
        for (j, item) in seq.iter().enumerate() {
            if j > 0 {
                out.push(' ');
            }
            match &item.atom {
                Atom::Text(t) => write_text(t, out),
                Atom::Class(ranges, negated) => write_ranges(ranges, *negated, out),
                Atom::Any => out.push('.'),
                Atom::Rule(r) => out.push_str(&rename(r)),
                Atom::Group(g) => {
                    out.push('(');
                    write_alternatives(g, rename, out);
                    out.push(')');
                }
            }
            match item.repeat {
                (1, Some(1)) => {}
                (0, None) => out.push('*'),
                (1, None) => out.push('+'),
                (0, Some(1)) => out.push('?'),
                (m, None) => out.push_str(&format!("{{{m},}}")),
                (m, Some(n)) => out.push_str(&format!("{{{m},{n}}}")),
            }
        }
    }
}

/// The regex of a GBNF grammar (llama.cpp's format, rule `root` the whole
/// output) whose rules do not recurse, every rule inlined where it is used:
/// a grammar without recursion is a regular language, which is what a
/// constraint is (CONSTRAIN-5). Strings, character classes (ranges, `^`),
/// `.`, groups, alternation, `*`, `+`, `?` (whitespace before them allowed)
/// and `{m}`, `{m,}`, `{m,n}`, and `#` comments are read; a rule's body may
/// go on over newlines (llama.cpp's reader ends a rule at a newline outside
/// parentheses, so what it takes is read the same). A recursive rule, one
/// used from `root` but not defined, a redefined one,
/// a token reference (`<[id]>`, `<name>`: ids, not text) or anything
/// unparsable is a [`ConstraintError::Grammar`] naming it.
pub fn to_regex(grammar: &str) -> Result<String, ConstraintError> {
    match read(grammar)? {
        Read::Regular(regex) => Ok(regex),
        Read::Recursive { why, .. } => Err(ConstraintError::Grammar { reason: why }),
    }
}

/// A GBNF grammar as read: the regex of one without recursion, or the
/// rules of a recursive one (a context-free language, [`crate::cfg`]).
pub(crate) enum Read {
    Regular(String),
    Recursive { rules: Vec<(String, Alternatives)>, why: String },
}

pub(crate) fn read(grammar: &str) -> Result<Read, ConstraintError> {
    let bad = |reason: String| ConstraintError::Grammar { reason };
    let rules = parse_rules(grammar).map_err(bad)?;
    if !rules.iter().any(|(n, _)| n == "root") {
        return Err(bad("no rule `root`".into()));
    }
    let named = rules.iter().map(|(n, body)| (n.as_str(), body)).collect();
    let mut inliner = Inliner { rules: &named, stack: Vec::new(), done: std::collections::HashMap::new(), depth: 0, recursive: false };
    match inliner.inline("root") {
        Ok(regex) => Ok(Read::Regular(regex)),
        Err(why) if inliner.recursive => Ok(Read::Recursive { rules, why }),
        Err(why) => Err(bad(why)),
    }
}

/// The longest regex a grammar may inline to: each rule used twice by the
/// one above it doubles the text, so a hostile grammar of a few lines would
/// otherwise take all memory before the DFA's own size limit is reached.
pub const MAX_INLINED_BYTES: usize = 1 << 20;

/// One rule's body as parsed: a list of alternatives, each a sequence.
pub(crate) type Alternatives = Vec<Vec<Item>>;

#[derive(Debug, Clone)]
pub(crate) enum Atom {
    /// Text, matched exactly.
    Text(String),
    /// A character class: its ranges, negated or not.
    Class(Vec<(char, char)>, bool),
    /// Any one character.
    Any,
    Rule(String),
    Group(Alternatives),
}

#[derive(Debug, Clone)]
pub(crate) struct Item {
    pub(crate) atom: Atom,
    /// `{lo,hi}` (`None`: unbounded); `{1,Some(1)}` for none.
    pub(crate) repeat: (u32, Option<u32>),
}

/// The most repetitions a `{m,n}` may ask for (as a schema's bounds).
const MAX_REPEAT: u32 = 256;

pub(crate) fn parse_rules(text: &str) -> Result<Vec<(String, Alternatives)>, String> {
    let chars: Vec<char> = text.chars().collect();
    let mut p = Parser { chars: &chars, at: 0, depth: 0 };
    let mut rules: Vec<(String, Alternatives)> = Vec::new();
    let mut names = std::collections::HashSet::new();
    p.space();
    while p.at < chars.len() {
        let name = p.name().ok_or_else(|| format!("a rule name expected at character {}", p.at))?;
        p.space();
        if !p.eat("::=") {
            return Err(format!("`::=` expected after `{name}` at character {}", p.at));
        }
        let body = p.alternatives()?;
        if !names.insert(name.clone()) {
            return Err(format!("rule `{name}` is defined twice"));
        }
        rules.push((name, body));
        p.space();
    }
    Ok(rules)
}

struct Parser<'a> {
    chars: &'a [char],
    at: usize,
    /// Open groups here: bounded, so a hostile nesting cannot exhaust the stack.
    depth: usize,
}

/// The deepest a grammar's groups may nest, and its rules (each inlined
/// into the one using it).
const MAX_GROUP_DEPTH: usize = 64;

impl Parser<'_> {
    fn peek(&self) -> Option<char> {
        self.chars.get(self.at).copied()
    }

    /// Skips whitespace (newlines too) and `#` comments.
    fn space(&mut self) {
        while let Some(c) = self.peek() {
            if c == '#' {
                while self.peek().is_some_and(|c| c != '\n') {
                    self.at += 1;
                }
            } else if c.is_whitespace() {
                self.at += 1;
            } else {
                break;
            }
        }
    }

    fn eat(&mut self, s: &str) -> bool {
        let n = s.chars().count();
        if self.chars.get(self.at..self.at + n).is_some_and(|w| w.iter().copied().eq(s.chars())) {
            self.at += n;
            return true;
        }
        false
    }

    fn name(&mut self) -> Option<String> {
        let start = self.at;
        while self.peek().is_some_and(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_') {
            self.at += 1;
        }
        (self.at > start).then(|| self.chars[start..self.at].iter().collect())
    }

    /// Whether a rule definition (`name ::=`) starts here: the end of the body before it.
    fn at_definition(&mut self) -> bool {
        let save = self.at;
        let found = self.name().is_some() && {
            self.space();
            self.eat("::=")
        };
        self.at = save;
        found
    }

    fn alternatives(&mut self) -> Result<Alternatives, String> {
        let mut alts = vec![self.sequence()?];
        while self.eat("|") {
            alts.push(self.sequence()?);
        }
        Ok(alts)
    }

    fn sequence(&mut self) -> Result<Vec<Item>, String> {
        let mut items = Vec::new();
        loop {
            self.space();
            match self.peek() {
                None | Some('|' | ')') => return Ok(items),
                Some(_) if self.at_definition() => return Ok(items),
                Some(_) => {
                    let atom = self.atom()?;
                    // `x *` is `x*`, as llama.cpp reads it; not across a newline,
                    // where a `*` could only start nothing.
                    while self.peek().is_some_and(|c| c == ' ' || c == '\t') {
                        self.at += 1;
                    }
                    let repeat = self.repeat()?;
                    items.push(Item { atom, repeat });
                }
            }
        }
    }

    fn atom(&mut self) -> Result<Atom, String> {
        let at = self.at;
        match self.peek() {
            Some('"') => {
                self.at += 1;
                let mut text = String::new();
                loop {
                    match self.peek() {
                        None => return Err(format!("a string at character {at} is not closed")),
                        Some('"') => break,
                        Some(_) => text.push(self.char_in_literal()?),
                    }
                }
                self.at += 1;
                Ok(Atom::Text(text))
            }
            Some('[') => {
                self.at += 1;
                let negated = self.eat("^");
                let mut ranges = Vec::new();
                while self.peek() != Some(']') {
                    if self.peek().is_none() {
                        return Err(format!("a class at character {at} is not closed"));
                    }
                    let lo = self.char_in_literal()?;
                    let hi = if self.peek() == Some('-') && self.chars.get(self.at + 1) != Some(&']') {
                        self.at += 1;
                        self.char_in_literal()?
                    } else {
                        lo
                    };
                    if hi < lo {
                        return Err(format!("the range {lo:?}-{hi:?} at character {at} is empty"));
                    }
                    ranges.push((lo, hi));
                }
                self.at += 1;
                if ranges.is_empty() {
                    return Err(format!("the class at character {at} is empty"));
                }
                Ok(Atom::Class(ranges, negated))
            }
            Some('.') => {
                self.at += 1;
                Ok(Atom::Any)
            }
            Some('(') => {
                self.at += 1;
                self.depth += 1;
                if self.depth > MAX_GROUP_DEPTH {
                    return Err(format!("groups nest more than {MAX_GROUP_DEPTH} deep at character {at}"));
                }
                let alts = self.alternatives()?;
                self.depth -= 1;
                self.space();
                if !self.eat(")") {
                    return Err(format!("the group at character {at} is not closed"));
                }
                Ok(Atom::Group(alts))
            }
            Some('<') => Err(format!("a token reference at character {at}: a constraint is over text, not token ids")),
            _ => self.name().map(Atom::Rule).ok_or_else(|| format!("unexpected {:?} at character {at}", self.peek().unwrap_or(' '))),
        }
    }

    /// One character of a string or class, its escape undone.
    fn char_in_literal(&mut self) -> Result<char, String> {
        let at = self.at;
        let c = self.peek().ok_or("the text ends inside an escape")?;
        self.at += 1;
        if c != '\\' {
            return Ok(c);
        }
        let e = self.peek().ok_or("the text ends inside an escape")?;
        self.at += 1;
        let hex = |p: &mut Self, n: usize| -> Result<char, String> {
            let digits: String = p.chars.get(p.at..p.at + n).map(|d| d.iter().collect()).unwrap_or_default();
            p.at += n;
            let hex = digits.len() == n && digits.chars().all(|d| d.is_ascii_hexdigit());
            hex.then(|| u32::from_str_radix(&digits, 16).ok()).flatten().and_then(char::from_u32).ok_or_else(|| format!("the escape at character {at} is not a character"))
        };
        match e {
            'n' => Ok('\n'),
            't' => Ok('\t'),
            'r' => Ok('\r'),
            'x' => hex(self, 2),
            'u' => hex(self, 4),
            'U' => hex(self, 8),
            '\\' | '"' | '[' | ']' | '-' | '^' => Ok(e),
            other => Err(format!("unknown escape \\{other} at character {at}")),
        }
    }

    fn repeat(&mut self) -> Result<(u32, Option<u32>), String> {
        let at = self.at;
        let r = match self.peek() {
            Some('*') => (0, None),
            Some('+') => (1, None),
            Some('?') => (0, Some(1)),
            Some('{') => {
                self.at += 1;
                let num = |p: &mut Self| -> Option<u32> {
                    let start = p.at;
                    while p.peek().is_some_and(|c| c.is_ascii_digit()) {
                        p.at += 1;
                    }
                    p.chars[start..p.at].iter().collect::<String>().parse().ok()
                };
                let lo = num(self).ok_or_else(|| format!("a count expected at character {}", self.at))?;
                let hi = if self.eat(",") { num(self) } else { Some(lo) };
                if !self.eat("}") {
                    return Err(format!("the repetition at character {at} is not closed"));
                }
                if lo > MAX_REPEAT || hi.is_some_and(|h| h > MAX_REPEAT || h < lo) {
                    return Err(format!("the repetition at character {at} is outside 0 ..= {MAX_REPEAT} or empty"));
                }
                return Ok((lo, hi));
            }
            _ => return Ok((1, Some(1))),
        };
        self.at += 1;
        Ok(r)
    }
}

/// Inlines rules into one regex: `stack` is the rules being inlined (a rule
/// met again there is recursion), `done` each rule's regex once made.
struct Inliner<'a> {
    rules: &'a std::collections::HashMap<&'a str, &'a Alternatives>,
    stack: Vec<String>,
    done: std::collections::HashMap<String, String>,
    /// Rules and groups open here together, bounded as the parser's groups are.
    depth: usize,
    /// Set where the error is a recursive rule, or a regex too long: a
    /// context-free grammar holds either.
    recursive: bool,
}

impl Inliner<'_> {
    /// `name`'s regex with every rule it uses inlined.
    fn inline(&mut self, name: &str) -> Result<String, String> {
        if self.stack.iter().any(|n| n == name) {
            self.recursive = true;
            return Err(format!("rule `{name}` is recursive ({} -> {name}): a recursive grammar is not a regular language", self.stack.join(" -> ")));
        }
        if let Some(done) = self.done.get(name) {
            return Ok(done.clone());
        }
        let rules = self.rules;
        let body = *rules.get(name).ok_or_else(|| format!("rule `{name}` is used but not defined"))?;
        self.stack.push(name.to_string());
        let out = self.nested(&format!("rule `{name}`"), body);
        self.stack.pop();
        let out = out?;
        self.done.insert(name.to_string(), out.clone());
        Ok(out)
    }

    /// [`Inliner::alternatives`] one level deeper, refused past the bound.
    fn nested(&mut self, what: &str, alts: &Alternatives) -> Result<String, String> {
        if self.depth >= MAX_GROUP_DEPTH {
            return Err(format!("rules and groups nest more than {MAX_GROUP_DEPTH} deep at {what}"));
        }
        self.depth += 1;
        let out = self.alternatives(alts);
        self.depth -= 1;
        out
    }

    fn alternatives(&mut self, alts: &Alternatives) -> Result<String, String> {
        let mut parts = Vec::with_capacity(alts.len());
        let mut len = 0;
        for seq in alts {
            let mut s = String::new();
            for item in seq {
                let atom = match &item.atom {
                    Atom::Text(t) => regex_syntax::escape(t),
                    Atom::Class(ranges, negated) => {
                        let body: String = ranges.iter().map(|&(lo, hi)| format!("\\x{{{:x}}}-\\x{{{:x}}}", lo as u32, hi as u32)).collect();
                        format!("[{}{body}]", if *negated { "^" } else { "" })
                    }
                    Atom::Any => "(?s:.)".into(),
                    Atom::Rule(r) => self.inline(r)?,
                    Atom::Group(g) => self.nested("a group", g)?,
                };
                let (lo, hi) = item.repeat;
                let suffix = match (lo, hi) {
                    (1, Some(1)) => String::new(),
                    (lo, Some(hi)) => format!("{{{lo},{hi}}}"),
                    (lo, None) => format!("{{{lo},}}"),
                };
                len += atom.len() + suffix.len() + 4;
                if len > MAX_INLINED_BYTES {
                    self.recursive = true;
                    return Err(format!("the grammar inlines to more than {MAX_INLINED_BYTES} bytes of regex (rules used many times over)"));
                }
                s.push_str(&format!("(?:{atom}){suffix}"));
            }
            parts.push(s);
        }
        Ok(format!("(?:{})", parts.join("|")))
    }
}
