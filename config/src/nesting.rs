//! How deeply a YAML text nests its collections, measured in one linear pass before any YAML
//! parser sees the text. Both parsers the loader runs (libyaml behind serde_yaml, yaml-rust2
//! behind the position index) keep one entry per open flow collection that every token walks,
//! and yaml-rust2 reads ahead over a whole flow collection that could be a mapping key: `[[[[…`
//! costs them time quadratic in the depth. A text nested deeper than [`MAX_NESTING_DEPTH`] is
//! refused here instead, at the collection that goes one level too deep.
//!
//! This is a lexer, not a parser: it knows what decides nesting (indentation, `- `, `key:`,
//! brackets) and what hides brackets (quoted, block and plain scalars, comments). Where YAML
//! is ambiguous to it, it counts a bracket rather than skipping it: on well-formed YAML it
//! agrees with the parsers level for level, and malformed text it passes may nest a level
//! deeper for a parser, never more.

/// Collections (mappings and sequences, block or flow) a config may nest: the top-level mapping
/// is the first level. Far beyond any real config; well under serde_yaml's own limit.
pub const MAX_NESTING_DEPTH: usize = 64;

/// Where a text first nests deeper than its limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TooDeep {
    /// Byte offset of the collection (or its first property) that opens the level too many.
    pub(crate) offset: usize,
}

/// The deepest nesting of `text` (0 for a lone scalar), or where it first goes deeper than
/// `limit`.
pub(crate) fn measure(text: &str, limit: usize) -> Result<usize, TooDeep> {
    let mut scan = Scan {
        b: text.as_bytes(),
        i: 0,
        line_start: 0,
        blocks: Vec::new(),
        flow: 0,
        deepest: 0,
        limit,
    };
    if text.starts_with('\u{feff}') {
        scan.i = '\u{feff}'.len_utf8();
        scan.line_start = scan.i;
    }
    scan.run()?;
    Ok(scan.deepest)
}

/// The 1-based line and column (in characters) of byte `offset` of `text`.
pub(crate) fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset];
    let line_start = before.rfind('\n').map_or(0, |n| n + 1);
    let line = before.bytes().filter(|&b| b == b'\n').count() + 1;
    (line, before[line_start..].chars().count() + 1)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Block {
    Map,
    Seq,
}

/// What the lines after a structure line may belong to.
#[derive(Debug, Clone, Copy)]
enum Pending {
    Nothing,
    /// A `|` or `>` scalar under a block collection at column `parent` (-1: none); `explicit`
    /// is its indentation indicator; `blank` the most spaces of the empty lines seen so far.
    BlockScalar {
        parent: isize,
        explicit: Option<usize>,
        blank: usize,
    },
    /// A block scalar whose content lines are indented at least this much.
    BlockScalarAt(usize),
    /// A plain scalar that lines indented deeper than `parent` continue.
    Plain {
        parent: isize,
    },
}

struct Scan<'a> {
    b: &'a [u8],
    i: usize,
    line_start: usize,
    /// Open block collections, outermost first, with the column each one is at.
    blocks: Vec<(usize, Block)>,
    /// Open flow collections.
    flow: usize,
    deepest: usize,
    limit: usize,
}

fn is_blank_or_end(b: Option<&u8>) -> bool {
    matches!(b, None | Some(b' ' | b'\t' | b'\r' | b'\n'))
}

