//! Where a file's bytes land: through the page cache, as any program writes, or, for
//! a large file, straight to the disk with `O_DIRECT`.
//!
//! A buffered write copies every byte into a fresh page of the page cache, and once
//! more dirty pages wait for the disk than the kernel allows (`vm.dirty_ratio`) it
//! holds the writer back until writeback catches up. For a model of 40–200 GB that is
//! all cost and no gain: the pages cannot stay cached anyway, and filling the cache
//! evicts what the machine had in it. So a file of at least [`DIRECT_MIN`] bytes (a
//! shard of a large model) is gathered per range into aligned
//! blocks of [`BLOCK`] bytes and written with `O_DIRECT`: the disk takes the bytes
//! from our buffer. The hashing thread reads the blocks back the same way. The last
//! partial page of a file (a size is rarely a multiple of [`ALIGN`]) goes through the
//! page cache. Parallel downloads of large shards measured much faster written this
//! way than through the page cache (benchmarks/pull.md, "Figures that were in code
//! comments"). The cost: a model served right after its pull is read from the disk,
//! not from memory.
//!
//! `SOUS_PULL_IO` chooses: `auto` (the default: direct from [`DIRECT_MIN`] bytes),
//! `direct` (every file) or `buffered` (none). Where the filesystem refuses `O_DIRECT`
//! (tmpfs on older kernels, some network filesystems), at open or at the first write
//! or read, the file goes through the page cache instead: the bytes are the same.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The environment variable that chooses how a pull writes: `auto`, `direct` or
/// `buffered`.
pub const IO_ENV: &str = sous_engine::env::PULL_IO.name;

/// Files at least this large are written with `O_DIRECT` under `auto`: the shards of a
/// large model. A smaller file fits well within the dirty pages the kernel lets a writer
/// keep, so the page cache takes it at memory speed and the hash reads it back from
/// memory: SmolLM2's one file of 269 MB measured faster through the page cache than
/// past it, where its hash waited on the disk (benchmarks/pull.md, "Figures that were
/// in code comments").
pub const DIRECT_MIN: u64 = 1 << 30;

/// Offsets, lengths and buffer addresses of direct I/O are multiples of this: the
/// largest logical block size of common disks (512 or 4096 bytes).
pub const ALIGN: usize = 4096;

/// Bytes gathered per range before one direct write.
pub const BLOCK: usize = 1 << 20;

/// How a pull writes its files (`SOUS_PULL_IO`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Io {
    /// Direct from [`DIRECT_MIN`] bytes, else through the page cache.
    #[default]
    Auto,
    /// Every file direct, where the filesystem allows.
    Direct,
    /// Every file through the page cache.
    Buffered,
}

impl Io {
    /// `SOUS_PULL_IO`'s value; anything but `auto`, `direct`, `buffered` or unset is
    /// refused.
    pub fn from_env() -> Result<Io, String> {
        Io::parse(sous_engine::env::PULL_IO.get().as_deref())
    }

    fn parse(value: Option<&str>) -> Result<Io, String> {
        match value {
            None | Some("auto") => Ok(Io::Auto),
            Some("direct") => Ok(Io::Direct),
            Some("buffered") => Ok(Io::Buffered),
            Some(v) => Err(format!(
                "{IO_ENV}={v} is not a way sous writes: use `auto` (O_DIRECT for files of 1 GiB and more), `direct` or `buffered`"
            )),
        }
    }

    fn wants_direct(self, size: u64) -> bool {
        match self {
            Io::Auto => size >= DIRECT_MIN,
            Io::Direct => size > 0,
            Io::Buffered => false,
        }
    }
}

/// A partial file open for the ranges and the hashing thread: its page-cache handle,
/// and its `O_DIRECT` handle while the filesystem takes direct I/O.
#[derive(Debug)]
pub(super) struct Partial {
    buffered: File,
    direct: Option<File>,
    /// The filesystem refused a direct write or read: everything goes buffered.
    refused: AtomicBool,
}

impl Partial {
    /// Opens (creating) `path` for reading and writing, with a direct handle beside
    /// when `io` wants one for `size` bytes and the filesystem gives it.
    pub(super) fn open(path: &Path, io: Io, size: u64) -> io::Result<Partial> {
        let buffered = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(path)?;
        let direct = if io.wants_direct(size) {
            open_direct(OpenOptions::new().read(true).write(true), path).ok()
        } else {
            None
        };
        Ok(Partial {
            buffered,
            direct,
            refused: AtomicBool::new(false),
        })
    }

