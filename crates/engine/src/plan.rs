//! A build spread over many processes or machines. [`IndexRecipe::plan`] fixes what every
//! part must share (the encoder's whitening and the codec, learned from a sample of the
//! images, and the model), parts are extracted, encoded and written anywhere
//! ([`BuildPlan::write_part`]), and [`BuildPlan::commit`] joins them into one index through
//! the index's atomic path. On the same images it gives the index `index build` gives: the
//! same ids in the same order, the same codes.

use crate::error::{Error, Result};
use crate::inputs::metas_in_order;
use crate::progress::{Continued, Progress};
use crate::recipe::{encode_all, IndexRecipe, IvfSetting};
use craterdex_errors::{ensure, IoContext, ResultExt};
use craterdex_index::parts::{commit_parts, part_images, part_singles, write_part};
use craterdex_index::shards::{shard_dir, ShardSet};
use craterdex_index::{Codec, ImageMeta, TokenCodec};
use craterdex_model::extract::FeatureSet;
use craterdex_tokens::{Descriptors, Encoder};
use rand::seq::index::sample;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// At most this many images teach the encoder its whitening and the codec its codebooks:
/// whitening reads at most 100,000 tokens (16 from each of 6,250 images), so a larger
/// sample would change nothing but the memory it takes.
pub const LEARN_SAMPLE_IMAGES: usize = 8192;

/// Which of `n` images (by position) an index learns from: all of them up to
/// [`LEARN_SAMPLE_IMAGES`], else that many chosen at random with `seed`, in order.
pub fn learn_sample(n: usize, seed: u64) -> Vec<usize> {
    if n <= LEARN_SAMPLE_IMAGES {
        return (0..n).collect();
    }
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut rows = sample(&mut rng, n, LEARN_SAMPLE_IMAGES).into_vec();
    rows.sort_unstable();
    rows
}

/// The rows of `extracted` (ids of the images that could be read, in input order) that
/// [`learn_sample`] picks from the `inputs` ids; `None` when that is all of them.
pub fn learn_rows(inputs: &[String], extracted: &[String], seed: u64) -> Option<Vec<usize>> {
    if inputs.len() <= LEARN_SAMPLE_IMAGES {
        return None;
    }
    let sampled: std::collections::HashSet<&str> = learn_sample(inputs.len(), seed)
        .into_iter()
        .map(|i| inputs[i].as_str())
        .collect();
    Some(
        (0..extracted.len())
            .filter(|&r| sampled.contains(extracted[r].as_str()))
            .collect(),
    )
}

/// Images read and encoded at once by a build too large to hold every image's features
/// (about 2 GB of ViT-S/14 patch tokens at the default crop size).
pub const CHUNK_IMAGES: usize = 4096;

/// Where in `ids` (a build's inputs, in order) the images its encoder and codec learn from
/// lie: [`learn_sample`]'s for [`crate::LearnFrom::Sample`], else the named ones.
pub fn learn_positions(ids: &[String], learn: &crate::LearnFrom, seed: u64) -> Vec<usize> {
    match learn {
        crate::LearnFrom::Sample => learn_sample(ids.len(), seed),
        crate::LearnFrom::Ids(named) => (0..ids.len())
            .filter(|&i| named.contains(&ids[i]))
            .collect(),
    }
}

/// The features of the images at some positions of a build's inputs (those that could be
/// read, in order), under a step name, reporting to a progress.
pub(crate) type ExtractAt<'a> = dyn FnMut(&[usize], &str, &dyn Progress) -> Result<FeatureSet> + 'a;