impl Scan<'_> {
    fn at(&self, i: usize) -> Option<&u8> {
        self.b.get(i)
    }

    fn column(&self, i: usize) -> usize {
        i - self.line_start
    }

    /// The column of the innermost block collection, -1 when there is none.
    fn parent(&self) -> isize {
        self.blocks.last().map_or(-1, |&(c, _)| c as isize)
    }

    fn opened(&mut self, offset: usize) -> Result<(), TooDeep> {
        let depth = self.blocks.len() + self.flow;
        if depth > self.limit {
            return Err(TooDeep { offset });
        }
        self.deepest = self.deepest.max(depth);
        Ok(())
    }

    /// A `- ` or a `key:` at `col`: the block collection it belongs to, opened if new.
    fn block_entry(&mut self, col: usize, kind: Block, offset: usize) -> Result<(), TooDeep> {
        while self.blocks.last().is_some_and(|&(c, _)| c > col) {
            self.blocks.pop();
        }
        // A sequence at a key's own column is the value of the key above (`key:\n- a`); the
        // next key at that column ends it.
        if kind == Block::Map && self.blocks.last() == Some(&(col, Block::Seq)) {
            self.blocks.pop();
        }
        if self.blocks.last() == Some(&(col, kind)) {
            return Ok(());
        }
        self.blocks.push((col, kind));
        self.opened(offset)
    }

    fn skip_to_line_end(&mut self) {
        while let Some(&c) = self.at(self.i) {
            if c == b'\n' {
                break;
            }
            self.i += 1;
        }
    }

    /// Past the newline ending the current line.
    fn next_line(&mut self) {
        self.skip_to_line_end();
        if self.i < self.b.len() {
            self.i += 1;
        }
        self.line_start = self.i;
    }

    fn run(&mut self) -> Result<(), TooDeep> {
        let mut pending = Pending::Nothing;
        while self.i < self.b.len() {
            let mut indent = 0;
            while self.at(self.i + indent) == Some(&b' ') {
                indent += 1;
            }
            let first = self.i + indent;
            let mut j = first;
            while matches!(self.at(j), Some(b' ' | b'\t' | b'\r')) {
                j += 1;
            }
            if is_blank_or_end(self.at(j)) {
                if let Pending::BlockScalar { blank, .. } = &mut pending {
                    *blank = (*blank).max(indent);
                }
                self.next_line();
                continue;
            }
            let marker = indent == 0 && self.document_marker(first);
            pending = match pending {
                Pending::BlockScalar {
                    parent,
                    explicit,
                    blank,
                } => {
                    let least = match explicit {
                        Some(m) if parent < 0 => m,
                        Some(m) => parent as usize + m,
                        None => ((parent + 1).max(1) as usize).max(blank),
                    };
                    if indent >= least && !marker {
                        // Without an indicator the first content line sets the indentation.
                        let at = if explicit.is_some() { least } else { indent };
                        pending = Pending::BlockScalarAt(at);
                        self.next_line();
                        continue;
                    }
                    Pending::Nothing
                }
                Pending::BlockScalarAt(least) if indent >= least && !marker => {
                    self.next_line();
                    continue;
                }
                Pending::Plain { parent }
                    if indent as isize > parent && !marker && self.b[first] != b'#' =>
                {
                    // A comment ends a plain scalar; nothing else on a continuation line does.
                    self.i = first;
                    let mut previous = b' ';
                    let mut comment = false;
                    while let Some(&c) = self.at(self.i) {
                        if c == b'\n' {
                            break;
                        }
                        if c == b'#' && matches!(previous, b' ' | b'\t') {
                            comment = true;
                        }
                        previous = c;
                        self.i += 1;
                    }
                    pending = if comment {
                        Pending::Nothing
                    } else {
                        Pending::Plain { parent }
                    };
                    self.next_line();
                    continue;
                }
                _ => Pending::Nothing,
            };
            // A comment line says nothing about the structure around it.
            if self.b[first] == b'#' {
                self.next_line();
                continue;
            }
            while self.blocks.last().is_some_and(|&(c, _)| c > indent) {
                self.blocks.pop();
            }
            self.i = first;
            pending = self.structure()?;
            self.next_line();
        }
        Ok(())
    }

    /// `---` or `...` (followed by a blank) at `i`, the start of a line.
    fn document_marker(&self, i: usize) -> bool {
        let m = &self.b[i..];
        (m.starts_with(b"---") || m.starts_with(b"...")) && is_blank_or_end(m.get(3))
    }

    /// Reads the tokens of a line in block context from `self.i`; flow collections and quoted
    /// scalars may carry it over later lines. Returns what the following lines may continue.
    fn structure(&mut self) -> Result<Pending, TooDeep> {
        // The column of the node's first property (`&anchor`, `!tag`), where a key starts.
        let mut node: Option<usize> = None;
        loop {
            while matches!(self.at(self.i), Some(b' ' | b'\t' | b'\r')) {
                self.i += 1;
            }
            let Some(&c) = self.at(self.i) else {
                return Ok(Pending::Nothing);
            };
            let start = self.i;
            let col = self.column(start);
            let next_blank = is_blank_or_end(self.at(start + 1));
            match c {
                b'\n' | b'#' => return Ok(Pending::Nothing),
                // `? key`, and `: value` after it or after an empty key, are mapping entries.
                b'-' | b'?' | b':' if next_blank => {
                    let kind = if c == b'-' { Block::Seq } else { Block::Map };
                    self.block_entry(node.unwrap_or(col), kind, start)?;
                    node = None;
                    self.i += 1;
                }
                b'-' | b'.' if col == 0 && self.document_marker(start) => {
                    self.blocks.clear();
                    self.i += 3;
                }
                b'%' if col == 0 => return Ok(Pending::Nothing),
                b'&' | b'!' => {
                    node.get_or_insert(col);
                    self.property();
                }
                b'|' | b'>' => {
                    let mut explicit = None;
                    self.i += 1;
                    for _ in 0..2 {
                        match self.at(self.i) {
                            Some(&d @ b'1'..=b'9') => explicit = Some(usize::from(d - b'0')),
                            Some(b'+' | b'-') => {}
                            _ => break,
                        }
                        self.i += 1;
                    }
                    return Ok(Pending::BlockScalar {
                        parent: self.parent(),
                        explicit,
                        blank: 0,
                    });
                }
                // Whatever follows on the line is read as tokens again: in valid YAML only a `:`
                // or a comment does.
                b'[' | b'{' => {
                    let key_col = node.take().unwrap_or(col);
                    let inner = self.flow_collection()?;
                    self.key_follows(key_col, start, inner)?;
                }
                b'\'' | b'"' => {
                    let key_col = node.take().unwrap_or(col);
                    self.quoted();
                    self.key_follows(key_col, start, 0)?;
                }
                _ => {
                    let key_col = node.take().unwrap_or(col);
                    match self.plain() {
                        PlainEnd::Key => {
                            self.block_entry(key_col, Block::Map, start)?;
                            self.i += 1;
                        }
                        PlainEnd::Comment => return Ok(Pending::Nothing),
                        PlainEnd::Line => {
                            return Ok(Pending::Plain {
                                parent: self.parent(),
                            });
                        }
                    }
                }
            }
        }
    }

    /// After a flow collection or quoted scalar that started at byte `start`: when a `:` makes
    /// it a key, enters the mapping at `key_col` and consumes the `:`. A flow key nests its own
    /// `inner` levels inside that mapping, which was not open yet while they were read.
    fn key_follows(&mut self, key_col: usize, start: usize, inner: usize) -> Result<(), TooDeep> {
        while matches!(self.at(self.i), Some(b' ' | b'\t')) {
            self.i += 1;
        }
        if self.at(self.i) == Some(&b':') && is_blank_or_end(self.at(self.i + 1)) {
            self.block_entry(key_col, Block::Map, start)?;
            let depth = self.blocks.len() + inner;
            if depth > self.limit {
                return Err(TooDeep { offset: start });
            }
            self.deepest = self.deepest.max(depth);
            self.i += 1;
        }
        Ok(())
    }

    /// Skips an anchor or tag (a verbatim tag `!<…>` may hold brackets). Ends at a flow
    /// indicator, as an anchor does: a tag that holds one has it counted, never skipped.
    fn property(&mut self) {
        let anchor = self.b[self.i] == b'&';
        if self.b[self.i..].starts_with(b"!<") {
            while let Some(&c) = self.at(self.i) {
                if c == b'\n' {
                    return;
                }
                self.i += 1;
                if c == b'>' {
                    break;
                }
            }
        }
        while !is_blank_or_end(self.at(self.i))
            && !matches!(self.b[self.i], b'[' | b']' | b'{' | b'}' | b',')
        {
            // libyaml ends an anchor name at the first character that is not a letter, a
            // digit, `_` or `-`: `&a: v` anchors an empty key there.
            if anchor && self.b[self.i] == b':' && is_blank_or_end(self.at(self.i + 1)) {
                break;
            }
            self.i += 1;
        }
    }

    /// Skips a quoted scalar starting at `self.i`, over as many lines as it spans.
    fn quoted(&mut self) {
        let quote = self.b[self.i];
        self.i += 1;
        while let Some(&c) = self.at(self.i) {
            match c {
                b'\\' if quote == b'"' => self.i += 2,
                b'\'' if quote == b'\'' && self.at(self.i + 1) == Some(&b'\'') => self.i += 2,
                _ if c == quote => {
                    self.i += 1;
                    return;
                }
                b'\n' => {
                    self.i += 1;
                    self.line_start = self.i;
                }
                _ => self.i += 1,
            }
        }
        self.i = self.i.min(self.b.len());
    }

    /// Skips a plain scalar in block context, which may hold brackets and quotes.
    fn plain(&mut self) -> PlainEnd {
        let mut previous = b' ';
        while let Some(&c) = self.at(self.i) {
            match c {
                b'\n' => return PlainEnd::Line,
                b':' if is_blank_or_end(self.at(self.i + 1)) => return PlainEnd::Key,
                b'#' if matches!(previous, b' ' | b'\t') => return PlainEnd::Comment,
                _ => {}
            }
            previous = c;
            self.i += 1;
        }
        PlainEnd::Line
    }

    /// Reads a flow collection starting at `self.i` to its end (or the end of the text);
    /// returns the most levels it nested (itself included).
    fn flow_collection(&mut self) -> Result<usize, TooDeep> {
        let base = self.blocks.len();
        let mut levels: Vec<FlowLevel> = Vec::new();
        // Inside a plain scalar (which goes on over blanks and lines) a quote, `&`, `!` or `?`
        // is an ordinary character, and so is a `#` with no blank before it.
        let mut plain = false;
        let mut blank_before = true;
        // After a quoted scalar or a collection a `:` is an indicator even with no blank after
        // it (a JSON-like key, `{"a":1}`).
        let mut after_node = false;
        while let Some(&c) = self.at(self.i) {
            let next = self.at(self.i + 1);
            match c {
                b'[' | b'{' => {
                    self.flow += 1;
                    self.opened(self.i)?;
                    let depth = base + self.flow;
                    levels.push(FlowLevel {
                        sequence: c == b'[',
                        pair: false,
                        entry_most: depth,
                        most: depth,
                    });
                    self.i += 1;
                    (plain, blank_before, after_node) = (false, false, false);
                }
                b']' | b'}' => {
                    self.i += 1;
                    (plain, blank_before, after_node) = (false, false, true);
                    let Some(level) = levels.pop() else {
                        continue;
                    };
                    self.flow -= 1 + usize::from(level.pair);
                    match levels.last_mut() {
                        Some(outer) => {
                            outer.entry_most = outer.entry_most.max(level.most);
                            outer.most = outer.most.max(level.most);
                        }
                        None => return Ok(level.most - base),
                    }
                }
                b',' => {
                    if let Some(level) = levels.last_mut() {
                        if level.pair {
                            level.pair = false;
                            self.flow -= 1;
                        }
                        level.entry_most = base + self.flow;
                    }
                    self.i += 1;
                    (plain, blank_before, after_node) = (false, false, false);
                }
                b' ' | b'\t' | b'\r' => {
                    self.i += 1;
                    blank_before = true;
                }
                b'\n' => {
                    self.i += 1;
                    self.line_start = self.i;
                    blank_before = true;
                }
                b'#' if blank_before || !plain => self.skip_to_line_end(),
                b'\'' | b'"' if !plain => {
                    self.quoted();
                    (blank_before, after_node) = (false, true);
                }
                b'!' | b'&' if !plain => {
                    self.property();
                    (blank_before, after_node) = (false, false);
                }
                // Where no plain scalar goes on, libyaml takes `?` and `:` for indicators
                // whatever follows them.
                b':' | b'?'
                    if !plain
                        || (c == b':'
                            && (after_node
                                || is_blank_or_end(next)
                                || matches!(next, Some(b'[' | b']' | b'{' | b'}' | b',')))) =>
                {
                    if let Some(level) = levels.last_mut().filter(|l| l.sequence && !l.pair) {
                        // `[k: v]` and `[? k]` hold a one-pair mapping, one level deeper,
                        // key included.
                        level.pair = true;
                        self.flow += 1;
                        let key = level.entry_most + 1;
                        level.entry_most = key;
                        level.most = level.most.max(key);
                        if key > self.limit {
                            return Err(TooDeep { offset: self.i });
                        }
                        self.deepest = self.deepest.max(key);
                        self.opened(self.i)?;
                    }
                    self.i += 1;
                    (plain, blank_before, after_node) = (false, false, false);
                }
                _ => {
                    self.i += 1;
                    (plain, blank_before, after_node) = (true, false, false);
                }
            }
        }
        Ok(levels.iter().map(|l| l.most).max().unwrap_or(base) - base)
    }
}

