//! A model's packed weights in one mapping of transparent huge pages, and buffers (the
//! native engine's KV cache) in mappings of their own.
//!
//! A decode step reads every weight of the model once, front to back, and is bound by
//! how fast memory streams them. In 4 KiB pages that is a TLB miss and a page walk
//! every 4 KiB (66,000 of them a step for SmolLM2-135M's 270 MB of bf16), and the
//! hardware prefetchers stop at every page boundary. Most distributions set Linux's
//! transparent huge pages to `madvise`, so memory from the allocator stays in 4 KiB
//! pages unless asked otherwise. Huge pages made both a plain read of the weights and
//! the native engine's decode steps faster, one stream and many (benchmarks/native.md, "Figures that were in code comments").
//!
//! A matrix of a layer (0.6–3.5 MB for SmolLM2) is too small to hold a 2 MiB-aligned
//! page of its own, so [`place`] copies all of a model's weights into one anonymous
//! mapping, 2 MiB-aligned and advised `MADV_HUGEPAGE`, one matrix at a time, each
//! heap copy freed once copied and the freed heap given back to the system every
//! 64 MiB (so at most that much is held twice). Whether the kernel backs it with huge pages depends on the system
//! (`/sys/kernel/mm/transparent_hugepage/enabled`: `never` turns them off, and
//! fragmented memory may leave part of it in small pages); [`Placement`] reports what
//! it got. The values are the same bytes either way, so no result changes.
//!
//! Whether to place them is the caller's choice, never read here: the native engine
//! leaves the weights where they are, and its KV cache on the heap ([`Zeroed::on_heap`]),
//! where `SOUS_HUGE_PAGES=off` says so (for measuring the difference, or on a system
//! where compaction at load costs more than it saves).

use std::ops::Deref;
use std::sync::Arc;

/// Element types a [`Buf`] or [`Zeroed`] may hold: plain values with no padding, for
/// which every bit pattern (all zeros included) is a value, so their bytes can be
/// copied and viewed as they are. Sealed: implemented for `u8`, `i8`, `u16`, `f32` and `u64`.
pub trait Plain: sealed::Sealed + Copy + Default + Send + Sync + 'static {}

mod sealed {
    pub trait Sealed {}
    impl Sealed for u8 {}
    impl Sealed for i8 {}
    impl Sealed for u16 {}
    impl Sealed for f32 {}
    impl Sealed for u64 {}
}

impl Plain for u8 {}
impl Plain for i8 {}
impl Plain for u16 {}
impl Plain for f32 {}
impl Plain for u64 {}

/// Alignment of the mapping: one huge page on x86-64 and most aarch64 kernels.
pub(crate) const HUGE_PAGE: usize = 2 << 20;

/// Alignment of every buffer inside the mapping (a cache line, and more than any
/// element needs).
const ALIGN: usize = 64;

/// One anonymous mapping, 2 MiB-aligned and advised for huge pages: the buffers of many
/// matrices, or one [`Zeroed`] buffer.
pub(crate) struct Region {
    map: memmap2::MmapMut,
    /// Offset of the first 2 MiB-aligned byte in `map`.
    base: usize,
}

impl Region {
    /// A zeroed mapping of at least `len` bytes starting on a 2 MiB boundary, advised
    /// for huge pages. Its pages are not touched yet: the advice must come before the
    /// first write faults them in.
    fn new(len: usize) -> std::io::Result<Region> {
        let map = memmap2::MmapMut::map_anon(len + HUGE_PAGE)?;
        let base = (map.as_ptr() as usize).next_multiple_of(HUGE_PAGE) - map.as_ptr() as usize;
        #[cfg(target_os = "linux")]
        map.advise_range(memmap2::Advice::HugePage, base, len)?;
        Ok(Region { map, base })
    }

    /// The first byte the buffers may use.
    fn start(&self) -> *const u8 {
        self.map[self.base..].as_ptr()
    }

    /// [`Region::start`], to write through.
    fn start_mut(&mut self) -> *mut u8 {
        self.map[self.base..].as_mut_ptr()
    }
}

