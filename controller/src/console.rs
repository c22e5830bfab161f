//! Standard output that a reader going away does not end.

use std::io::Write;

/// Standard output for a program's lines. A closed stdout (the terminal went away: SIGHUP, or a
/// pipe whose reader exited, as in `… | head -1`) must not end the work before its savepoint or
/// report: the first failed write is said once on stderr (`PROGRAM: standard output closed
/// (ERROR); AFTER`) and later text is dropped.
#[derive(Debug)]
pub struct Console {
    closed: bool,
    program: &'static str,
    after: &'static str,
}

impl Console {
    /// Output of `program`, whose stderr line on a closed stdout ends with `after` (what still
    /// happens: `the run goes on, see the report`).
    pub fn new(program: &'static str, after: &'static str) -> Console {
        Console {
            closed: false,
            program,
            after,
        }
    }

    /// Writes `line` and a newline.
    pub fn line(&mut self, line: &str) {
        self.emit(line, "\n");
    }

    /// Writes `text` as it is.
    pub fn write(&mut self, text: &str) {
        self.emit(text, "");
    }

    fn emit(&mut self, text: &str, end: &str) {
        if self.closed {
            return;
        }
        let mut out = std::io::stdout().lock();
        let written = out
            .write_all(text.as_bytes())
            .and_then(|()| out.write_all(end.as_bytes()))
            .and_then(|()| out.flush());
        if let Err(e) = written {
            self.closed = true;
            // A closed stderr too: nothing else can be told.
            let _ = writeln!(
                std::io::stderr().lock(),
                "{}: standard output closed ({e}); {}",
                self.program,
                self.after
            );
        }
    }
}