/// One open flow collection.
struct FlowLevel {
    sequence: bool,
    /// Whether the current entry of a sequence is a `key: value` pair, which is a mapping.
    pair: bool,
    /// The deepest level the current entry reached.
    entry_most: usize,
    /// The deepest level reached inside.
    most: usize,
}

enum PlainEnd {
    /// A `:` and a blank: the scalar was a key (`self.i` is at the `:`).
    Key,
    /// A comment ends the line.
    Comment,
    /// The line ends inside the scalar.
    Line,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn depth(text: &str) -> usize {
        measure(text, usize::MAX).expect("no limit")
    }

    /// The nesting depth yaml_rust2 sees, from its events; `None` when it does not parse.
    fn parsed_depth(text: &str) -> Option<usize> {
        use yaml_rust2::parser::{Event, Parser};
        let mut parser = Parser::new_from_str(text);
        let (mut open, mut deepest) = (0usize, 0usize);
        loop {
            match parser.next_token().ok()? {
                (Event::StreamEnd, _) => return Some(deepest),
                (Event::MappingStart(..) | Event::SequenceStart(..), _) => {
                    open += 1;
                    deepest = deepest.max(open);
                }
                (Event::MappingEnd | Event::SequenceEnd, _) => open -= 1,
                _ => {}
            }
        }
    }