/// A weight buffer: on the heap as it was packed, or in a [`Region`] after [`place`].
#[derive(Clone)]
pub(crate) enum Buf<T: Plain> {
    Heap(Vec<T>),
    Placed {
        region: Arc<Region>,
        /// Byte offset from the region's start (a multiple of [`ALIGN`]).
        offset: usize,
        len: usize,
    },
}

impl<T: Plain> Buf<T> {
    /// The buffer as a vector to append to (a placed one is copied back to the heap:
    /// only stacking packed matrices appends, and it runs before placement).
    pub(crate) fn vec_mut(&mut self) -> &mut Vec<T> {
        if let Buf::Placed { .. } = self {
            *self = Buf::Heap(self.to_vec());
        }
        match self {
            Buf::Heap(v) => v,
            Buf::Placed { .. } => unreachable!("replaced by a heap copy above"),
        }
    }
}

impl<T: Plain> From<Vec<T>> for Buf<T> {
    fn from(v: Vec<T>) -> Buf<T> {
        Buf::Heap(v)
    }
}

impl<T: Plain> Deref for Buf<T> {
    type Target = [T];

    #[allow(unsafe_code)]
    fn deref(&self) -> &[T] {
        match self {
            Buf::Heap(v) => v,
            // SAFETY: `place` wrote `len` values of `T` at `offset` (a multiple of 64 from
            // a 2 MiB boundary, so aligned for `T`) before creating this variant, and
            // nothing writes to those bytes again; the `Arc` keeps the mapping alive
            // as long as the slice's borrow of `self`. `T: Plain` has no invalid bit
            // patterns.
            Buf::Placed { region, offset, len } => unsafe {
                std::slice::from_raw_parts(region.start().add(*offset).cast::<T>(), *len)
            },
        }
    }
}

/// A buffer [`place`] can move: the packed weights' visitor hands each one over as this.
pub(crate) trait Movable {
    /// Bytes it takes.
    fn byte_len(&self) -> usize;
    /// Copies its bytes into `dst` (exactly [`Movable::byte_len`] long) and frees its
    /// heap copy, leaving it empty until [`Movable::settle`].
    fn move_out(&mut self, dst: &mut [u8]);
    /// Points it at its bytes in `region`, at `offset`.
    fn settle(&mut self, region: &Arc<Region>, offset: usize, len: usize);
    /// Elements it holds.
    fn elements(&self) -> usize;
}

impl<T: Plain> Movable for Buf<T> {
    fn byte_len(&self) -> usize {
        std::mem::size_of_val::<[T]>(self)
    }

    #[allow(unsafe_code)]
    fn move_out(&mut self, dst: &mut [u8]) {
        let values: &[T] = self;
        // SAFETY: `T: Plain` has no padding, so its values are initialised bytes;
        // the view covers exactly the slice's memory and lives only for this copy.
        let bytes = unsafe { std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), dst.len()) };
        dst.copy_from_slice(bytes);
        *self = Buf::Heap(Vec::new());
    }

    fn settle(&mut self, region: &Arc<Region>, offset: usize, len: usize) {
        *self = Buf::Placed {
            region: Arc::clone(region),
            offset,
            len,
        };
    }

    fn elements(&self) -> usize {
        self.len()
    }
}

/// A zeroed buffer of its own, in a mapping advised for huge pages where the mapping can
/// be made ([`Zeroed::new`]), on the heap otherwise or where the caller asks
/// ([`Zeroed::on_heap`]): the native engine's KV cache, whose every byte a long decode
/// step may read.
pub struct Zeroed<T: Plain>(Held<T>);

enum Held<T> {
    /// In a mapping of its own.
    Mapped { region: Region, len: usize },
    /// On the heap.
    Heap(Vec<T>),
}

impl<T: Plain> Zeroed<T> {
    /// `len` zeros (the pages are not touched: each is faulted in by its first write).
    pub fn new(len: usize) -> Zeroed<T> {
        let bytes = len * std::mem::size_of::<T>();
        if bytes < HUGE_PAGE {
            return Zeroed::on_heap(len);
        }
        match Region::new(bytes) {
            Ok(region) => Zeroed(Held::Mapped { region, len }),
            Err(_) => Zeroed::on_heap(len),
        }
    }

    /// `len` zeros on the heap, in pages of the system's default size.
    pub fn on_heap(len: usize) -> Zeroed<T> {
        Zeroed(Held::Heap(vec![T::default(); len]))
    }
}