/// Writes the index of the images `ids` (in that order, `metas` in any) at `dir`, `chunk`
/// images at a time, so that memory holds the features of the learning sample (`sample`,
/// positions in `ids`) and of one chunk, never all of them. `extract(positions, what,
/// progress)` gives the features of the images at `positions` that could be read, in order.
/// The index equals the one [`IndexRecipe::write_index`] makes of all the features with
/// the same sample, in one segment per chunk, merged by the default policy.
#[allow(clippy::too_many_arguments)]
pub(crate) fn write_in_chunks(
    recipe: &IndexRecipe,
    dir: &Path,
    ids: &[String],
    metas: Vec<ImageMeta>,
    sample: &[usize],
    chunk: usize,
    model: Option<String>,
    extract: &mut ExtractAt<'_>,
    progress: &dyn Progress,
) -> Result<usize> {
    let mut metas: std::collections::HashMap<String, ImageMeta> =
        metas.into_iter().map(|m| (m.id.clone(), m)).collect();
    let feats = extract(sample, "learning sample", progress)?;
    let sample_metas = metas_in_order(
        feats.ids.iter().filter_map(|id| metas.get(id).cloned()),
        &feats.ids,
    )?;
    progress.note(&format!(
        "whitening and codec learned from {} of {} images; the rest read {chunk} at a time",
        feats.len(),
        ids.len()
    ));
    let plan = recipe.plan(&feats, &sample_metas, model, progress)?;
    let mut learned: std::collections::HashMap<String, Descriptors> = feats
        .ids
        .iter()
        .cloned()
        .zip(encode_all(&plan.encoder, &feats))
        .collect();
    drop(feats);
    let in_sample: std::collections::HashSet<usize> = sample.iter().copied().collect();
    let rest = ids.len() - in_sample.len();
    let parent = match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent).io("create", &parent)?;
    let staging = tempfile::Builder::new()
        .prefix(".craterdex-build-")
        .tempdir_in(&parent)
        .io("create a staging directory in", &parent)?;
    let codec = plan.token_codec();
    let mut parts = Vec::new();
    let mut read = 0;
    progress.start("images", rest);
    let continued = Continued::new(progress);
    for (c, positions) in (0..ids.len())
        .collect::<Vec<_>>()
        .chunks(chunk.max(1))
        .enumerate()
    {
        let new: Vec<usize> = positions
            .iter()
            .copied()
            .filter(|p| !in_sample.contains(p))
            .collect();
        let mut fresh: std::collections::HashMap<String, Descriptors> = if new.is_empty() {
            Default::default()
        } else {
            let f = extract(&new, "images", &continued)?;
            f.ids
                .iter()
                .cloned()
                .zip(encode_all(&plan.encoder, &f))
                .collect()
        };
        continued.done_before(new.len());
        let mut read_ids = Vec::with_capacity(positions.len());
        let mut descs = Vec::with_capacity(positions.len());
        for &p in positions {
            let id = &ids[p];
            let desc = match in_sample.contains(&p) {
                true => learned.remove(id),
                false => fresh.remove(id),
            };
            if let Some(desc) = desc {
                read_ids.push(id.clone());
                descs.push(desc);
            }
        }
        if read_ids.is_empty() {
            continue;
        }
        let records = read_ids.iter().filter_map(|id| metas.remove(id));
        let images: Vec<(ImageMeta, Descriptors)> = metas_in_order(records, &read_ids)?
            .into_iter()
            .zip(descs)
            .collect();
        read += images.len();
        let part = staging.path().join(format!("part-{c:06}"));
        write_part(&part, &codec, &images)?;
        parts.push(part);
    }
    progress.finish();
    ensure!(
        !parts.is_empty(),
        Error::Invalid("images: no image could be read".into())
    );
    plan.commit(dir, &parts, progress)?;
    craterdex_index::Index::merge(dir, &craterdex_index::MergePolicy::default())?;
    Ok(read)
}

const PLAN_FORMAT: &str = "craterdex-build-plan/2";

/// What every part of one index shares. Saved as JSON, so that workers on other machines
/// read the same encoder and codec.
#[derive(Clone, Serialize, Deserialize)]
pub struct BuildPlan {
    format: String,
    /// Width of the backbone features the encoder takes.
    pub feature_dim: usize,
    pub encoder: Encoder,
    pub codec: Codec,
    codebooks: Vec<f32>,
    /// The model fingerprint the index records (queries from another model are refused).
    pub model: Option<String>,
    pub ivf: IvfSetting,
    pub nprobe: Option<usize>,
    pub seed: u64,
}

