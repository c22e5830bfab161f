//! A fresh bearer token per run for the engines a [`super::LocalRuntime`] starts, in a file
//! only this user can read (a private directory with mode 0700, the file 0600), removed when
//! the runtime is dropped. Another user of the machine cannot stop the job or delete its
//! savepoints (`streamscale_engine::auth`).

use std::io::{Read as _, Write as _};
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

/// A generated token and the file holding it.
#[derive(Debug)]
pub struct RunToken {
    token: String,
    dir: PathBuf,
    file: PathBuf,
}

impl RunToken {
    /// 128 random bits from `/dev/urandom` as 32 hex digits, written to a new private directory
    /// under `parent` (the system's temporary directory when `None`).
    ///
    /// # Errors
    /// The I/O error, with the path.
    pub fn generate(parent: Option<&Path>) -> Result<RunToken, (PathBuf, std::io::Error)> {
        let mut bytes = [0u8; 16];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut bytes))
            .map_err(|e| (PathBuf::from("/dev/urandom"), e))?;
        let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let parent = parent.map_or_else(std::env::temp_dir, Path::to_path_buf);
        let dir = parent.join(format!(
            "streamscale-run-{}-{}",
            std::process::id(),
            &token[..8]
        ));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| (dir.clone(), e))?;
        let file = dir.join("engine-token");
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&file)
            .and_then(|mut f| f.write_all(token.as_bytes()))
            .map_err(|e| (file.clone(), e))?;
        Ok(RunToken { token, dir, file })
    }

    /// The token.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The file holding it (for the engine's `--auth-token-file`).
    pub fn file(&self) -> &Path {
        &self.file
    }
}

impl Drop for RunToken {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    #[test]
    fn the_token_file_is_private_fresh_and_removed() {
        let parent = tempfile::tempdir().expect("tempdir");
        let a = RunToken::generate(Some(parent.path())).expect("token");
        let b = RunToken::generate(Some(parent.path())).expect("token");
        assert_ne!(a.token(), b.token());
        assert_eq!(a.token().len(), 32);
        let mode = |p: &Path| std::fs::metadata(p).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode(a.file()), 0o600);
        assert_eq!(mode(a.file().parent().expect("dir")), 0o700);
        assert_eq!(std::fs::read_to_string(a.file()).expect("read"), a.token());
        let file = a.file().to_path_buf();
        drop(a);
        assert!(!file.exists());
    }
}
