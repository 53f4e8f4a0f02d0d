//! Parses the text that [`crate::printer::print_trace`] writes back into a [`Trace`].
//!
//! The parser exists for golden tests and for reading dumps, so it accepts exactly the printed
//! format: a `def` line, one type comment per input, one call per line (a composite's
//! decomposition on the lines after it, one level deeper, as comments) and a `return`. Every
//! call is re-recorded through a [`TraceBuilder`], so prims get their metadata from their meta
//! rules; type comments are checked against it, never trusted.
//!
//! Value names in the text are only names: `t7` may follow `t12`, numbers may have gaps (the
//! output of a pass that removed values, a hand-edited golden file). The parser maps each name
//! to a dense id in the order the values are defined (inputs first), as the builder numbers
//! them, so the trace it returns prints densely numbered. A name read before any line defines
//! it is an error naming it and the line.

use crate::dtype::{DType, Device};
use crate::error::{ErrorKind, IrError, Result};
use crate::ids::ValueId;
use crate::printer::describe_kind;
use crate::symbols::{SymbolKind, SymbolTable};
use crate::symfloat::FloatFn;
use crate::trace::{Trace, TraceBuilder};
use crate::value::{Arg, Kwargs, Scalar, TensorMeta, ValueKind};
use rustc_hash::FxHashMap;
use std::fmt;

/// The op name parse errors carry.
const OP: &str = "trace parser";

/// Parses a whole printed trace.
///
/// Every call is re-recorded, so its outputs get their prim's meta rule's metadata. Errors (a
/// [`ErrorKind::Value`] with op `trace parser`) name the line: a syntax error, an unknown prim
/// or symbol, a value read before it is defined, a type comment that disagrees with the meta
/// rule, or the meta rule's own error.
///
/// ```
/// use trace_ir::parser::parse_trace;
///
/// let trace = parse_trace(concat!(
///     "def computation(t0, t1):\n",
///     "  # t0: \"cpu f32[2, 3]\"\n",
///     "  # t1: \"cpu f32[2, 3]\"\n",
///     "  t2 = prims.mul(t0, t1)  # t2: \"cpu f32[2, 3]\"\n",
///     "  t3 = prims.sum(t2, (1,))  # t3: \"cpu f32[2]\"\n",
///     "  return t3\n",
/// ))?;
/// assert_eq!(trace.bsyms.len(), 2);
///
/// // A type comment is checked against the meta rule, never trusted.
/// let error = parse_trace(concat!(
///     "def computation(t0):\n",
///     "  # t0: \"cpu f32[2, 3]\"\n",
///     "  t1 = prims.sum(t0, (1,))  # t1: \"cpu f32[3]\"\n",
///     "  return t1\n",
/// ))
/// .unwrap_err();
/// assert!(error.message.contains("line 3"), "{error}");
/// # Ok::<(), trace_ir::IrError>(())
/// ```
pub fn parse_trace(text: &str) -> Result<Trace> {
    let mut lines = text.lines().enumerate().map(|(i, l)| (i + 1, l)).filter(|(_, l)| !is_preamble(l));
    let Some((number, def)) = lines.next() else {
        return Err(error(1, "expected `def <name>(<inputs>):`, found no code"));
    };
    let mut parser = Parser::new(parse_def(number, def)?);
    let mut last = number;
    for (number, line) in lines {
        parser.line(number, line)?;
        last = number;
    }
    parser.finish(last)
}

/// Parses the arguments of a call as printed between its parentheses: `t0, (1,), keepdim=True`.
pub fn parse_args(text: &str) -> Result<(Vec<Arg>, Kwargs)> {
    let tokens = lex(NO_LINE, &format!("({text})"))?.tokens;
    let mut cursor = Cursor::new(&tokens, NO_LINE);
    let args = cursor.call_args()?;
    cursor.finish()?;
    Ok(args)
}