    /// The page-cache handle (for sizing the file).
    pub(super) fn file(&self) -> &File {
        &self.buffered
    }

    /// Whether writes of aligned blocks go to the disk directly.
    pub(super) fn is_direct(&self) -> bool {
        self.direct.is_some() && !self.refused.load(Ordering::Relaxed)
    }

    /// Runs `op` on the direct handle when the transfer of `len` bytes at `offset`,
    /// from or into memory at `address`, is aligned and the file is direct; on the
    /// page-cache handle otherwise, or when the filesystem refuses it (EINVAL), from
    /// then on.
    fn transfer(
        &self,
        address: usize,
        len: usize,
        offset: u64,
        mut op: impl FnMut(&File) -> io::Result<()>,
    ) -> io::Result<()> {
        let aligned =
            address.is_multiple_of(ALIGN) && len.is_multiple_of(ALIGN) && offset.is_multiple_of(ALIGN as u64);
        if let Some(direct) = self.direct.as_ref()
            && aligned
            && len > 0
            && !self.refused.load(Ordering::Relaxed)
        {
            match op(direct) {
                Err(e) if refuses_direct(&e) => self.refused.store(true, Ordering::Relaxed),
                done => return done,
            }
        }
        op(&self.buffered)
    }

    /// Writes all of `data` at `offset`: directly when it is an aligned block and the
    /// file is direct, else through the page cache.
    pub(super) fn write_all_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        self.transfer(data.as_ptr() as usize, data.len(), offset, |file| {
            file.write_all_at(data, offset)
        })
    }

    /// Fills `data` from `offset`, directly when it is an aligned block and the file is
    /// direct, else from the page cache.
    pub(super) fn read_exact_at(&self, data: &mut [u8], offset: u64) -> io::Result<()> {
        let (address, len) = (data.as_ptr() as usize, data.len());
        self.transfer(address, len, offset, |file| file.read_exact_at(data, offset))
    }
}

/// Whether files in `dir` can be written with `O_DIRECT`: one aligned page is written
/// to a probe file, which is removed.
pub fn takes_direct(dir: &Path) -> bool {
    let path = dir.join(".sous-direct-probe");
    let taken = open_direct(OpenOptions::new().create(true).truncate(true).write(true), &path)
        .and_then(|file| file.write_all_at(&Aligned::new().bytes()[..ALIGN], 0))
        .is_ok();
    let _ = std::fs::remove_file(&path);
    taken
}

/// Opens `path` with `options` and `O_DIRECT`, on Linux; elsewhere refuses, and every
/// file goes through the page cache.
fn open_direct(options: &mut OpenOptions, path: &Path) -> io::Result<File> {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(nix::libc::O_DIRECT).open(path)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (options, path);
        Err(io::Error::from(io::ErrorKind::Unsupported))
    }
}

/// EINVAL from a direct transfer: this filesystem (or this block size) does not take
/// it. Any other error is a real one.
fn refuses_direct(e: &io::Error) -> bool {
    e.raw_os_error() == Some(nix::libc::EINVAL)
}

/// A buffer of `BLOCK` bytes whose start is aligned for direct I/O: a slice of a
/// vector `ALIGN` bytes longer, from the first aligned address in it. (A vector of
/// bytes has no alignment to ask for, and this crate has no unsafe code to allocate
/// one with a layout.) The heap block does not move when the buffer does.
pub(super) struct Aligned {
    raw: Vec<u8>,
    at: usize,
}

impl Aligned {
    pub(super) fn new() -> Aligned {
        let raw = vec![0; BLOCK + ALIGN];
        let at = (ALIGN - raw.as_ptr() as usize % ALIGN) % ALIGN;
        Aligned { raw, at }
    }

    pub(super) fn bytes(&self) -> &[u8] {
        &self.raw[self.at..self.at + BLOCK]
    }

    pub(super) fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.raw[self.at..self.at + BLOCK]
    }
}

