//! Reading an index's rows: segments, other views of a crater, single vectors, stored and
//! decoded tokens.

use crate::index::Index;
use crate::segment::Segment;
use crate::segment_writer::SegmentData;
use crate::single_int8::Int8Vectors;
use craterdex_tokens::Descriptors;
use std::collections::HashMap;

// The small accessors are #[inline]: searches call them per row, from other code units
// (docs/performance.md, "The search's files split by idea").
impl Index {
    /// What search reads of each segment; `int8_singles` makes (once per segment, in
    /// parallel chunks) and includes the int8 copies of the single vectors.
    pub(crate) fn segment_parts(&self, int8_singles: bool) -> Vec<SegmentParts<'_>> {
        let d = self.single_dim();
        self.segments
            .iter()
            .map(|s| SegmentParts {
                first: s.first_row,
                count: s.count,
                single: s.single(),
                lists: s.lists(),
                single_int8: int8_singles.then(|| s.single_int8(d)),
            })
            .collect()
    }

    #[inline]
    pub(crate) fn segment_of(&self, row: usize) -> &Segment {
        let i = self
            .segments
            .partition_point(|s| s.first_row + s.count <= row);
        &self.segments[i]
    }

    /// The live rows of each crater with more than one, by crater id; made when first asked.
    fn views_by_crater(&self) -> &HashMap<String, Vec<usize>> {
        self.views.get_or_init(|| {
            let mut by_crater: HashMap<String, Vec<usize>> = HashMap::new();
            for (r, m) in self.metas.iter().enumerate() {
                if let (false, Some(c)) = (self.deleted_rows[r], &m.crater_id) {
                    by_crater.entry(c.clone()).or_default().push(r);
                }
            }
            by_crater.retain(|_, rows| rows.len() > 1);
            by_crater
        })
    }

    /// The most live rows any one crater has (1 where no crater has two).
    pub fn most_views_per_crater(&self) -> usize {
        self.views_by_crater()
            .values()
            .map(Vec::len)
            .max()
            .unwrap_or(1)
    }

    /// The other live rows showing `row`'s crater (none without a crater id).
    pub fn other_views(&self, row: usize) -> impl Iterator<Item = usize> + '_ {
        let views = self.views_by_crater();
        self.metas[row]
            .crater_id
            .as_ref()
            .and_then(|c| views.get(c))
            .into_iter()
            .flatten()
            .copied()
            .filter(move |&r| r != row)
    }

    /// The single vector of `row` as stored.
    #[inline]
    pub fn single_of(&self, row: usize) -> &[f32] {
        let s = self.segment_of(row);
        let d = self.single_dim();
        let local = row - s.first_row;
        &s.single()[local * d..(local + 1) * d]
    }

    /// The descriptors of an indexed image as stored (tokens decoded by the codec), to search
    /// with an image that is already in the index.
    pub fn descriptors_of(&self, row: usize) -> Descriptors {
        let mut tokens = Vec::new();
        self.decode_tokens(row, &mut tokens);
        Descriptors {
            single: self.single_of(row).to_vec(),
            tokens,
        }
    }

    /// For an int8 index, the codes `[K, D]` and scales `[K]` of `row`.
    #[inline]
    pub fn int8_tokens(&self, row: usize) -> Option<(&[i8], &[f32])> {
        (self.codec.codec == crate::Codec::Int8).then(|| self.int8_run(row, row + 1))
    }

    /// The int8 codes `[n * K, D]` and scales `[n * K]` of rows `lo..hi` of one segment
    /// (int8 indexes).
    #[inline]
    pub(crate) fn int8_run(&self, lo: usize, hi: usize) -> (&[i8], &[f32]) {
        let (payload, scales) = self.stored_run(lo, hi);
        (bytemuck::cast_slice(payload), scales)
    }

    /// The f32 tokens `[n * K, D]` of rows `lo..hi` of one segment (f32 indexes).
    #[inline]
    pub(crate) fn f32_run(&self, lo: usize, hi: usize) -> &[f32] {
        bytemuck::cast_slice(self.stored_run(lo, hi).0)
    }

    /// The stored token bytes and scales of rows `lo..hi`, which lie in one segment.
    #[inline]
    fn stored_run(&self, lo: usize, hi: usize) -> (&[u8], &[f32]) {
        let s = self.segment_of(lo);
        assert!(
            hi <= s.first_row + s.count,
            "rows {lo}..{hi} cross a segment boundary"
        );
        let (lo, hi) = (lo - s.first_row, hi - s.first_row);
        let k = self.manifest.tokens_per_image;
        let bpt = self.codec.bytes_per_token();
        let payload = &s.tokens()[lo * k * bpt..hi * k * bpt];
        let scales: &[f32] = match s.scales() {
            Some(m) => &m[lo * k..hi * k],
            None => &[],
        };
        (payload, scales)
    }

    /// The stored arrays of `rows` (any order, any segments) as one segment's data, bytes as
    /// stored: what a merge or a split writes again without decoding.
    pub(crate) fn rows_data(&self, rows: &[usize]) -> SegmentData {
        let mut data = SegmentData {
            single: Vec::with_capacity(rows.len() * self.single_dim()),
            payload: Vec::with_capacity(rows.len() * self.token_bytes_per_image()),
            scales: Vec::new(),
            metas: Vec::with_capacity(rows.len()),
            lists: None,
        };
        for &row in rows {
            data.single.extend_from_slice(self.single_of(row));
            let (payload, scales) = self.stored_run(row, row + 1);
            data.payload.extend_from_slice(payload);
            data.scales.extend_from_slice(scales);
            data.metas.push(self.metas[row].clone());
        }
        data
    }

    /// Decodes the stored tokens of `row` into `out` (`[K, D]`).
    #[inline]
    pub fn decode_tokens(&self, row: usize, out: &mut Vec<f32>) {
        out.resize(self.manifest.tokens_per_image * self.codec.dim, 0.0);
        self.decode_tokens_into(row, out);
    }

    /// Decodes the stored tokens of `row` into a slice of exactly `K * D` floats.
    #[inline]
    pub fn decode_tokens_into(&self, row: usize, out: &mut [f32]) {
        let (payload, scales) = self.stored_run(row, row + 1);
        self.codec.decode(payload, scales, out);
    }
}

/// What search reads of one segment.
pub(crate) struct SegmentParts<'a> {
    pub first: usize,
    pub count: usize,
    /// `[count, Ds]`
    pub single: &'a [f32],
    pub lists: Option<&'a crate::ivf::InvertedLists>,
    pub single_int8: Option<&'a Int8Vectors>,
}