/// Parses the type of a value as type comments print it: `cpu f32[4, 4]`, `int 3`. An input's
/// tensor type may end in ` requires_grad` (traces for the VJP pass).
pub fn parse_value_type(text: &str) -> Result<ValueKind> {
    if let Some(tensor) = text.strip_suffix(" requires_grad") {
        return match parse_value_type(tensor)? {
            ValueKind::Tensor(t) => Ok(ValueKind::Tensor(TensorMeta { requires_grad: true, ..t })),
            ValueKind::Number(_) | ValueKind::Size(_) => {
                Err(IrError::new(ErrorKind::Value, OP, format!("a number cannot require grad: \"{text}\"")))
            }
        };
    }
    let bad = || IrError::new(ErrorKind::Value, OP, format!("cannot read the type \"{text}\""));
    let (head, rest) = text.split_once(' ').ok_or_else(bad)?;
    if head == "size" {
        return rest.parse().map(ValueKind::Size).map_err(|_| bad());
    }
    if let "int" | "float" | "bool" = head {
        let tokens = lex(NO_LINE, rest)?.tokens;
        let mut cursor = Cursor::new(&tokens, NO_LINE);
        let arg = cursor.arg()?;
        cursor.finish()?;
        return match arg {
            Arg::Scalar(s) if s.type_name() == head => Ok(ValueKind::Number(s)),
            _ => Err(bad()),
        };
    }
    let device = parse_device(head)?;
    let (dtype, dims) = rest.strip_suffix(']').and_then(|r| r.split_once('[')).ok_or_else(bad)?;
    let dtype = DType::ALL.into_iter().find(|d| d.short_name() == dtype).ok_or_else(bad)?;
    let shape =
        dims.split(',').map(str::trim).filter(|d| !d.is_empty()).map(sizes::parse_dim).collect::<Result<Vec<_>>>()?;
    Ok(ValueKind::Tensor(TensorMeta::with_dims(dtype, device, shape)))
}

mod sizes;

/// The line number of text parsed out of context ([`parse_args`], [`parse_value_type`]).
const NO_LINE: usize = 0;

fn error(line: usize, message: impl fmt::Display) -> IrError {
    let message = if line == NO_LINE { message.to_string() } else { format!("line {line}: {message}") };
    IrError::new(ErrorKind::Value, OP, message)
}

fn parse_device(text: &str) -> Result<Device> {
    Device::parse(text).map_err(|e| IrError::new(ErrorKind::Value, OP, e.message))
}

/// Adds the line number to an error raised while recording the call on `line`.
fn at(line: usize) -> impl FnOnce(IrError) -> IrError {
    move |mut e| {
        e.message = format!("line {line}: {}", e.message);
        e
    }
}

/// Lines outside the function: blanks, imports, and comments at column 0 (which is where golden
/// tests put their directives).
fn is_preamble(line: &str) -> bool {
    line.trim().is_empty() || line.starts_with('#') || line.starts_with("import ") || line.starts_with("from ")
}

// ---------------------------------------------------------------------------------------------
// Lexing

#[derive(Clone, Debug, PartialEq)]
enum Token {
    Name(String),
    /// A number's text without sign; the parser decides int or float.
    Number(String),
    Str(String),
    Punct(char),
    Ellipsis,
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Token::Name(s) | Token::Number(s) => write!(f, "`{s}`"),
            Token::Str(s) => write!(f, "{s:?}"),
            Token::Punct(c) => write!(f, "`{c}`"),
            Token::Ellipsis => f.write_str("`...`"),
        }
    }
}

fn describe(token: Option<&Token>) -> String {
    token.map_or("the end of the line".to_string(), Token::to_string)
}

/// A line split into tokens, and the text of its trailing `#` comment.
struct Lexed {
    tokens: Vec<Token>,
    comment: Option<String>,
}

fn lex(line: usize, text: &str) -> Result<Lexed> {
    let chars: Vec<char> = text.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while let Some(&c) = chars.get(i) {
        let start = i;
        i += 1;
        match c {
            ' ' | '\t' => {}
            '#' => {
                let comment = chars[i..].iter().collect::<String>().trim().to_string();
                return Ok(Lexed { tokens, comment: Some(comment) });
            }
            '"' | '\'' => {
                let (s, end) = lex_string(line, &chars, start)?;
                tokens.push(Token::Str(s));
                i = end;
            }
            '.' if chars[i..].starts_with(&['.', '.']) => {
                tokens.push(Token::Ellipsis);
                i += 2;
            }
            '0'..='9' => {
                i = scan_number(&chars, start);
                tokens.push(Token::Number(chars[start..i].iter().collect()));
            }
            c if c.is_alphabetic() || c == '_' => {
                while chars.get(i).is_some_and(|c| c.is_alphanumeric() || *c == '_') {
                    i += 1;
                }
                tokens.push(Token::Name(chars[start..i].iter().collect()));
            }
            '(' | ')' | '[' | ']' | ',' | '=' | ':' | '.' | '-' | '+' | '*' | '/' | '%' => tokens.push(Token::Punct(c)),
            other => return Err(error(line, format!("unexpected character {other:?}"))),
        }
    }
    Ok(Lexed { tokens, comment: None })
}