/// The bytes of one range on their way to the file: written as they come, through
/// the page cache, or gathered into an aligned block and written when it is full (and
/// when the range ends) for a direct file.
pub(super) struct RangeWriter {
    partial: Arc<Partial>,
    /// The block being gathered (a direct file only).
    block: Option<Aligned>,
    /// File offset of the block's first byte: how far this range's bytes are written.
    start: u64,
    /// Bytes in the block.
    len: usize,
    /// Time spent inside writes since the caller last took it.
    writing: Writing,
}

/// Time spent inside writes: through the page cache (on the async runtime's workers),
/// and direct (on blocking threads, while the range waits).
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Writing {
    pub(super) buffered: Duration,
    pub(super) direct: Duration,
}

impl RangeWriter {
    /// A writer of bytes from `offset` on. A direct file gathers blocks when `offset`
    /// is aligned (a range's start always is, unless it resumes from a log written
    /// through the page cache).
    pub(super) fn new(partial: Arc<Partial>, offset: u64) -> RangeWriter {
        let block = (partial.is_direct() && offset.is_multiple_of(ALIGN as u64)).then(Aligned::new);
        RangeWriter {
            partial,
            block,
            start: offset,
            len: 0,
            writing: Writing::default(),
        }
    }

    /// The file offset up to which this range's bytes are written.
    pub(super) fn written(&self) -> u64 {
        self.start
    }

    /// The time spent inside writes since the last call.
    pub(super) fn take_writing(&mut self) -> Writing {
        std::mem::take(&mut self.writing)
    }

    /// Takes the next bytes of the range; whether bytes reached the file.
    pub(super) async fn push(&mut self, mut piece: &[u8]) -> io::Result<bool> {
        if self.block.is_none() {
            // Through the page cache. Blocking, but a write of one network chunk
            // into memory.
            let began = Instant::now();
            let written = self.partial.write_all_at(piece, self.start);
            self.writing.buffered += began.elapsed();
            written?;
            self.start += piece.len() as u64;
            return Ok(!piece.is_empty());
        }
        let mut moved = false;
        while !piece.is_empty() {
            let n = (BLOCK - self.len).min(piece.len());
            if let Some(block) = self.block.as_mut() {
                block.bytes_mut()[self.len..self.len + n].copy_from_slice(&piece[..n]);
            }
            self.len += n;
            piece = &piece[n..];
            if self.len == BLOCK {
                moved |= self.flush().await?;
            }
        }
        Ok(moved)
    }

    /// Writes the block gathered so far, on a blocking thread (a direct write waits
    /// for the disk); whether bytes reached the file. Called when a range ends: a block
    /// cut short elsewhere would leave the next ones unaligned.
    pub(super) async fn flush(&mut self) -> io::Result<bool> {
        if self.len == 0 {
            return Ok(false);
        }
        let Some(block) = self.block.take() else {
            return Ok(false);
        };
        let (partial, len, offset) = (self.partial.clone(), self.len, self.start);
        let (block, written, took) = tokio::task::spawn_blocking(move || {
            let began = Instant::now();
            let written = write_block(&partial, block.bytes(), len, offset);
            (block, written, began.elapsed())
        })
        .await
        .map_err(|e| io::Error::other(e.to_string()))?;
        self.block = Some(block);
        self.writing.direct += took;
        written?;
        self.start += len as u64;
        self.len = 0;
        Ok(true)
    }
}

/// Writes the first `len` bytes of `block` at `offset`: its whole pages directly,
/// the rest (the end of a file) through the page cache.
fn write_block(partial: &Partial, block: &[u8], len: usize, offset: u64) -> io::Result<()> {
    let whole = len - len % ALIGN;
    if whole > 0 {
        partial.write_all_at(&block[..whole], offset)?;
    }
    if whole < len {
        partial.write_all_at(&block[whole..len], offset + whole as u64)?;
    }
    Ok(())
}