impl IndexRecipe {
    /// The plan of an index whose encoder is `encoder` and whose codec learns from
    /// `sample_descs` (the first images that [`LEARN_SAMPLE_IMAGES`] allows are used).
    pub fn plan_with(
        &self,
        encoder: Encoder,
        feature_dim: usize,
        sample_descs: &[Descriptors],
        model: Option<String>,
    ) -> Result<BuildPlan> {
        let codec = self.train_codec(&encoder, sample_descs, feature_dim)?;
        Ok(BuildPlan {
            format: PLAN_FORMAT.into(),
            feature_dim,
            encoder,
            codec: codec.codec,
            codebooks: codec.codebooks,
            model,
            ivf: self.ivf,
            nprobe: self.nprobe,
            seed: self.seed,
        })
    }

    /// The plan learned from `sample` (the features of [`learn_sample`]'s images, with their
    /// `metas` in that order, or none): whitening and codec both learn from all of it.
    pub fn plan(
        &self,
        sample: &FeatureSet,
        metas: &[ImageMeta],
        model: Option<String>,
        progress: &dyn Progress,
    ) -> Result<BuildPlan> {
        let encoder = self.learn_encoder(sample, None, metas, progress)?;
        let descs = encode_all(&encoder, sample);
        self.plan_with(encoder, sample.dim, &descs, model)
    }
}

impl BuildPlan {
    /// Learns the plan of a build from the sample `entries`, read with `extractor` (whose
    /// model the index will record), and saves it at `path`; returns how many images it
    /// learned from.
    pub fn learn(
        path: &Path,
        entries: &crate::Entries,
        recipe: &IndexRecipe,
        extractor: &crate::Extractor,
        progress: &dyn Progress,
    ) -> Result<usize> {
        let feats = extractor.extract(&entries.items, "sample", progress)?;
        let metas = crate::inputs::metas_in_order(entries.metas.clone(), &feats.ids)?;
        recipe
            .plan(&feats, &metas, Some(extractor.fingerprint()), progress)?
            .save(path)?;
        Ok(feats.len())
    }

    /// Reads `entries` with `extractor`, which must run the plan's model, and writes them
    /// as the part at `dir`; returns how many images it holds.
    pub fn write_entries(
        &self,
        dir: &Path,
        entries: &crate::Entries,
        extractor: &crate::Extractor,
        progress: &dyn Progress,
    ) -> Result<usize> {
        if let Some(m) = &self.model {
            ensure!(
                *m == extractor.fingerprint(),
                Error::Invalid(format!(
                    "the plan was learned with model {m}, this worker runs {}",
                    extractor.fingerprint()
                ))
            );
        }
        let feats = extractor.extract(&entries.items, "part", progress)?;
        let metas = crate::inputs::metas_in_order(entries.metas.clone(), &feats.ids)?;
        self.write_part(dir, &feats, metas)
    }

    pub fn save(&self, path: &Path) -> Result<()> {
        Ok(craterdex_durable::write_atomic(
            path,
            &serde_json::to_vec(self)?,
        )?)
    }