/// The end of the number starting at `start`: digits, an optional fraction and exponent.
fn scan_number(chars: &[char], start: usize) -> usize {
    let digits = |mut i: usize| {
        while chars.get(i).is_some_and(char::is_ascii_digit) {
            i += 1;
        }
        i
    };
    let mut i = digits(start);
    if chars.get(i) == Some(&'.') && chars.get(i + 1) != Some(&'.') {
        i = digits(i + 1);
    }
    if matches!(chars.get(i), Some('e' | 'E')) {
        let sign = usize::from(matches!(chars.get(i + 1), Some('+' | '-')));
        if chars.get(i + 1 + sign).is_some_and(char::is_ascii_digit) {
            i = digits(i + 1 + sign);
        }
    }
    i
}

/// Reads a quoted string starting at `start` with the escapes Rust's `{:?}` writes; returns it and
/// the position after the closing quote.
fn lex_string(line: usize, chars: &[char], start: usize) -> Result<(String, usize)> {
    let quote = chars[start];
    let mut out = String::new();
    let mut i = start + 1;
    loop {
        let Some(&c) = chars.get(i) else { return Err(error(line, "unterminated string")) };
        i += 1;
        match c {
            c if c == quote => return Ok((out, i)),
            '\\' => {
                let (c, next) = unescape(line, chars, i)?;
                out.push(c);
                i = next;
            }
            c => out.push(c),
        }
    }
}

fn unescape(line: usize, chars: &[char], i: usize) -> Result<(char, usize)> {
    let simple = match chars.get(i) {
        Some('n') => '\n',
        Some('t') => '\t',
        Some('r') => '\r',
        Some('0') => '\0',
        Some(c @ ('\\' | '"' | '\'')) => *c,
        Some('u') if chars.get(i + 1) == Some(&'{') => {
            let close = (i + 2..chars.len()).find(|&j| chars[j] == '}');
            let code = close.and_then(|j| {
                let hex: String = chars[i + 2..j].iter().collect();
                u32::from_str_radix(&hex, 16).ok().and_then(char::from_u32).map(|c| (c, j + 1))
            });
            return code.ok_or_else(|| error(line, "bad \\u{...} escape in string"));
        }
        _ => return Err(error(line, "unknown escape in string")),
    };
    Ok((simple, i + 1))
}

/// `t12` -> value 12.
fn value_id(name: &str) -> Option<ValueId> {
    let digits = name.strip_prefix('t')?;
    let canonical =
        !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) && (digits == "0" || !digits.starts_with('0'));
    canonical.then(|| digits.parse().ok().map(ValueId)).flatten()
}

// ---------------------------------------------------------------------------------------------
// Arguments

/// Reads the tokens of one line.
struct Cursor<'a> {
    tokens: &'a [Token],
    pos: usize,
    line: usize,
}

impl<'a> Cursor<'a> {
    fn new(tokens: &'a [Token], line: usize) -> Self {
        Cursor { tokens, pos: 0, line }
    }

    fn error(&self, message: impl fmt::Display) -> IrError {
        error(self.line, message)
    }

