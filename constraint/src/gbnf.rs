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
            out.push('"');
            text.chars().for_each(|c| escape(c, &['"', '\\'], out));
            out.push('"');
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
    out.push('[');
    for &(lo, hi) in ranges {
        escape(lo, &[']', '\\', '-', '^', '['], out);
        if hi != lo {
            out.push('-');
            escape(hi, &[']', '\\', '-', '^', '['], out);
        }
    }
    out.push(']');
    Ok(())
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
