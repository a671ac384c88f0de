//! The README's walk-throughs as steps a test runs, so that what the
//! README tells a reader to type is what the test builds and runs.
//!
//! A step is a fenced code block right after a marker line (an HTML
//! comment, invisible when the README is rendered):
//!
//! * `<!-- walkthrough: file PATH -->`: the block is the file at `PATH`
//!   (relative to the project); `file PATH append` appends it instead.
//! * `<!-- walkthrough: patch PATH -->`: the block is a `diff` of the file
//!   at `PATH`, as [`apply_patch`] reads it.
//! * `<!-- walkthrough: commands GROUP -->`: the block is shell commands.
//!   The blocks of one group run as one script (a later block may stop the
//!   background jobs an earlier one started), once every step before the
//!   group's last block was taken.

use crate::error::{HarnessError, Result};

/// What a README block is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// A file of the project, written (or appended to).
    File {
        /// Path relative to the project.
        path: String,
        /// Append instead of writing.
        append: bool,
        /// The block.
        text: String,
    },
    /// A change to a file of the project ([`apply_patch`]).
    Patch {
        /// Path relative to the project.
        path: String,
        /// The block.
        diff: String,
    },
    /// Shell commands: the whole script of a group.
    Commands {
        /// The group's name.
        group: String,
        /// Its blocks, in order, one after the other.
        script: String,
    },
}

const MARKER: &str = "<!-- walkthrough: ";

/// The steps of `readme`, in the order to take them.
pub fn parse(readme: &str) -> Result<Vec<Step>> {
    let bad = |line: usize, what: &str| {
        HarnessError::Scenario(format!("README line {}: {what}", line + 1))
    };
    let lines: Vec<&str> = readme.lines().collect();
    // (marker words, block) in document order.
    let mut blocks: Vec<(Vec<&str>, String)> = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some(rest) = lines[i].strip_prefix(MARKER) else {
            i += 1;
            continue;
        };
        let words: Vec<&str> = rest
            .strip_suffix("-->")
            .ok_or_else(|| bad(i, "a walkthrough marker must end with -->"))?
            .split_whitespace()
            .collect();
        if !lines.get(i + 1).is_some_and(|l| l.starts_with("```")) {
            return Err(bad(
                i,
                "a walkthrough marker must be followed by a code block",
            ));
        }
        let start = i + 2;
        let len = lines[start..]
            .iter()
            .position(|l| *l == "```")
            .ok_or_else(|| bad(i, "the code block does not end"))?;
        let mut text = lines[start..start + len].join("\n");
        text.push('\n');
        blocks.push((words, text));
        i = start + len + 1;
    }
    let mut steps = Vec::new();
    for (n, (words, text)) in blocks.iter().enumerate() {
        let step = match words.as_slice() {
            ["file", path] => Step::File {
                path: (*path).into(),
                append: false,
                text: text.clone(),
            },
            ["file", path, "append"] => Step::File {
                path: (*path).into(),
                append: true,
                text: text.clone(),
            },
            ["patch", path] => Step::Patch {
                path: (*path).into(),
                diff: text.clone(),
            },
            ["commands", group] => {
                let later = blocks[n + 1..]
                    .iter()
                    .any(|(w, _)| w.as_slice() == ["commands", *group]);
                if later {
                    continue;
                }
                let script = blocks
                    .iter()
                    .filter(|(w, _)| w.as_slice() == ["commands", *group])
                    .map(|(_, t)| t.as_str())
                    .collect();
                Step::Commands {
                    group: (*group).into(),
                    script,
                }
            }
            other => {
                return Err(HarnessError::Scenario(format!(
                    "unknown walkthrough marker {other:?}"
                )))
            }
        };
        steps.push(step);
    }
    Ok(steps)
}