    fn peek(&self, ahead: usize) -> Option<&'a Token> {
        self.tokens.get(self.pos + ahead)
    }

    fn bump(&mut self) -> Option<&'a Token> {
        let token = self.tokens.get(self.pos);
        self.pos += usize::from(token.is_some());
        token
    }

    fn found(&self) -> String {
        describe(self.peek(0))
    }

    fn eat(&mut self, c: char) -> bool {
        let hit = self.peek(0) == Some(&Token::Punct(c));
        self.pos += usize::from(hit);
        hit
    }

    fn expect(&mut self, c: char) -> Result<()> {
        if !self.eat(c) {
            return Err(self.error(format!("expected `{c}`, found {}", self.found())));
        }
        Ok(())
    }

    fn name(&mut self) -> Result<&'a str> {
        match self.peek(0) {
            Some(Token::Name(name)) => {
                self.pos += 1;
                Ok(name)
            }
            _ => Err(self.error(format!("expected a name, found {}", self.found()))),
        }
    }

    fn string(&mut self) -> Result<&'a str> {
        match self.bump() {
            Some(Token::Str(s)) => Ok(s),
            _ => Err(self.error("expected a string")),
        }
    }

    fn value(&mut self) -> Result<ValueId> {
        let name = self.name()?;
        value_id(name).ok_or_else(|| self.error(format!("expected a value name like t0, found `{name}`")))
    }

    /// `prims.add`, `torch.Tensor.add`.
    fn dotted_name(&mut self) -> Result<String> {
        let mut name = self.name()?.to_string();
        while self.eat('.') {
            name.push('.');
            name.push_str(self.name()?);
        }
        Ok(name)
    }

    fn finish(&self) -> Result<()> {
        match self.peek(0) {
            None => Ok(()),
            Some(token) => Err(self.error(format!("unexpected {token} after the end of the statement"))),
        }
    }

    /// One argument, written as [`crate::printer::write_arg`] writes it: a literal, a value, or
    /// an int expression over size values (`2*t0 + 1`, see [`sizes`]).
    fn arg(&mut self) -> Result<Arg> {
        let first = self.primary()?;
        self.expression_after(first)
    }

    /// An argument without the operators that may follow it.
    fn primary(&mut self) -> Result<Arg> {
        match self.bump() {
            Some(Token::Number(text)) => self.number(text).map(Arg::Scalar),
            Some(Token::Punct('-')) => match self.bump() {
                Some(Token::Number(text)) => self.number(&format!("-{text}")).map(Arg::Scalar),
                Some(Token::Punct('(')) => {
                    self.pos -= 1;
                    let operand = self.primary()?;
                    sizes::negated(&operand).ok_or_else(|| self.error("expected a number after `-`"))
                }
                _ => Err(self.error("expected a number after `-`")),
            },
            Some(Token::Str(s)) => Ok(Arg::Str(s.clone())),
            Some(Token::Ellipsis) => Ok(Arg::Ellipsis),
            Some(Token::Punct('(')) => match self.sequence(')')? {
                (mut items, false) if items.len() == 1 => Ok(items.remove(0)),
                (items, _) => Ok(Arg::Tuple(items)),
            },
            Some(Token::Punct('[')) => Ok(Arg::List(self.sequence(']')?.0)),
            Some(Token::Name(name)) => self.named(name),
            other => Err(self.error(format!("expected an argument, found {}", describe(other)))),
        }
    }

    fn number(&self, text: &str) -> Result<Scalar> {
        let parsed = if text.contains(['.', 'e', 'E']) {
            text.parse().ok().map(Scalar::Float)
        } else {
            text.parse().ok().map(Scalar::Int)
        };
        parsed.ok_or_else(|| self.error(format!("bad number {text}")))
    }

    /// Items up to `close`, after the opening bracket; also says whether a comma came last.
    fn sequence(&mut self, close: char) -> Result<(Vec<Arg>, bool)> {
        let mut items = Vec::new();
        let mut comma = false;
        while !self.eat(close) {
            items.push(self.arg()?);
            comma = self.eat(',');
            if !comma {
                self.expect(close)?;
                break;
            }
        }
        Ok((items, comma))
    }

    /// An argument that starts with a name: a value, a constant, or a call spelling a literal.
    fn named(&mut self, name: &str) -> Result<Arg> {
        match name {
            "None" => Ok(Arg::None),
            "True" => Ok(Arg::Scalar(Scalar::Bool(true))),
            "False" => Ok(Arg::Scalar(Scalar::Bool(false))),
            "float" => self.special_float(),
            "slice" => {
                self.expect('(')?;
                match <[Arg; 3]>::try_from(self.sequence(')')?.0) {
                    Ok(parts) => Ok(Arg::Slice(Box::new(parts))),
                    Err(_) => Err(self.error("slice(...) takes exactly 3 arguments")),
                }
            }
            "torch" => self.torch_attribute(),
            "math" => self.math_call(),
            _ => {
                if let Some(v) = value_id(name) {
                    return Ok(Arg::Value(v));
                }
                let constant = name.strip_prefix("_c").and_then(|i| i.parse().ok());
                constant.map(Arg::PyConst).ok_or_else(|| self.error(format!("unknown name `{name}`")))
            }
        }
    }

    /// `float('inf')`, `float('-inf')`, `float('nan')`.
    fn special_float(&mut self) -> Result<Arg> {
        self.expect('(')?;
        let x = match self.string()? {
            "inf" => f64::INFINITY,
            "-inf" => f64::NEG_INFINITY,
            "nan" => f64::NAN,
            other => return Err(self.error(format!("unsupported float('{other}')"))),
        };
        self.expect(')')?;
        Ok(Arg::Scalar(Scalar::Float(x)))
    }

    /// `math.log(operand)`: a function of `math` of a symbolic float (`FloatFn`).
    fn math_call(&mut self) -> Result<Arg> {
        self.expect('.')?;
        let name = self.name()?;
        let func = FloatFn::from_name(name).ok_or_else(|| self.error(format!("unknown function math.{name}")))?;
        self.expect('(')?;
        let operand = self.arg()?;
        self.expect(')')?;
        sizes::math_call(func, &operand).ok_or_else(|| self.error(format!("math.{name} of a non-number")))
    }

    /// `torch.float32` or `torch.device('cpu')`.
    fn torch_attribute(&mut self) -> Result<Arg> {
        self.expect('.')?;
        let name = self.name()?;
        if name == "sym_sqrt" {
            self.expect('(')?;
            let operand = self.arg()?;
            self.expect(')')?;
            return sizes::square_root(&operand).ok_or_else(|| self.error("torch.sym_sqrt of a non-number"));
        }
        if name != "device" {
            let dtype = DType::ALL.into_iter().find(|d| d.torch_name() == name);
            return dtype.map(Arg::DType).ok_or_else(|| self.error(format!("unknown dtype torch.{name}")));
        }
        self.expect('(')?;
        let device = parse_device(self.string()?).map_err(at(self.line))?;
        self.expect(')')?;
        Ok(Arg::Device(device))
    }

    /// `(args, key=value)`, parentheses included.
    fn call_args(&mut self) -> Result<(Vec<Arg>, Kwargs)> {
        self.expect('(')?;
        let (mut args, mut kwargs) = (Vec::new(), Vec::new());
        while !self.eat(')') {
            if let (Some(Token::Name(key)), Some(Token::Punct('='))) = (self.peek(0), self.peek(1)) {
                self.pos += 2;
                kwargs.push((key.clone(), self.arg()?));
            } else if kwargs.is_empty() {
                args.push(self.arg()?);
            } else {
                return Err(self.error("positional argument after a keyword argument"));
            }
            if !self.eat(',') {
                self.expect(')')?;
                break;
            }
        }
        Ok((args, kwargs))
    }
}