    const SAMPLES: &[&str] = &[
        "a: 1\n",
        "plain scalar\n",
        "a:\n  b:\n    c: [1, [2, {x: y}]]\n",
        "- a\n- - b\n  - - c\n",
        "- a: 1\n  b:\n  - x\n  - y: [z]\n- c: 2\n",
        "key:\n- a\n- b\nother:\n  deeper: {a: [b]}\n",
        "regex: ^/a[0-9]+[[[$\npath: /x{{\n",
        "text: |\n  [[[[ {{{{\n  ]]\nnext: [1]\n",
        "folded: >-\n    [[[[\n\n    {{{\nnext: {a: 1}\n",
        "- |2\n   [[[ [[[\n- x\n",
        "quoted: \"[[[ \\\" [[[\"\nsingle: '[[ '' [['\nm: ['a]', \"b}\"]\n",
        "# [[[[ comment\na: 1 # [[[ also\nb: [x] # [[\n",
        "multi: first line\n  [[[ continued\n  {{ still\nnext: 1\n",
        "flow: [a,\n  [b,\n   {c: d}],\n  e]\nafter: 1\n",
        "? complex\n: value\n",
        "[a, b]: c\n",
        "anchors: &x [1, 2]\nalias: *x\ntagged: !!str [not]\n",
        "---\na: [1]\n...\n",
        "in_flow: [it's, a#b, 'q]', {k: v}]\n",
        "plugins:\n  p:\n    config:\n      rules:\n        - name: x\n          match: { path: \"/[a-z]+\" }\n",
    ];

