//! What a skill may be: exactly one function definition, and nothing that runs when it is
//! defined. A saved skill is defined at the start of every new session of its user, before
//! the model's first code, so anything besides the `def` (a top-level call, an import, an
//! assignment) would run there unasked, every time. The source is parsed on the host
//! (Ruff's parser, `ruff_python_parser`, which reads current Python) before it is stored and
//! again whenever it is read back, so a skill stored before this check existed, or written
//! into the store by hand, is reported as broken rather than defined.
//!
//! Defining a function runs three kinds of code of its own, and each is decided here:
//! - **decorators** are calls: refused (apply one in a cell after the skill is defined);
//! - **default values** are evaluated: only literals are allowed (numbers, strings, bytes,
//!   `None`, `True`, `False`, `...`, a sign before a number, and tuples, lists, sets and
//!   dicts of those, nested at most [`MAX_DEFAULT_DEPTH`] deep), which run nothing;
//! - **annotations** are evaluated at definition before Python 3.14: the runtime defines a
//!   skill with `from __future__ import annotations` in force, so they stay strings and run
//!   nothing (on 3.14 they are lazy anyway). Type parameters (`def f[T]`) are lazy too.
//!
//! The function's body runs only when the code calls it, as any code of the session does.

use ruff_python_ast::{Expr, Stmt, UnaryOp};

/// Deepest nesting of a default value's literal containers (the runtime checks the same).
pub const MAX_DEFAULT_DEPTH: usize = bridge_core::protocol::SKILL_DEFAULT_DEPTH;

/// Stack of the thread that parses: the parser grows its own stack as it descends, but the
/// tree it returns is dropped recursively, and a source of `skills.max_size` (1 MiB at most)
/// can nest hundreds of thousands of levels (`1+1+1+…`). Reserved, not used: a thread's
/// stack is mapped lazily.
const PARSE_STACK: usize = 1 << 30;

/// Why a source cannot be a skill (not exactly one function of its name, code that would run
/// at definition, a source the parser cannot read).
#[derive(Debug, thiserror::Error)]
pub enum NotASkill {
    /// The thread the source is parsed on could not be started.
    #[error("cannot start the parser's thread: {0}")]
    ParserThread(#[source] std::io::Error),
    /// The parser panicked on the source.
    #[error("the parser failed on it")]
    ParserFailed,
    /// The source is not Python the parser reads; `line` is where it stopped (1-based).
    #[error("its source is not Python this bridge can read (line {line}: {error})")]
    NotPython {
        /// The line of the error, counted from 1.
        line: usize,
        /// The parser's error.
        #[source]
        error: ruff_python_parser::ParseErrorType,
    },
    /// The source has no statement at all.
    #[error("its source defines nothing; a skill is one `def {name}(...):`")]
    Empty {
        /// The skill's name.
        name: String,
    },
    /// The source is one statement, but not a function definition.
    #[error("its source is {found}, not a function definition; a skill is one `def {name}(...):`")]
    NotAFunction {
        /// The skill's name.
        name: String,
        /// What the statement is, for a person ("an import", "a call").
        found: &'static str,
    },
    /// The source has more than one top-level statement.
    #[error(
        "its source has {count} top-level statements (one of them {other}); a skill is exactly one function definition, with nothing before or after it that would run when a session starts (put imports and helpers inside the function)"
    )]
    TooManyStatements {
        /// How many top-level statements there are.
        count: usize,
        /// What one of those besides the skill's function is ("an import", "a call").
        other: &'static str,
    },
    /// The source's one function has another name than the skill.
    #[error("its source defines {found:?}, not {name:?}")]
    WrongName {
        /// The name the source defines.
        found: String,
        /// The skill's name.
        name: String,
    },
    /// The function is decorated.
    #[error(
        "it has a decorator, which runs when the skill is defined; save the undecorated function and apply the decorator in a cell"
    )]
    Decorated,
    /// A parameter's default value is not a literal.
    #[error(
        "the default value of its parameter {parameter:?} is an expression, which runs when the skill is defined; defaults may only be literals (numbers, strings, None, True, False, and tuples, lists, sets or dicts of them): use None and compute the value inside the function"
    )]
    DefaultNotLiteral {
        /// The parameter's name.
        parameter: String,
    },
}

/// `Ok` when `source` is exactly one function definition named `name` that runs nothing when
/// it is defined; else why not, as a sentence that says what to change.
pub fn check(name: &str, source: &str) -> Result<(), NotASkill> {
    let (name, source) = (name.to_string(), source.to_string());
    std::thread::Builder::new()
        .name("skill-parse".into())
        .stack_size(PARSE_STACK)
        .spawn(move || check_here(&name, &source))
        .map_err(NotASkill::ParserThread)?
        .join()
        .unwrap_or(Err(NotASkill::ParserFailed))
}

fn check_here(name: &str, source: &str) -> Result<(), NotASkill> {
    let parsed = ruff_python_parser::parse_module(source).map_err(|e| {
        let at = usize::from(e.location.start()).min(source.len());
        let line = source.as_bytes()[..at]
            .iter()
            .filter(|b| **b == b'\n')
            .count()
            + 1;
        NotASkill::NotPython {
            line,
            error: e.error,
        }
    })?;
    let body = &parsed.syntax().body;
    let def = match body.as_slice() {
        [Stmt::FunctionDef(def)] => def,
        [] => return Err(NotASkill::Empty { name: name.into() }),
        [one] => {
            return Err(NotASkill::NotAFunction {
                name: name.into(),
                found: what(one),
            });
        }
        more => {
            let other = more
                .iter()
                .find(|s| !matches!(s, Stmt::FunctionDef(d) if d.name.as_str() == name))
                .unwrap_or(&more[1]);
            return Err(NotASkill::TooManyStatements {
                count: more.len(),
                other: what(other),
            });
        }
    };
    if def.name.as_str() != name {
        return Err(NotASkill::WrongName {
            found: def.name.as_str().into(),
            name: name.into(),
        });
    }
    if !def.decorator_list.is_empty() {
        return Err(NotASkill::Decorated);
    }
    let p = &def.parameters;
    for param in p.posonlyargs.iter().chain(&p.args).chain(&p.kwonlyargs) {
        if let Some(default) = &param.default
            && !literal(default, 0)
        {
            return Err(NotASkill::DefaultNotLiteral {
                parameter: param.parameter.name.as_str().into(),
            });
        }
    }
    Ok(())
}