// ---------------------------------------------------------------------------------------------
// Lines

/// A type comment: `t3: "cpu f32[4]", t4: "cpu i64[4]"`.
type Types = Vec<(ValueId, String)>;

/// One call line: `(t3, t4) = prims.topk(t0, 2, 0, True, True)  # t3: ..., t4: ...`.
struct Call {
    line: usize,
    targets: Vec<ValueId>,
    callee: String,
    args: Vec<Arg>,
    kwargs: Kwargs,
    types: Types,
}

/// What a line of the function body holds.
enum Statement {
    Call(Call),
    Return(Arg),
    /// A comment line of its own at the top level: the type of an input.
    Types(Types),
    /// `# guard t0 - t1 == 0`: a relation between sizes the trace relies on.
    Guard(crate::sym::Guard),
}

/// `def computation(t0, t1):` -> the inputs.
fn parse_def(line: usize, text: &str) -> Result<Vec<ValueId>> {
    let lexed = lex(line, text)?;
    let mut c = Cursor::new(&lexed.tokens, line);
    if c.name().ok() != Some("def") {
        return Err(error(line, "expected `def <name>(<inputs>):`"));
    }
    c.name()?;
    c.expect('(')?;
    let mut inputs = Vec::new();
    while !c.eat(')') {
        inputs.push(c.value()?);
        if !c.eat(',') {
            c.expect(')')?;
            break;
        }
    }
    c.expect(':')?;
    c.finish()?;
    if let Some((i, v)) = inputs.iter().enumerate().find(|(i, v)| inputs[..*i].contains(v)) {
        return Err(error(line, format!("input {} is {v}, which names an earlier input too", i + 1)));
    }
    Ok(inputs)
}

