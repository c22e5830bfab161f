//! An error's message with its causes, for one-line error output.

/// `error` and its sources on one line, `: `-separated, leaving out a source whose text is
/// already said (an error that quotes its source would otherwise say it twice; reqwest's
/// "error sending request" hides `Connection refused` two sources down). Line breaks in a
/// message become spaces.
pub fn with_causes(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string().replace('\n', " ");
    let mut cause = error.source();
    while let Some(c) = cause {
        let more = c.to_string().replace('\n', " ");
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        cause = c.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot read job.yaml: {0}")]
    struct Quoting(#[source] std::io::Error);

    #[derive(Debug, thiserror::Error)]
    #[error("request failed")]
    struct Hiding(#[source] std::io::Error);

    #[test]
    fn a_quoted_cause_is_said_once_and_a_hidden_one_is_added() {
        let io = || std::io::Error::other("Connection refused");
        assert_eq!(
            with_causes(&Quoting(io())),
            "cannot read job.yaml: Connection refused"
        );
        assert_eq!(
            with_causes(&Hiding(io())),
            "request failed: Connection refused"
        );
    }
}