impl<T: Plain> Deref for Zeroed<T> {
    type Target = [T];

    #[allow(unsafe_code)]
    fn deref(&self) -> &[T] {
        match &self.0 {
            Held::Heap(v) => v,
            // SAFETY: the region holds `len` values of `T` from its 2 MiB-aligned start
            // (`Region::new` made it that long), zeroed by the kernel, and a zero `T` is a
            // value (`Plain`); it lives as long as `self`.
            Held::Mapped { region, len } => unsafe {
                std::slice::from_raw_parts(region.start().cast::<T>(), *len)
            },
        }
    }
}

impl<T: Plain> std::ops::DerefMut for Zeroed<T> {
    #[allow(unsafe_code)]
    fn deref_mut(&mut self) -> &mut [T] {
        match &mut self.0 {
            Held::Heap(v) => v,
            // SAFETY: as in `deref`; `&mut self` makes this the only view.
            Held::Mapped { region, len } => unsafe {
                std::slice::from_raw_parts_mut(region.start_mut().cast::<T>(), *len)
            },
        }
    }
}

/// What [`place`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// Bytes of weights now in the mapping.
    pub bytes: u64,
    /// How much of the mapping the kernel backs with huge pages, as
    /// `/proc/self/smaps` says (`None` where it cannot be read).
    pub huge_bytes: Option<u64>,
    /// The system's mode ([`system_mode`]), which says why there are none.
    pub mode: Option<String>,
}

impl std::fmt::Display for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        write!(
            f,
            "{:.0} MiB of weights in one mapping advised for huge pages",
            mib(self.bytes)
        )?;
        match (self.huge_bytes, self.mode.as_deref()) {
            (Some(0), Some(mode)) => write!(f, " (none of it in huge pages: THP is `{mode}` here)"),
            (Some(huge), _) => write!(f, " ({:.0} MiB of it in huge pages)", mib(huge)),
            (None, _) => Ok(()),
        }
    }
}

/// The system's transparent huge page mode (`always`, `madvise` or `never`), from
/// `/sys/kernel/mm/transparent_hugepage/enabled`; `None` where the kernel does not say
/// (not Linux, or built without THP).
pub fn system_mode() -> Option<String> {
    let enabled = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").ok()?;
    mode_in(&enabled).map(str::to_owned)
}

/// The selected mode in the kernel's list, the bracketed word: `always [madvise] never`
/// is `madvise`.
pub fn mode_in(enabled: &str) -> Option<&str> {
    enabled
        .split_whitespace()
        .find_map(|w| w.strip_prefix('[')?.strip_suffix(']'))
}

/// Whether the system's mode (`mode`, [`system_mode`]) gives an advised mapping huge
/// pages (`always` or `madvise`): where the native engine asks for them, its weights
/// and KV cache get them.
pub fn in_use(mode: Option<&str>) -> bool {
    matches!(mode, Some("always" | "madvise"))
}

/// What [`place`] moves: a value holding [`Movable`] buffers (the products' packed
/// matrices).
pub(crate) trait Placeable {
    /// Hands each of its buffers to `f`.
    fn for_each_buf(&mut self, f: &mut dyn FnMut(&mut dyn Movable));
}

/// Moves every buffer of `weights` into one mapping advised for huge pages (see the
/// module's documentation). Nothing moves, and `Ok(None)` comes back, where there is
/// nothing to move. An error (the mapping could not be made) leaves every buffer where
/// it was.
pub(crate) fn place<W: Placeable>(weights: &mut [&mut W]) -> std::io::Result<Option<Placement>> {
    let mut total = 0usize;
    for w in weights.iter_mut() {
        w.for_each_buf(&mut |b| total += b.byte_len().next_multiple_of(ALIGN));
    }
    if total == 0 {
        return Ok(None);
    }
    let mut region = Region::new(total)?;
    let base = region.base;
    // First every buffer's bytes into the mapping, each heap copy freed as it goes;
    // then, with the mapping shared, every buffer pointed at its bytes, in the same
    // order.
    let mut spans = Vec::new();
    let (mut offset, mut untrimmed) = (0, 0);
    for w in weights.iter_mut() {
        w.for_each_buf(&mut |b| {
            let len = b.byte_len();
            spans.push((offset, b.elements()));
            b.move_out(&mut region.map[base + offset..base + offset + len]);
            offset += len.next_multiple_of(ALIGN);
            untrimmed += len;
            if untrimmed >= TRIM_EVERY {
                give_back_heap();
                untrimmed = 0;
            }
        });
    }
    give_back_heap();
    let region = Arc::new(region);
    let mut spans = spans.into_iter();
    for w in weights.iter_mut() {
        w.for_each_buf(&mut |b| {
            if let Some((offset, len)) = spans.next() {
                b.settle(&region, offset, len);
            }
        });
    }
    Ok(Some(Placement {
        bytes: total as u64,
        huge_bytes: huge_bytes(region.start(), total),
        mode: system_mode(),
    }))
}