/// Splits a body line into its depth (0 for top-level symbols, 1 for their decompositions, ...)
/// and its statement.
fn parse_line(line: usize, text: &str) -> Result<(usize, Statement)> {
    let indent = text.len() - text.trim_start_matches(' ').len();
    if indent < 2 || !indent.is_multiple_of(2) {
        return Err(error(line, format!("indentation of {indent} spaces; the body is indented by 2 per level")));
    }
    let depth = indent / 2 - 1;
    let body = &text[indent..];
    if depth == 0 {
        let lexed = lex(line, body)?;
        if lexed.tokens.is_empty() {
            let comment = lexed.comment.as_deref().unwrap_or("");
            if let Some(guard) = comment.strip_prefix("guard ") {
                return Ok((0, Statement::Guard(sizes::parse_guard(line, guard)?)));
            }
            let types = parse_types(line, comment)?;
            return Ok((0, Statement::Types(types)));
        }
        return Ok((0, parse_statement(line, lexed)?));
    }
    let Some(nested) = body.strip_prefix("# ") else {
        return Err(error(line, "a decomposition line must be a comment (`# t3 = ...`)"));
    };
    match parse_statement(line, lex(line, nested)?)? {
        Statement::Call(call) => Ok((depth, Statement::Call(call))),
        _ => Err(error(line, "expected a call in a decomposition")),
    }
}

fn parse_statement(line: usize, lexed: Lexed) -> Result<Statement> {
    let mut c = Cursor::new(&lexed.tokens, line);
    if c.peek(0) == Some(&Token::Name("return".into())) {
        c.pos += 1;
        let arg = c.arg()?;
        c.finish()?;
        return Ok(Statement::Return(arg));
    }
    let targets = parse_targets(&mut c)?;
    let callee = c.dotted_name()?;
    let (args, kwargs) = c.call_args()?;
    c.finish()?;
    let types = parse_types(line, lexed.comment.as_deref().unwrap_or(""))?;
    Ok(Statement::Call(Call { line, targets, callee, args, kwargs, types }))
}

/// `t3 = ` or `(t3, t4) = `, or nothing for a call without outputs.
fn parse_targets(c: &mut Cursor) -> Result<Vec<ValueId>> {
    if c.eat('(') {
        let mut targets = Vec::new();
        while !c.eat(')') {
            targets.push(c.value()?);
            if !c.eat(',') {
                c.expect(')')?;
                break;
            }
        }
        c.expect('=')?;
        return Ok(targets);
    }
    if c.peek(1) == Some(&Token::Punct('=')) {
        let target = c.value()?;
        c.expect('=')?;
        return Ok(vec![target]);
    }
    Ok(Vec::new())
}

fn parse_types(line: usize, comment: &str) -> Result<Types> {
    let lexed = lex(line, comment)?;
    let mut c = Cursor::new(&lexed.tokens, line);
    let mut types = Vec::new();
    while c.peek(0).is_some() {
        let v = c.value()?;
        c.expect(':')?;
        types.push((v, c.string()?.to_string()));
        if !c.eat(',') {
            break;
        }
    }
    c.finish()?;
    Ok(types)
}

// ---------------------------------------------------------------------------------------------
// Recording

/// A composite call whose decomposition lines are being read.
struct OpenComposite {
    depth: usize,
    call: Call,
    /// The first value id its decomposition can define.
    first_value: usize,
}

struct Parser {
    builder: TraceBuilder,
    /// The inputs as the text names them, in order.
    inputs: Vec<ValueId>,
    input_types: Vec<Option<ValueKind>>,
    /// Each name the text has defined so far, and the dense id its value got.
    names: FxHashMap<ValueId, ValueId>,
    open: Vec<OpenComposite>,
    started: bool,
    outputs: Option<Arg>,
    /// The guards the text states, over the names it uses.
    guards: Vec<crate::sym::Guard>,
}