    pub fn load(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).io("read", path)?;
        let plan: BuildPlan = serde_json::from_slice(&bytes).map_err(|e| {
            Error::Invalid(format!(
                "{}: not a craterdex build plan: {e}",
                path.display()
            ))
        })?;
        ensure!(
            plan.format == PLAN_FORMAT,
            Error::Invalid(format!(
                "{}: format {:?}, this craterdex reads {PLAN_FORMAT:?}",
                path.display(),
                plan.format
            ))
        );
        plan.encoder
            .validate()
            .with_context(|| format!("{}: invalid encoder", path.display()))?;
        let codec = plan.token_codec();
        ensure!(
            plan.codebooks.len() == codec.codebook_bytes() / 4,
            Error::Invalid(format!(
                "{}: {} codebook values, the codec needs {}",
                path.display(),
                plan.codebooks.len(),
                codec.codebook_bytes() / 4
            ))
        );
        Ok(plan)
    }

    /// The codec every part encodes with.
    pub fn token_codec(&self) -> TokenCodec {
        TokenCodec {
            codec: self.codec,
            dim: self.encoder.token_dim(self.feature_dim),
            codebooks: self.codebooks.clone(),
            pq_tables: Default::default(),
        }
    }

    /// Encodes `feats` (with `metas`, in the same order) and writes them as the part at
    /// `dir`. Returns how many images it holds.
    pub fn write_part(
        &self,
        dir: &Path,
        feats: &FeatureSet,
        metas: Vec<ImageMeta>,
    ) -> Result<usize> {
        ensure!(
            feats.dim == self.feature_dim,
            Error::Invalid(format!(
                "the features are {}-d, the plan's encoder takes {}-d",
                feats.dim, self.feature_dim
            ))
        );
        ensure!(
            metas.len() == feats.len(),
            Error::Invalid(format!(
                "{} metadata records for {} images",
                metas.len(),
                feats.len()
            ))
        );
        let images: Vec<(ImageMeta, Descriptors)> = metas
            .into_iter()
            .zip(encode_all(&self.encoder, feats))
            .collect();
        Ok(write_part(dir, &self.token_codec(), &images)?)
    }

    /// Joins `parts` (in order) into the index at `dir`, replacing any index there once the
    /// new one is complete. IVF lists, where the recipe asks for them, are trained on every
    /// part's single vectors, as a one-shot build trains them on all of its images.
    pub fn commit(&self, dir: &Path, parts: &[PathBuf], progress: &dyn Progress) -> Result<usize> {
        let codec = self.token_codec();
        let recipe = IndexRecipe {
            ivf: self.ivf,
            nprobe: self.nprobe,
            seed: self.seed,
            ..Default::default()
        };
        let mut images = 0;
        for p in parts {
            images += part_images(p)?;
        }
        let ivf = match recipe.ivf_lists(images)? {
            None => None,
            Some(_) => {
                progress.start("read parts", parts.len());
                let mut singles = Vec::new();
                for (i, p) in parts.iter().enumerate() {
                    singles.extend(part_singles(p, &codec)?);
                    progress.advance(i + 1);
                }
                progress.finish();
                recipe.train_ivf_on(&singles, self.encoder.single_dim(self.feature_dim))?
            }
        };
        Ok(commit_parts(
            dir,
            &self.encoder,
            &codec,
            self.model.clone(),
            parts,
            ivf.as_ref().map(|(i, n)| (i, *n)),
        )?)
    }

    /// Commits `parts_by_shard[i]` as shard index `out/shard-NNN` (each as [`BuildPlan::
    /// commit`] does, IVF lists trained per shard), then writes `out/shards.json`. Every
    /// shard has this plan's encoder and codec, so their scores compare.
    pub fn commit_shards(
        &self,
        out: &Path,
        parts_by_shard: &[Vec<PathBuf>],
        progress: &dyn Progress,
    ) -> Result<ShardSet> {
        ensure!(
            !parts_by_shard.is_empty() && parts_by_shard.iter().all(|p| !p.is_empty()),
            Error::Invalid("every shard needs at least one part".into())
        );
        let mut counts = Vec::with_capacity(parts_by_shard.len());
        for (i, parts) in parts_by_shard.iter().enumerate() {
            counts.push(self.commit(&out.join(shard_dir(i)), parts, progress)?);
        }
        let set = ShardSet::new(&counts, &serde_json::to_vec(&self.encoder)?);
        set.write(out)?;
        Ok(set)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::progress::Silent;
    use crate::recipe::view_pairs;
    use craterdex_index::Index;
    use rand::Rng;

    fn random_features(n: usize, seed: u64) -> FeatureSet {
        let (d, t) = (16, 9);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let mut v =
            |len: usize| -> Vec<f32> { (0..len).map(|_| rng.gen_range(-1.0..1.0)).collect() };
        FeatureSet {
            ids: (0..n).map(|i| format!("img{i:03}")).collect(),
            dim: d,
            tokens: t,
            cls: v(n * d),
            patches: v(n * t * d),
            attention: v(n * t).iter().map(|x| x.abs()).collect(),
        }
    }

    fn metas(f: &FeatureSet) -> Vec<ImageMeta> {
        f.ids
            .iter()
            .map(|id| ImageMeta {
                id: id.clone(),
                ..Default::default()
            })
            .collect()
    }

    /// Every image's id, single vector and stored token codes, by id.
    fn contents(idx: &Index) -> Vec<(String, Vec<f32>, Vec<f32>)> {
        let mut out: Vec<_> = idx
            .live_rows()
            .map(|r| {
                let mut tokens = Vec::new();
                idx.decode_tokens(r, &mut tokens);
                (idx.meta(r).id.clone(), idx.single_of(r).to_vec(), tokens)
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    fn recipe(codec: Codec, ivf: IvfSetting) -> IndexRecipe {
        let mut recipe = IndexRecipe {
            codec,
            ivf,
            ..Default::default()
        };
        if let craterdex_tokens::Aggregation::Instance { k, .. } = &mut recipe.recipe.aggregation {
            *k = 4;
        }
        recipe
    }

    #[test]
    fn parts_committed_equal_a_one_shot_build() {
        let feats = random_features(60, 1);
        for (codec, ivf) in [
            (Codec::Int8, IvfSetting::Off),
            (Codec::F16, IvfSetting::Lists(3)),
        ] {
            let recipe = recipe(codec, ivf);
            let tmp = tempfile::tempdir().unwrap();
            let one_shot = tmp.path().join("one");
            write_one_shot(&recipe, &one_shot, &feats, metas(&feats), None);

            let plan_path = tmp.path().join("plan.json");
            recipe
                .plan(&feats, &[], None, &crate::Silent)
                .unwrap()
                .save(&plan_path)
                .unwrap();
            let plan = BuildPlan::load(&plan_path).unwrap();
            // parts written out of order, one of them twice (a retried task)
            let chunks: Vec<Vec<usize>> =
                (0..4).map(|p| (p * 15..(p + 1) * 15).collect()).collect();
            let parts: Vec<PathBuf> = (0..4)
                .map(|p| tmp.path().join(format!("staging/part-{p}")))
                .collect();
            for p in [2, 0, 3, 1, 2] {
                let f = feats.select(&chunks[p]);
                assert_eq!(plan.write_part(&parts[p], &f, metas(&f)).unwrap(), 15);
            }
            let joined = tmp.path().join("joined");
            assert_eq!(plan.commit(&joined, &parts, &Silent).unwrap(), 60);

            let (a, b) = (
                Index::open(&one_shot).unwrap(),
                Index::open(&joined).unwrap(),
            );
            assert_eq!(b.segment_count(), 4);
            assert_eq!(
                a.ivf().map(|(i, n)| (i.centroids.clone(), n)),
                b.ivf().map(|(i, n)| (i.centroids.clone(), n))
            );
            assert_eq!(contents(&a), contents(&b), "{codec:?} {ivf:?}");
            assert_eq!(
                serde_json::to_string(&a.encoder).unwrap(),
                serde_json::to_string(&b.encoder).unwrap()
            );
        }
    }

    /// Records the steps and counts a build reports.
    #[derive(Default)]
    struct Steps(std::sync::Mutex<Vec<(String, usize)>>);

    impl Progress for Steps {
        fn start(&self, what: &str, total: usize) {
            self.0
                .lock()
                .unwrap()
                .push((format!("start {what}"), total));
        }
        fn advance(&self, done: usize) {
            self.0.lock().unwrap().push(("advance".into(), done));
        }
    }

    #[test]
    fn a_build_in_chunks_equals_a_one_shot_build_with_the_same_sample() {
        let all = random_features(60, 3);
        // two views per crater, so that whitening learns from pairs; img017 cannot be read
        let metas: Vec<ImageMeta> = all
            .ids
            .iter()
            .enumerate()
            .map(|(i, id)| ImageMeta {
                id: id.clone(),
                crater_id: Some(format!("c{}", i / 2)),
                ..Default::default()
            })
            .collect();
        let unreadable = "img017";
        let readable: Vec<usize> = (0..60).filter(|&i| all.ids[i] != unreadable).collect();
        let feats = all.select(&readable);
        let sample: Vec<usize> = (0..60).filter(|i| i % 3 != 1).collect();
        for (codec, ivf) in [
            (Codec::Int8, IvfSetting::Off),
            (Codec::F16, IvfSetting::Lists(3)),
        ] {
            let recipe = recipe(codec, ivf);
            let tmp = tempfile::tempdir().unwrap();
            let one_shot = tmp.path().join("one");
            let rows = learn_rows_of(&sample, &all.ids, &feats.ids);
            let readable_metas = crate::inputs::metas_in_order(metas.clone(), &feats.ids).unwrap();
            write_one_shot(&recipe, &one_shot, &feats, readable_metas, Some(&rows));

            let chunked = tmp.path().join("built/chunked");
            let mut asked = Vec::new();
            let mut extract = |positions: &[usize], _: &str, p: &dyn Progress| {
                asked.push(positions.to_vec());
                p.start("chunk", positions.len());
                p.advance(positions.len());
                let keep: Vec<usize> = positions
                    .iter()
                    .copied()
                    .filter(|&i| all.ids[i] != unreadable)
                    .collect();
                Ok(all.select(&keep))
            };
            let steps = Steps::default();
            let read = write_in_chunks(
                &recipe,
                &chunked,
                &all.ids,
                metas.iter().rev().cloned().collect(),
                &sample,
                14,
                None,
                &mut extract,
                &steps,
            )
            .unwrap();
            assert_eq!(read, 59);
            // the sample first, then each chunk's other images: every image read once
            assert_eq!(asked[0], sample);
            let rest: Vec<usize> = asked[1..].concat();
            assert_eq!(rest, (0..60).filter(|i| i % 3 == 1).collect::<Vec<_>>());
            assert!(asked[1..].iter().all(|c| c.len() <= 14));
            // one bar over the images outside the sample, counting up to all of them
            let steps = steps.0.into_inner().unwrap();
            let bar = steps.iter().position(|s| s.0 == "start images").unwrap();
            assert_eq!(steps[bar].1, 20);
            let counts: Vec<usize> = steps[bar + 1..]
                .iter()
                .take_while(|s| s.0 == "advance")
                .map(|s| s.1)
                .collect();
            assert!(counts.windows(2).all(|w| w[0] < w[1]), "{steps:?}");
            assert_eq!(counts.last(), Some(&20), "{steps:?}");

            let (a, b) = (
                Index::open(&one_shot).unwrap(),
                Index::open(&chunked).unwrap(),
            );
            assert_eq!(b.segment_count(), 5, "one segment per chunk: 60 / 14");
            assert_eq!(contents(&a), contents(&b), "{codec:?} {ivf:?}");
            let order = |idx: &Index| -> Vec<String> {
                idx.live_rows().map(|r| idx.meta(r).id.clone()).collect()
            };
            if ivf == IvfSetting::Off {
                assert_eq!(order(&a), order(&b), "images in input order");
            }
            assert_eq!(
                a.ivf().map(|(i, n)| (i.centroids.clone(), n)),
                b.ivf().map(|(i, n)| (i.centroids.clone(), n))
            );
            assert_eq!(
                serde_json::to_string(&a.encoder).unwrap(),
                serde_json::to_string(&b.encoder).unwrap()
            );
            // the staging directory is gone
            let left: Vec<_> = std::fs::read_dir(tmp.path().join("built"))
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            assert_eq!(left, vec![std::ffi::OsString::from("chunked")]);
        }
    }

    /// With a real (tiny) model over image files, one of them unreadable: a build in chunks
    /// writes the index a one-shot build writes, and entries encoded in chunks are the ones
    /// encoded at once.
    #[test]
    fn images_read_in_chunks_index_and_encode_as_read_at_once() {
        use crate::{Engine, Entries, Extractor, LearnFrom, ModelOptions};
        let tmp = tempfile::tempdir().unwrap();
        let ckpt = craterdex_model::testing::write_tiny_checkpoint_of_depth(
            &tmp.path().join("ckpt"),
            16,
            4,
            4,
            2,
        );
        let (model, _) = craterdex_model::import::import_file(&ckpt, "tiny2", tmp.path()).unwrap();
        let extractor = std::sync::Arc::new(
            Extractor::load(
                &ModelOptions {
                    model: Some(model),
                    cache: false,
                    ..Default::default()
                },
                &Silent,
            )
            .unwrap(),
        );
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
        let mut entries = Entries::default();
        for i in 0..11 {
            let (id, path) = (format!("v{i:02}"), tmp.path().join(format!("v{i:02}.png")));
            if i == 6 {
                std::fs::write(&path, b"not an image").unwrap();
            } else {
                image::GrayImage::from_fn(24, 24, |_, _| image::Luma([rng.gen::<u8>()]))
                    .save(&path)
                    .unwrap();
            }
            entries.metas.push(ImageMeta {
                id: id.clone(),
                crater_id: Some(format!("c{}", i / 2)),
                ..Default::default()
            });
            entries.items.push((id, path));
        }
        entries.learn = LearnFrom::Ids(
            ["v00", "v01", "v04", "v05", "v06", "v09"]
                .map(String::from)
                .into(),
        );
        let recipe = recipe(Codec::Int8, IvfSetting::Off);
        let build = |name: &str, chunk: usize| {
            let dir = tmp.path().join(name);
            Engine::build_in_chunks_of(&dir, &entries, &recipe, extractor.clone(), &Silent, chunk)
                .unwrap()
        };
        let at_once = build("at-once", 100);
        let chunked = build("chunked", 3);
        let (a, b) = (
            Index::open(&tmp.path().join("at-once")).unwrap(),
            Index::open(&tmp.path().join("chunked")).unwrap(),
        );
        assert_eq!((a.segment_count(), b.segment_count()), (1, 4));
        assert_eq!(a.live_rows().count(), 10);
        assert_eq!(contents(&a), contents(&b));
        assert_eq!(
            serde_json::to_string(&a.encoder).unwrap(),
            serde_json::to_string(&b.encoder).unwrap()
        );
        let read = extractor
            .extract(&entries.items, "entries", &Silent)
            .unwrap();
        let once = at_once
            .encode_with_metas(entries.metas.clone(), &read)
            .unwrap();
        assert_eq!(once.len(), 10);
        for (engine, chunk) in [(&at_once, 100), (&chunked, 3)] {
            let by_chunk = engine
                .encode_entries_in_chunks_of(&entries, &Silent, chunk)
                .unwrap();
            assert_eq!(by_chunk.len(), once.len(), "chunks of {chunk}");
            for ((ma, da), (mb, db)) in once.iter().zip(&by_chunk) {
                assert_eq!(ma, mb, "chunks of {chunk}");
                assert_eq!((&da.single, &da.tokens), (&db.single, &db.tokens));
            }
        }
    }

    /// The index of `feats` built at once, whitening and codec learned from `rows` (all
    /// when `None`).
    fn write_one_shot(
        recipe: &IndexRecipe,
        dir: &Path,
        feats: &FeatureSet,
        metas: Vec<ImageMeta>,
        rows: Option<&[usize]>,
    ) {
        let encoder = recipe.learn_encoder(feats, rows, &metas, &Silent).unwrap();
        recipe
            .write_index(dir, &encoder, feats, metas, None, rows, &Silent)
            .unwrap();
    }

    /// The rows of `extracted` that `sample` (positions in `inputs`) names.
    fn learn_rows_of(sample: &[usize], inputs: &[String], extracted: &[String]) -> Vec<usize> {
        let named: std::collections::HashSet<&str> =
            sample.iter().map(|&i| inputs[i].as_str()).collect();
        (0..extracted.len())
            .filter(|&r| named.contains(extracted[r].as_str()))
            .collect()
    }

    #[test]
    fn an_incomplete_or_damaged_part_is_refused_and_the_old_index_kept() {
        let feats = random_features(20, 2);
        let recipe = recipe(Codec::Int8, IvfSetting::Off);
        let plan = recipe.plan(&feats, &[], None, &crate::Silent).unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let (p0, p1) = (tmp.path().join("part-0"), tmp.path().join("part-1"));
        let (a, b) = (
            feats.select(&(0..10).collect::<Vec<_>>()),
            feats.select(&(10..20).collect::<Vec<_>>()),
        );
        plan.write_part(&p0, &a, metas(&a)).unwrap();
        plan.write_part(&p1, &b, metas(&b)).unwrap();
        let out = tmp.path().join("index");
        plan.commit(&out, std::slice::from_ref(&p0), &Silent)
            .unwrap();

        std::fs::remove_file(p1.join(craterdex_index::parts::PART_FILE)).unwrap();
        let err = plan
            .commit(&out, &[p0.clone(), p1.clone()], &Silent)
            .unwrap_err();
        assert!(format!("{err:#}").contains("incomplete"), "{err:#}");
        plan.write_part(&p1, &b, metas(&b)).unwrap();
        let tokens = p1.join("tokens.bin");
        let mut bytes = std::fs::read(&tokens).unwrap();
        bytes[3] ^= 0x40;
        std::fs::write(&tokens, bytes).unwrap();
        let err = plan
            .commit(&out, &[p0.clone(), p1.clone()], &Silent)
            .unwrap_err();
        assert!(format!("{err:#}").contains("tokens.bin"), "{err:#}");
        // the same part twice: ids repeat
        let err = plan
            .commit(&out, &[p0.clone(), p0.clone()], &Silent)
            .unwrap_err();
        assert!(format!("{err:#}").contains("appears twice"), "{err:#}");
        assert_eq!(Index::open(&out).unwrap().live(), 10);
    }

    #[test]
    fn two_images_of_one_crater_make_whitening_pairs_when_the_recipe_asks() {
        let craters = [
            Some("a"),
            None,
            Some("b"),
            Some("a"),
            Some(""),
            Some("b"),
            Some("a"),
        ];
        assert_eq!(view_pairs(&craters), vec![(0, 3), (2, 5), (3, 6)]);
        let feats = random_features(40, 3);
        let mut with_craters = metas(&feats);
        for (i, m) in with_craters.iter_mut().enumerate() {
            m.crater_id = Some(format!("c{}", i / 2));
        }
        let recipe = IndexRecipe::default();
        assert!(recipe.recipe.whiten_pairs.is_some());
        let pca = IndexRecipe {
            recipe: craterdex_tokens::Recipe {
                whiten_pairs: None,
                ..Default::default()
            },
            ..Default::default()
        };
        let paired = recipe
            .learn_encoder(&feats, None, &with_craters, &crate::Silent)
            .unwrap();
        // without crater ids, or with pairs switched off, it is PCA whitening
        let unpaired = recipe
            .learn_encoder(&feats, None, &metas(&feats), &crate::Silent)
            .unwrap();
        let pca_only = pca
            .learn_encoder(&feats, None, &with_craters, &crate::Silent)
            .unwrap();
        assert_eq!(unpaired.token_whitening, pca_only.token_whitening);
        assert_eq!(unpaired.single_whitening, pca_only.single_whitening);
        assert_ne!(paired.token_whitening, pca_only.token_whitening);
        assert_ne!(paired.single_whitening, pca_only.single_whitening);
    }

    #[test]
    fn the_learn_sample_is_everything_up_to_the_limit_then_seeded() {
        assert_eq!(learn_sample(5, 0), vec![0, 1, 2, 3, 4]);
        let s = learn_sample(20_000, 3);
        assert_eq!(s.len(), LEARN_SAMPLE_IMAGES);
        assert!(s.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(s, learn_sample(20_000, 3));
        assert_ne!(s, learn_sample(20_000, 4));
    }

    #[test]
    fn learn_rows_follow_the_sample_past_unreadable_images() {
        let inputs: Vec<String> = (0..10_000).map(|i| format!("c{i}")).collect();
        assert_eq!(learn_rows(&inputs[..100], &inputs[..99], 0), None);
        // every third image could not be read
        let extracted: Vec<String> = inputs
            .iter()
            .enumerate()
            .filter(|(i, _)| i % 3 != 0)
            .map(|(_, s)| s.clone())
            .collect();
        let rows = learn_rows(&inputs, &extracted, 5).unwrap();
        let want: Vec<&str> = learn_sample(10_000, 5)
            .into_iter()
            .filter(|i| i % 3 != 0)
            .map(|i| inputs[i].as_str())
            .collect();
        let got: Vec<&str> = rows.iter().map(|&r| extracted[r].as_str()).collect();
        assert_eq!(got, want);
    }
}