/// Bytes moved between two [`give_back_heap`]s: the heap copies and the mapping are
/// both resident for at most this much.
const TRIM_EVERY: usize = 64 << 20;

/// Returns the heap memory the moved buffers freed to the system. glibc keeps freed
/// chunks that are not at the top of its heaps (a matrix smaller than its dynamic mmap
/// threshold, 32 MiB at most, comes from there) for later allocations: without this, a
/// server held its weights twice, 200 MB more resident for SmolLM2 (1,588 against
/// 1,383 MB with `SOUS_HUGE_PAGES=off`). Elsewhere the allocator does what it does.
fn give_back_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[allow(unsafe_code)]
    // SAFETY: `malloc_trim` takes no pointer and only releases glibc's own free memory.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Bytes of huge pages backing the mapping that holds `start` (its `AnonHugePages` in
/// `/proc/self/smaps`), or `None` where that cannot be read (not Linux).
fn huge_bytes(start: *const u8, len: usize) -> Option<u64> {
    let kb = smaps_field(start, "AnonHugePages")?;
    let kb: u64 = kb.trim_end_matches("kB").trim().parse().ok()?;
    Some((kb * 1024).min(len as u64))
}

/// The value of `field` for the mapping that holds `at`, from `/proc/self/smaps`.
pub(crate) fn smaps_field(at: *const u8, field: &str) -> Option<String> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let at = at as usize;
    let mut inside = false;
    for line in smaps.lines() {
        // A mapping's first line starts with its address range: `lo-hi perms ...`.
        if let Some((range, _)) = line.split_once(' ')
            && let Some((lo, hi)) = range.split_once('-')
            && let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
        {
            inside = lo <= at && at < hi;
            continue;
        }
        if inside
            && let Some((name, value)) = line.split_once(':')
            && name == field
        {
            return Some(value.trim().to_string());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_selected_mode_of_the_kernel_list() {
        assert_eq!(mode_in("always [madvise] never\n"), Some("madvise"));
        assert_eq!(mode_in("[always] madvise never\n"), Some("always"));
        assert_eq!(mode_in("always madvise [never]\n"), Some("never"));
        assert_eq!(mode_in(""), None);
        assert!(!in_use(Some("never")) && !in_use(None));
    }

    #[test]
    fn a_zeroed_buffer_is_zero_writable_and_advised() {
        let len = 3 * HUGE_PAGE / 4 + 5;
        let mut z = Zeroed::<f32>::new(len);
        assert_eq!(z.len(), len);
        assert!(z.iter().all(|&v| v == 0.0));
        for (i, v) in z.iter_mut().enumerate().step_by(1001) {
            *v = i as f32;
        }
        assert_eq!(z[5005], 5005.0);
        // Index 0 wrote a zero; every other multiple of 1001 below `len` its index.
        assert_eq!(z.iter().filter(|&&v| v != 0.0).count(), (len - 1) / 1001);
        #[cfg(target_os = "linux")]
        {
            let flags = smaps_field(z.as_ptr().cast(), "VmFlags").expect("smaps lists the mapping");
            assert!(
                flags.split_whitespace().any(|f| f == "hg"),
                "not advised: {flags}"
            );
        }
        // Too small for a huge page: on the heap, zeroed all the same.
        let small = Zeroed::<u16>::new(100);
        assert!(small.iter().all(|&v| v == 0));
    }
}