impl Parser {
    fn new(inputs: Vec<ValueId>) -> Self {
        let input_types = vec![None; inputs.len()];
        let (builder, names) = (TraceBuilder::new(), FxHashMap::default());
        Parser {
            builder,
            inputs,
            input_types,
            names,
            open: Vec::new(),
            started: false,
            outputs: None,
            guards: Vec::new(),
        }
    }

    /// `arg` with each name replaced by its value's id; a name no earlier line defines is an
    /// error naming it.
    fn resolve(&self, line: usize, arg: &Arg) -> Result<Arg> {
        let mut unknown = None;
        let resolved = arg.map_values(&mut |v| match self.names.get(&v) {
            Some(&id) => Arg::Value(id),
            None => {
                unknown.get_or_insert(v);
                Arg::Value(v)
            }
        });
        match unknown {
            Some(v) => Err(error(line, format!("{v} is read here but no line above defines it"))),
            None => sizes::with_hints(&resolved, &self.builder).map_err(at(line)),
        }
    }

    /// A call's arguments with their names resolved.
    fn resolve_call(&self, call: &Call) -> Result<(Vec<Arg>, Kwargs)> {
        let args = call.args.iter().map(|a| self.resolve(call.line, a)).collect::<Result<_>>()?;
        let kwargs = call.kwargs.iter().map(|(k, a)| Ok((k.clone(), self.resolve(call.line, a)?)));
        Ok((args, kwargs.collect::<Result<_>>()?))
    }

    /// The value a defined name refers to.
    fn id(&self, name: ValueId) -> Option<ValueId> {
        self.names.get(&name).copied()
    }

    /// Gives the names a call's line defines to the values the call recorded.
    fn define(&mut self, call: &Call, values: &[ValueId]) -> Result<()> {
        if values.len() != call.targets.len() {
            let count = values.len();
            let message =
                format!("{} defines {count} value(s), but the line names {}", call.callee, names(&call.targets));
            return Err(error(call.line, message));
        }
        for (&name, &id) in call.targets.iter().zip(values) {
            if self.names.insert(name, id).is_some() {
                return Err(error(call.line, format!("{name} is defined a second time")));
            }
        }
        Ok(())
    }

    fn line(&mut self, number: usize, text: &str) -> Result<()> {
        if self.outputs.is_some() {
            return Err(error(number, "code after `return`"));
        }
        match parse_line(number, text)? {
            (_, Statement::Types(types)) if !self.started => self.input_types(number, types),
            (_, Statement::Types(_)) => {
                Err(error(number, "type comments of inputs must come right after the `def` line"))
            }
            (_, Statement::Guard(guard)) if !self.started => {
                self.guards.push(guard);
                Ok(())
            }
            (_, Statement::Guard(_)) => Err(error(number, "guards must come right after the `def` line")),
            (depth, Statement::Call(call)) => {
                self.start(number)?;
                self.close_composites(depth)?;
                if depth > self.open.len() {
                    return Err(error(number, "this line is indented deeper than a decomposition of the line above"));
                }
                self.call(depth, call)
            }
            (_, Statement::Return(arg)) => {
                self.start(number)?;
                self.close_composites(0)?;
                self.outputs = Some(self.resolve(number, &arg)?);
                Ok(())
            }
        }
    }

    fn input_types(&mut self, line: usize, types: Types) -> Result<()> {
        for (v, text) in types {
            let Some(i) = self.inputs.iter().position(|&input| input == v) else {
                return Err(error(line, format!("{v} is not an input")));
            };
            self.input_types[i] = Some(parse_value_type(&text).map_err(at(line))?);
        }
        Ok(())
    }

    /// Adds the inputs once their type comments have been read.
    fn start(&mut self, line: usize) -> Result<()> {
        if std::mem::replace(&mut self.started, true) {
            return Ok(());
        }
        for (&v, kind) in self.inputs.iter().zip(&self.input_types) {
            let Some(kind) = kind else {
                return Err(error(line, format!("input {v} has no type comment (`# {v}: \"cpu f32[4]\"`)")));
            };
            let kind = self.resolve_kind(line, kind)?;
            let id = self.builder.add_input(kind);
            self.names.insert(v, id);
        }
        for guard in std::mem::take(&mut self.guards) {
            let guard = self.resolve_guard(line, &guard)?;
            self.builder.facts_mut().assume(guard);
        }
        Ok(())
    }

