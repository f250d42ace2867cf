//! The heap of one plugin call.
//!
//! The host runs every call in a fresh instance and throws it away afterwards, so a
//! plugin's memory never needs to be reused for long: allocating moves a pointer
//! forward, a freed block comes back once nothing allocated after it is in use (a
//! `String` or `Vec` that grows last is extended where it lies), and the whole heap
//! goes with the instance. Compared with a general-purpose allocator this makes
//! allocating a few instructions and freeing almost nothing, which is most of what a
//! `render` does besides formatting text.
//!
//! The memory a call may use is still bounded by the host's cap: memory freed out of
//! order beyond what is remembered stays used until the call ends, so a plugin that
//! allocates and frees a lot in one call reaches the cap sooner than with a reusing
//! allocator. Such a plugin turns the SDK's `call-allocator` feature off
//! (`default-features = false`) and keeps the standard allocator.

/// Freed blocks remembered below the top at once; one freed while this many wait is
/// forgotten (its bytes stay used until the call ends).
const HOLES: usize = 32;

/// A bump region `[next, end)`: where the next block starts and where memory ends,
/// with the blocks freed below the top, given back once everything above them is.
#[cfg_attr(not(all(target_arch = "wasm32", feature = "call-allocator")), allow(dead_code))]
#[derive(Debug)]
pub(crate) struct Bump {
    next: usize,
    end: usize,
    /// `(start, end)` of freed blocks below `next`, in no particular order.
    holes: [(usize, usize); HOLES],
    len: usize,
}

#[cfg_attr(not(all(target_arch = "wasm32", feature = "call-allocator")), allow(dead_code))]
impl Bump {
    /// A region from `next` up to `end`.
    pub(crate) const fn new(next: usize, end: usize) -> Self {
        Self { next, end, holes: [(0, 0); HOLES], len: 0 }
    }

    /// Whether the region is still the empty one of `Bump::new(0, 0)` (not set up yet).
    pub(crate) fn unset(&self) -> bool {
        self.end == 0
    }

    /// The start of a new block of `size` bytes aligned to `align` (a power of two),
    /// asking `grow` for the bytes missing beyond `end` when it does not fit (`grow`
    /// answers how many it added, 0 when it could not).
    pub(crate) fn alloc(&mut self, size: usize, align: usize, grow: impl FnOnce(usize) -> usize) -> Option<usize> {
        let start = self.next.checked_add(align - 1)? & !(align - 1);
        let end = start.checked_add(size)?;
        self.reach(end, grow)?;
        self.next = end;
        Some(start)
    }

    /// Gives the block at `start` of `size` bytes back: at once if it is the last one
    /// handed out (and with it every freed block it uncovers), else when it is uncovered.
    pub(crate) fn free(&mut self, start: usize, size: usize) {
        if start + size != self.next {
            if self.len < HOLES {
                self.holes[self.len] = (start, start + size);
                self.len += 1;
            }
            return;
        }
        self.next = start;
        while let Some(i) = self.holes[..self.len].iter().position(|&(_, end)| end == self.next) {
            self.next = self.holes[i].0;
            self.len -= 1;
            self.holes[i] = self.holes[self.len];
        }
    }

    /// Resizes the last block in place (`true`), or says it cannot (`false`: the caller
    /// copies it into a new block).
    pub(crate) fn resize_last(&mut self, start: usize, size: usize, new_size: usize, grow: impl FnOnce(usize) -> usize) -> bool {
        if start + size != self.next {
            return false;
        }
        let Some(end) = start.checked_add(new_size) else { return false };
        if self.reach(end, grow).is_none() {
            return false;
        }
        self.next = end;
        true
    }

    fn reach(&mut self, end: usize, grow: impl FnOnce(usize) -> usize) -> Option<()> {
        if end > self.end {
            let added = grow(end - self.end);
            if added < end - self.end {
                return None;
            }
            self.end += added;
        }
        Some(())
    }
}

#[cfg(all(target_arch = "wasm32", feature = "call-allocator"))]
mod wasm {
    #![allow(unsafe_code)]

    use core::alloc::{GlobalAlloc, Layout};
    use core::arch::wasm32;
    use core::cell::UnsafeCell;

    use super::Bump;

    const PAGE: usize = 65536;

    unsafe extern "C" {
        /// Where the linker put the end of the stack and static data: the heap starts here.
        static __heap_base: u8;
    }

    /// The plugin's global allocator (see the module documentation).
    pub struct CallAllocator(UnsafeCell<Bump>);

    // SAFETY: a wasm32-unknown-unknown instance runs one thread; nothing else reaches the cell.
    unsafe impl Sync for CallAllocator {}

    impl CallAllocator {
        fn with<T>(&self, f: impl FnOnce(&mut Bump) -> T) -> T {
            // SAFETY: one thread, and `f` never allocates: this is the only reference.
            let bump = unsafe { &mut *self.0.get() };
            if bump.unset() {
                // The first allocation of the call: the heap runs from the linker's
                // heap base to the end of the memory the instance started with.
                *bump = Bump::new(&raw const __heap_base as usize, wasm32::memory_size(0) * PAGE);
            }
            f(bump)
        }
    }

