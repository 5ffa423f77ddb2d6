//! Buffers whose values start on a cache line: a 64-byte row of an AMX tile (or a vector
//! load) that straddles two lines is loaded as two, and large buffers from glibc's mmap start
//! 16 bytes past a page. A 3x3 bf16 convolution of 192 or 384 channels on AMX ran 35% slower
//! from a map 16 bytes off a line (Sapphire Rapids, one thread).

use std::ops::{Deref, DerefMut};

/// Bytes the values start at a multiple of.
pub(crate) const LINE: usize = 64;

/// `len` values of `T` from the first [`LINE`] boundary of a vector that holds them with room
/// to spare.
#[derive(Debug, Default)]
pub(crate) struct Aligned<T> {
    buf: Vec<T>,
    start: usize,
    len: usize,
}

impl<T: Copy + Default> Aligned<T> {
    /// `len` default values.
    pub(crate) fn zeroed(len: usize) -> Self {
        let mut a = Self {
            buf: Vec::new(),
            start: 0,
            len: 0,
        };
        a.resize_for_overwrite(len);
        a.fill(T::default());
        a
    }

    /// Room for `len` values, the memory reused where it holds them: what they are is left
    /// unspecified (values from before, moved, or defaults), for a caller that writes them
    /// all.
    pub(crate) fn resize_for_overwrite(&mut self, len: usize) {
        let size = std::mem::size_of::<T>().max(1);
        self.buf.resize(len + LINE / size, T::default());
        self.start = (self.buf.as_ptr() as usize).wrapping_neg() % LINE / size;
        self.len = len;
    }
}

impl<T> Deref for Aligned<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &self.buf[self.start..self.start + self.len]
    }
}

impl<T> DerefMut for Aligned<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut self.buf[self.start..self.start + self.len]
    }
}

impl<T: Copy + Default> Clone for Aligned<T> {
    /// A copy on a line of its own (a clone of the vector would keep the offset, not the
    /// alignment).
    fn clone(&self) -> Self {
        let mut a = Self::zeroed(0);
        a.resize_for_overwrite(self.len);
        a.copy_from_slice(self);
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_start_on_a_line_and_keep_their_length_when_resized_or_cloned() {
        for len in [0, 1, 31, 64, 1000, 100_000] {
            let mut a = Aligned::<u16>::zeroed(len);
            assert_eq!(a.len(), len);
            assert_eq!(a.as_ptr() as usize % LINE, 0);
            assert!(a.iter().all(|&v| v == 0));
            for (i, v) in a.iter_mut().enumerate() {
                *v = i as u16;
            }
            let c = a.clone();
            assert_eq!((c.as_ptr() as usize % LINE, &c[..]), (0, &a[..]));
            a.resize_for_overwrite(len * 3 + 7);
            assert_eq!((a.len(), a.as_ptr() as usize % LINE), (len * 3 + 7, 0));
            let f = Aligned::<f32>::zeroed(len);
            assert_eq!(f.as_ptr() as usize % LINE, 0);
        }
    }
}
