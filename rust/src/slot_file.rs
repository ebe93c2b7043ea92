//! Reading a slot file from disk: the one rule for every path that does (`Store.ingest` from a path, so the
//! CLI's `ingest` and `sync` and the hooks; `inspect_state`; `hash_file`; `cut_state` and its extras).
//!
//! CONTRACT: only a regular file is read (a symlink to one is fine). The path is stat'ed before it is opened,
//! and opened with O_NONBLOCK, so a FIFO or device put in its place after the stat cannot block the open;
//! the open file is fstat'ed again and must still be a regular file. At most the size that fstat reported is
//! read, and after the first 12 bytes only if they are a slot file's head (`format::check_head`): `/dev/zero`,
//! a FIFO, a directory or a large file of something else never costs more than that.

use std::fs::{File, Metadata, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

use crate::error::{Error, Result};
use crate::format::{check_head, FormatError, HEAD_LEN};

/// What the path is, if it is not a regular file.
fn kind(m: &Metadata) -> Option<&'static str> {
    let t = m.file_type();
    let kind = if t.is_file() {
        return None;
    } else if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a file"
    };
    Some(kind)
}

fn regular(path: &Path, m: &Metadata) -> Result<()> {
    match kind(m) {
        None => Ok(()),
        Some(kind) => Err(FormatError::NotAFile { path: path.to_path_buf(), kind }.into()),
    }
}

/// Open a regular file without blocking; returns it with its size.
pub fn open_slot_file(path: &Path) -> Result<(File, u64)> {
    regular(path, &std::fs::metadata(path).map_err(|e| Error::io(path, e))?)?;
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| Error::io(path, e))?;
    let m = f.metadata().map_err(|e| Error::io(path, e))?;
    regular(path, &m)?;
    Ok((f, m.len()))
}

/// The bytes of a slot file, read under the rule above.
pub fn read_slot_file(path: &Path) -> Result<Vec<u8>> {
    let (f, size) = open_slot_file(path)?;
    let mut f = f.take(size);
    let mut buf = Vec::with_capacity(HEAD_LEN);
    (&mut f).take(HEAD_LEN as u64).read_to_end(&mut buf).map_err(|e| Error::io(path, e))?;
    check_head(&buf, size)?;
    buf.try_reserve_exact(size as usize - buf.len()).map_err(|_| {
        Error::io(path, std::io::Error::new(std::io::ErrorKind::OutOfMemory, format!("{size} bytes do not fit in memory")))
    })?;
    f.read_to_end(&mut buf).map_err(|e| Error::io(path, e))?;
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_not_a_file(r: Result<Vec<u8>>, want: &str) {
        match r {
            Err(Error::Format(FormatError::NotAFile { kind, .. })) => assert_eq!(kind, want),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn refuses_what_is_not_a_regular_file() {
        is_not_a_file(read_slot_file(Path::new("/dev/zero")), "a character device");
        is_not_a_file(read_slot_file(Path::new("/")), "a directory");
        let dir = std::env::temp_dir().join(format!("kvstore-slotfile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("fifo.bin");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        is_not_a_file(read_slot_file(&fifo), "a FIFO"); // returns: nothing opens it for writing
        // a large file of something else: refused after its head
        let big = dir.join("big.bin");
        std::fs::File::create(&big).unwrap().set_len(1 << 34).unwrap(); // sparse, 16 GiB
        assert!(matches!(read_slot_file(&big), Err(Error::Format(FormatError::BadMagic { found: 0 }))));
        assert!(matches!(read_slot_file(&dir.join("missing.bin")), Err(Error::Io { .. })));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