    fn call(&mut self, depth: usize, call: Call) -> Result<()> {
        let line = call.line;
        let (args, kwargs) = self.resolve_call(&call)?;
        let outputs = match call.callee.split_once('.') {
            Some(("prims", name)) => {
                if let Some((key, _)) = kwargs.first() {
                    return Err(error(line, format!("prims take no keyword arguments, got {key}=")));
                }
                self.builder.record_prim(name, args).map_err(at(line))?
            }
            Some(("ltorch", _)) => {
                let symbol = SymbolTable::register(&call.callee, SymbolKind::Composite);
                self.builder.begin_composite(symbol, args, kwargs);
                let first_value = self.builder.num_values();
                self.open.push(OpenComposite { depth, call, first_value });
                return Ok(());
            }
            _ => self.fallback(&call, args, kwargs)?,
        };
        self.define(&call, &outputs)?;
        self.check_types(&call)
    }

    /// A call of anything but a prim or composite: its outputs' types come from its type comment.
    fn fallback(&mut self, call: &Call, args: Vec<Arg>, kwargs: Kwargs) -> Result<Vec<ValueId>> {
        let mut metas = Vec::with_capacity(call.targets.len());
        for &v in &call.targets {
            let text = call.types.iter().find(|(t, _)| *t == v).map(|(_, text)| text.as_str());
            let kind = text.map(parse_value_type).transpose().map_err(at(call.line))?;
            match kind.map(|k| self.resolve_kind(call.line, &k)).transpose()? {
                Some(ValueKind::Tensor(meta)) => metas.push(meta),
                _ => {
                    let why = "is not a prim or composite, so its output";
                    return Err(error(call.line, format!("{} {why} {v} needs a tensor type comment", call.callee)));
                }
            }
        }
        let symbol = SymbolTable::register(&call.callee, SymbolKind::Fallback);
        Ok(self.builder.record_fallback(symbol, args, kwargs, metas))
    }

    /// Closes the open composites at `depth` or deeper: the line just read is not part of them.
    fn close_composites(&mut self, depth: usize) -> Result<()> {
        while self.open.last().is_some_and(|c| c.depth >= depth) {
            let OpenComposite { call, first_value, .. } = self.open.pop().expect("checked above");
            let defined = first_value..self.builder.num_values();
            if call.targets.is_empty() {
                return Err(error(call.line, format!("{} has no outputs", call.callee)));
            }
            let inside = |v: &ValueId| self.id(*v).filter(|id| defined.contains(&id.index()));
            if let Some(v) = call.targets.iter().find(|v| inside(v).is_none()) {
                return Err(error(
                    call.line,
                    format!("{} returns {v}, which its decomposition does not define", call.callee),
                ));
            }
            let outputs = call.targets.iter().filter_map(inside).collect();
            self.builder.end_composite(outputs).map_err(at(call.line))?;
            self.check_types(&call)?;
        }
        Ok(())
    }

    /// Checks a line's type comment against the recorded values.
    fn check_types(&self, call: &Call) -> Result<()> {
        if call.types.is_empty() {
            return Ok(());
        }
        let commented: Vec<ValueId> = call.types.iter().map(|(v, _)| *v).collect();
        if commented != call.targets {
            return Err(error(
                call.line,
                format!("the type comment names {} but the line defines {}", names(&commented), names(&call.targets)),
            ));
        }
        for (v, text) in &call.types {
            let actual = self.id(*v).and_then(|id| self.builder.value(id)).map(|k| describe_kind(&self.named_kind(k)));
            let actual = actual.unwrap_or_default();
            if actual != *text {
                return Err(error(call.line, format!("{v} is \"{actual}\" but its type comment says \"{text}\"")));
            }
        }
        Ok(())
    }

    fn finish(mut self, last_line: usize) -> Result<Trace> {
        let Some(outputs) = self.outputs.take() else {
            return Err(error(last_line, "the function has no `return`"));
        };
        self.builder.finish(outputs).map_err(at(last_line))
    }
}

fn names(values: &[ValueId]) -> String {
    let names: Vec<String> = values.iter().map(ValueId::to_string).collect();
    format!("({})", names.join(", "))
}