    /// Grows memory 0 by whole pages covering `bytes`: the bytes added, 0 at the cap.
    fn grow(bytes: usize) -> usize {
        let pages = bytes.div_ceil(PAGE);
        if wasm32::memory_grow(0, pages) == usize::MAX { 0 } else { pages * PAGE }
    }

    // SAFETY: blocks are handed out once, never overlapping (`Bump` only moves `next`
    // past them, or back over blocks that are all freed), aligned as asked, and inside
    // memory 0 (grown before `next` passes its end).
    unsafe impl GlobalAlloc for CallAllocator {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            self.with(|b| b.alloc(layout.size(), layout.align(), grow)).map_or(core::ptr::null_mut(), |at| at as *mut u8)
        }

        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            self.with(|b| b.free(ptr as usize, layout.size()));
        }

        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            if self.with(|b| b.resize_last(ptr as usize, layout.size(), new_size, grow)) {
                return ptr;
            }
            // SAFETY: the caller guarantees `layout.align()` with `new_size` makes a valid layout.
            let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
            // SAFETY: a new block, then the old one's bytes copied into it (the blocks
            // never overlap) before the old one is freed.
            unsafe {
                let new = self.alloc(new_layout);
                if !new.is_null() {
                    core::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                    self.dealloc(ptr, layout);
                }
                new
            }
        }
    }

    #[global_allocator]
    static ALLOCATOR: CallAllocator = CallAllocator(UnsafeCell::new(Bump::new(0, 0)));
}

#[cfg(test)]
mod tests {
    use super::{Bump, HOLES};

    fn no_growth(_: usize) -> usize {
        0
    }

    #[test]
    fn blocks_are_aligned_and_never_overlap() {
        let mut b = Bump::new(1001, 4096);
        let a = b.alloc(10, 8, no_growth).expect("fits");
        let c = b.alloc(1, 1, no_growth).expect("fits");
        let d = b.alloc(16, 16, no_growth).expect("fits");
        assert_eq!((a, c, d), (1008, 1018, 1024));
    }

    #[test]
    fn memory_grows_by_what_grow_adds_and_a_refusal_allocates_nothing() {
        let mut b = Bump::new(0, 100);
        assert_eq!(b.alloc(150, 1, |more| if more == 50 { 65536 } else { 0 }), Some(0));
        assert_eq!((b.next, b.end), (150, 65636));
        assert_eq!(b.alloc(70_000, 1, no_growth), None);
        assert_eq!(b.alloc(70_000, 1, |_| 10), None, "growth short of the block");
        assert_eq!((b.next, b.end), (150, 65636), "a failed allocation leaves the region as it was");
        assert_eq!(b.alloc(usize::MAX, 1, |_| usize::MAX), None, "overflow");
    }

    #[test]
    fn only_the_last_block_is_freed_or_resized_in_place() {
        let mut b = Bump::new(0, 1000);
        let first = b.alloc(100, 1, no_growth).expect("fits");
        let last = b.alloc(100, 1, no_growth).expect("fits");
        assert!(!b.resize_last(first, 100, 200, no_growth), "not the last block");
        assert!(b.resize_last(last, 100, 300, no_growth));
        assert_eq!(b.alloc(1, 1, no_growth), Some(400));
        b.free(first, 100);
        assert_eq!(b.alloc(1, 1, no_growth), Some(401), "freeing an older block gives nothing back yet");
        b.free(401, 1);
        assert_eq!(b.alloc(1, 1, no_growth), Some(401), "the last block's bytes are reused");
        assert!(!b.resize_last(401, 1, 5000, no_growth), "no memory to grow into");
    }

    /// `log(&format!("{}", "y".repeat(n)))` in a loop: the argument is freed before the
    /// text made from it, and both come back once the text is freed.
    #[test]
    fn blocks_freed_out_of_order_come_back_once_uncovered() {
        let mut b = Bump::new(0, 1 << 20);
        for _ in 0..10_000 {
            let argument = b.alloc(4096, 1, no_growth).expect("fits");
            let text = b.alloc(4200, 1, no_growth).expect("fits");
            b.free(argument, 4096);
            b.free(text, 4200);
        }
        assert_eq!(b.next, 0, "nothing kept");
        // Freed below the top, in address order: the first HOLES are remembered, later
        // ones forgotten (their bytes stay used until the call ends).
        let blocks: Vec<usize> = (0..HOLES + 3).map(|_| b.alloc(8, 8, no_growth).expect("fits")).collect();
        let top = b.alloc(8, 8, no_growth).expect("fits");
        for &block in &blocks {
            b.free(block, 8);
        }
        b.free(top, 8);
        assert_eq!(b.next, top, "stops below the top: the block under it was forgotten");
        let mut c = Bump::new(0, 1 << 20);
        let blocks: Vec<usize> = (0..HOLES).map(|_| c.alloc(8, 8, no_growth).expect("fits")).collect();
        let top = c.alloc(8, 8, no_growth).expect("fits");
        for &block in blocks.iter().rev() {
            c.free(block, 8);
        }
        c.free(top, 8);
        assert_eq!(c.next, 0, "all remembered, all back");
    }
}