/// Applies `diff` to `source`. The diff is hunks separated by lines
/// starting with `@@`; in a hunk, a line starting with a space is context,
/// `-` a line removed, `+` a line added (an empty line is empty context).
/// Each hunk's context and removed lines must appear in `source`, in
/// order, after the previous hunk's; they are replaced by its context and
/// added lines.
pub fn apply_patch(source: &str, diff: &str) -> Result<String> {
    let mut lines: Vec<String> = source.lines().map(String::from).collect();
    let mut from = 0;
    for hunk in diff
        .lines()
        .collect::<Vec<_>>()
        .split(|l| l.starts_with("@@"))
    {
        let mut old = Vec::new();
        let mut new = Vec::new();
        for line in hunk {
            let tag = line.chars().next().unwrap_or(' ');
            let text = line.get(tag.len_utf8()..).unwrap_or("");
            match tag {
                ' ' => {
                    old.push(text);
                    new.push(text);
                }
                '-' => old.push(text),
                '+' => new.push(text),
                _ => {
                    return Err(HarnessError::Scenario(format!(
                        "a diff line must start with a space, - or +: {line:?}"
                    )))
                }
            }
        }
        if old.is_empty() {
            return Err(HarnessError::Scenario(format!(
                "a hunk needs a line of context: {hunk:?}"
            )));
        }
        let at = (from..=lines.len().saturating_sub(old.len()))
            .find(|&i| {
                lines[i..i + old.len()]
                    .iter()
                    .zip(&old)
                    .all(|(a, b)| a == b)
            })
            .ok_or_else(|| {
                HarnessError::Scenario(format!("hunk not found in the file:\n{}", hunk.join("\n")))
            })?;
        lines.splice(at..at + old.len(), new.iter().map(|s| (*s).to_owned()));
        from = at + new.len();
    }
    let mut out = lines.join("\n");
    out.push('\n');
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const README: &str = "\
# Title

<!-- walkthrough: commands new -->
```sh
cargo new x
```

<!-- walkthrough: file src/main.rs -->
```rust
fn main() {
    a();
}
```

<!-- walkthrough: commands run -->
```sh
run &
```

<!-- walkthrough: file Cargo.toml append -->
```toml
dep = 1
```

<!-- walkthrough: commands run -->
```sh
kill $(jobs -p)
```

```sh
not a step
```
";

    #[test]
    fn steps_in_order_with_a_group_run_once_after_its_last_block() {
        let steps = parse(README).unwrap();
        assert_eq!(
            steps,
            [
                Step::Commands {
                    group: "new".into(),
                    script: "cargo new x\n".into()
                },
                Step::File {
                    path: "src/main.rs".into(),
                    append: false,
                    text: "fn main() {\n    a();\n}\n".into()
                },
                Step::File {
                    path: "Cargo.toml".into(),
                    append: true,
                    text: "dep = 1\n".into()
                },
                Step::Commands {
                    group: "run".into(),
                    script: "run &\nkill $(jobs -p)\n".into()
                },
            ]
        );
    }

    #[test]
    fn markers_without_a_block_or_unknown_are_errors() {
        assert!(parse("<!-- walkthrough: file a -->\ntext\n").is_err());
        assert!(parse("<!-- walkthrough: file a -->\n```\nno end\n").is_err());
        assert!(parse("<!-- walkthrough: frobnicate a -->\n```\nx\n```\n").is_err());
    }

    #[test]
    fn a_patch_replaces_each_hunk_in_order() {
        let source = "a\nb\n\nc\nd\nc\n";
        let diff = " a\n+x\n b\n\n@@\n-c\n+y\n d\n@@\n-c\n";
        assert_eq!(apply_patch(source, diff).unwrap(), "a\nx\nb\n\ny\nd\n");
    }

    #[test]
    fn a_hunk_that_is_not_there_is_an_error() {
        assert!(apply_patch("a\nb\n", "-b\n@@\n-a\n").is_err());
        assert!(apply_patch("a\n", " z\n+y\n").is_err());
        assert!(apply_patch("a\n", "+y\n").is_err());
        assert!(apply_patch("a\n", "*a\n").is_err());
        assert!(apply_patch("é\n", "éa\n").is_err());
    }
}