    #[test]
    fn depth_matches_the_parser_on_samples_and_example_configs() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut texts: Vec<(String, String)> = SAMPLES
            .iter()
            .map(|s| ((*s).to_owned(), (*s).to_owned()))
            .collect();
        for sub in [
            "examples",
            "tests/fixtures",
            "tests/ui/valid",
            "tests/ui/invalid",
            "fuzz/corpus/load",
            "../benches/harness/configs",
        ] {
            let path = dir.join(sub);
            for f in std::fs::read_dir(&path).unwrap() {
                let f = f.unwrap().path();
                if let Ok(text) = std::fs::read_to_string(&f) {
                    texts.push((f.display().to_string(), text));
                }
            }
        }
        let mut compared = 0;
        for (name, text) in &texts {
            if let Some(parsed) = parsed_depth(text) {
                assert_eq!(depth(text), parsed, "{name}");
                compared += 1;
            }
        }
        assert!(compared > SAMPLES.len(), "{compared} texts compared");
    }

    #[test]
    fn deep_flow_nesting_is_refused_at_the_first_level_too_many() {
        let text = "[".repeat(100_000);
        let err = measure(&text, MAX_NESTING_DEPTH).unwrap_err();
        assert_eq!(err.offset, MAX_NESTING_DEPTH);
        assert_eq!(line_col(&text, err.offset), (1, MAX_NESTING_DEPTH + 1));

        let nested = |n: usize| format!("a:\n  b: {}{}\n", "[".repeat(n), "]".repeat(n));
        let at_limit = nested(MAX_NESTING_DEPTH - 2);
        assert_eq!(measure(&at_limit, MAX_NESTING_DEPTH), Ok(MAX_NESTING_DEPTH));
        let err = measure(&nested(MAX_NESTING_DEPTH - 1), MAX_NESTING_DEPTH).unwrap_err();
        assert_eq!(
            line_col(&at_limit, err.offset),
            (2, 6 + MAX_NESTING_DEPTH - 2)
        );
    }

    #[test]
    fn deep_block_nesting_is_refused() {
        let compact = "- ".repeat(100_000) + "x\n";
        let err = measure(&compact, MAX_NESTING_DEPTH).unwrap_err();
        assert_eq!(err.offset, 2 * MAX_NESTING_DEPTH);

        let mut indented = String::new();
        for level in 0..=MAX_NESTING_DEPTH {
            indented += &format!("{}k{level}:\n", " ".repeat(level));
        }
        let err = measure(&indented, MAX_NESTING_DEPTH).unwrap_err();
        assert_eq!(
            line_col(&indented, err.offset),
            (MAX_NESTING_DEPTH + 1, MAX_NESTING_DEPTH + 1)
        );
    }

    #[test]
    fn brackets_in_scalars_and_comments_do_not_nest() {
        let many = "[{".repeat(500);
        for text in [
            format!("a: \"{many}\"\n"),
            format!("a: '{many}'\n"),
            format!("a: x{many}\n"),
            format!("a: 1 # {many}\n"),
            format!("# {many}\n"),
            format!("a: |\n  {many}\n  {many}\nb: 1\n"),
            format!("- a: >2\n     {many}\n  b: 1\n"),
            format!("a: first\n  {many}\n"),
            format!("a: [\"{many}\", '{many}', !t b]\n"),
        ] {
            let parsed = parsed_depth(&text).expect("valid YAML");
            assert_eq!(measure(&text, MAX_NESTING_DEPTH), Ok(parsed), "{text}");
        }
    }
}