/// Whether evaluating `e` runs nothing but building a constant.
fn literal(e: &Expr, depth: usize) -> bool {
    if depth > MAX_DEFAULT_DEPTH {
        return false;
    }
    match e {
        Expr::StringLiteral(_)
        | Expr::BytesLiteral(_)
        | Expr::NumberLiteral(_)
        | Expr::BooleanLiteral(_)
        | Expr::NoneLiteral(_)
        | Expr::EllipsisLiteral(_) => true,
        Expr::UnaryOp(u) => {
            matches!(u.op, UnaryOp::USub | UnaryOp::UAdd)
                && matches!(*u.operand, Expr::NumberLiteral(_))
        }
        Expr::Tuple(t) => t.elts.iter().all(|e| literal(e, depth + 1)),
        Expr::List(l) => l.elts.iter().all(|e| literal(e, depth + 1)),
        Expr::Set(s) => s.elts.iter().all(|e| literal(e, depth + 1)),
        Expr::Dict(d) => d.items.iter().all(|i| {
            i.key.as_ref().is_some_and(|k| literal(k, depth + 1)) && literal(&i.value, depth + 1)
        }),
        _ => false,
    }
}

/// A statement named for a person: "an import", "a call".
fn what(s: &Stmt) -> &'static str {
    match s {
        Stmt::FunctionDef(_) => "another function definition",
        Stmt::ClassDef(_) => "a class definition",
        Stmt::Import(_) | Stmt::ImportFrom(_) => "an import",
        Stmt::Assign(_) | Stmt::AugAssign(_) | Stmt::AnnAssign(_) | Stmt::TypeAlias(_) => {
            "an assignment"
        }
        Stmt::Expr(e) if matches!(*e.value, Expr::Call(_)) => "a call",
        Stmt::Expr(_) => "an expression",
        _ => "a statement",
    }
}

#[cfg(test)]
mod tests {
    use super::check;

    #[test]
    fn one_function_and_nothing_that_runs() {
        for ok in [
            "def f(x):\n    return x * 2\n",
            "async def f(a, /, b=1, *args, c=-2.5, d=(1, 'x', None), e={'k': [b'\\x00', ...]}, **kw) -> int:\n    \"\"\"Doc.\"\"\"\n    import os\n    return os.getpid()\n",
            "def f(x: os.system('annotations are strings')) -> print('never'):\n    pass\n",
            "def f[T](x: T) -> T:\n    return x\n",
            "# a comment\n\ndef f():\n    return f'{1}'  # runs when called\n",
        ] {
            if let Err(e) = check("f", ok) {
                panic!("{ok}: {e}");
            }
        }
    }

    #[test]
    fn code_besides_the_function_is_refused_with_a_reason() {
        for (source, says) in [
            ("import os\ndef f():\n    pass\n", "one of them an import"),
            (
                "def f():\n    pass\nos.system('id')\n",
                "one of them a call",
            ),
            (
                "def f():\n    pass\n__import__('os').system('id')\n",
                "a call",
            ),
            (
                "def f():\n    pass\ndef g():\n    pass\n",
                "another function definition",
            ),
            ("x = 1\n", "an assignment, not a function"),
            ("", "defines nothing"),
            ("@print\ndef f():\n    pass\n", "decorator"),
            ("def f(x=print('boo')):\n    pass\n", "parameter \"x\""),
            (
                "def f(*, x=[1, (2, open('/etc/passwd'))]):\n    pass\n",
                "parameter \"x\"",
            ),
            ("def f(x=-y):\n    pass\n", "parameter \"x\""),
            ("def f(x=f'{y}'):\n    pass\n", "parameter \"x\""),
            ("def g():\n    pass\n", "defines \"g\", not \"f\""),
            (
                "def f(:\n    pass\n",
                "not Python this bridge can read (line 1",
            ),
            ("def f():\n    pass\n\x1b[1A\x1b[2K", "not Python"),
        ] {
            let e = check("f", source).unwrap_err().to_string();
            assert!(e.contains(says), "{source:?}: {e}");
        }
        let deep = format!(
            "def f(x={}1{}):\n    pass\n",
            "[".repeat(40),
            "]".repeat(40)
        );
        assert!(check("f", &deep).is_err());
    }

    /// A source as large as `skills.max_size` allows, nested as deep as it can be, is read and
    /// dropped without exhausting a stack.
    #[test]
    fn deep_nesting_is_no_crash() {
        let n = 300_000;
        let sums = format!("def f():\n    return {}1\n", "1+".repeat(n));
        assert!(check("f", &sums).is_ok());
        let lists = format!("def f():\n    return {}{}\n", "[".repeat(n), "]".repeat(n));
        let _ = check("f", &lists);
        let neg = format!("def f():\n    return {}1\n", "-".repeat(n));
        assert!(check("f", &neg).is_ok());
    }
}