/// Fills the first `len` bytes of `block` from `offset`: whole pages directly, the
/// rest through the page cache.
pub(super) fn read_block(partial: &Partial, block: &mut Aligned, len: usize, offset: u64) -> io::Result<()> {
    let bytes = block.bytes_mut();
    let whole = len - len % ALIGN;
    if whole > 0 {
        partial.read_exact_at(&mut bytes[..whole], offset)?;
    }
    if whole < len {
        partial.read_exact_at(&mut bytes[whole..len], offset + whole as u64)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes no two offsets share: a misplaced block shows.
    fn data(len: usize) -> Vec<u8> {
        crate::hub::download::xet::tests::generated(len, 0x2545_F491_4F6C_DD1D)
    }

    /// Pushes `bytes` from `offset` in pieces of `piece` bytes, as a range would.
    async fn push_all(partial: &Arc<Partial>, bytes: &[u8], offset: u64, piece: usize) -> RangeWriter {
        let mut writer = RangeWriter::new(partial.clone(), offset);
        for part in bytes.chunks(piece) {
            writer.push(part).await.expect("push");
        }
        writer.flush().await.expect("flush");
        writer
    }

    #[tokio::test]
    async fn ranges_gathered_into_blocks_land_byte_for_byte() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("f");
        // Two ranges, the second ending the file off a page boundary.
        let size = 3 * BLOCK + 5 * ALIGN + 123;
        let split = 2 * BLOCK;
        let bytes = data(size);
        let partial = Arc::new(Partial::open(&path, Io::Direct, size as u64).expect("open"));
        partial.file().set_len(size as u64).expect("size");
        let (first, second) = tokio::join!(
            push_all(&partial, &bytes[..split], 0, 7919),
            push_all(&partial, &bytes[split..], split as u64, 65_536 + 7),
        );
        assert_eq!(first.written(), split as u64);
        // The first range ended on a block's end: flushing nothing keeps its block.
        assert_eq!(first.block.is_some(), partial.is_direct());
        assert_eq!(second.written(), size as u64);
        assert_eq!(std::fs::read(&path).expect("read"), bytes);
        // Where the filesystem takes direct I/O, the file kept it: no write was refused.
        assert_eq!(partial.is_direct(), takes_direct(dir.path()));

        // Read back as the hashing thread reads, a block at a time, the tail included.
        let mut block = Aligned::new();
        let mut back = Vec::new();
        let mut at = 0;
        while at < size {
            let n = (size - at).min(BLOCK);
            read_block(&partial, &mut block, n, at as u64).expect("read back");
            back.extend_from_slice(&block.bytes()[..n]);
            at += n;
        }
        assert!(back == bytes, "read back differs");
    }

    #[tokio::test]
    async fn a_range_resumed_off_a_page_and_buffered_files_write_through_the_cache() {
        let dir = tempfile::tempdir().expect("tempdir");
        let bytes = data(BLOCK + 999);
        // A resume log written through the page cache can end anywhere: from there the
        // range writes as it comes, and the bytes are the same.
        let path = dir.path().join("resumed");
        let partial = Arc::new(Partial::open(&path, Io::Direct, bytes.len() as u64).expect("open"));
        partial.file().set_len(bytes.len() as u64).expect("size");
        partial.write_all_at(&bytes[..1001], 0).expect("head");
        let writer = push_all(&partial, &bytes[1001..], 1001, 4096).await;
        assert_eq!(writer.written(), bytes.len() as u64);
        assert_eq!(std::fs::read(&path).expect("read"), bytes);

        for (io, size) in [(Io::Buffered, DIRECT_MIN), (Io::Auto, DIRECT_MIN - 1)] {
            let path = dir.path().join(format!("{io:?}"));
            let partial = Arc::new(Partial::open(&path, io, size).expect("open"));
            assert!(!partial.is_direct(), "{io:?} of {size} bytes");
            push_all(&partial, &bytes, 0, 10_000).await;
            assert_eq!(std::fs::read(&path).expect("read"), bytes);
        }
    }

    #[test]
    fn sous_pull_io_takes_three_words() {
        assert_eq!(Io::parse(None), Ok(Io::Auto));
        assert_eq!(Io::parse(Some("auto")), Ok(Io::Auto));
        assert_eq!(Io::parse(Some("direct")), Ok(Io::Direct));
        assert_eq!(Io::parse(Some("buffered")), Ok(Io::Buffered));
        let refused = Io::parse(Some("odirect")).expect_err("refused");
        assert!(
            refused.contains("SOUS_PULL_IO=odirect") && refused.contains("`buffered`"),
            "{refused}"
        );
        assert!(Io::Auto.wants_direct(DIRECT_MIN) && !Io::Auto.wants_direct(DIRECT_MIN - 1));
    }
}
